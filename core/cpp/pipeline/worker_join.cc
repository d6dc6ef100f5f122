// Horovod's join on the worker (docs/collectives.md, "Join"): JOIN with the round of every
// tensor, the names the others declare meanwhile taken under their keys, and on JOIN_DONE every
// tensor's round set to the highest any machine reached, so the next push of every tensor is
// the same round on every machine (ps/scheduler_join.cc has the scheduler's half).
#include <algorithm>
#include <chrono>

#include "common/logging.h"
#include "pipeline/worker.h"

namespace byteps {

Status WorkerCore::Join(int* last_rank) {
  if (!cfg_.distributed) {  // one machine: nobody to wait for
    *last_rank = cfg_.rank;
    return Status::OK();
  }
  const std::string why =
      cfg_.local_size > 1 ? "several worker processes per machine (BYTEPS_LOCAL_SIZE=" +
                                std::to_string(cfg_.local_size) +
                                "): a machine's processes sum their tensors before it pushes"
      : cfg_.async_mode ? std::string("asynchronous training (BYTEPS_ENABLE_ASYNC=1)")
      : tuner_          ? std::string("BYTEPS_AUTOTUNE (it re-cuts every tensor at once)")
      : cfg_.sync_auto || cfg_.sync != SyncScheme::kPs
          ? std::string("BYTEPS_SYNC other than ps: the ring, tree and HiPS all-reduces "
                        "need every machine")
          : std::string();
  if (!why.empty())
    return Status::Config("rank " + std::to_string(cfg_.rank) + ": join() is not available "
                          "with " + why);
  std::vector<std::pair<uint32_t, uint32_t>> rounds;
  {
    std::lock_guard<std::mutex> lk(ctx_mu_);
    for (auto& c : contexts_) {
      std::lock_guard<std::mutex> clk(c->mu);
      if (c->in_flight)
        return Status::InvalidArgument("rank " + std::to_string(cfg_.rank) + ": join() with '" +
                                       c->name + "' in flight; synchronize it first");
      if (c->round > 0) rounds.emplace_back(c->declared_key, c->round);
    }
  }
  {
    std::lock_guard<std::mutex> lk(join_mu_);
    join_done_ = false;
  }
  ps_->Join(
      cfg_.rank, rounds, [this](uint32_t key, const std::string& name) { AdoptTensor(key, name); },
      [this](int last, const std::vector<std::pair<uint32_t, uint32_t>>& highest) {
        {
          std::lock_guard<std::mutex> lk(ctx_mu_);
          for (auto& [key, round] : highest) {
            auto it = by_key_.find(key);
            if (it == by_key_.end()) continue;
            std::lock_guard<std::mutex> clk(it->second->mu);
            it->second->round = std::max(it->second->round, round);
          }
        }
        std::lock_guard<std::mutex> lk(join_mu_);
        join_done_ = true;
        join_last_ = last;
        join_cv_.notify_all();
      });
  std::unique_lock<std::mutex> lk(join_mu_);
  while (!join_done_) {
    if (failed_) {
      std::lock_guard<std::mutex> flk(fatal_mu_);
      return fatal_;
    }
    join_cv_.wait_for(lk, std::chrono::milliseconds(100));
  }
  *last_rank = join_last_;
  return Status::OK();
}

void WorkerCore::AdoptTensor(uint32_t key, const std::string& name) {
  std::lock_guard<std::mutex> lk(ctx_mu_);
  auto named = by_name_.find(name);
  auto keyed = by_key_.find(key);
  if (named != by_name_.end() || keyed != by_key_.end()) {
    if (named == by_name_.end() || named->second->declared_key != key)
      BPS_LOG(WARNING) << "rank " << cfg_.rank << ": the others declared '" << name
                       << "' as key " << key << " while this machine was joined, but here "
                       << "that name or key is taken; its next use fails on every rank";
    return;
  }
  MakeContextLocked(name, key);
}

}  // namespace byteps
