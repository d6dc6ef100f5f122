// The PUSH credit sized from the servers' acknowledgement delay (docs/architecture.md §5,
// "The adaptive push window").
//
// ByteScheduler's credit (SOSP'19 §4.2) bounds the bytes a worker has pushed and the servers
// have not yet acknowledged. A fixed byte count cannot fit every link: 1 MiB in flight is 10 ms
// of an 800 Mbit/s link but 87 ms of a 100 Mbit/s one, where the pushes then queue the
// colocated server's pull responses (which complete the other workers' rounds) behind them.
// This window follows the link the way a delay-based congestion window (TCP Vegas) does: per
// acknowledged push, the bytes that were queued ahead of it are estimated from how much longer
// it took than the fastest push ever acknowledged, `in_flight x (delay - base) / delay`; once
// per window of acknowledgements the window grows by one partition while fewer than `low`
// partitions were queued (and a push had to wait for credit), and shrinks by one partition
// while more than `high` were. On a link-bound path the window therefore holds between `low`
// and `high` partitions whatever the link rate, and where the path is not the bottleneck (a
// large bandwidth-delay product) it grows until queueing shows or `max` is reached.
// The pushes to every remote server share the worker's NIC, so they share one fastest delay;
// pushes to a server on the worker's own host never cross the NIC and are not sampled (they
// still count towards a window of acknowledgements). The fastest delay is never forgotten
// (Vegas's baseRTT): under a steady backlog no later push sees an empty queue to replace it.
// Thread-safe (acknowledgements arrive on several receiving threads).
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace byteps {

class PushWindow {
 public:
  struct Config {
    size_t start_bytes = 0;  // the window at the start (bytes)
    size_t min_bytes = 0;    // it never falls below (bytes)
    size_t max_bytes = 0;    // nor rises above (bytes)
    double low = 3.0;        // grow while fewer partitions than this were queued
    double high = 6.0;       // shrink while more than this were
  };

  explicit PushWindow(const Config& c);

  // One acknowledged push of `bytes` (to a server on this host when `local`); `in_flight` bytes
  // were in flight when it left (itself included), `delay_ns` passed between handing it to the
  // van and its acknowledgement, and `limited` says whether a push was waiting for credit when
  // the acknowledgement came. Returns the new window (bytes) when it changed, 0 otherwise.
  size_t OnAck(bool local, size_t bytes, size_t in_flight, int64_t delay_ns, bool limited);

  size_t window() const;
  // The mean window over the acknowledgements so far (bytes; 0 before the first).
  double mean_window() const;
  uint64_t changes() const;

 private:
  Config cfg_;
  mutable std::mutex mu_;
  size_t window_;
  double unit_ = 0;              // running mean of a push's bytes (the partition unit)
  int64_t base_ns_ = INT64_MAX;  // the fastest remote push's delay
  double round_min_queued_ = -1;  // least queued bytes seen this round (-1: no sample)
  size_t round_acked_ = 0;       // bytes acknowledged since the round began
  bool round_limited_ = false;   // a push waited for credit during the round
  double window_sum_ = 0;
  uint64_t acks_ = 0;
  uint64_t changes_ = 0;
};

}  // namespace byteps
