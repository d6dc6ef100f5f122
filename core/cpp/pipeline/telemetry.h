// push_pull telemetry (BYTEPS_TELEMETRY_ON; docs/timeline.md): the throughput samples behind
// upstream's get_pushpull_speed() and the per-tensor counters behind
// byteps.basics.get_telemetry(). The hot path is one relaxed atomic add per completed push_pull
// (and a clock read); the sample list takes a lock once per sample period.
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

namespace byteps {

class Telemetry {
 public:
  // At most this many unread samples are kept (the oldest go first).
  static constexpr size_t kMaxSamples = 1024;

  void Configure(bool on, double interval_s);
  bool on() const { return on_; }
  // A push_pull of `bytes` completed at `now_ns` (steady clock). The first one opens the first
  // sample; each later one adds its bytes, and once `interval` has passed since the open
  // sample began, closes it: the bytes completed in it over its duration.
  void Record(uint64_t bytes, int64_t now_ns);
  // (milliseconds since the epoch when the sample closed, MB/s with MB = 10^6 bytes): the
  // oldest sample not yet read, which this call consumes (upstream's queue); (0, -5.0) when
  // there is none.
  std::pair<uint64_t, double> PopSpeed();
  size_t num_samples();

 private:
  bool on_ = false;
  int64_t interval_ns_ = 10'000'000'000;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> since_ns_{0};  // the open sample's start; 0 = no traffic yet
  std::mutex mu_;
  std::deque<std::pair<uint64_t, double>> samples_;
};

}  // namespace byteps
