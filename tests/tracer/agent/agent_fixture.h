// What the agent tests share: a job's rings in a temporary /dev/shm folder, a run directory, the
// agent's options over them, and small readers of what it wrote and served.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "megascope/launch/process.h"
#include "megascope/tracer/agent/agent.h"
#include "megascope/tracer/agent/agent_state.h"
#include "megascope/tracer/agent/host_metrics.h"
#include "megascope/tracer/clock.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/sqlite.h"
#include "megascope/tracer/trace_store.h"
#include "megascope/tracer/tracer.h"
#include "sqlite_util.h"
#include "test_util.h"

namespace megascope::tracer::agent {
using megascope::launch::Process;
namespace fs = std::filesystem;
using megascope::testing::TempDir;

inline int64_t Count(const std::string& db, const std::string& sql) {
  const std::vector<int64_t> row = megascope::testing::FirstRow(db, sql);
  return row.empty() ? -1 : row[0];
}

// The body of GET http://127.0.0.1:port/path, or the error (with the server's reason).
inline std::string HttpGet(int port, const std::string& path) {
  auto r = megascope::tracer::HttpGet("http://127.0.0.1:" + std::to_string(port) + path, 10000);
  return r.ok() ? *r : r.status().message();
}

class AgentTest : public ::testing::Test {
 protected:
  RingOptions Ring(int rank, const std::string& node = "n0") {
    RingOptions o;
    o.dir = shm_.path();
    o.job = "agenttest";
    o.node = node;
    o.rank = rank;
    o.world_size = 4;
    o.coords = {rank / 2, 0, rank % 2};
    o.lane_capacity = 1 << 14;
    return o;
  }
  AgentOptions Options() {
    AgentOptions a;
    a.node = "n0";
    a.run_dir = run_.path();
    a.job = "agenttest";
    a.shm_dir = shm_.path();
    return a;
  }
  std::string Db() const { return run_.path() + "/nodes/n0/trace.db"; }

  TempDir shm_, run_;
};

}  // namespace megascope::tracer::agent
