// The exit codes of megascope's processes, in one place: a worker's (what the supervisor and the
// controller read to tell a rank's own failure from its peers' and from the job's own error) and
// `megascope launch`'s (what a scheduler or a person's script reads). Every command exits
// kExitUsage on bad flags (cli/).
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

namespace megascope::launch {

inline constexpr int kExitUsage = 2;  // any command: bad flags or arguments, nothing started

// A worker (`megascope worker`, one rank).
inline constexpr int kExitOk = 0;
inline constexpr int kExitCommFailure = 3;  // a collective failed because a peer is gone or stuck
inline constexpr int kExitSetup = 4;
// The job's own input is wrong (a data file, the config, its job name held by a live process):
// the same on any machine.
inline constexpr int kExitJobError = 5;
// Could not connect to its peers at the attempt's start (the rendezvous or a connection timed
// out): the far end, the link or this end -- not this rank's fault alone. Its last log line names
// the peer it was reaching (CannotReach) where it knows it.
inline constexpr int kExitUnreachable = 6;
// Stopped on request (SIGTERM) after its state writes in flight finished: 128 + SIGTERM.
inline constexpr int kExitStopped = 143;

// A rank that ended because of a peer (a collective failed, a peer could not be reached): the
// cause is elsewhere, and the supervisor and the controller look for it there.
inline constexpr bool PeersFailure(int exit_code) {
  return exit_code == kExitCommFailure || exit_code == kExitUnreachable;
}

// The words a worker's log uses for the peer it could not reach, and their reader: the rank named,
// or -1 when the line names none.
inline std::string CannotReach(int peer) { return "cannot reach rank " + std::to_string(peer); }
inline int CannotReachPeer(std::string_view line) {
  constexpr std::string_view kWords = "cannot reach rank ";
  const size_t at = line.find(kWords);
  if (at == std::string_view::npos) return -1;
  const std::string rest(line.substr(at + kWords.size()));
  char* end = nullptr;
  const long peer = std::strtol(rest.c_str(), &end, 10);
  return end == rest.c_str() || peer < 0 ? -1 : static_cast<int>(peer);
}

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
