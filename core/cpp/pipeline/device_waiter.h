// Waits for the events of a copy stage's copies (docs/gpu.md): the stage's thread queues a
// copy on the device and hands the partition here; this thread waits for the copy's event, in
// the order the copies were queued (one stream: they complete in that order), and calls the
// completion, so the stage's thread goes on queueing the next copies meanwhile.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "device/device.h"

namespace byteps {

struct PartTask;

class DeviceWaiter {
 public:
  using Done = std::function<void(PartTask*, const Status&)>;
  ~DeviceWaiter() { Stop(); }
  // Starts the thread (once; later calls do nothing).
  void Start(Done done);
  // `t` is done when `e` (recorded on d's stream after its copy) completes. `start`: a timing
  // event recorded before the copy (copy timing on), whose time to `e` is added to d's
  // counters for direction `dir` and `bytes` (Device::AddCopyTime); null: none.
  void Add(device::Device* d, device::Event e, PartTask* t, device::Event start = nullptr,
           device::CopyDir dir = device::CopyDir::kDeviceToHost, size_t bytes = 0);
  // Waits for what was added, then ends the thread.
  void Stop();

 private:
  struct Item {
    device::Device* device;
    device::Event event;
    PartTask* task;
    device::Event start;
    device::CopyDir dir;
    size_t bytes;
  };
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stop_ = false;
  bool timing_failed_ = false;  // the waiter thread's: a copy timing error is logged once
  Done done_;
  std::thread thread_;
};

}  // namespace byteps
