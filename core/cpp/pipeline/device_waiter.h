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
  // `t` is done when `e` (recorded on d's stream after its copy) completes.
  void Add(device::Device* d, device::Event e, PartTask* t);
  // Waits for what was added, then ends the thread.
  void Stop();

 private:
  struct Item {
    device::Device* device;
    device::Event event;
    PartTask* task;
  };
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stop_ = false;
  Done done_;
  std::thread thread_;
};

}  // namespace byteps
