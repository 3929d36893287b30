// The exit codes of megascope's processes, in one place: a worker's (what the supervisor and the
// controller read to tell a rank's own failure from its peers' and from the job's own error) and
// `megascope launch`'s (what a scheduler or a person's script reads). Every command exits
// kExitUsage on bad flags (cli/).
#pragma once

namespace megascope::launch {

inline constexpr int kExitUsage = 2;  // any command: bad flags or arguments, nothing started

// A worker (`megascope worker`, one rank).
inline constexpr int kExitOk = 0;
inline constexpr int kExitCommFailure = 3;  // a collective failed because a peer is gone or stuck
inline constexpr int kExitSetup = 4;
// The job's own input is wrong (a data file, the config, its job name held by a live process):
// the same on any machine.
inline constexpr int kExitJobError = 5;
// Stopped on request (SIGTERM) after its state writes in flight finished: 128 + SIGTERM.
inline constexpr int kExitStopped = 143;

// `megascope launch` (controller::Controller::Run).
inline constexpr int kLaunchFinished = 0;
inline constexpr int kLaunchFailed = 1;  // could not start (setup, agents, the baseline check)
inline constexpr int kLaunchPaused = 3;  // paused for a person: it says what it needs
// Every step ran, but records were lost (a full disk): progress lines, control.db events or the
// launch's reports; the launch says which.
inline constexpr int kLaunchIncomplete = 4;
inline constexpr int kLaunchStopped =
    130;  // a person stopped it (Ctrl-C, SIGTERM, `megascope stop`)

}  // namespace megascope::launch
