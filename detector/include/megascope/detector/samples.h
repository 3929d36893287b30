// Metric samples and the CSV files of docs/formats.md section 3: the long-format metrics CSV
// (timestamp_s,machine,metric,value), the labels CSV (ground truth) and the peer-groups CSV
// (machine,group), read and written here. The metrics reader streams (it never holds the whole
// file); the writer buffers (a fleet simulation writes tens of millions of rows).
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megascope/tracer/status.h"

namespace megascope::detector {

struct Sample {
  double time_s = 0;  // seconds (since the epoch or since the run's start)
  std::string machine;
  std::string metric;
  double value = 0;
};

struct Label {
  std::string machine;
  double fault_start_s = 0;
  double fault_end_s = 0;
  std::string fault_type;
};

// Streams a metrics CSV. Errors name the file and line.
class MetricsCsvReader {
 public:
  static Result<std::unique_ptr<MetricsCsvReader>> Open(const std::string& path);
  // Reads the next sample; false at end of file. Check status() after false.
  bool Next(Sample* s);
  const Status& status() const { return status_; }
  int64_t line() const { return line_; }
  int64_t bytes_read() const { return bytes_; }
  int64_t file_size() const { return size_; }

 private:
  std::string path_;
  std::ifstream in_;
  std::string buf_;
  int64_t line_ = 0, bytes_ = 0, size_ = 0;
  Status status_;
};

// Writes a metrics CSV: the header, then one row per Row(). Times with `time_decimals` decimals,
// values with `value_digits` significant digits. Close() reports any write error (full disk).
class MetricsCsvWriter {
 public:
  static Result<std::unique_ptr<MetricsCsvWriter>> Open(const std::string& path,
                                                        int time_decimals = 3,
                                                        int value_digits = 12);
  ~MetricsCsvWriter();
  void Row(double time_s, std::string_view machine, std::string_view metric, double value);
  Status Close();
  int64_t rows() const { return rows_; }

 private:
  void Flush();
  std::string path_;
  std::FILE* f_ = nullptr;
  std::string buf_;
  int time_decimals_ = 3, value_digits_ = 12;
  int64_t rows_ = 0;
  bool failed_ = false;
};

Result<std::vector<Label>> ReadLabelsCsv(const std::string& path);
Status WriteLabelsCsv(const std::string& path, const std::vector<Label>& labels);
// machine -> group name.
Result<std::vector<std::pair<std::string, std::string>>> ReadGroupsCsv(const std::string& path);
Status WriteGroupsCsv(const std::string& path,
                      const std::vector<std::pair<std::string, std::string>>& groups);

// The topology (docs/formats.md section 3): one row per machine and shared component, spelled
// kind:name ("node7,rack:r03"); a machine may have several (its rack, switch, PDU).
Result<std::vector<std::pair<std::string, std::string>>> ReadTopologyCsv(const std::string& path);
Status WriteTopologyCsv(
    const std::string& path,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& topology);

// Parses one "timestamp_s,machine,metric,value" line (exposed for tests).
Status ParseMetricsLine(std::string_view line, Sample* s);

}  // namespace megascope::detector
