// A real ClickHouse server for tests (Debian's clickhouse-server, which scripts/setup.sh installs):
// started on free loopback ports with its config and data in a test directory, killed and started
// again on the same data, and stopped at scope exit. Users: `default` (no password) and `writer`
// (password "s3cret"). Optionally one node of a cluster `megascope_test` of several shards.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "megascope/launch/process.h"
#include "megascope/tracer/http_client.h"
#include "test_util.h"

namespace megascope::testing {

inline constexpr const char* kClickHouseServer = "/usr/sbin/clickhouse-server";

inline bool ClickHouseInstalled() { return ::access(kClickHouseServer, X_OK) == 0; }

// A free loopback port below the kernel's ephemeral range (32768 and up): a server started again
// on it after a kill finds it free, where an ephemeral port may meanwhile be the local end of some
// other process's outgoing connection.
inline int ListenPort() {
  static std::mt19937 pick(std::random_device{}());
  for (int tries = 0; tries < 1000; ++tries) {
    const int port = std::uniform_int_distribution<int>(20000, 32000)(pick);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (free) return port;
  }
  return FreePort();
}

class ClickHouseServer {
 public:
  // `dir`: its config, data and log. `shard_tcp_ports`: the native (TCP) ports of every shard of
  // the cluster `megascope_test` this server belongs to (empty: no cluster); `tcp_port`: its own
  // (0: a free one).
  explicit ClickHouseServer(std::string dir, std::vector<int> shard_tcp_ports = {},
                            int tcp_port = 0)
      : dir_(std::move(dir)),
        http_port_(ListenPort()),
        tcp_port_(tcp_port > 0 ? tcp_port : ListenPort()) {
    std::filesystem::create_directories(dir_);
    std::string cluster;
    if (!shard_tcp_ports.empty()) {
      cluster = "<remote_servers><megascope_test>";
      for (const int p : shard_tcp_ports)
        cluster += "<shard><replica><host>127.0.0.1</host><port>" + std::to_string(p) +
                   "</port></replica></shard>";
      cluster += "</megascope_test></remote_servers>";
    }
    std::ofstream(dir_ + "/config.xml")
        << "<?xml version=\"1.0\"?><yandex><logger><level>warning</level><log>" << dir_
        << "/server.log</log><errorlog>" << dir_
        << "/server.err.log</errorlog><size>10M</size><count>1</count></logger>"
        << "<http_port>" << http_port_ << "</http_port><tcp_port>" << tcp_port_
        << "</tcp_port><listen_host>127.0.0.1</listen_host><path>" << dir_
        << "/data/</path><tmp_path>" << dir_ << "/tmp/</tmp_path><user_files_path>" << dir_
        << "/user_files/</user_files_path><format_schema_path>" << dir_
        << "/format_schemas/</format_schema_path><users_config>" << dir_
        << "/users.xml</users_config><default_profile>default</default_profile>"
        << "<default_database>default</default_database><mark_cache_size>67108864"
        << "</mark_cache_size><uncompressed_cache_size>67108864</uncompressed_cache_size>"
        << cluster << "</yandex>\n";
    const std::string user =
        "<networks><ip>127.0.0.1</ip></networks><profile>default</profile>"
        "<quota>default</quota>";
    std::ofstream(dir_ + "/users.xml")
        << "<?xml version=\"1.0\"?><yandex><profiles><default><max_memory_usage>2000000000"
        << "</max_memory_usage></default></profiles><users><default><password></password>" << user
        << "</default><writer><password>s3cret</password>" << user << "</writer></users>"
        << "<quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0"
        << "</errors><result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0"
        << "</execution_time></interval></default></quotas></yandex>\n";
  }
  ~ClickHouseServer() { Kill(); }

  // Starts the server and waits until it answers (at most 60 s).
  ::testing::AssertionResult Start() {
    launch::ProcessSpec spec({kClickHouseServer, "--config-file=" + dir_ + "/config.xml"},
                             dir_ + "/stdout.log");
    spec.append_log = true;
    auto p = launch::Process::Spawn(spec);
    if (!p.ok()) return ::testing::AssertionFailure() << p.status().ToString();
    process_ = std::move(*p);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (tracer::HttpGet("http://127.0.0.1:" + std::to_string(http_port_) + "/ping", 1000).ok())
        return ::testing::AssertionSuccess();
      if (!process_->running()) {
        std::ifstream err(dir_ + "/server.err.log");
        std::stringstream text;
        text << err.rdbuf();
        const std::string e = text.str();
        return ::testing::AssertionFailure()
               << "clickhouse-server exited:\n"
               << process_->LogTail(20) << (e.size() > 4000 ? e.substr(e.size() - 4000) : e);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure() << "clickhouse-server did not answer within 60 s";
  }
  // SIGKILL: what a crashed or powered-off server does.
  void Kill() {
    if (process_) {
      process_->Signal(SIGKILL);
      process_->Wait();
      process_.reset();
    }
  }
  int http_port() const { return http_port_; }
  int tcp_port() const { return tcp_port_; }
  // clickhouse://[USER@]127.0.0.1:PORT/DB[?cluster=megascope_test]
  std::string Url(const std::string& db, const std::string& credentials = "",
                  bool cluster = false) const {
    return "clickhouse://" + (credentials.empty() ? "" : credentials + "@") +
           "127.0.0.1:" + std::to_string(http_port_) + "/" + db +
           (cluster ? "?cluster=megascope_test" : "");
  }

 private:
  std::string dir_;
  int http_port_, tcp_port_;
  std::unique_ptr<launch::Process> process_;
};

// A test with a ClickHouse server of its own, started before it (skipped where none is installed).
class ClickHouseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ClickHouseInstalled())
      GTEST_SKIP() << "clickhouse-server is not installed (scripts/setup.sh installs it)";
    server_ = std::make_unique<ClickHouseServer>(dir_.path() + "/ch");
    ASSERT_TRUE(server_->Start());
  }
  TempDir dir_;
  std::unique_ptr<ClickHouseServer> server_;
};

}  // namespace megascope::testing
