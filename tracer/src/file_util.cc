#include "megascope/tracer/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

namespace megascope::tracer {

Result<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return err == ENOENT ? NotFound(path + " does not exist")
                         : ErrnoError("cannot open " + path, err);
  }
  // Read in place, sized by fstat (a file that grows meanwhile is read to its end): no buffer on
  // the stack, which is small on the agent's HTTP threads.
  struct stat st {};
  std::string out(::fstat(fd, &st) == 0 && st.st_size > 0 ? static_cast<size_t>(st.st_size) + 1 : 0,
                  '\0');  // + 1: room to see the end without growing
  size_t have = 0;
  for (;;) {
    if (have == out.size()) out.resize(std::max<size_t>(4096, out.size() * 2));
    const ssize_t n = ::read(fd, out.data() + have, out.size() - have);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoError("cannot read " + path, err);
    }
    have += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(have);
  return out;
}

Status WriteFileAtomic(const std::string& path, std::string_view text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(path);
  if (p.has_parent_path()) {
    fs::create_directories(p.parent_path(), ec);
    if (ec)
      return IoError("cannot create directory " + p.parent_path().string() + ": " + ec.message());
  }
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot write " + tmp, errno);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoError("cannot write " + tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("cannot flush " + tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("cannot rename " + tmp + " to " + path, err);
  }
  return Status::Ok();
}

Result<std::string> ReadToken(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) {
    return PermissionDenied("cannot read the token " + path + ": " + text.status().message());
  }
  const size_t begin = text->find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return PermissionDenied("the token file " + path + " is empty");
  return text->substr(begin, text->find_first_of(" \t\r\n", begin) - begin);
}

}  // namespace megascope::tracer
