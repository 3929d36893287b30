#include "megascope/detector/samples.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "megascope/tracer/format.h"

namespace megascope::detector {
namespace {

// Fields of one CSV line (RFC 4180: a field may be quoted, with "" for a quote inside, so a series
// name with labels -- DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="..."} -- keeps its commas). Quoted fields
// come back with their quotes; Unquote takes them off.
std::vector<std::string_view> SplitCsv(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  bool quoted = false;
  for (size_t i = 0; i <= line.size(); ++i) {
    if (i < line.size() && line[i] == '"') quoted = !quoted;
    if (i == line.size() || (line[i] == ',' && !quoted)) {
      out.push_back(line.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

std::string Unquote(std::string_view field) {
  if (field.size() < 2 || field.front() != '"' || field.back() != '"') return std::string(field);
  std::string out;
  for (size_t i = 1; i + 1 < field.size(); ++i) {
    out += field[i];
    if (field[i] == '"' && i + 2 < field.size() && field[i + 1] == '"') ++i;
  }
  return out;
}

// A field as RFC 4180 writes it: quoted when it holds a comma or a quote.
void AppendCsvField(std::string_view field, std::string* out) {
  if (field.find_first_of(",\"") == std::string_view::npos) {
    *out += field;
    return;
  }
  *out += '"';
  for (char c : field) {
    if (c == '"') *out += '"';
    *out += c;
  }
  *out += '"';
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  return s;
}

bool ParseDouble(std::string_view s, double* out) {
  s = Trim(s);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

// Reads a small CSV with the given header, calling `row` for each data line.
Status ReadSmallCsv(const std::string& path, const std::vector<std::string>& header,
                    const std::function<Status(const std::vector<std::string_view>&)>& row) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open " + path);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::string_view l = Trim(line);
    if (l.empty()) continue;
    auto fields = SplitCsv(l);
    if (n == 1) {
      bool ok = fields.size() == header.size();
      for (size_t i = 0; ok && i < header.size(); ++i) ok = Trim(fields[i]) == header[i];
      if (!ok) {
        std::string want;
        for (const auto& h : header) want += (want.empty() ? "" : ",") + h;
        return InvalidArgument(path + ":1: header should be '" + want + "', found '" +
                               std::string(l) + "'");
      }
      continue;
    }
    if (fields.size() != header.size()) {
      return InvalidArgument(path + ":" + std::to_string(n) + ": expected " +
                             std::to_string(header.size()) + " fields, found " +
                             std::to_string(fields.size()));
    }
    Status st = row(fields);
    if (!st.ok()) return InvalidArgument(path + ":" + std::to_string(n) + ": " + st.message());
  }
  if (n == 0) return InvalidArgument(path + " is empty (a header line is required)");
  return Status::Ok();
}

}  // namespace

Status ParseMetricsLine(std::string_view line, Sample* s) {
  auto f = SplitCsv(Trim(line));
  if (f.size() != 4)
    return InvalidArgument("expected 4 fields (timestamp_s,machine,metric,value), found " +
                           std::to_string(f.size()));
  if (!ParseDouble(f[0], &s->time_s))
    return InvalidArgument("timestamp_s '" + std::string(f[0]) + "' is not a number");
  // Seconds since the epoch or since the run's start: never negative, and 1e11 s is the year
  // 5138 (epoch milliseconds, the usual mistake, are 1.7e12).
  if (s->time_s < 0)
    return InvalidArgument("timestamp_s " + std::string(Trim(f[0])) +
                           " is negative (seconds since the epoch or since the run's start)");
  if (s->time_s > 1e11)
    return InvalidArgument("timestamp_s " + std::string(Trim(f[0])) +
                           " is past the year 5000 (milliseconds? timestamp_s is in seconds)");
  if (Trim(f[1]).empty()) return InvalidArgument("empty machine");
  if (Trim(f[2]).empty()) return InvalidArgument("empty metric");
  s->machine = Unquote(Trim(f[1]));
  s->metric = Unquote(Trim(f[2]));
  if (!ParseDouble(f[3], &s->value))
    return InvalidArgument("value '" + std::string(f[3]) + "' is not a number");
  return Status::Ok();
}

Result<std::unique_ptr<MetricsCsvReader>> MetricsCsvReader::Open(const std::string& path) {
  auto r = std::make_unique<MetricsCsvReader>();
  r->path_ = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgument(path + " is a directory, not a metrics CSV " +
                           "(timestamp_s,machine,metric,value): name the file");
  }
  r->in_.open(path);
  if (!r->in_) return NotFound("cannot open metrics file " + path);
  r->size_ = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (!std::getline(r->in_, r->buf_))
    return InvalidArgument(path + " is empty (a header line is required)");
  r->line_ = 1;
  r->bytes_ = static_cast<int64_t>(r->buf_.size()) + 1;
  auto h = SplitCsv(Trim(r->buf_));
  if (h.size() != 4 || Trim(h[0]) != "timestamp_s" || Trim(h[1]) != "machine" ||
      Trim(h[2]) != "metric" || Trim(h[3]) != "value") {
    return InvalidArgument(path +
                           ":1: header should be 'timestamp_s,machine,metric,value', found '" +
                           std::string(Trim(r->buf_)) + "'");
  }
  return r;
}

bool MetricsCsvReader::Next(Sample* s) {
  while (std::getline(in_, buf_)) {
    ++line_;
    bytes_ += static_cast<int64_t>(buf_.size()) + 1;
    if (Trim(buf_).empty()) continue;
    Status st = ParseMetricsLine(buf_, s);
    if (!st.ok()) {
      status_ = InvalidArgument(path_ + ":" + std::to_string(line_) + ": " + st.message());
      return false;
    }
    return true;
  }
  if (in_.bad())
    status_ = IoError("read error in " + path_ + " after line " + std::to_string(line_));
  return false;
}

Result<std::vector<Label>> ReadLabelsCsv(const std::string& path) {
  std::vector<Label> labels;
  Status st = ReadSmallCsv(
      path, {"machine", "fault_start_s", "fault_end_s", "fault_type"},
      [&](const std::vector<std::string_view>& f) -> Status {
        Label l;
        l.machine = Trim(f[0]);
        if (!ParseDouble(f[1], &l.fault_start_s) || !ParseDouble(f[2], &l.fault_end_s)) {
          return InvalidArgument("fault_start_s and fault_end_s must be numbers");
        }
        if (l.fault_end_s < l.fault_start_s) return InvalidArgument("fault ends before it starts");
        l.fault_type = Trim(f[3]);
        labels.push_back(std::move(l));
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return labels;
}

Result<std::vector<std::pair<std::string, std::string>>> ReadGroupsCsv(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> groups;
  Status st = ReadSmallCsv(path, {"machine", "group"},
                           [&](const std::vector<std::string_view>& f) -> Status {
                             if (Trim(f[0]).empty() || Trim(f[1]).empty())
                               return InvalidArgument("empty machine or group");
                             groups.emplace_back(Trim(f[0]), Trim(f[1]));
                             return Status::Ok();
                           });
  if (!st.ok()) return st;
  return groups;
}

Result<std::unique_ptr<MetricsCsvWriter>> MetricsCsvWriter::Open(const std::string& path,
                                                                 int time_decimals,
                                                                 int value_digits) {
  auto w = std::unique_ptr<MetricsCsvWriter>(new MetricsCsvWriter());
  w->path_ = path;
  w->time_decimals_ = time_decimals;
  w->value_digits_ = value_digits;
  w->f_ = std::fopen(path.c_str(), "w");
  if (w->f_ == nullptr) return ErrnoError("cannot write " + path, errno);
  w->buf_.reserve(1 << 20);
  w->buf_ = "timestamp_s,machine,metric,value\n";
  return w;
}

MetricsCsvWriter::~MetricsCsvWriter() {
  if (f_ != nullptr) (void)Close();
}

void MetricsCsvWriter::Row(double t, std::string_view machine, std::string_view metric, double v) {
  char tmp[64];
  auto p = std::to_chars(tmp, tmp + sizeof(tmp), t, std::chars_format::fixed, time_decimals_).ptr;
  buf_.append(tmp, p);
  buf_ += ',';
  AppendCsvField(machine, &buf_);
  buf_ += ',';
  AppendCsvField(metric, &buf_);
  buf_ += ',';
  p = std::to_chars(tmp, tmp + sizeof(tmp), v, std::chars_format::general, value_digits_).ptr;
  buf_.append(tmp, p);
  buf_ += '\n';
  ++rows_;
  if (buf_.size() > (1 << 20) - 256) Flush();
}

void MetricsCsvWriter::Flush() {
  if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) failed_ = true;
  buf_.clear();
}

Status MetricsCsvWriter::Close() {
  if (f_ == nullptr) return FailedPrecondition(path_ + " is already closed");
  Flush();
  failed_ |= std::fclose(f_) != 0;
  f_ = nullptr;
  return failed_ ? IoError("write error on " + path_ + " (disk full?)") : Status::Ok();
}

namespace {

Status WriteSmallCsv(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return ErrnoError("cannot write " + path, errno);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return IoError("write error on " + path + " (disk full?)");
  return Status::Ok();
}

}  // namespace

Status WriteLabelsCsv(const std::string& path, const std::vector<Label>& labels) {
  std::string text = "machine,fault_start_s,fault_end_s,fault_type\n";
  std::string line;
  for (const Label& l : labels) {
    line = tracer::Format("%s,%.1f,%.1f,%s\n", l.machine.c_str(), l.fault_start_s, l.fault_end_s,
                          l.fault_type.c_str());
    text += line;
  }
  return WriteSmallCsv(path, text);
}

Status WriteGroupsCsv(const std::string& path,
                      const std::vector<std::pair<std::string, std::string>>& groups) {
  std::string text = "machine,group\n";
  for (const auto& [machine, group] : groups) text += machine + "," + group + "\n";
  return WriteSmallCsv(path, text);
}

Result<std::vector<std::pair<std::string, std::string>>> ReadTopologyCsv(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> rows;
  Status st = ReadSmallCsv(path, {"machine", "component"},
                           [&](const std::vector<std::string_view>& f) -> Status {
                             const std::string_view machine = Trim(f[0]), comp = Trim(f[1]);
                             const size_t colon = comp.find(':');
                             if (machine.empty() || colon == 0 || colon == std::string_view::npos ||
                                 colon + 1 == comp.size())
                               return InvalidArgument(
                                   "want machine,kind:name (e.g. node7,rack:r03)"
                                   ", got '" +
                                   std::string(machine) + "," + std::string(comp) + "'");
                             rows.emplace_back(machine, comp);
                             return Status::Ok();
                           });
  if (!st.ok()) return st;
  return rows;
}

Status WriteTopologyCsv(const std::string& path,
                        const std::vector<std::pair<std::string, std::vector<std::string>>>& t) {
  std::string text = "machine,component\n";
  for (const auto& [machine, components] : t) {
    for (const std::string& c : components) text += machine + "," + c + "\n";
  }
  return WriteSmallCsv(path, text);
}

}  // namespace megascope::detector
