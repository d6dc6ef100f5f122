// The PUSH credit sized from the servers' acknowledgement delay (docs/architecture.md §5,
// "The adaptive push window").
//
// ByteScheduler's credit (SOSP'19 §4.2) bounds the bytes a worker has pushed and the servers
// have not yet acknowledged. A fixed byte count cannot fit every link: 1 MiB in flight is 10 ms
// of an 800 Mbit/s link but 87 ms of a 100 Mbit/s one, where the pushes then queue the
// colocated server's pull responses (which complete the other workers' rounds) behind them.
// This window follows the network the way a delay-based congestion window (TCP Vegas) does.
// Each acknowledged push to a remote server gives the share of its delay that the fastest push
// did not have, `(delay - base) / delay`: the time it queued. Every remote push waits in the
// worker's NIC queue, so per window of acknowledgements the least share that every server's
// pushes showed (each server's least, which filters out a push delayed by scheduling noise,
// then the least over the servers) is the NIC's, and Vegas's estimate of the bytes in that
// queue is the remote bytes in flight times it. Each server's own queue (its bytes in flight
// times its share) is bounded as well: workers pushing to one server would otherwise each
// grow a queue there that drains only at the end of a round. The window shrinks by one
// partition while either holds more than `high` partitions, and grows by one while the NIC's
// holds fewer than `low` (and a push had to wait for credit). The NIC's queue is the one that
// holds this host's other traffic (its colocated server's pull responses, which complete the
// other workers' rounds) behind the pushes. So the window holds `low`..`high` partitions
// queued whatever the link rate, and where the NIC is not the bottleneck (a large
// bandwidth-delay product) it grows until it is or `max` is reached.
// A partition here is the byte-weighted mean size of the recent pushes (the size of the
// partition a pushed byte belongs to), so a model's many small tensors do not shrink the unit
// of its large ones. Pushes to a server on the worker's own host never cross the NIC and are
// not sampled (they still count towards a window of acknowledgements). The fastest delay is
// never forgotten (Vegas's baseRTT): under a steady backlog no later push sees an empty queue
// to replace it. Thread-safe (acknowledgements arrive on several threads).
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace byteps {

// The worker's adaptive window lies between one partition bound and this many (32 x 256 KiB =
// 8 MiB with the default BYTEPS_PARTITION_BYTES).
constexpr size_t kAdaptiveCreditMaxBounds = 32;

class PushWindow {
 public:
  struct Config {
    size_t start_bytes = 0;  // the window at the start (bytes)
    size_t min_bytes = 0;    // it never falls below (bytes)
    size_t max_bytes = 0;    // nor rises above (bytes)
    double low = 2.0;        // grow while fewer partitions than this were queued (Vegas alpha)
    double high = 4.0;       // shrink while more than this were (Vegas beta)
  };

  explicit PushWindow(const Config& c);

  // A push of `bytes` to server `path` (>= 0; `local`: the server runs on this worker's host)
  // leaves.
  void OnSend(int path, bool local, size_t bytes);
  // Its acknowledgement: `delay_ns` passed between the push leaving and its acknowledgement,
  // and `limited`: a push was waiting for credit when the acknowledgement came. Returns the new
  // window (bytes) when it changed, 0 otherwise.
  size_t OnAck(int path, size_t bytes, int64_t delay_ns, bool limited);
  // A push that was sent and will never be acknowledged (it failed): its bytes leave the path.
  void OnLost(int path, size_t bytes);

  size_t window() const;
  // The mean window over the acknowledgements so far (bytes; 0 before the first).
  double mean_window() const;
  uint64_t changes() const;

 private:
  struct Path {
    size_t in_flight = 0;
    bool remote = false;  // as OnSend was told
    double round_min_queued = -1;  // least share of delay queued this round (-1: no sample)
  };
  Path& PathLocked(int path);

  Config cfg_;
  mutable std::mutex mu_;
  size_t window_;
  double unit_num_ = 0, unit_den_ = 0;  // decaying sums of bytes^2 and bytes (the unit)
  int64_t base_ns_ = INT64_MAX;  // the fastest remote push's delay
  std::vector<Path> paths_;
  size_t round_acked_ = 0;       // bytes acknowledged since the round began
  bool round_limited_ = false;   // a push waited for credit during the round
  double window_sum_ = 0;
  uint64_t acks_ = 0;
  uint64_t changes_ = 0;
};

}  // namespace byteps
