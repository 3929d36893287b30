// A metrics CSV read in time order whatever the order of its rows, in bounded memory. Exporters
// dump series by series (`promtool tsdb dump`, remote-read exports): a file in that order holds
// every series' whole history before the next, which a stream with a lateness bound cannot align.
// Runs of `run_rows` rows are sorted by time and spilled to unlinked temporary files, then merged
// (an external merge sort): memory is about run_rows x 24 bytes, whatever the file's size.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megascope/detector/samples.h"
#include "megascope/tracer/status.h"

namespace megascope::detector {

class TimeOrderedReader {
 public:
  struct Options {
    size_t run_rows = size_t{1} << 21;  // rows sorted in memory at once (~48 MiB)
    std::string tmp_dir;                // spill files' folder ($TMPDIR or /tmp when empty)
    // Called now and then while the file is read (bytes read, file size).
    std::function<void(int64_t, int64_t)> progress;
  };
  // Reads the whole file (sorting and spilling as it goes); errors name the file and line.
  static Result<std::unique_ptr<TimeOrderedReader>> Open(const std::string& path,
                                                         const Options& options);
  ~TimeOrderedReader();
  TimeOrderedReader(const TimeOrderedReader&) = delete;
  TimeOrderedReader& operator=(const TimeOrderedReader&) = delete;
  // The next sample in time order (rows of equal time in file order); false at the end. Check
  // status() after false (a spill file that cannot be read back).
  bool Next(Sample* s);
  const Status& status() const { return status_; }
  int64_t rows() const { return rows_; }                       // rows in the file
  int64_t rows_returned() const { return next_; }              // rows Next has given
  int runs() const { return static_cast<int>(runs_.size()); }  // spilled runs (0: all in memory)

  TimeOrderedReader() = default;

  // One row as it is sorted and spilled (names interned).
  struct Row {
    double time_s, value;
    int32_t machine, metric;
  };

 private:
  struct Run {
    std::FILE* f = nullptr;
    std::vector<Row> buf;
    size_t at = 0;
    bool Fill();
  };
  Status Spill(std::vector<Row>* rows, const std::string& tmp_dir);
  bool Head(size_t run, Row* out);

  std::vector<std::string> machines_, metrics_;
  std::vector<Row> memory_;  // the only run, when the file fit in one
  size_t memory_at_ = 0;
  std::vector<Run> runs_;
  std::vector<std::pair<Row, size_t>> heap_;  // (row, run): the merge's front
  int64_t rows_ = 0, next_ = 0;
  Status status_;
};

}  // namespace megascope::detector
