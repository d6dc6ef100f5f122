#include "handles.h"

#include <chrono>
#include <cstdint>
#include <vector>

namespace byteps {

int64_t HandleTable::Create(DoneCallback on_done) {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t h = next_++;
  State s;
  s.on_done = std::move(on_done);
  states_.emplace(h, std::move(s));
  return h;
}

void HandleTable::MarkDone(int64_t handle, const Status& st) {
  DoneCallback cb;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = states_.find(handle);
    if (it == states_.end() || it->second.done) return;
    if (it->second.on_done) {
      cb = std::move(it->second.on_done);
      states_.erase(it);
    } else {
      it->second.done = true;
      it->second.status = st;
    }
  }
  if (cb) {
    cb(st);
    return;
  }
  cv_.notify_all();
}

Status HandleTable::Poll(int64_t handle, bool* done) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(handle);
  if (it == states_.end())
    return Status::InvalidArgument("unknown handle " + std::to_string(handle) +
                                   " (already synchronized, or never returned by push_pull)");
  *done = it->second.done;
  return Status::OK();
}

Status HandleTable::Wait(int64_t handle, double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = states_.find(handle);
  if (it == states_.end())
    return Status::InvalidArgument("unknown handle " + std::to_string(handle) +
                                   " (already synchronized, or never returned by push_pull)");
  auto ready = [&] { return states_.at(handle).done; };
  if (timeout_s < 0) {
    cv_.wait(lk, ready);
  } else if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), ready)) {
    return Status::Timeout("handle " + std::to_string(handle) + " not done after " +
                           std::to_string(timeout_s) + " s");
  }
  Status st = states_.at(handle).status;
  states_.erase(handle);
  return st;
}

void HandleTable::Release(int64_t handle) {
  std::lock_guard<std::mutex> lk(mu_);
  states_.erase(handle);
}

void HandleTable::FailAll(const Status& st) {
  std::vector<DoneCallback> callbacks;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = states_.begin(); it != states_.end();) {
      State& s = it->second;
      if (s.done) {
        ++it;
      } else if (s.on_done) {
        callbacks.push_back(std::move(s.on_done));
        it = states_.erase(it);
      } else {
        s.done = true;
        s.status = st;
        ++it;
      }
    }
  }
  cv_.notify_all();
  for (auto& cb : callbacks) cb(st);
}

size_t HandleTable::open_handles() {
  std::lock_guard<std::mutex> lk(mu_);
  return states_.size();
}

}  // namespace byteps
