// The copy stages' event waiter (device_waiter.h).
#include "pipeline/device_waiter.h"

#include "common/logging.h"

namespace byteps {

void DeviceWaiter::Start(Done done) {
  std::lock_guard<std::mutex> lk(mu_);
  if (thread_.joinable() || stop_) return;
  done_ = std::move(done);
  thread_ = std::thread([this] { Loop(); });
}

void DeviceWaiter::Add(device::Device* d, device::Event e, PartTask* t, device::Event start,
                       device::CopyDir dir, size_t bytes) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    items_.push_back(Item{d, e, t, start, dir, bytes});
  }
  cv_.notify_one();
}

void DeviceWaiter::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void DeviceWaiter::Loop() {
  for (;;) {
    Item it;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !items_.empty(); });
      if (items_.empty()) return;  // stopping, and nothing left to wait for
      it = items_.front();
      items_.pop_front();
    }
    Status st = it.device->Synchronize(it.event);
    if (st.ok() && it.start) {  // copy timing: read before the task moves on (and recopies)
      Status timed = it.device->AddCopyTime(it.dir, it.start, it.event, it.bytes);
      if (!timed.ok() && !timing_failed_) {
        timing_failed_ = true;
        BPS_LOG(WARNING) << "copy timing stopped counting: " << timed.message();
      }
    }
    done_(it.task, st);
  }
}

}  // namespace byteps
