// A blocking FIFO on a growable ring buffer: no allocation per element once it has grown to the
// working-set size (the deque alternative allocates chunks as it moves).
#pragma once
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace byteps {

template <typename T>
class RingQueue {
 public:
  explicit RingQueue(size_t capacity = 256) : buf_(capacity) {}

  void Push(const T& v) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (size_ == buf_.size()) Grow();
      buf_[(head_ + size_) % buf_.size()] = v;
      ++size_;
    }
    cv_.notify_one();
  }
  // Returns false when closed (and drained) or on timeout.
  bool Pop(T* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return size_ > 0 || closed_; })) return false;
    if (size_ == 0) return false;
    *out = buf_[head_];
    head_ = (head_ + 1) % buf_.size();
    --size_;
    return true;
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  bool closed() const {
    std::lock_guard<std::mutex> lk(mu_);
    return closed_;
  }

 private:
  void Grow() {
    std::vector<T> next(buf_.size() * 2);
    for (size_t i = 0; i < size_; ++i) next[i] = buf_[(head_ + i) % buf_.size()];
    buf_.swap(next);
    head_ = 0;
  }
  std::vector<T> buf_;
  size_t head_ = 0, size_ = 0;
  bool closed_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace byteps
