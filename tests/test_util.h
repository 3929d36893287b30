// Helpers shared by tests: a temporary directory removed at scope exit.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace megascope::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& base = "/tmp") {
    std::string tmpl = base + "/megascope-test-XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace megascope::testing
