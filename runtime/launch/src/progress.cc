#include "megascope/launch/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <string>

namespace megascope::launch {

std::vector<nlohmann::json> ProgressReader::Poll() {
  std::vector<nlohmann::json> out;
  if (!in_.is_open()) in_.open(path_);
  if (!in_.is_open()) return out;
  in_.clear();
  for (std::string line; std::getline(in_, line);) {
    if (in_.eof()) {  // no newline yet: still being written
      partial_ += line;
      break;
    }
    line = partial_ + line;
    partial_.clear();
    if (line.empty()) continue;  // a writer's fresh start after a torn fragment
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const std::exception&) {
      ++damaged_;
    }
  }
  return out;
}

void ProgressReader::SkipExisting() {
  if (!in_.is_open()) in_.open(path_);
  if (!in_.is_open()) return;
  in_.seekg(0, std::ios::end);
  partial_.clear();
}

Status AppendProgress(const std::string& path, const nlohmann::json& line) {
  // Per process: whether this writer's last line was cut short (its fragment has no newline).
  static std::atomic<bool> torn{false};
  const std::string text = (torn.load() ? "\n" : "") + line.dump() + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot append to " + path, errno);
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n == static_cast<ssize_t>(text.size())) {
    torn.store(false);
    return Status::Ok();
  }
  if (n > 0) torn.store(true);
  return n < 0 ? ErrnoError("cannot append to " + path, err)
               : IoError("a line of " + path + " was cut short (" + std::to_string(n) + " of " +
                         std::to_string(text.size()) + " bytes written): disk full?");
}

std::string FormatStepLine(const nlohmann::json& j, long long steps) {
  char buf[256];
  std::snprintf(
      buf, sizeof(buf),
      "step %4lld/%lld | loss %.4f | %8.0f tokens/s | step %.3f s | lr %.2e | grad norm %.3f",
      j.value("step", 0LL), steps, j.value("loss", 0.0), j.value("tokens_per_s", 0.0),
      j.value("step_time_s", 0.0), j.value("lr", 0.0), j.value("grad_norm", 0.0));
  return buf;
}

}  // namespace megascope::launch
