// A TCP proxy on loopback in front of a real server, with a gate: while the gate is shut, what a
// client sends is held in the proxy (the server answers as late as the test wants: a store slower
// than its writers, with nothing mocked on either side). It notes the largest request it passed on
// (the bytes a client sent before the server's next answer: HTTP/1.1 does not pipeline).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "clickhouse_server.h"

namespace megascope::testing {

class GateProxy {
 public:
  explicit GateProxy(int upstream_port) : upstream_(upstream_port), port_(ListenPort()) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a = Loopback(port_);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listen_fd_, 16) != 0)
      ADD_FAILURE() << "gate proxy: cannot listen on 127.0.0.1:" << port_;
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~GateProxy() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      open_ = true;
    }
    changed_.notify_all();
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    for (std::thread& t : pumps_) t.join();
    ::close(listen_fd_);
  }
  GateProxy(const GateProxy&) = delete;
  GateProxy& operator=(const GateProxy&) = delete;

  int port() const { return port_; }

  void Shut() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = false;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> l(mu_);
      open_ = true;
    }
    changed_.notify_all();
  }
  // Waits (at most `timeout`) until a client's bytes are held at the shut gate.
  bool WaitHeld(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return changed_.wait_for(l, timeout, [&] { return held_ > 0; });
  }
  bool Holding() {
    std::lock_guard<std::mutex> l(mu_);
    return held_ > 0;
  }
  size_t LargestRequest() {
    std::lock_guard<std::mutex> l(mu_);
    return largest_;
  }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }

  void Accept() {
    for (;;) {
      const int client = ::accept(listen_fd_, nullptr, nullptr);
      if (client < 0) return;  // shut down
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) {
        ::close(client);
        return;
      }
      pumps_.emplace_back([this, client] { Pump(client); });
    }
  }

  // One connection: the client's bytes go up once the gate is open, the server's come back.
  void Pump(int client) {
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = Loopback(upstream_);
    if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(server);
      ::close(client);
      return;
    }
    size_t request = 0;  // bytes sent up since the server last answered
    std::vector<char> buf(1 << 16);
    for (;;) {
      pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(fds, 2, 200) < 0) break;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stop_) break;
      }
      if (fds[0].revents != 0) {
        const ssize_t n = ::read(client, buf.data(), buf.size());
        if (n <= 0) break;
        {
          std::unique_lock<std::mutex> l(mu_);
          ++held_;
          changed_.notify_all();
          changed_.wait(l, [&] { return open_; });
          --held_;
        }
        if (!SendAll(server, buf.data(), static_cast<size_t>(n))) break;
        request += static_cast<size_t>(n);
      }
      if (fds[1].revents != 0) {
        const ssize_t n = ::read(server, buf.data(), buf.size());
        if (n <= 0) break;
        {
          std::lock_guard<std::mutex> l(mu_);
          largest_ = std::max(largest_, request);
        }
        request = 0;
        if (!SendAll(client, buf.data(), static_cast<size_t>(n))) break;
      }
    }
    ::close(server);
    ::close(client);
  }

  static bool SendAll(int fd, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  int upstream_;
  int port_;
  int listen_fd_ = -1;
  std::thread acceptor_;
  std::vector<std::thread> pumps_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = true;
  bool stop_ = false;
  int held_ = 0;
  size_t largest_ = 0;
};

}  // namespace megascope::testing
