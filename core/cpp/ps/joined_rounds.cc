// Horovod's join on the summation service (docs/collectives.md, "Join"): a worker machine that
// has joined pushes nothing more until every machine has joined, and the rounds of every
// synchronous key complete without it, as if it had pushed nothing (Horovod's zeros to a sum;
// min, max and product combine the others' values only). Part of SummationEngine
// (ps/summation_engine.h); SetJoined runs on the caller's thread, HandleJoinChanged on the key's
// engine thread, after the events queued for it: so a push that arrived before the join was
// announced still counts, and one that arrives after it was lifted is expected again.
#include <algorithm>
#include <cstdint>

#include "common/logging.h"
#include "ps/summation_engine.h"

namespace byteps {

void SummationEngine::SetJoined(const std::vector<int>& workers) {
  std::vector<bool> now(num_worker_, false);
  for (int w : workers)
    if (w >= 0 && w < num_worker_) now[w] = true;
  bool any = false;
  for (int w = 0; w < num_worker_; ++w) {
    joined_[w].store(now[w]);
    any = any || now[w];
  }
  any_joined_.store(any);
  BPS_LOG(DEBUG) << Name() << ": " << workers.size() << " worker machines have joined";
  std::vector<RoundKey*> keys;
  {
    std::shared_lock<std::shared_mutex> lk(keys_mu_);
    for (auto& [k, ks] : keys_)
      if (!ks->async) keys.push_back(ks.get());
  }
  for (RoundKey* ks : keys) Dispatch(Event{EventType::kJoinChanged, false, ks, 0, 0});
}

int SummationEngine::ExpectedNow(const RoundKey* ks) const {
  if (!any_joined_.load(std::memory_order_relaxed)) return ks->expected;
  int n = 0;
  for (int w : ks->senders) n += joined_[w].load(std::memory_order_relaxed) ? 0 : 1;
  return n;
}

void SummationEngine::HandleJoinChanged(const Event& ev) {
  RoundKey* ks = ev.ks;
  const int need = ExpectedNow(ks);
  for (int p = 0; p < 2; ++p)
    if (ks->count[p] > 0 && !ks->complete[p] && ks->count[p] >= need)
      SumComplete(ks, p, ks->count[p], ks->first_push_ns[p]);
}

}  // namespace byteps
