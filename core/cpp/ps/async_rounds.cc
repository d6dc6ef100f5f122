// The summation service's asynchronous mode (BYTEPS_ENABLE_ASYNC; docs/async.md; BytePS,
// OSDI'20 §5): the server keeps the parameters and every worker goes at its own pace. Part of
// SummationEngine (ps/summation_engine.h); runs on the key's engine thread, except SetAsync and
// WorkerLeft (the caller's).
//
// Per asynchronous key and worker, the worker's round is its own count of push_pulls of the key
// (the PUSH header's round: 1, 2, ...). Round 1 carries the worker's initial value: the key's
// store is made from the initialiser's (the lowest worker that has not left: worker 0, i.e. rank
// 0's machine, unless it left before pushing), and every round-1 push is answered with the store
// once it exists; the other workers' initial values are not used. Every later round carries a
// delta (the worker's parameters after its local optimizer step minus before), added to the
// store at once; the answer is the store's value after it. With BYTEPS_ASYNC_MAX_STALENESS = s
// >= 0, the answer to round r waits while r > s + the round of the slowest worker that has not
// left (its delta is in the store meanwhile), so no worker gets more than s rounds ahead.
// Workers that leave (WorkerLeft: died, or shut down) no longer count as the slowest.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "common/logging.h"
#include "ps/summation_engine.h"
#include "reduce/sum.h"

namespace byteps {

void SummationEngine::SetAsync(bool on, int64_t max_staleness) {
  async_ = on;
  max_staleness_ = max_staleness;
}

void SummationEngine::WorkerLeft(int worker) {
  if (worker < 0 || worker >= num_worker_ || left_[worker].exchange(true)) return;
  BPS_LOG(INFO) << Name() << ": worker " << worker << " left; asynchronous keys stop waiting for it";
  std::vector<RoundKey*> keys;
  {
    std::shared_lock<std::shared_mutex> lk(keys_mu_);
    for (auto& [k, ks] : keys_)
      if (ks->async) keys.push_back(ks.get());
  }
  for (RoundKey* ks : keys) Dispatch(Event{EventType::kWorkerLeft, false, ks, worker, 0});
}

int SummationEngine::Initializer() const {
  for (int w = 0; w < num_worker_; ++w)
    if (!left_[w].load()) return w;
  return -1;
}

uint32_t SummationEngine::SlowestLiveRound(const RoundKey* ks) const {
  uint32_t slowest = UINT32_MAX;
  for (int w = 0; w < num_worker_; ++w)
    if (!left_[w].load()) slowest = std::min(slowest, ks->worker_round[w]);
  return slowest;
}

bool SummationEngine::Stale(const RoundKey* ks, uint32_t round) const {
  if (max_staleness_ < 0) return false;
  const uint32_t slowest = SlowestLiveRound(ks);
  return slowest != UINT32_MAX &&
         static_cast<int64_t>(round) > static_cast<int64_t>(slowest) + max_staleness_;
}

void SummationEngine::ReplyValue(RoundKey* ks, int worker, uint32_t round) {
  if (Stale(ks, round)) {
    ks->held[worker] = round;
    return;
  }
  ks->held[worker] = 0;
  memcpy(ks->snapshot[worker], ks->sum[0], ks->len);
  ks->reply_round[worker] = round;
  sink_->SendValue(worker, *ks);
}

void SummationEngine::ReleaseHeld(RoundKey* ks) {
  if (!ks->initialized) return;
  for (int w = 0; w < num_worker_; ++w)
    if (ks->held[w] && !Stale(ks, ks->held[w])) ReplyValue(ks, w, ks->held[w]);
}

void SummationEngine::TryInitialize(RoundKey* ks) {
  if (ks->initialized) return;
  const int from = Initializer();
  if (from < 0 || !ks->init_ready[from]) return;
  memcpy(ks->sum[0], ks->staging[from].load(std::memory_order_acquire), ks->len);
  ks->initialized = true;
  ks->version = 0;
  BPS_LOG(DEBUG) << Name() << ": asynchronous key " << ks->key << " starts from worker " << from
                 << "'s value";
  for (int w = 0; w < num_worker_; ++w) {
    if (!ks->init_ready[w]) continue;
    ks->init_ready[w] = 0;
    ReplyValue(ks, w, 1);
  }
}

void SummationEngine::HandleAsyncPush(const Event& ev) {
  RoundKey* ks = ev.ks;
  const int w = ev.worker;
  if (ev.round == 1) {
    // A worker's first push_pull of the key (in this process): its initial value. A worker that
    // joins later, or starts again, gets the store as it is.
    ks->worker_round[w] = 1;
    if (ks->initialized) {
      if (ev.pull_too) ReplyValue(ks, w, 1);
    } else {
      ks->init_ready[w] = 1;
      TryInitialize(ks);
    }
    ReleaseHeld(ks);
    return;
  }
  if (!ks->initialized || ev.round <= ks->worker_round[w]) {
    BPS_LOG(ERROR) << "key " << ks->key << ": asynchronous push of round " << ev.round
                   << " from worker " << w << " after its round " << ks->worker_round[w]
                   << (ks->initialized ? "" : ", before the key's initial value") << "; ignored";
    sink_->SendError(w, Name() + ": asynchronous push of key " + std::to_string(ks->key) +
                            " round " + std::to_string(ev.round) + " out of order (worker " +
                            std::to_string(w) + "'s last round was " +
                            std::to_string(ks->worker_round[w]) + ")");
    return;
  }
  reduce::SumInto(ks->sum[0], ks->staging[w].load(std::memory_order_acquire),
                  ks->len / DTypeSize(ks->dtype), ks->dtype);
  ks->version++;
  ks->worker_round[w] = ev.round;
  if (ev.pull_too) ReplyValue(ks, w, ev.round);
  ReleaseHeld(ks);
}

void SummationEngine::HandleAsyncPull(const Event& ev) {
  RoundKey* ks = ev.ks;
  if (!ks->initialized) {
    sink_->SendError(ev.worker, Name() + ": pull of asynchronous key " + std::to_string(ks->key) +
                                    " before its initial value was pushed");
    return;
  }
  ReplyValue(ks, ev.worker, ev.round);
}

void SummationEngine::HandleAsyncStallQuery(const Event& ev) {
  RoundKey* ks = ev.ks;
  const int w = ev.worker;
  std::vector<int> missing;
  if (!ks->initialized && ks->init_ready[w]) {
    const int from = Initializer();
    if (from >= 0) missing.push_back(from);  // waits for the initial value
  } else if (ks->held[w] && ks->held[w] == ev.round) {
    // Waits for the slowest: every live worker more than the bound behind.
    for (int v = 0; v < num_worker_; ++v)
      if (!left_[v].load() &&
          static_cast<int64_t>(ks->worker_round[v]) + max_staleness_ < ev.round)
        missing.push_back(v);
  }
  sink_->SendStallReport(w, ks->key, ev.round, missing);
}

}  // namespace byteps
