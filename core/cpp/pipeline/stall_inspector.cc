// The stall inspector (stall_inspector.h): the watchdog's check of the operations in flight.
#include "pipeline/stall_inspector.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "common/logging.h"
#include "pipeline/context.h"
#include "pipeline/gate.h"
#include "pipeline/worker_config.h"
#include "ps/ps_client.h"

namespace byteps {

void AddMachineRanks(const std::vector<int>& machines, int local_size, std::set<int>* ranks) {
  for (int w : machines)
    for (int lr = 0; lr < local_size; ++lr) ranks->insert(w * local_size + lr);
}

std::string RankList(const std::set<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  if (text.empty()) return text;
  return std::string("rank") + (ranks.size() > 1 ? "s " : " ") + text;
}

std::string NotSubmittedBy(const std::set<int>& ranks) {
  return ranks.empty() ? std::string() : "not yet submitted by " + RankList(ranks);
}

std::string MachineText(int machine, int local_size) {
  const int L = local_size;
  return "worker machine " + std::to_string(machine) +
         (L == 1 ? " (rank " + std::to_string(machine) + ")"
                 : " (ranks " + std::to_string(machine * L) + "-" +
                       std::to_string(machine * L + L - 1) + ")");
}

StallInspector::StallInspector(const WorkerConfig& cfg, PsClient* ps, Hooks hooks)
    : cfg_(cfg), ps_(ps), hooks_(std::move(hooks)) {}

void StallInspector::SendStallQueries(TensorContext* c) {
  for (auto& t : c->parts) {
    if (t->stages.pos >= t->stages.size) continue;
    if (StageTable::Row(t->stages.current()).waits != Waits::kServer) continue;
    ps_->StallQuery(t->server, t->key, c->round);
  }
}

std::string StallInspector::StallWhere(TensorContext* c) {
  if (c->waiting_for_declare) return "waiting for the other workers to declare it";
  std::string stages;
  for (auto& t : c->parts) {
    if (t->stages.pos >= t->stages.size) continue;
    Stage s = t->stages.current();
    const StageRow& row = StageTable::Row(s);
    std::string name = row.name;
    if (hooks_.gate_at(c, s).gate)
      name += " (waiting for the other local processes)";
    else if (row.waits == Waits::kServer)
      name += " (waiting for server " + std::to_string(t->server) + ")";
    else if (row.waits == Waits::kPeer && t->coll) {
      std::lock_guard<std::mutex> lk(t->coll->mu);
      if (t->coll->active && t->coll->pc < t->coll->prog.ops.size())
        name += " (waiting for " +
                MachineText(t->coll->prog.ops[t->coll->pc].peer, cfg_.local_size) + ")";
    }
    if (stages.find(name) == std::string::npos) stages += (stages.empty() ? "" : ", ") + name;
  }
  return std::to_string(c->remaining.load()) + " of " + std::to_string(c->parts.size()) +
         " partitions unfinished, at " + stages;
}

std::string StallInspector::StallCulprits(TensorContext* c) {
  const int L = cfg_.local_size;
  std::set<int> ranks;
  bool root_waits = false, root_orders = false;
  for (auto& t : c->parts) {
    if (t->stages.pos >= t->stages.size) continue;
    Stage s = t->stages.current();
    const StallGate g = hooks_.gate_at(c, s);
    if (g.kind == StallGate::kRootOrders) {
      root_orders = true;  // the local root orders the call: it knows who is missing
    } else if (g.kind == StallGate::kRootPulls) {
      root_waits = true;  // the local root waits for the servers: it knows who is missing
    } else if (g.gate) {
      std::vector<int> got = g.gate->Signalled(t->key);
      for (int lr = 0; lr < L; ++lr)
        if (lr != cfg_.local_rank && std::find(got.begin(), got.end(), lr) == got.end())
          ranks.insert(cfg_.worker_id * L + lr);
    } else if (StageTable::Row(s).waits == Waits::kServer && ps_) {
      std::vector<int> missing;
      if (ps_->StallReport(&t->pull, &missing)) AddMachineRanks(missing, L, &ranks);
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

std::set<int> StallInspector::LeftWorkersMissing(TensorContext* c) {
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
  AddMachineRanks(machines, cfg_.local_size, &ranks);
  return ranks;
}

void StallInspector::CheckLeftWorkers(std::chrono::steady_clock::time_point now) {
  std::chrono::steady_clock::time_point left_at;
  if (!ps_->LeftWorkers(nullptr, &left_at)) return;
  // A left worker flushed its pushes before it finalized; a second's grace lets the last of
  // them reach the servers before they are asked who is missing.
  if (now - left_at < std::chrono::seconds(1)) return;
  std::vector<TensorContext*> ask, doomed;
  hooks_.for_each_tensor([&](TensorContext* c) {
    std::lock_guard<std::mutex> clk(c->mu);
    if (!c->in_flight || c->waiting_for_declare) return;
    if (c->left_queried_at <= left_at) {
      c->left_queried_at = now;
      ask.push_back(c);
    } else if (now - c->left_queried_at >= std::chrono::milliseconds(500)) {
      doomed.push_back(c);
    }
  });
  for (auto* c : ask) {
    for (auto& t : c->parts) ps_->ClearStallReport(&t->pull);
    SendStallQueries(c);
  }
  for (auto* c : doomed) {
    std::set<int> ranks = LeftWorkersMissing(c);
    if (ranks.empty()) continue;
    hooks_.fail_op_on_machine(
        c, Status::PeerLost("rank " + std::to_string(cfg_.rank) + ": push_pull of '" + c->name +
                            "' can never finish: " + RankList(ranks) +
                            " shut down (called shutdown() or exited) without submitting it; "
                            "every rank must make the same push_pull calls"));
  }
}

void StallInspector::Check(std::chrono::steady_clock::time_point now) {
  // Ask the servers one second before the warning (or the timeout) is due, so the answer is
  // there when the text is written.
  double warn = cfg_.stall_warning_s;
  double ask_at = std::max(0.0, (warn > 0 ? std::min(warn, cfg_.timeout_s) : cfg_.timeout_s) - 1.0);
  std::vector<TensorContext*> late, query, stalled;
  hooks_.for_each_tensor([&](TensorContext* c) {
    std::lock_guard<std::mutex> clk(c->mu);
    if (!c->in_flight) return;
    double age = std::chrono::duration<double>(now - c->started).count();
    // A declaration that waits for other workers is timed out by the scheduler, whose
    // message names the missing workers; this is the backstop.
    double limit = cfg_.timeout_s + (c->waiting_for_declare ? 5.0 : 0.0);
    if (age > limit) {
      late.push_back(c);
      return;
    }
    if (c->waiting_for_declare) return;
    if (age >= ask_at && !c->stall_queried && cfg_.distributed && cfg_.is_root()) {
      c->stall_queried = true;
      query.push_back(c);
    }
    if (warn > 0 && age >= warn && !c->stall_warned) {
      c->stall_warned = true;
      stalled.push_back(c);
    }
  });
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
    hooks_.fail_op(c, Status::Timeout("rank " + std::to_string(cfg_.rank) + ": push_pull of '" +
                                      c->name + "' did not finish within " +
                                      std::to_string(static_cast<int>(cfg_.timeout_s)) +
                                      " s (BYTEPS_TIMEOUT); " + StallWhere(c) +
                                      (who.empty() ? "" : "; " + who) +
                                      "; are all ranks calling push_pull on this tensor?"));
  }
}

}  // namespace byteps
