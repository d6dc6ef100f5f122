#include "scheduling/autotune_search.h"

#include <algorithm>
#include <cstdint>

namespace byteps {

std::vector<int64_t> DefaultPartitionGrid() {
  return {64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20};
}
std::vector<int64_t> DefaultCreditGrid() { return {1, 2, 4, 8, 16}; }

AutotuneSearch::AutotuneSearch(TunePoint start, std::vector<int64_t> partitions,
                               std::vector<int64_t> credits, int max_trials)
    : start_(start),
      partitions_(std::move(partitions)),
      credits_(std::move(credits)),
      max_trials_(std::max(1, max_trials)) {
  for (auto* axis : {&partitions_, &credits_}) {
    const int64_t s = axis == &partitions_ ? start.partition_bytes : start.credit;
    if (std::find(axis->begin(), axis->end(), s) == axis->end()) axis->push_back(s);
    std::sort(axis->begin(), axis->end());
    axis->erase(std::unique(axis->begin(), axis->end()), axis->end());
  }
}

bool AutotuneSearch::Measured(const TunePoint& p) const {
  for (auto& t : trials_)
    if (t.point == p) return true;
  return false;
}

TuneTrial AutotuneSearch::Best() const {
  if (trials_.empty()) return TuneTrial{start_, 0};
  const TuneTrial* best = &trials_[0];
  for (auto& t : trials_)
    if (t.seconds < best->seconds) best = &t;
  return *best;
}

bool AutotuneSearch::NextPhase() {
  queue_.clear();
  queue_pos_ = 0;
  const TunePoint best = Best().point;
  switch (phase_++) {
    case 0:  // the start point
      queue_.push_back(start_);
      return true;
    case 1:  // every partition size at the start credit
      for (int64_t p : partitions_) queue_.push_back({p, start_.credit});
      return true;
    case 2:  // every credit at the best partition size
      for (int64_t c : credits_) queue_.push_back({best.partition_bytes, c});
      return true;
    case 3: {  // the best credit moved: the neighbouring partition sizes at that credit
      if (best.credit == start_.credit) return true;
      auto it = std::find(partitions_.begin(), partitions_.end(), best.partition_bytes);
      if (it != partitions_.begin()) queue_.push_back({*(it - 1), best.credit});
      if (it + 1 != partitions_.end()) queue_.push_back({*(it + 1), best.credit});
      return true;
    }
    default:
      return false;
  }
}

bool AutotuneSearch::Next(TunePoint* p) {
  while (static_cast<int>(trials_.size()) < max_trials_) {
    while (queue_pos_ < queue_.size()) {
      const TunePoint& q = queue_[queue_pos_++];
      if (!Measured(q)) {
        *p = q;
        return true;
      }
    }
    if (!NextPhase()) return false;
  }
  return false;
}

void AutotuneSearch::Report(const TunePoint& p, double seconds) {
  trials_.push_back(TuneTrial{p, seconds});
}

}  // namespace byteps
