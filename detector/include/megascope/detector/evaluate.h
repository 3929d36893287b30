// Scoring of faulty-machine verdicts against labels, exactly as docs/formats.md section 3 defines
// it (only verdicts of kind faulty_machine at level faulty count; suspects and alerts are tallied
// apart): a verdict is a true positive when its machine is labelled faulty and it was raised inside
// that fault's [start, end]; later verdicts on an already detected fault are duplicates (neither
// way); every other verdict is a false positive. Delay = detected_at - fault_start.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "megascope/detector/samples.h"
#include "megascope/tracer/verdict.h"

namespace megascope::detector {

struct Score {
  int true_positives = 0, false_positives = 0, duplicates = 0;
  int faults = 0, detected = 0;
  std::vector<double> delays_s;
  double precision() const;
  double recall() const;
  double f1() const;
  double median_delay_s() const;
  double p90_delay_s() const;
};

struct Evaluation {
  Score total;
  std::map<std::string, Score> by_type;  // recall and delays per fault type (no false positives)
  // Verdicts that are not counted above: suspects (faulty_machine at level suspect: true when on a
  // labelled fault, false otherwise) and alerts that blame no machine (monitoring_gap,
  // shared_component).
  int suspects_true = 0, suspects_false = 0, alerts = 0;
  // Each counted verdict's confidence and whether it was true (duplicates left out): the
  // calibration table of FormatEvaluation.
  std::vector<std::pair<double, bool>> calibration;
};

Evaluation Evaluate(const std::vector<Verdict>& verdicts, const std::vector<Label>& labels);
// Of (confidence, true) pairs: per confidence band how many verdicts and how many true.
std::string FormatCalibration(const std::vector<std::pair<double, bool>>& scored);
// A readable multi-line report.
std::string FormatEvaluation(const Evaluation& e);
// The same as one line of JSON ("megascope-detector-score", version 1): precision, recall, f1,
// true and false positives, faults, median and p90 delay (null where undefined), and per fault
// type its faults, detections and median delay.
std::string EvaluationToJson(const Evaluation& e);

}  // namespace megascope::detector
