// The scripted fleet behind real HTTP: every agent endpoint the controller asks (/state, /metrics,
// /window, /dumps) is served by one civetweb server in this process from the FakeFleet's answers,
// and asked the way the real fleet asks it -- tracer::HttpGet side by side within one deadline
// (AskAgents), the live hang analysis through analyzer::LoadFromAgents over the agents' binary
// dump stream. Everything else is the FakeFleet's. What it measures beside the controller's own
// work: a TCP connection, a request and a reply per agent and tick, and every rank's flight
// recorder encoded, sent and decoded in a hang.
#pragma once

#include <CivetServer.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fake_fleet.h"
#include "megascope/analyzer/live.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/http_client.h"
#include "megascope/tracer/http_serve.h"

namespace megascope::controller::testing {

class HttpFleet final : public Fleet {
 public:
  // `threads`: the server's (the agents' side of every request).
  explicit HttpFleet(std::unique_ptr<FakeFleet> inner, int threads = 16)
      : inner_(std::move(inner)),
        handler_(this),
        server_({"listening_ports", "127.0.0.1:0", "num_threads", std::to_string(threads)}) {
    server_.addHandler("/", handler_);
    base_ = "http://127.0.0.1:" + std::to_string(server_.getListeningPorts().front()) + "/";
  }
  FakeFleet& inner() { return *inner_; }

  // --- over HTTP
  Result<std::string> AgentGet(const std::string& node, const std::string& path, int timeout_ms,
                               const std::string& token) override {
    if (!inner_->AgentPort(node)) return NotFound(node + " has no agent running");
    return tracer::HttpGet(base_ + node + path, timeout_ms, token);
  }
  std::vector<Result<std::string>> AgentGetAll(const std::vector<std::string>& nodes,
                                               const std::string& path, int timeout_ms,
                                               const std::string& token) override {
    std::vector<std::string> urls;
    urls.reserve(nodes.size());
    for (const std::string& n : nodes) urls.push_back(inner_->AgentPort(n) ? base_ + n : "");
    return AskAgents(nodes, urls, path, timeout_ms, token);
  }
  Result<analyzer::HangInput> LiveHangInput(const std::vector<std::string>& nodes, int attempt,
                                            const std::string& token) override {
    std::vector<std::string> urls;
    for (const std::string& n : nodes) {
      if (inner_->AgentPort(n)) urls.push_back(base_ + n);
    }
    return analyzer::LoadFromAgents(urls, attempt, token);
  }

  // --- the FakeFleet's
  Result<int> StartAgent(const std::string& node) override { return inner_->StartAgent(node); }
  std::optional<int> AgentPort(const std::string& node) const override {
    return inner_->AgentPort(node);
  }
  void StopAgent(const std::string& node, bool wait) override { inner_->StopAgent(node, wait); }
  void StopAgents() override { inner_->StopAgents(); }
  std::vector<launch::AgentExit> PollAgents() override { return inner_->PollAgents(); }
  bool SignalAgent(const std::string& node, int sig) override {
    return inner_->SignalAgent(node, sig);
  }
  Status StartRanks(const launch::AttemptPlan& plan, int world) override {
    return inner_->StartRanks(plan, world);
  }
  std::vector<launch::RankExit> PollRanks() override { return inner_->PollRanks(); }
  launch::RankExit FindOrigin(const std::vector<launch::RankExit>& failures,
                              std::chrono::milliseconds window,
                              std::vector<launch::RankExit>* others) override {
    return inner_->FindOrigin(failures, window, others);
  }
  std::vector<int> CollectDumps(std::chrono::milliseconds timeout) override {
    return inner_->CollectDumps(timeout);
  }
  void StopRanks() override { inner_->StopRanks(); }
  bool SignalRank(int rank, int sig) override { return inner_->SignalRank(rank, sig); }
  std::string NodeOfRank(int rank) const override { return inner_->NodeOfRank(rank); }
  std::vector<std::pair<SelfCheckFigures, SelfCheckFigures>> SelfCheckPairs(
      const std::vector<std::pair<std::string, std::string>>& pairs,
      double min_allreduce_gbps) override {
    return inner_->SelfCheckPairs(pairs, min_allreduce_gbps);
  }
  void AddNodeEnv(const std::string& node, const std::string& key,
                  const std::string& value) override {
    inner_->AddNodeEnv(node, key, value);
  }
  const launch::Host* HostOf(const std::string& node) const override {
    return inner_->HostOf(node);
  }

 private:
  // GET /<node>/<path>: the FakeFleet's answer for `node` (one at a time: the fake is not made
  // for threads; the controller's thread waits for the answers meanwhile). /dumps: the node's
  // ranks' flight recorders in the binary stream an agent sends.
  class Handler final : public CivetHandler {
   public:
    explicit Handler(HttpFleet* f) : f_(f) {}
    bool handleGet(CivetServer*, mg_connection* conn) override {
      const mg_request_info* info = mg_get_request_info(conn);
      const std::string uri = info->local_uri;
      const size_t slash = uri.find('/', 1);
      const std::string node = uri.substr(1, slash == std::string::npos ? 0 : slash - 1);
      std::string path = slash == std::string::npos ? "/" : uri.substr(slash);
      const std::string query = info->query_string != nullptr ? info->query_string : "";
      std::lock_guard<std::mutex> lock(f_->mu_);
      if (path == "/dumps") {
        int attempt = -1;
        if (const size_t at = query.find("attempt="); at != std::string::npos)
          attempt = std::atoi(query.c_str() + at + 8);
        if (!f_->inner_->AgentPort(node)) {
          tracer::HttpReply(conn, 404, "text/plain", node + " has no agent\n");
          return true;
        }
        std::string body;
        tracer::AppendDumpStreamHeader(&body);
        for (const tracer::Dump& d : f_->inner_->NodeDumps(node, attempt))
          tracer::AppendDumpFrame(d, &body);
        tracer::HttpReply(conn, 200, "application/octet-stream", body);
        return true;
      }
      if (!query.empty()) path += "?" + query;
      const Result<std::string> answer = f_->inner_->AgentGet(node, path, 1000, "");
      if (answer.ok()) {
        tracer::HttpReply(
            conn, 200, path.starts_with("/metrics") ? "text/plain" : "application/json", *answer);
      } else {
        tracer::HttpReply(conn, 503, "text/plain", answer.status().ToString() + "\n");
      }
      return true;
    }

   private:
    HttpFleet* f_;
  };

  std::unique_ptr<FakeFleet> inner_;
  std::mutex mu_;  // one request at a time reads the fake
  Handler handler_;
  CivetServer server_;  // last: stops before what its handler reads
  std::string base_;
};

}  // namespace megascope::controller::testing
