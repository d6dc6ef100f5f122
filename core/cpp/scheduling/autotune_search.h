// The search of BYTEPS_AUTOTUNE (docs/autotune.md): which (partition bytes, credit) to try
// next, given the measured iteration time of every point tried so far. Pure and deterministic:
// the same reports in the same order give the same points on every worker, with no random
// state and no floating-point arithmetic other than comparisons, so workers that feed it the
// same (all-reduced) measurements agree on every trial and on the choice.
//
// A coordinate search over a small grid: the start point, then every partition size of the
// grid at the start credit, then every credit at the best partition size so far, then, when
// the best credit moved, the two partition sizes next to the best one at that credit. An axis
// with a single value (a knob the user set) is held fixed. At most `max_trials` points.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace byteps {

struct TunePoint {
  int64_t partition_bytes = 0;  // BYTEPS_PARTITION_BYTES (before rounding to pages)
  int64_t credit = 0;           // BYTEPS_SCHEDULING_CREDIT (partitions; 0 = unlimited)
  bool operator==(const TunePoint& o) const {
    return partition_bytes == o.partition_bytes && credit == o.credit;
  }
};

struct TuneTrial {
  TunePoint point;
  double seconds = 0;  // the measured iteration time
};

class AutotuneSearch {
 public:
  // `partitions` and `credits`: the values of each axis (sorted ascending here; `start`'s are
  // added when missing). max_trials >= 1.
  AutotuneSearch(TunePoint start, std::vector<int64_t> partitions, std::vector<int64_t> credits,
                 int max_trials);
  // The next point to measure (the first call: the start point); false when the search is
  // over (then Best() is the choice). Every call after a true answer must be followed by
  // Report of that point before the next call.
  bool Next(TunePoint* p);
  void Report(const TunePoint& p, double seconds);
  // The point of the smallest measured time (the earliest of equal ones); the start point
  // before any report.
  TuneTrial Best() const;
  const std::vector<TuneTrial>& trials() const { return trials_; }
  const std::vector<int64_t>& partitions() const { return partitions_; }
  const std::vector<int64_t>& credits() const { return credits_; }

 private:
  bool Measured(const TunePoint& p) const;
  // Fills queue_ with the next phase's points; false when no phase is left.
  bool NextPhase();

  TunePoint start_;
  std::vector<int64_t> partitions_, credits_;
  int max_trials_;
  int phase_ = 0;
  std::vector<TunePoint> queue_;
  size_t queue_pos_ = 0;
  std::vector<TuneTrial> trials_;
};

// The grids of the search (docs/autotune.md): partition sizes 64 KiB .. 4 MiB in powers of two,
// credits 1 .. 16 in powers of two.
std::vector<int64_t> DefaultPartitionGrid();
std::vector<int64_t> DefaultCreditGrid();

}  // namespace byteps
