// The one recorder of a process megascope's in-process library is loaded into. The library is one
// shared object with two names: NCCL loads it as its profiler plugin
// (libnccl-profiler-megascope.so) and the CUDA driver as an injection library
// (libmegascope-cupti.so, a link to the same file), so both find the process's ring here instead of
// each opening one (a ring belongs to one rank).
//
// Environment (megascope wrap sets it): MEGASCOPE_JOB, MEGASCOPE_NODE, MEGASCOPE_ATTEMPT,
// MEGASCOPE_SHM_DIR (/dev/shm), MEGASCOPE_RUN_DIR; the rank from RANK, SLURM_PROCID,
// OMPI_COMM_WORLD_RANK or PMI_RANK and the world from WORLD_SIZE, SLURM_NTASKS,
// OMPI_COMM_WORLD_SIZE or PMI_SIZE.
#pragma once

#include <initializer_list>
#include <string>

#include "megascope/tracer/tracer.h"

namespace megascope::inproc {

// An environment variable's value ("" unset counts as unset).
std::string Env(const char* name, const std::string& fallback = "");
// The first of `names` that is set, as an integer.
int EnvInt(std::initializer_list<const char*> names, int fallback);

struct Process {
  tracer::RingOptions ring;
  std::string run_dir;               // MEGASCOPE_RUN_DIR ("" when not set)
  tracer::Tracer* tracer = nullptr;  // null when the ring could not be made
  std::string error;                 // why not ("" when it was)
};

// Made at the first call from any thread (the ring, and a thread beating the heartbeat once a
// second), never destroyed: NCCL and CUPTI may call in from their threads until the process ends,
// and the ring stays for the node's agent to drain.
Process& TheProcess();

}  // namespace megascope::inproc
