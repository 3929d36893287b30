#include "proc_fault.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "megascope/tracer/dump.h"
#include "megascope/tracer/file_util.h"

namespace megascope::controller {
namespace {

namespace fs = std::filesystem;

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// /proc/net/dev with `errors` added to the receive errors of the first interface but lo (a
// "megascope0" line when there is none).
std::string NetDevWithErrors(const std::string& real, uint64_t errors) {
  std::istringstream in(real);
  std::string out, line;
  bool added = errors == 0;
  for (int n = 0; std::getline(in, line); ++n) {
    const auto colon = line.find(':');
    std::string iface = colon == std::string::npos ? "" : line.substr(0, colon);
    iface.erase(0, iface.find_first_not_of(' '));
    if (n < 2 || colon == std::string::npos || iface == "lo" || added) {
      out += line + "\n";
      continue;
    }
    std::istringstream f(line.substr(colon + 1));
    std::vector<uint64_t> x;
    for (uint64_t v; f >> v;) x.push_back(v);
    if (x.size() < 16) x.resize(16, 0);
    x[2] += errors;
    out += line.substr(0, colon + 1);
    for (uint64_t v : x) out += " " + std::to_string(v);
    out += "\n";
    added = true;
  }
  if (!added) {
    out += "megascope0: 0 0 " + std::to_string(errors) + " 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
  }
  return out;
}

// /proc/meminfo with MemAvailable lowered by `share` of MemTotal.
std::string MeminfoWithLess(const std::string& real, double share) {
  std::istringstream in(real);
  std::string out, line;
  uint64_t total = 0;
  std::vector<std::string> lines;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) == 0) total = std::stoull(line.substr(9));
    lines.push_back(line);
  }
  for (const std::string& l : lines) {
    if (l.rfind("MemAvailable:", 0) == 0) {
      const uint64_t avail = std::stoull(l.substr(13));
      const uint64_t less = static_cast<uint64_t>(share * static_cast<double>(total));
      out += "MemAvailable:   " + std::to_string(avail > less ? avail - less : 0) + " kB\n";
    } else {
      out += l + "\n";
    }
  }
  return out;
}

}  // namespace

ProcFault::ProcFault(std::string dir, std::string what, double seconds, std::string real_proc)
    : dir_(std::move(dir)),
      what_(std::move(what)),
      real_(std::move(real_proc)),
      seconds_(seconds) {}

ProcFault::~ProcFault() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Status ProcFault::Start() {
  std::error_code ec;
  fs::create_directories(dir_ + "/net", ec);
  if (ec) return IoError("cannot create " + dir_ + "/net: " + ec.message());
  for (const char* f : {"stat", "diskstats"}) {  // never faulty: the machine's own
    fs::remove(dir_ + "/" + f, ec);
    fs::create_symlink(real_ + "/" + f, dir_ + "/" + f, ec);
    if (ec) return IoError("cannot link " + dir_ + "/" + f + ": " + ec.message());
  }
  RETURN_IF_ERROR(Refresh());
  thread_ = std::thread([this] {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      (void)Refresh();  // a failed write leaves the previous file; the next try follows
    }
  });
  return Status::Ok();
}

void ProcFault::Fire() {
  int64_t expected = 0;
  fired_ns_.compare_exchange_strong(expected, SteadyNs());
}

Status ProcFault::Refresh() {
  const int64_t fired = fired_ns_.load();
  const double since = fired == 0 ? -1 : static_cast<double>(SteadyNs() - fired) / 1e9;
  const bool on = since >= 0 && (seconds_ <= 0 || since < seconds_);
  // Errors already counted stay counted (a counter never goes back) after the fault ends.
  const double errors_s = since < 0 ? 0 : (seconds_ > 0 ? std::min(since, seconds_) : since);
  const uint64_t errors = what_ == "nic-errors" ? static_cast<uint64_t>(200 * errors_s) : 0;
  RETURN_IF_ERROR(tracer::WriteFileAtomic(
      dir_ + "/net/dev",
      NetDevWithErrors(tracer::ReadFile(real_ + "/net/dev").value_or(""), errors)));
  const std::string meminfo = tracer::ReadFile(real_ + "/meminfo").value_or("");
  return tracer::WriteFileAtomic(dir_ + "/meminfo",
                                 on && what_ == "memory" ? MeminfoWithLess(meminfo, 0.4) : meminfo);
}

}  // namespace megascope::controller
