// Priority + credit queue (ByteScheduler, SOSP'19 §3; docs/architecture.md §5).
//
// Items leave in order of higher priority first, then smaller key (earlier partition). With a
// credit limit C (bytes), an item leaves only while the bytes taken and not yet returned stay
// within C — except that an item always leaves when nothing is in flight, so a partition larger
// than C cannot block forever. Only the head item is considered (a large high-priority partition
// is never overtaken by smaller low-priority ones). Credit 0 = unlimited.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace byteps {

struct QueueItem {
  int64_t priority;
  uint64_t key;
  size_t bytes;
  void* ptr;
};

class ScheduledQueue {
 public:
  ScheduledQueue(std::string name, size_t credit_bytes);

  void Push(const QueueItem& item);
  // Blocks until an item may leave, the queue is closed, or `timeout` passes.
  // Returns false when closed or timed out (nothing popped).
  bool Pop(QueueItem* out, std::chrono::milliseconds timeout);
  // Non-blocking Pop.
  bool TryPop(QueueItem* out);
  // Gives back the credit of an item that left (its bytes are no longer in flight).
  void ReturnCredit(size_t bytes);
  // Gives back credit and, if an item may now leave, pops it into *out (returns true) instead of
  // waking a waiting Pop: for a caller that runs the item itself. When it returns false no item
  // may leave, so no waiter could have made progress either.
  bool ReturnCreditAndTryPop(size_t bytes, QueueItem* out);
  // Changes the credit limit (bytes; 0 = unlimited) at run time (BYTEPS_AUTOTUNE): items in
  // flight keep their credit; waiters are woken, as a larger limit may let the head leave.
  void SetCredit(size_t credit_bytes);
  size_t credit() const;
  void Close();
  size_t size() const;
  size_t in_flight_bytes() const;
  const std::string& name() const { return name_; }

 private:
  bool CanPopLocked() const;
  void PopLocked(QueueItem* out);

  std::string name_;
  size_t credit_bytes_;  // 0 = unlimited
  size_t in_flight_ = 0;
  bool closed_ = false;
  std::vector<QueueItem> heap_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace byteps
