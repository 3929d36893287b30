#include "megascope/launch/link_seam.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "megascope/tracer/clock.h"
#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"
#include "megascope/tracer/format.h"

namespace megascope::launch {

Status WriteLinkFault(const std::string& path, const LinkFault& f) {
  if (f.rate_mbps <= 0) return tracer::WriteFileAtomic(path, "");
  std::string line = tracer::Format("rate_mbps=%.6g until_ns=%lld\n", f.rate_mbps,
                                    static_cast<long long>(f.until_ns));
  return tracer::WriteFileAtomic(path, line);
}

Result<LinkFault> ParseLinkFault(const std::string& text) {
  LinkFault f;
  std::istringstream in(text);
  for (std::string kv; in >> kv;) {
    const auto eq = kv.find('=');
    const std::string key = kv.substr(0, eq),
                      value = eq == std::string::npos ? "" : kv.substr(eq + 1);
    char* end = nullptr;
    if (key == "rate_mbps") {
      f.rate_mbps = std::strtod(value.c_str(), &end);
    } else if (key == "until_ns") {
      f.until_ns = std::strtoll(value.c_str(), &end, 10);
    } else {
      return InvalidArgument("link fault: unknown field '" + key + "' (rate_mbps, until_ns)");
    }
    if (value.empty() || *end != '\0')
      return InvalidArgument("link fault: " + key + "='" + value + "' is not a number");
  }
  if (f.rate_mbps < 0) return InvalidArgument("link fault: rate_mbps must be >= 0");
  return f;
}

LinkSeam::LinkSeam() {
  if (const char* p = std::getenv(kLinkSeamEnv); p != nullptr) path_ = p;
}

std::chrono::nanoseconds LinkSeam::DelayFor(size_t bytes) {
  if (path_.empty()) return std::chrono::nanoseconds(0);
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_read_) {
    next_read_ = now + std::chrono::milliseconds(200);
    auto f = ParseLinkFault(tracer::ReadFile(path_).value_or(""));
    if (!f.ok() && !warned_) {
      std::fprintf(stderr, "[link seam] %s: %s; the link stays healthy\n", path_.c_str(),
                   f.status().ToString().c_str());
      warned_ = true;
    }
    fault_ = f.ok() ? *f : LinkFault{};
  }
  if (fault_.rate_mbps <= 0 || (fault_.until_ns > 0 && tracer::WallNowNs() >= fault_.until_ns))
    return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(
      static_cast<int64_t>(static_cast<double>(bytes) / (fault_.rate_mbps * 1e6) * 1e9));
}

void LinkSeam::Hold(size_t bytes) {
  const auto d = DelayFor(bytes);
  if (d.count() > 0) std::this_thread::sleep_for(d);
}

}  // namespace megascope::launch
