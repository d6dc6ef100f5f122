// The worker's watchdog thread (once a second): the stall inspector, operation timeouts, and
// the liveness of the other local processes.
//
// Stall inspector (Horovod's stall check, for a parameter server): a push_pull still in flight
// after BYTEPS_STALL_WARNING_SECONDS is logged as a warning naming the tensor, where it waits
// and the ranks that have not submitted it; after BYTEPS_TIMEOUT it fails with the same text.
// Who is missing comes from the gates (local ranks that have not signalled) and, for partitions
// waiting for their sum, from the servers: a STALL_QUERY for (key, round), answered by a
// STALL_REPORT listing the worker machines whose push has not arrived.
#include <cstdint>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "common/logging.h"
#include "pipeline/worker.h"

namespace byteps {

void WorkerCore::SendStallQueries(TensorContext* c) {
  for (auto& t : c->parts) {
    if (t->stages.pos >= t->stages.size) continue;
    if (StageTable::Row(t->stages.current()).waits != Waits::kServer) continue;
    ps_->StallQuery(t->server, t->key, c->round);
  }
}

std::string WorkerCore::StallWhere(TensorContext* c) {
  if (c->waiting_for_declare) return "waiting for the other workers to declare it";
  std::string stages;
  for (auto& t : c->parts) {
    if (t->stages.pos >= t->stages.size) continue;
    Stage s = t->stages.current();
    const StageRow& row = StageTable::Row(s);
    std::string name = row.name;
    if (gate_before_[c->plan()][static_cast<int>(s)])
      name += " (waiting for the other local processes)";
    else if (row.waits == Waits::kServer)
      name += " (waiting for server " + std::to_string(t->server) + ")";
    else if (row.waits == Waits::kPeer && t->coll) {
      std::lock_guard<std::mutex> lk(t->coll->mu);
      if (t->coll->active && t->coll->pc < t->coll->prog.ops.size())
        name += " (waiting for " + MachineText(t->coll->prog.ops[t->coll->pc].peer) + ")";
    }
    if (stages.find(name) == std::string::npos) stages += (stages.empty() ? "" : ", ") + name;
  }
  return std::to_string(c->remaining.load()) + " of " + std::to_string(c->parts.size()) +
         " partitions unfinished, at " + stages;
}

void WorkerCore::AddMachineRanks(const std::vector<int>& machines, std::set<int>* ranks) const {
  for (int w : machines)
    for (int lr = 0; lr < cfg_.local_size; ++lr) ranks->insert(w * cfg_.local_size + lr);
}

std::string WorkerCore::RankList(const std::set<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  if (text.empty()) return text;
  return std::string("rank") + (ranks.size() > 1 ? "s " : " ") + text;
}

std::string WorkerCore::NotSubmittedBy(const std::set<int>& ranks) {
  return ranks.empty() ? std::string() : "not yet submitted by " + RankList(ranks);
}

std::string WorkerCore::StallCulprits(TensorContext* c) {
  const int L = cfg_.local_size;
  std::set<int> ranks;
  bool root_waits = false, root_orders = false;
  for (auto& t : c->parts) {
    if (t->stages.pos >= t->stages.size) continue;
    Stage s = t->stages.current();
    Gate* g = gate_before_[c->plan()][static_cast<int>(s)];
    if (g && !cfg_.is_root() && g == seq_gate_[static_cast<int>(s)].get()) {
      root_orders = true;  // the local root orders the call: it knows who is missing
    } else if (g == pulled_gate_.get() && g) {
      root_waits = true;  // the local root waits for the servers: it knows who is missing
    } else if (g) {
      std::vector<int> got = g->Signalled(t->key);
      for (int lr = 0; lr < L; ++lr)
        if (lr != cfg_.local_rank && std::find(got.begin(), got.end(), lr) == got.end())
          ranks.insert(cfg_.worker_id * L + lr);
    } else if (StageTable::Row(s).waits == Waits::kServer && ps_) {
      std::vector<int> missing;
      if (ps_->StallReport(&t->pull, &missing)) AddMachineRanks(missing, &ranks);
    }
  }
  std::string text = NotSubmittedBy(ranks);
  if (root_waits)
    text += std::string(text.empty() ? "" : "; ") + "local rank 0 (rank " +
            std::to_string(cfg_.worker_id * L) + ") is waiting for the servers";
  if (root_orders)
    text += std::string(text.empty() ? "" : "; ") + "local rank 0 (rank " +
            std::to_string(cfg_.worker_id * L) + ") has not ordered its collective call yet";
  return text;
}

std::set<int> WorkerCore::LeftWorkersMissing(TensorContext* c) {
  std::set<int> left;
  ps_->LeftWorkers(&left, nullptr);
  std::vector<int> machines, missing;
  for (auto& t : c->parts) {
    if (t->stages.pos >= t->stages.size) continue;
    if (StageTable::Row(t->stages.current()).waits != Waits::kServer) continue;
    if (!ps_->StallReport(&t->pull, &missing)) continue;
    for (int m : missing)
      if (left.count(m) && std::find(machines.begin(), machines.end(), m) == machines.end())
        machines.push_back(m);
  }
  std::set<int> ranks;
  AddMachineRanks(machines, &ranks);
  return ranks;
}

void WorkerCore::CheckLeftWorkers(std::chrono::steady_clock::time_point now) {
  std::chrono::steady_clock::time_point left_at;
  if (!ps_->LeftWorkers(nullptr, &left_at)) return;
  // A left worker flushed its pushes before it finalized; a second's grace lets the last of
  // them reach the servers before they are asked who is missing.
  if (now - left_at < std::chrono::seconds(1)) return;
  std::vector<TensorContext*> ask, doomed;
  {
    std::lock_guard<std::mutex> lk(ctx_mu_);
    for (auto& c : contexts_) {
      std::lock_guard<std::mutex> clk(c->mu);
      if (!c->in_flight || c->waiting_for_declare) continue;
      if (c->left_queried_at <= left_at) {
        c->left_queried_at = now;
        ask.push_back(c.get());
      } else if (now - c->left_queried_at >= std::chrono::milliseconds(500)) {
        doomed.push_back(c.get());
      }
    }
  }
  for (auto* c : ask) {
    for (auto& t : c->parts) ps_->ClearStallReport(&t->pull);
    SendStallQueries(c);
  }
  for (auto* c : doomed) {
    std::set<int> ranks = LeftWorkersMissing(c);
    if (ranks.empty()) continue;
    FailOpOnMachine(c, Status::PeerLost("rank " + std::to_string(cfg_.rank) + ": push_pull of '" +
                                        c->name + "' can never finish: " + RankList(ranks) +
                                        " shut down (called shutdown() or exited) without "
                                        "submitting it; every rank must make the same push_pull "
                                        "calls"));
  }
}

void WorkerCore::WatchdogLoop() {
  int tick = 0;
  while (!threads_stop_) {
    usleep(200000);
    if (++tick % 5 != 0 || failed_) continue;
    auto now = std::chrono::steady_clock::now();
    // Ask the servers one second before the warning (or the timeout) is due, so the answer is
    // there when the text is written.
    double warn = cfg_.stall_warning_s;
    double ask_at = std::max(0.0, (warn > 0 ? std::min(warn, cfg_.timeout_s) : cfg_.timeout_s) - 1.0);
    std::vector<TensorContext*> late, query, stalled;
    {
      std::lock_guard<std::mutex> lk(ctx_mu_);
      for (auto& c : contexts_) {
        std::lock_guard<std::mutex> clk(c->mu);
        if (!c->in_flight) continue;
        double age = std::chrono::duration<double>(now - c->started).count();
        // A declaration that waits for other workers is timed out by the scheduler, whose
        // message names the missing workers; this is the backstop.
        double limit = cfg_.timeout_s + (c->waiting_for_declare ? 5.0 : 0.0);
        if (age > limit) {
          late.push_back(c.get());
          continue;
        }
        if (c->waiting_for_declare) continue;
        if (age >= ask_at && !c->stall_queried && cfg_.distributed && cfg_.is_root()) {
          c->stall_queried = true;
          query.push_back(c.get());
        }
        if (warn > 0 && age >= warn && !c->stall_warned) {
          c->stall_warned = true;
          stalled.push_back(c.get());
        }
      }
    }
    for (auto* c : query) SendStallQueries(c);
    if (cfg_.distributed && cfg_.is_root()) CheckLeftWorkers(now);
    for (auto* c : stalled) {
      std::string who = StallCulprits(c);
      BPS_LOG(WARNING) << "rank " << cfg_.rank << ": push_pull of '" << c->name
                       << "' has waited " << static_cast<int>(warn)
                       << " s (BYTEPS_STALL_WARNING_SECONDS): " << StallWhere(c)
                       << (who.empty() ? "" : "; " + who) << "; it fails after "
                       << static_cast<int>(cfg_.timeout_s) << " s (BYTEPS_TIMEOUT)";
    }
    for (auto* c : late) {
      std::string who = c->waiting_for_declare ? std::string() : StallCulprits(c);
      FinishOp(c, Status::Timeout("rank " + std::to_string(cfg_.rank) + ": push_pull of '" +
                                  c->name + "' did not finish within " +
                                  std::to_string(static_cast<int>(cfg_.timeout_s)) +
                                  " s (BYTEPS_TIMEOUT); " + StallWhere(c) +
                                  (who.empty() ? "" : "; " + who) +
                                  "; are all ranks calling push_pull on this tensor?"),
               true);
    }
    // Liveness of the other local processes.
    if (cfg_.local_size > 1) {
      LocalSignal ping;
      ping.type = static_cast<uint8_t>(LocalSignalType::kPing);
      ping.from = static_cast<uint16_t>(cfg_.local_rank);
      for (int r = 0; r < cfg_.local_size; ++r) {
        if (r == cfg_.local_rank || local_bye_[r]) continue;
        if (!channel_.Send(r, ping).ok() && !local_bye_[r] && !stopping_)
          Fatal(Status::PeerLost("worker process with local rank " + std::to_string(r) +
                                 " (rank " + std::to_string(cfg_.worker_id * cfg_.local_size + r) +
                                 ") on this machine died"));
      }
    }
  }
}

}  // namespace byteps
