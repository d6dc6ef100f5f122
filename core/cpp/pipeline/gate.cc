#include "gate.h"
#include <cstdint>

namespace byteps {

void Gate::Signal(uint64_t key, uint64_t sig, int from) {
  PartTask* release = nullptr;
  PartTask* bad = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    Entry& e = entries_[key];
    if (sig != 0) {
      if (e.waiting && e.task_sig != sig) bad = e.waiting;
      e.sig = sig;
      e.sig_from = from;
    }
    e.count++;
    e.froms.push_back(from);
    if (!bad && e.waiting && e.count >= expected_) {
      e.count -= expected_;
      e.froms.erase(e.froms.begin(), e.froms.begin() + expected_);
      release = e.waiting;
      e.waiting = nullptr;
      e.sig = 0;
    }
  }
  if (bad) mismatch_(bad, sig, from);
  if (release) release_(release);
}

void Gate::Arrive(PartTask* t, uint64_t key, uint64_t sig) {
  PartTask* release = nullptr;
  bool bad = false;
  uint64_t other = 0;
  int from = -1;
  {
    std::lock_guard<std::mutex> lk(mu_);
    Entry& e = entries_[key];
    if (e.sig != 0 && sig != 0 && e.sig != sig) {
      bad = true;
      other = e.sig;
      from = e.sig_from;
    }
    e.task_sig = sig;
    if (!bad && e.count >= expected_) {
      e.count -= expected_;
      e.froms.erase(e.froms.begin(), e.froms.begin() + expected_);
      e.sig = 0;
      release = t;
    } else if (!bad) {
      e.waiting = t;
    }
  }
  if (bad) mismatch_(t, other, from);
  if (release) release_(release);
}

std::vector<int> Gate::Signalled(uint64_t key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? std::vector<int>() : it->second.froms;
}

void Gate::Forget(uint64_t key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) it->second.waiting = nullptr;
}

}  // namespace byteps
