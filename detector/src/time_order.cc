#include "megascope/detector/time_order.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>

namespace megascope::detector {

namespace {

// Orders the merge's front: earliest first, then the earlier run (rows of one time keep file
// order across runs as within one).
bool Later(const std::pair<TimeOrderedReader::Row, size_t>& a,
           const std::pair<TimeOrderedReader::Row, size_t>& b) {
  if (a.first.time_s != b.first.time_s) return a.first.time_s > b.first.time_s;
  return a.second > b.second;
}

}  // namespace

TimeOrderedReader::~TimeOrderedReader() {
  for (Run& r : runs_) {
    if (r.f != nullptr) std::fclose(r.f);
  }
}

Status TimeOrderedReader::Spill(std::vector<Row>* rows, const std::string& tmp_dir) {
  std::stable_sort(rows->begin(), rows->end(),
                   [](const Row& a, const Row& b) { return a.time_s < b.time_s; });
  std::string dir = tmp_dir;
  if (dir.empty()) {
    const char* env = std::getenv("TMPDIR");
    dir = env != nullptr && *env != '\0' ? env : "/tmp";
  }
  std::string path = dir + "/megascope-detect-sort-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0)
    return IoError("cannot create a spill file in " + dir + " to sort the metrics by time");
  unlink(path.c_str());  // gone with the process, whatever happens
  Run run;
  run.f = fdopen(fd, "w+b");
  if (run.f == nullptr) {
    close(fd);
    return IoError("cannot open a spill file in " + dir);
  }
  runs_.push_back(std::move(run));
  if (std::fwrite(rows->data(), sizeof(Row), rows->size(), runs_.back().f) != rows->size() ||
      std::fflush(runs_.back().f) != 0) {
    return IoError("cannot write a spill file in " + dir + " (disk full?) to sort the metrics");
  }
  std::rewind(runs_.back().f);
  rows->clear();
  return Status::Ok();
}

bool TimeOrderedReader::Run::Fill() {
  buf.resize(4096);
  const size_t n = std::fread(buf.data(), sizeof(Row), buf.size(), f);
  buf.resize(n);
  at = 0;
  return n > 0;
}

bool TimeOrderedReader::Head(size_t run, Row* out) {
  Run& r = runs_[run];
  if (r.at >= r.buf.size() && !r.Fill()) {
    if (std::ferror(r.f)) status_ = IoError("cannot read back a spill file of the time sort");
    return false;
  }
  *out = r.buf[r.at++];
  return true;
}

Result<std::unique_ptr<TimeOrderedReader>> TimeOrderedReader::Open(const std::string& path,
                                                                   const Options& options) {
  ASSIGN_OR_RETURN(auto csv, MetricsCsvReader::Open(path));
  auto r = std::make_unique<TimeOrderedReader>();
  std::unordered_map<std::string, int32_t> machine_ids, metric_ids;
  auto intern = [](std::unordered_map<std::string, int32_t>& ids, std::vector<std::string>& names,
                   const std::string& name) {
    auto [it, added] = ids.try_emplace(name, static_cast<int32_t>(names.size()));
    if (added) names.push_back(name);
    return it->second;
  };
  const size_t run_rows = std::max<size_t>(1, options.run_rows);
  std::vector<Row> rows;
  rows.reserve(std::min<size_t>(run_rows, size_t{1} << 16));
  Sample s;
  while (csv->Next(&s)) {
    rows.push_back({s.time_s, s.value, intern(machine_ids, r->machines_, s.machine),
                    intern(metric_ids, r->metrics_, s.metric)});
    ++r->rows_;
    if (rows.size() >= run_rows) RETURN_IF_ERROR(r->Spill(&rows, options.tmp_dir));
    if (options.progress && (r->rows_ & 0xfffff) == 0)
      options.progress(csv->bytes_read(), csv->file_size());
  }
  RETURN_IF_ERROR(csv->status());
  if (r->runs_.empty()) {
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& a, const Row& b) { return a.time_s < b.time_s; });
    r->memory_ = std::move(rows);
    return r;
  }
  if (!rows.empty()) RETURN_IF_ERROR(r->Spill(&rows, options.tmp_dir));
  for (size_t i = 0; i < r->runs_.size(); ++i) {
    Row head;
    if (r->Head(i, &head)) r->heap_.emplace_back(head, i);
  }
  RETURN_IF_ERROR(r->status_);
  std::make_heap(r->heap_.begin(), r->heap_.end(), Later);
  return r;
}

bool TimeOrderedReader::Next(Sample* s) {
  Row row;
  if (runs_.empty()) {
    if (memory_at_ >= memory_.size()) return false;
    row = memory_[memory_at_++];
  } else {
    if (heap_.empty() || !status_.ok()) return false;
    std::pop_heap(heap_.begin(), heap_.end(), Later);
    row = heap_.back().first;
    const size_t run = heap_.back().second;
    heap_.pop_back();
    Row head;
    if (Head(run, &head)) {
      heap_.emplace_back(head, run);
      std::push_heap(heap_.begin(), heap_.end(), Later);
    } else if (!status_.ok()) {
      return false;
    }
  }
  s->time_s = row.time_s;
  s->value = row.value;
  s->machine = machines_[static_cast<size_t>(row.machine)];
  s->metric = metrics_[static_cast<size_t>(row.metric)];
  ++next_;
  return true;
}

}  // namespace megascope::detector
