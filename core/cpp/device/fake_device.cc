// The fake device (device.h): the backend of the device-path tests on hosts without a GPU.
// "Device memory" is ordinary host memory; each stream is a thread of its own that runs its
// queue in order, so copies are really asynchronous to the thread that queues them, events
// complete only when their stream reaches them, and a pipeline that forgets to wait for one
// reads or returns data that is not there yet (the tests see a wrong sum). Streams and events
// live as long as the process.
#include <cstdint>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "device/device.h"

namespace byteps {
namespace device {
namespace {

std::mutex g_mu;  // guards every fake event and stream queue
std::condition_variable g_cv;
std::atomic<int64_t> g_copy_delay_us{0};

struct FakeEvent {
  uint64_t recorded = 0;   // Record calls so far
  uint64_t completed = 0;  // the last of them its stream has reached
  int64_t completed_ns = 0;  // when (steady clock), for ElapsedNs
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class FakeStream {
 public:
  FakeStream() {
    std::thread([this] { Loop(); }).detach();  // lives as long as the process
  }
  void Enqueue(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ops_.push_back(std::move(op));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return !ops_.empty(); });
        op = std::move(ops_.front());
        ops_.pop_front();
      }
      op();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
};

void Sleep(int64_t us) {
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

class Fake : public Device {
 public:
  Kind kind() const override { return Kind::kFake; }
  int count() const override { return 1; }
  Status Use(int device) override {
    if (device != 0)
      return Status::InvalidArgument("the fake device has only device 0, not " +
                                     std::to_string(device));
    return Status::OK();
  }

 protected:
  Status DoCreateStream(int device, Stream* out) override {
    BPS_RETURN_IF_ERROR(Use(device));
    *out = new FakeStream();
    return Status::OK();
  }
  Status DoCreateEvent(Event* out, bool timing) override {
    (void)timing;  // every fake event keeps its time
    *out = new FakeEvent();
    return Status::OK();
  }
  Status DoElapsedNs(Event start, Event end, uint64_t* ns) override {
    auto *a = static_cast<FakeEvent*>(start), *b = static_cast<FakeEvent*>(end);
    std::lock_guard<std::mutex> lk(g_mu);
    if (a->completed < a->recorded || b->completed < b->recorded || !a->recorded)
      return Status::InvalidArgument("fake device: elapsed time of an event not complete");
    *ns = b->completed_ns > a->completed_ns ? static_cast<uint64_t>(b->completed_ns - a->completed_ns)
                                            : 0;
    return Status::OK();
  }
  void DoDestroyEvent(Event e) override {
    // Kept: a stream may still hold its last Record (a few bytes per event).
    (void)e;
  }
  Status DoCopyAsync(void* dst, const void* src, size_t n, CopyDir dir, Stream s) override {
    if (!s) return Status::InvalidArgument("fake device: no stream");
    static_cast<FakeStream*>(s)->Enqueue([dst, src, n] {
      Sleep(g_copy_delay_us.load());
      memcpy(dst, src, n);
    });
    return Status::OK();
  }
  Status DoRecord(Event e, Stream s) override {
    auto* ev = static_cast<FakeEvent*>(e);
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      seq = ++ev->recorded;
    }
    static_cast<FakeStream*>(s)->Enqueue([ev, seq] {
      {
        std::lock_guard<std::mutex> lk(g_mu);
        ev->completed = std::max(ev->completed, seq);
        ev->completed_ns = NowNs();
      }
      g_cv.notify_all();
    });
    return Status::OK();
  }
  Status DoStreamWait(Stream s, Event e) override {
    auto* ev = static_cast<FakeEvent*>(e);
    uint64_t target;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      target = ev->recorded;
    }
    static_cast<FakeStream*>(s)->Enqueue([ev, target] {
      std::unique_lock<std::mutex> lk(g_mu);
      g_cv.wait(lk, [&] { return ev->completed >= target; });
    });
    return Status::OK();
  }
  Status DoSynchronize(Event e) override {
    auto* ev = static_cast<FakeEvent*>(e);
    std::unique_lock<std::mutex> lk(g_mu);
    const uint64_t target = ev->recorded;
    g_cv.wait(lk, [&] { return ev->completed >= target; });
    return Status::OK();
  }
  Status DoHostAlloc(size_t n, void** out) override {
    if (posix_memalign(out, 4096, n) != 0)
      return Status::Internal("fake device: out of memory for " + std::to_string(n) + " bytes");
    return Status::OK();
  }
  void DoHostFree(void* p) override { free(p); }
  Status DoRegisterHost(void* p, size_t n) override {  // host memory is the device's already
    (void)p;
    (void)n;
    return Status::OK();
  }
  void DoUnregisterHost(void* p) override { (void)p; }
};

}  // namespace

Device* FakeDevice() {
  static Device* d = new Fake();  // process lifetime (its stream threads are detached)
  return d;
}

void SetFakeCopyDelay(int64_t us) { g_copy_delay_us = us; }

// Runs `op` on fake stream s after what is queued there (the fake collective's calls).
Status FakeEnqueue(Stream s, std::function<void()> op) {
  if (!s) return Status::InvalidArgument("fake device: no stream");
  static_cast<FakeStream*>(s)->Enqueue(std::move(op));
  return Status::OK();
}

Status FakeWriteAsync(Stream s, void* dst, const void* src, size_t n, int64_t delay_us) {
  if (!s) return Status::InvalidArgument("fake device: no stream");
  auto data = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                  static_cast<const char*>(src) + n);
  static_cast<FakeStream*>(s)->Enqueue([dst, data, delay_us] {
    Sleep(delay_us);
    memcpy(dst, data->data(), data->size());
  });
  return Status::OK();
}

}  // namespace device
}  // namespace byteps
