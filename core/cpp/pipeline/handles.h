// Completion handles of asynchronous operations. Python polls or waits on an integer handle;
// the wait blocks on a condition variable (the binding releases the GIL around it). A handle
// created with a completion callback (a framework engine's operation, engine_bridge.h) is never
// waited on: the callback receives the status when the operation finishes and the handle is
// released right after.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/status.h"

namespace byteps {

using DoneCallback = std::function<void(const Status&)>;

class HandleTable {
 public:
  // `on_done` (optional) runs once, on the completing thread and outside the table's lock.
  int64_t Create(DoneCallback on_done = nullptr);
  void MarkDone(int64_t handle, const Status& st);
  // Unknown handle -> InvalidArgument.
  Status Poll(int64_t handle, bool* done);
  // Waits until done (timeout_s < 0: no limit), returns the operation's status and releases
  // the handle (unless the wait timed out).
  Status Wait(int64_t handle, double timeout_s);
  void Release(int64_t handle);
  // Completes every open handle with `st` (shutdown, fatal errors).
  void FailAll(const Status& st);
  size_t open_handles();

 private:
  struct State {
    bool done = false;
    Status status;
    DoneCallback on_done;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_ = 1;
  std::unordered_map<int64_t, State> states_;
};

}  // namespace byteps
