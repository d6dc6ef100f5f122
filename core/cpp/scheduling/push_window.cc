#include "scheduling/push_window.h"

#include <algorithm>

namespace byteps {

PushWindow::PushWindow(const Config& c) : cfg_(c) {
  cfg_.min_bytes = std::max<size_t>(cfg_.min_bytes, 1);
  cfg_.max_bytes = std::max(cfg_.max_bytes, cfg_.min_bytes);
  window_ = std::clamp(cfg_.start_bytes, cfg_.min_bytes, cfg_.max_bytes);
}

size_t PushWindow::OnAck(bool local, size_t bytes, size_t in_flight, int64_t delay_ns,
                         bool limited) {
  std::lock_guard<std::mutex> lk(mu_);
  if (delay_ns <= 0) delay_ns = 1;
  window_sum_ += static_cast<double>(window_);
  ++acks_;
  unit_ = unit_ == 0 ? static_cast<double>(bytes) : unit_ + (static_cast<double>(bytes) - unit_) / 8;
  if (!local) {
    base_ns_ = std::min(base_ns_, delay_ns);
    // Vegas's estimate of the bytes queued on the path: what was in flight, times the share of
    // this push's delay that the fastest push did not have.
    const double queued =
        static_cast<double>(in_flight) * static_cast<double>(delay_ns - base_ns_) / delay_ns;
    if (round_min_queued_ < 0 || queued < round_min_queued_) round_min_queued_ = queued;
  }
  round_limited_ = round_limited_ || limited;
  round_acked_ += bytes;
  if (round_acked_ < window_) return 0;
  // A round (a window of acknowledgements) is over. The least queueing seen in it filters out
  // the delays that scheduling noise added to single pushes.
  const double queued = round_min_queued_;
  const bool was_limited = round_limited_;
  round_acked_ = 0;
  round_limited_ = false;
  round_min_queued_ = -1;
  if (queued < 0) return 0;  // only local pushes: nothing crossed the NIC
  const size_t step = std::max<size_t>(static_cast<size_t>(unit_), 1);
  size_t next = window_;
  if (queued > cfg_.high * unit_) next = window_ > step ? window_ - step : 0;
  else if (queued < cfg_.low * unit_ && was_limited) next = window_ + step;
  next = std::clamp(next, cfg_.min_bytes, cfg_.max_bytes);
  if (next == window_) return 0;
  window_ = next;
  ++changes_;
  return window_;
}

size_t PushWindow::window() const {
  std::lock_guard<std::mutex> lk(mu_);
  return window_;
}

double PushWindow::mean_window() const {
  std::lock_guard<std::mutex> lk(mu_);
  return acks_ ? window_sum_ / static_cast<double>(acks_) : 0.0;
}

uint64_t PushWindow::changes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return changes_;
}

}  // namespace byteps
