#include "megascope/launch/progress.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "megascope/tracer/format.h"

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
  std::string text = line.dump() + "\n";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot append to " + path, errno);
  struct stat st {};
  char last = '\n';
  // A fragment any writer left (a line cut short by a full disk, a process killed mid-write; this
  // one or an earlier attempt's) is ended first, so it costs one damaged line and not this one.
  if (::fstat(fd, &st) == 0 && st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) == 1 &&
      last != '\n')
    text.insert(0, "\n");
  // Room first (blocks past the end, the size unchanged): on a full disk the line is refused whole
  // instead of cut short. Filesystems without fallocate just write.
  if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, st.st_size, static_cast<off_t>(text.size())) != 0 &&
      errno == ENOSPC) {
    ::close(fd);
    return ErrnoError("cannot append to " + path, ENOSPC);
  }
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n == static_cast<ssize_t>(text.size())) return Status::Ok();
  return n < 0 ? ErrnoError("cannot append to " + path, err)
               : IoError("a line of " + path + " was cut short (" + std::to_string(n) + " of " +
                         std::to_string(text.size()) + " bytes written): disk full?");
}

Status ProgressWriter::Append(const nlohmann::json& line) {
  pending_.push_back(line);
  if (pending_.size() > max_pending_) {
    pending_.pop_front();
    ++dropped_;
  }
  while (!pending_.empty()) {
    RETURN_IF_ERROR(append_(path_, pending_.front()));
    pending_.pop_front();
  }
  return Status::Ok();
}

std::string FormatStepLine(const nlohmann::json& j, long long steps) {
  return tracer::Format(
      "step %4lld/%lld | loss %.4f | %8.0f tokens/s | step %.3f s | lr %.2e | grad norm %.3f",
      j.value("step", 0LL), steps, j.value("loss", 0.0), j.value("tokens_per_s", 0.0),
      j.value("step_time_s", 0.0), j.value("lr", 0.0), j.value("grad_norm", 0.0));
}

}  // namespace megascope::launch
