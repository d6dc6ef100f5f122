#include "pipeline/telemetry.h"

#include <chrono>
#include <cstdint>

namespace byteps {

void Telemetry::Configure(bool on, double interval_s) {
  on_ = on;
  interval_ns_ = static_cast<int64_t>(interval_s * 1e9);
  if (interval_ns_ < 1) interval_ns_ = 1;
}

void Telemetry::Record(uint64_t bytes, int64_t now_ns) {
  int64_t since = since_ns_.load(std::memory_order_relaxed);
  if (since == 0) {  // the first push_pull's end opens the first sample
    since_ns_.compare_exchange_strong(since, now_ns, std::memory_order_relaxed);
    return;
  }
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (now_ns - since < interval_ns_) return;
  std::lock_guard<std::mutex> lk(mu_);
  since = since_ns_.load(std::memory_order_relaxed);
  if (now_ns - since < interval_ns_) return;  // another thread closed it
  const uint64_t b = bytes_.exchange(0, std::memory_order_relaxed);
  since_ns_.store(now_ns, std::memory_order_relaxed);
  const double mb_per_s = static_cast<double>(b) * 1e3 / static_cast<double>(now_ns - since);
  const uint64_t ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  samples_.emplace_back(ms, mb_per_s);
  if (samples_.size() > kMaxSamples) samples_.pop_front();
}

std::pair<uint64_t, double> Telemetry::PopSpeed() {
  std::lock_guard<std::mutex> lk(mu_);
  if (samples_.empty()) return {0, -5.0};
  auto s = samples_.front();
  samples_.pop_front();
  return s;
}

size_t Telemetry::num_samples() {
  std::lock_guard<std::mutex> lk(mu_);
  return samples_.size();
}

}  // namespace byteps
