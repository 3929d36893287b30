#include "process_recorder.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace megascope::inproc {

std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

int EnvInt(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names) {
    const std::string v = Env(n);
    if (!v.empty()) return std::atoi(v.c_str());
  }
  return fallback;
}

namespace {

tracer::RingOptions ReadRing() {
  tracer::RingOptions r;
  r.dir = Env("MEGASCOPE_SHM_DIR", "/dev/shm");
  r.job = Env("MEGASCOPE_JOB", "nccl");
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  r.node = Env("MEGASCOPE_NODE", host);
  r.rank = EnvInt({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, 0);
  r.world_size =
      EnvInt({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, r.rank + 1);
  r.local_rank =
      EnvInt({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}, 0);
  r.attempt = EnvInt({"MEGASCOPE_ATTEMPT", "TORCHELASTIC_RESTART_COUNT"}, 0);
  r.lanes = 16;  // the user's threads, one proxy thread per communicator, CUPTI's buffer thread
  r.max_groups = 256;
  return r;
}

}  // namespace

Process& TheProcess() {
  static Process* p = [] {
    auto* proc = new Process;
    proc->ring = ReadRing();
    proc->run_dir = Env("MEGASCOPE_RUN_DIR");
    auto t = tracer::Tracer::Create(proc->ring);
    if (!t.ok()) {
      proc->error = t.status().message();
      return proc;
    }
    proc->tracer = t->release();
    // The heartbeat says the process is alive (a frozen one stops beating); once a second.
    std::thread([t = proc->tracer] {
      for (;;) {
        t->Touch();
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }).detach();
    return proc;
  }();
  return *p;
}

}  // namespace megascope::inproc
