#include "scheduling/push_window.h"

#include <algorithm>
#include <cstdint>

namespace byteps {
namespace {
constexpr double kUnitDecay = 1.0 / 16;  // per acknowledgement
}  // namespace

PushWindow::PushWindow(const Config& c) : cfg_(c) {
  cfg_.min_bytes = std::max<size_t>(cfg_.min_bytes, 1);
  cfg_.max_bytes = std::max(cfg_.max_bytes, cfg_.min_bytes);
  window_ = std::clamp(cfg_.start_bytes, cfg_.min_bytes, cfg_.max_bytes);
}

PushWindow::Path& PushWindow::PathLocked(int path) {
  const size_t i = path < 0 ? 0 : static_cast<size_t>(path);
  if (i >= paths_.size()) paths_.resize(i + 1);
  return paths_[i];
}

void PushWindow::OnSend(int path, bool local, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  Path& p = PathLocked(path);
  p.in_flight += bytes;
  p.remote = !local;
}

void PushWindow::OnLost(int path, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  Path& p = PathLocked(path);
  p.in_flight = bytes > p.in_flight ? 0 : p.in_flight - bytes;
}

size_t PushWindow::OnAck(int path, size_t bytes, int64_t delay_ns, bool limited) {
  std::lock_guard<std::mutex> lk(mu_);
  if (delay_ns <= 0) delay_ns = 1;
  window_sum_ += static_cast<double>(window_);
  ++acks_;
  // The partition unit: the mean size of the partition a pushed byte belongs to (sizes
  // weighted by their bytes, decaying), so that a model's many small tensors do not make the
  // unit of its large ones small.
  const double b = static_cast<double>(bytes);
  unit_num_ = unit_num_ * (1 - kUnitDecay) + b * b;
  unit_den_ = unit_den_ * (1 - kUnitDecay) + b;
  const double unit = unit_den_ > 0 ? unit_num_ / unit_den_ : b;
  Path& p = PathLocked(path);
  p.in_flight = bytes > p.in_flight ? 0 : p.in_flight - bytes;
  if (p.remote) {
    base_ns_ = std::min(base_ns_, delay_ns);
    // The share of this push's delay that the fastest push did not have: time it queued.
    const double queued =
        static_cast<double>(delay_ns - base_ns_) / static_cast<double>(delay_ns);
    if (p.round_min_queued < 0 || queued < p.round_min_queued) p.round_min_queued = queued;
  }
  round_limited_ = round_limited_ || limited;
  round_acked_ += bytes;
  if (round_acked_ < window_) return 0;
  // A round (a window of acknowledgements) is over. Every remote push waits in the NIC's
  // queue, so the share of delay queued that every sampled path shows is the NIC's; what a
  // path shows beyond it queued at its server, behind other workers' pushes. Only the NIC's
  // queue delays this host's other traffic (its server's pull responses): Vegas's estimate of
  // the bytes in it is the remote bytes in flight times that share.
  // A server's own queue is bounded too (`high` partitions of this worker's pushes queued
  // for it anywhere): several workers pushing to one server would otherwise each keep
  // growing a queue there that drains only at the end of a round.
  double shared = -1, remote = 0, path_most = 0;
  for (size_t i = 0; i < paths_.size(); ++i) {
    Path& q = paths_[i];
    if (q.round_min_queued >= 0) {
      if (shared < 0 || q.round_min_queued < shared) shared = q.round_min_queued;
      path_most = std::max(path_most, q.round_min_queued * static_cast<double>(q.in_flight));
    }
    if (q.remote) remote += static_cast<double>(q.in_flight);
    q.round_min_queued = -1;
  }
  const bool sampled = shared >= 0;
  const double queued = std::max(shared * remote, path_most);
  const bool was_limited = round_limited_;
  round_acked_ = 0;
  round_limited_ = false;
  if (!sampled) return 0;  // only local pushes: nothing crossed the NIC
  const size_t step = std::max<size_t>(static_cast<size_t>(unit), 1);
  size_t next = window_;
  if (queued > cfg_.high * unit) next = window_ > step ? window_ - step : 0;
  else if (queued < cfg_.low * unit && was_limited) next = window_ + step;
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
