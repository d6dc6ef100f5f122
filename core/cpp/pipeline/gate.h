// A gate in front of a pipeline stage: a partition passes once `expected` signals for its key
// have arrived from the other local processes (upstream's "ready tables", without the polling).
// Signals may arrive before the task does; counts are consumed, not reset, so a fast peer's
// signal for the next round is kept.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace byteps {

struct PartTask;

class Gate {
 public:
  // `release` is called (outside the lock) with each task that passes.
  // `mismatch` is called when a signal's tensor signature differs from the task's.
  Gate(std::string name, int expected, std::function<void(PartTask*)> release,
       std::function<void(PartTask*, uint64_t, int)> mismatch)
      : name_(std::move(name)), expected_(expected), release_(std::move(release)),
        mismatch_(std::move(mismatch)) {}

  // A signal from local rank `from` for partition `key` (`sig` = 0: no signature check).
  void Signal(uint64_t key, uint64_t sig, int from);
  // The task reached this gate.
  void Arrive(PartTask* t, uint64_t key, uint64_t sig);
  // Drops a waiting task (its operation failed).
  void Forget(uint64_t key);
  // Local ranks whose signals for `key` have arrived and are not yet consumed (stall reports).
  std::vector<int> Signalled(uint64_t key);
  const std::string& name() const { return name_; }

 private:
  struct Entry {
    int count = 0;
    PartTask* waiting = nullptr;
    uint64_t sig = 0;
    int sig_from = -1;
    uint64_t task_sig = 0;
    std::vector<int> froms;  // senders of the counted signals, in arrival order
  };
  std::string name_;
  int expected_;
  std::function<void(PartTask*)> release_;
  std::function<void(PartTask*, uint64_t, int)> mismatch_;
  std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace byteps
