#include "scheduled_queue.h"

#include <algorithm>

namespace byteps {
namespace {
// std heap is a max-heap on `less`: "a < b" means a leaves after b.
bool LeavesLater(const QueueItem& a, const QueueItem& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  return a.key > b.key;
}
}  // namespace

ScheduledQueue::ScheduledQueue(std::string name, size_t credit_bytes)
    : name_(std::move(name)), credit_bytes_(credit_bytes) {
  heap_.reserve(1024);
}

void ScheduledQueue::Push(const QueueItem& item) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    heap_.push_back(item);
    std::push_heap(heap_.begin(), heap_.end(), LeavesLater);
  }
  cv_.notify_one();
}

bool ScheduledQueue::CanPopLocked() const {
  if (heap_.empty()) return false;
  if (credit_bytes_ == 0 || in_flight_ == 0) return true;
  return in_flight_ + heap_.front().bytes <= credit_bytes_;
}

void ScheduledQueue::PopLocked(QueueItem* out) {
  std::pop_heap(heap_.begin(), heap_.end(), LeavesLater);
  *out = heap_.back();
  heap_.pop_back();
  in_flight_ += out->bytes;
}

bool ScheduledQueue::Pop(QueueItem* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return closed_ || CanPopLocked(); })) return false;
  if (closed_) return false;
  PopLocked(out);
  bool more = CanPopLocked();
  lk.unlock();
  if (more) cv_.notify_one();
  return true;
}

bool ScheduledQueue::TryPop(QueueItem* out) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_ || !CanPopLocked()) return false;
  PopLocked(out);
  return true;
}

void ScheduledQueue::ReturnCredit(size_t bytes) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    in_flight_ = bytes > in_flight_ ? 0 : in_flight_ - bytes;
  }
  cv_.notify_all();
}

bool ScheduledQueue::ReturnCreditAndTryPop(size_t bytes, QueueItem* out) {
  std::lock_guard<std::mutex> lk(mu_);
  in_flight_ = bytes > in_flight_ ? 0 : in_flight_ - bytes;
  if (closed_ || !CanPopLocked()) return false;
  PopLocked(out);
  return true;
}

void ScheduledQueue::SetCredit(size_t credit_bytes) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    credit_bytes_ = credit_bytes;
  }
  cv_.notify_all();
}

size_t ScheduledQueue::credit() const {
  std::lock_guard<std::mutex> lk(mu_);
  return credit_bytes_;
}

void ScheduledQueue::Close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

size_t ScheduledQueue::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return heap_.size();
}

size_t ScheduledQueue::in_flight_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return in_flight_;
}

}  // namespace byteps
