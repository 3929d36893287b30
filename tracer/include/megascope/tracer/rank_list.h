// Group membership as arithmetic runs (first, count, stride): a world of 100,000 ranks is one run,
// a data-parallel group strided by the tensor-parallel size is one run, a model-parallel group one
// run per stage. Lists that are no runs cost what a vector would. Reads like a vector of global
// ranks in group order; the runs are built greedily as ranks are appended, so two lists hold the
// same ranks in the same order exactly when their runs are equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <vector>

namespace megascope::tracer {

class RankList {
 public:
  struct Run {
    int32_t first = 0;
    int32_t stride = 1;
    uint32_t count = 0;
    uint32_t offset = 0;  // index of `first` in the list
    int32_t operator[](uint32_t k) const { return first + static_cast<int32_t>(k) * stride; }
    bool operator==(const Run& o) const {
      return first == o.first && count == o.count && (count < 2 || stride == o.stride);
    }
  };

  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = int32_t;
    using difference_type = std::ptrdiff_t;
    using pointer = const int32_t*;
    using reference = int32_t;
    const_iterator() = default;
    const_iterator(const Run* run, uint32_t k) : run_(run), k_(k) {}
    int32_t operator*() const { return (*run_)[k_]; }
    const_iterator& operator++() {
      if (++k_ == run_->count) {
        ++run_;
        k_ = 0;
      }
      return *this;
    }
    const_iterator operator++(int) {
      const_iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const const_iterator& o) const { return run_ == o.run_ && k_ == o.k_; }

   private:
    const Run* run_ = nullptr;
    uint32_t k_ = 0;
  };

  RankList() = default;
  RankList(std::initializer_list<int32_t> ranks) { assign(ranks.begin(), ranks.end()); }
  template <typename It>
  RankList(It begin, It end) {
    assign(begin, end);
  }
  explicit RankList(const std::vector<int32_t>& ranks) { assign(ranks.begin(), ranks.end()); }

  void push_back(int32_t rank);
  // Appends `count` ranks first, first + stride, ... (one run when it continues the last).
  void AppendRun(int32_t first, uint32_t count, int32_t stride);
  template <typename It>
  void assign(It begin, It end) {
    clear();
    for (; begin != end; ++begin) push_back(static_cast<int32_t>(*begin));
  }
  void clear() {
    runs_.clear();
    size_ = 0;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int32_t operator[](size_t i) const;  // O(log runs)
  int32_t front() const { return runs_.front().first; }
  int32_t back() const { return runs_.back()[runs_.back().count - 1]; }
  // Position of `rank` in the list, or -1.
  int IndexOf(int32_t rank) const;
  bool contains(int32_t rank) const { return IndexOf(rank) >= 0; }
  std::vector<int32_t> ToVector() const { return {begin(), end()}; }
  const std::vector<Run>& runs() const { return runs_; }

  const_iterator begin() const { return {runs_.data(), 0}; }
  const_iterator end() const { return {runs_.data() + runs_.size(), 0}; }

  bool operator==(const RankList& o) const { return size_ == o.size_ && runs_ == o.runs_; }

 private:
  std::vector<Run> runs_;
  size_t size_ = 0;
};

}  // namespace megascope::tracer
