// A real (2,2,2) training run with its agents, scraped by a real Prometheus server on loopback.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "megascope/launch/process.h"
#include "megascope/runtime/data.h"
#include "megascope/tracer/http_client.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
// The body of GET http://127.0.0.1:port/path, or the error (with the server's reason).
std::string HttpGet(int port, const std::string& path) {
  auto r = megascope::tracer::HttpGet("http://127.0.0.1:" + std::to_string(port) + path, 10000);
  return r.ok() ? *r : r.status().message();
}
using megascope::testing::TempDir;

std::unique_ptr<megascope::launch::Process> Spawn(const std::string& cmd, const std::string& log) {
  auto p = megascope::launch::Process::Spawn({{"/bin/sh", "-c", "exec " + cmd}, log});
  return p.ok() ? std::move(p).value() : nullptr;
}

std::set<std::string> NamesIn(const std::string& text) {
  static const std::regex kName(R"(megascope_[a-z_]+)");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kName);
       it != std::sregex_iterator(); ++it) {
    std::string n = it->str();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (n.size() > strlen(suffix) && n.ends_with(suffix)) n.resize(n.size() - strlen(suffix));
    }
    names.insert(n);
  }
  return names;
}

TEST(PrometheusE2eTest, PrometheusScrapesEveryRanksStepAndDashboardsUseRealMetrics) {
  TempDir dir;
  const std::string data = dir.path() + "/notes.bin";
  ASSERT_TRUE(
      megascope::runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data)
          .ok());
  const std::string run = dir.path() + "/run";
  auto train = Spawn(std::string(MEGASCOPE_BIN) + " train --dp 2 --tp 2 --pp 2 --nodes 2 --data " +
                         data + " --run-dir " + run + " --job e2e" + std::to_string(::getpid()) +
                         " --steps 100000 --layers 2 --width 32 --heads 2 --seq 16 --batch 4",
                     dir.path() + "/train.log");
  // The agents' ports are in run.json once the launcher has started them; the file_sd list is
  // written just after it (a reader between the two once found no list).
  std::vector<int> ports;
  auto targets_ready = [&] {
    std::ifstream in(run + "/prometheus_targets.json");
    const auto t = nlohmann::json::parse(in, nullptr, false);
    return t.is_array() && t.size() == 2;
  };
  for (int i = 0; i < 200 && (ports.size() < 2 || !targets_ready()); ++i) {
    std::ifstream in(run + "/run.json");
    if (in) {
      try {
        auto j = nlohmann::json::parse(in);
        ports.clear();
        for (const auto& a : j["agents"]) ports.push_back(a["port"]);
      } catch (...) {
      }
    }
    if (ports.size() < 2 || !targets_ready())
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(ports.size(), 2u);
  {  // the same agents in the file_sd list
    std::ifstream targets(run + "/prometheus_targets.json");
    const auto t = nlohmann::json::parse(targets, nullptr, false);
    ASSERT_TRUE(t.is_array() && t.size() == 2) << t.dump();
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(t[i]["targets"][0], "127.0.0.1:" + std::to_string(ports[i])) << t.dump();
  }
  const int prom_port = megascope::testing::FreePort();
  std::ofstream(dir.path() + "/prometheus.yml")
      << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
      << "scrape_configs:\n  - job_name: megascope\n    honor_labels: true\n    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << ports[0] << "', '127.0.0.1:" << ports[1] << "']\n";
  auto prom = Spawn("prometheus --config.file=" + dir.path() +
                        "/prometheus.yml --storage.tsdb.path=" + dir.path() +
                        "/tsdb --web.listen-address=127.0.0.1:" + std::to_string(prom_port),
                    dir.path() + "/prometheus.log");
  size_t series = 0;
  std::string last;
  for (int i = 0; i < 120 && series < 8; ++i) {  // at most 60 s
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    last = HttpGet(prom_port, "/api/v1/query?query=megascope_step");
    try {
      auto j = nlohmann::json::parse(last);
      series = j["data"]["result"].size();
    } catch (...) {
    }
  }
  // Every metric the dashboard and the alert rules read is served by a live agent.
  const std::string live = HttpGet(ports[0], "/metrics") + HttpGet(ports[1], "/metrics");
  megascope::launch::StopAll({prom.get(), train.get()}, std::chrono::seconds(20));
  EXPECT_EQ(series, 8u) << last;
  std::set<std::string> served;
  static const std::regex kType(R"(# TYPE (megascope_[a-z_]+) )");
  for (auto it = std::sregex_iterator(live.begin(), live.end(), kType);
       it != std::sregex_iterator(); ++it) {
    served.insert((*it)[1].str());
  }
  for (const char* file : {"/grafana/megascope-job.json", "/prometheus/megascope-rules.yml"}) {
    std::ifstream in(std::string(MEGASCOPE_DASHBOARDS) + file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto used = NamesIn(text);
    EXPECT_FALSE(used.empty()) << file;
    for (const std::string& name : used) {
      if (name.starts_with("megascope_gpu_") && live.find("megascope_gpu_") == std::string::npos)
        continue;  // no NVML here
      if (name == "megascope_restarts_total" || name == "megascope_evictions_total" ||
          name == "megascope_verdicts_total")
        continue;  // from a launch's control.db: the next test has a launch
      EXPECT_TRUE(served.count(name)) << name << " (used in " << file << ")";
    }
  }
  EXPECT_EQ(
      megascope::testing::RunCommand("promtool check rules " + std::string(MEGASCOPE_DASHBOARDS) +
                                     "/prometheus/megascope-rules.yml")
          .code,
      0);
}

// Every panel of the dashboard has data from a real Prometheus that found the agents through the
// run's file_sd list, across a restart that moved node1's ranks to the spare node2 (a static list
// goes stale there: the spare's agent is new).
TEST(PrometheusE2eTest, EveryPanelHasDataAcrossARestartThroughTheTargetsFile) {
  TempDir dir;
  const std::string data = dir.path() + "/notes.bin";
  ASSERT_TRUE(
      megascope::runtime::PrepareByteTokens(MEGASCOPE_TEST_DATA "/text/notes_on_training.txt", data)
          .ok());
  const std::string run = dir.path() + "/run", job = "sd" + std::to_string(::getpid());
  const int prom_port = megascope::testing::FreePort();
  std::ofstream(dir.path() + "/prometheus.yml")
      << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
      << "scrape_configs:\n  - job_name: megascope\n    honor_labels: true\n"
      << "    file_sd_configs:\n      - files: ['" << run << "/prometheus_targets.json']\n"
      << "        refresh_interval: 1s\n";
  auto prom = Spawn("prometheus --config.file=" + dir.path() +
                        "/prometheus.yml --storage.tsdb.path=" + dir.path() +
                        "/tsdb --web.listen-address=127.0.0.1:" + std::to_string(prom_port),
                    dir.path() + "/prometheus.log");
  // Its own shared-memory directory: the launch is stopped mid-run, and a stopped launch keeps its
  // newest state in memory for a relaunch.
  auto launch =
      Spawn(std::string(MEGASCOPE_BIN) + " launch --dp 2 --nodes 2 --spares 1 --data " + data +
                " --run-dir " + run + " --job " + job + " --shm-dir " + dir.path() + "/shm" +
                " --steps 100000 --layers 2 --width 32 --heads 2 --seq 16 --batch 4"
                " --microbatches 2 --hang-after 2 --tick 0.1 --min-gemm-ratio 0.2"
                " --min-bandwidth-ratio 0.1 --inject crash:node=node1,at=5",
            dir.path() + "/launch.log");
  ASSERT_NE(prom, nullptr);
  ASSERT_NE(launch, nullptr);
  std::ifstream dash(std::string(MEGASCOPE_DASHBOARDS) + "/grafana/megascope-job.json");
  const auto dashboard = nlohmann::json::parse(dash);
  auto encode = [](const std::string& q) {
    std::string out;
    for (unsigned char c : q) {
      if (std::isalnum(c) != 0 || c == '_' || c == '.' || c == '-') {
        out += static_cast<char>(c);
      } else {
        char buf[4];
        std::snprintf(buf, sizeof(buf), "%%%02X", c);
        out += buf;
      }
    }
    return out;
  };
  auto series = [&](const std::string& query) -> size_t {
    try {
      return nlohmann::json::parse(
                 HttpGet(prom_port, "/api/v1/query?query=" + encode(query)))["data"]["result"]
          .size();
    } catch (...) {
      return 0;
    }
  };
  // Until the spare's agent is scraped and every panel (but the GPU's, without NVML) has data.
  std::map<std::string, size_t> missing;
  for (int i = 0; i < 180; ++i) {  // at most 90 s
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    missing.clear();
    if (series("up{megascope_node=\"node2\"} == 1") == 0) missing["the spare's agent"] = 0;
    for (const auto& panel : dashboard["panels"]) {
      for (const auto& t : panel["targets"]) {
        std::string q = t["expr"];
        if (q.find("megascope_gpu_") != std::string::npos) continue;  // no NVML here
        for (size_t at; (at = q.find("$job")) != std::string::npos;) q.replace(at, 4, job);
        if (series(q) == 0) missing[panel["title"].get<std::string>() + ": " + q] = 0;
      }
    }
    if (missing.empty()) break;
  }
  const size_t restarts = series("megascope_restarts_total{job=\"" + job + "\"}");
  megascope::launch::StopAll({launch.get(), prom.get()}, std::chrono::seconds(20));
  std::string what;
  for (const auto& [m, n] : missing) what += "\n  no data: " + m;
  EXPECT_TRUE(missing.empty()) << what;
  EXPECT_GT(restarts, 0u);
  std::ifstream targets(run + "/prometheus_targets.json");
  const std::string text((std::istreambuf_iterator<char>(targets)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("node2"), std::string::npos) << text;
  EXPECT_EQ(text.find("\"node1\""), std::string::npos)
      << "the evicted node is still listed: " << text;
}

}  // namespace
