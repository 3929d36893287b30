// Baselines the evaluation runs side by side with the detector: a per-metric z-score across
// machines on raw values with no continuity window, and a Mahalanobis-distance detector over all
// metrics (Minder's baseline). Both re-alert a machine at most once per `cooldown_ticks`.
#pragma once

#include <vector>

#include "megascope/detector/detector.h"

namespace megascope::detector {

class ZScoreBaseline final : public FrameDetector {
 public:
  explicit ZScoreBaseline(double threshold = 3.0, int cooldown_ticks = 60)
      : threshold_(threshold), cooldown_(cooldown_ticks) {}
  void OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) override;
  const char* Name() const override { return "zscore"; }

 private:
  double threshold_;
  int cooldown_;
  std::vector<int64_t> last_alert_;
};

class MahalanobisBaseline final : public FrameDetector {
 public:
  // `quantile`: the chi-square tail probability that triggers (0.999 by default).
  explicit MahalanobisBaseline(double quantile = 0.999, int cooldown_ticks = 60)
      : quantile_(quantile), cooldown_(cooldown_ticks) {}
  void OnFrame(const Frame& f, const Registry& reg, std::vector<Verdict>* out) override;
  const char* Name() const override { return "mahalanobis"; }

 private:
  double quantile_;
  int cooldown_;
  std::vector<int64_t> last_alert_;
  std::vector<std::vector<double>> last_value_;  // [machine][metric], carried 5 ticks
  std::vector<std::vector<int64_t>> last_tick_;
};

}  // namespace megascope::detector
