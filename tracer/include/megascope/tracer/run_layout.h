// RunLayout: every path of a run directory, named once (docs/formats.md section 7), for every floor
// that reads or writes one (the agent, the analyzer, the runtime, the controller, the CLI). Also
// the node memory area where in-memory snapshots live (tmpfs under the shm directory, one folder
// per node).
#pragma once

#include <cstdint>
#include <string>

namespace megascope {

class RunLayout {
 public:
  explicit RunLayout(std::string run_dir) : dir_(std::move(run_dir)) {}

  const std::string& dir() const { return dir_; }
  std::string run_json() const { return dir_ + "/run.json"; }
  // The agents for Prometheus' file_sd_configs (scrape_targets.h).
  std::string prometheus_targets() const { return dir_ + "/prometheus_targets.json"; }
  std::string control_db() const { return dir_ + "/control.db"; }
  std::string token() const { return dir_ + "/control.token"; }  // 0600: whoever reads it may act
  std::string controller_json() const {
    return dir_ + "/controller.json";
  }  // where the controller listens
  std::string progress() const { return dir_ + "/progress.jsonl"; }
  std::string checkpoint_request() const { return dir_ + "/checkpoint.request"; }
  std::string report_md() const { return dir_ + "/report.md"; }
  std::string timeline_html() const { return dir_ + "/timeline.html"; }
  std::string nodes() const { return dir_ + "/nodes"; }
  std::string node_dir(const std::string& node) const { return nodes() + "/" + node; }
  std::string trace_db(const std::string& node) const { return node_dir(node) + "/trace.db"; }
  std::string agent_log(const std::string& node) const { return node_dir(node) + "/agent.log"; }
  std::string agent_port(const std::string& node) const { return node_dir(node) + "/agent.port"; }
  std::string ranks() const { return dir_ + "/ranks"; }
  std::string rank_dir(int rank) const { return ranks() + "/" + std::to_string(rank); }
  std::string worker_log(int rank) const { return rank_dir(rank) + "/worker.log"; }
  // Written only with --trace-alternate: step,traced,wall_ns,cpu_ns per step of this rank.
  std::string step_costs(int rank) const { return rank_dir(rank) + "/step_costs.csv"; }
  std::string dumps_root() const { return dir_ + "/dumps"; }
  std::string dumps(int attempt) const {
    return dumps_root() + "/attempt_" + std::to_string(attempt);
  }
  std::string dump(int attempt, int rank) const {
    return dumps(attempt) + "/rank_" + std::to_string(rank) + ".json";
  }
  std::string rendezvous(int attempt) const {
    return dir_ + "/rendezvous/attempt_" + std::to_string(attempt);
  }
  std::string checkpoints() const { return dir_ + "/checkpoints"; }
  std::string checkpoint(int64_t step) const {
    return checkpoints() + "/step_" + std::to_string(step);
  }
  std::string self_check_dir(const std::string& id) const { return dir_ + "/selfcheck/" + id; }

 private:
  std::string dir_;
};

// The in-memory snapshot area of `node` for `job` (tmpfs: host memory, not the run's disk).
inline std::string NodeMemoryDir(const std::string& shm_dir, const std::string& job,
                                 const std::string& node) {
  return shm_dir + "/megascope-" + job + "-memory/" + node;
}
inline std::string MemoryRoot(const std::string& shm_dir, const std::string& job) {
  return shm_dir + "/megascope-" + job + "-memory";
}

}  // namespace megascope
