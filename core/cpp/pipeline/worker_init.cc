// Worker set-up and tear-down: local rendezvous, joining the job, stage plan, threads (the
// configuration is read in worker_config.cc).
#include <cstdint>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm/socket_util.h"
#include "common/logging.h"
#include "pipeline/worker.h"

namespace byteps {

WorkerCore::WorkerCore(WorkerConfig cfg)
    : cfg_(std::move(cfg)),
      nccl_(cfg_, NcclSequencer::Hooks{
                      [this](int r, const LocalSignal& s) { return channel_.Send(r, s); },
                      [this](PartTask* t, uint8_t stage) {
                        SendSignal(LocalSignalType::kCollGo, t, -1, stage);
                      },
                      [this](PartTask* t, const Status& st) { OnCopied(t, st); },
                      [this] { return failed_.load(); },
                      [this](const Status& st) {
                        // Fatal fails every operation: a thread of its own (the caller holds
                        // the tensor's lock).
                        std::lock_guard<std::mutex> lk(abort_mu_);
                        abort_threads_.emplace_back([this, st] { Fatal(st); });
                      }}) {
  timeline_.Configure(cfg_.trace);
  telemetry_.Configure(cfg_.telemetry_on, cfg_.telemetry_interval_s);
  local_bye_.reset(new std::atomic<bool>[cfg_.local_size]);
  for (int i = 0; i < cfg_.local_size; ++i) local_bye_[i] = false;
  peer_left_.reset(new std::atomic<bool>[cfg_.num_worker]);
  for (int i = 0; i < cfg_.num_worker; ++i) peer_left_[i] = false;
}

WorkerCore::~WorkerCore() { Stop(); }

void WorkerCore::BuildStagePlan() {
  int L = cfg_.local_size;
  auto release = [this](PartTask* t) {
    if (t->ctx->traced) t->trace.ready[static_cast<int>(t->stages.current())] = TraceNowNs();
    queues_[static_cast<int>(t->stages.current())]->Push(
        QueueItem{t->ctx->priority, t->key, t->part.length, t});
  };
  auto mismatch = [this](PartTask* t, uint64_t, int from) {
    TensorContext* ctx = t->ctx;
    Status st = Status::Mismatch("tensor '" + ctx->name + "' (key " +
                                 std::to_string(ctx->declared_key) + ", " + DTypeName(ctx->dtype) +
                                 ShapeString(ctx->shape) + ") on local rank " +
                                 std::to_string(cfg_.local_rank) +
                                 " differs in name, dtype, shape, compression or scheme from "
                                 "local rank " +
                                 std::to_string(from) + " (rank " +
                                 std::to_string(cfg_.worker_id * cfg_.local_size + from) + ")");
    LocalSignal s;
    s.type = static_cast<uint8_t>(LocalSignalType::kOpError);
    s.code = static_cast<uint8_t>(StatusCode::kMismatch);
    s.key = ctx->declared_key;
    strncpy(s.text, st.message().c_str(), sizeof(s.text) - 1);
    for (int r = 0; r < cfg_.local_size; ++r)
      if (r != cfg_.local_rank) channel_.Send(r, s);
    FinishOp(ctx, st, true);
  };
  if (L > 1) {
    written_gate_ = std::make_unique<Gate>("WRITTEN", L - 1, release, mismatch);
    reduced_gate_ = std::make_unique<Gate>("REDUCED", L - 1, release, mismatch);
    pulled_gate_ = std::make_unique<Gate>("PULLED", 1, release, mismatch);
  }
  Gate* const gates[kGateCount] = {nullptr, written_gate_.get(), reduced_gate_.get(),
                                   pulled_gate_.get()};  // by GateKind
  const int layout = static_cast<int>(LayoutOf(L, cfg_.distributed, cfg_.is_root()));
  const bool nccl = cfg_.nccl && L > 1;
  // A sequenced stage's gate: the root waits for the others' READY (checking their tensor's
  // signature) and queues the partition for the stage's thread; each other process waits for
  // the root's GO and makes the call in the thread the GO came in (nccl_sequencer.cc).
  auto run_now = [this](PartTask* t) {
    const int s = static_cast<int>(t->stages.current());
    if (t->ctx->traced) t->trace.ready[s] = t->trace.start[s] = TraceNowNs();
    (this->*StageTable::rows[s].run)(t);
  };
  for (const StageRow& row : StageTable::rows) {
    if (!nccl || row.nccl[layout].entry != Entry::kSequenced) continue;
    seq_gate_[static_cast<int>(row.id)] =
        cfg_.is_root() ? std::make_unique<Gate>(std::string(row.name) + " READY", L - 1, release,
                                                mismatch)
                       : std::make_unique<Gate>(std::string(row.name) + " GO", 1, run_now,
                                                mismatch);
  }
  for (int variant = 0; variant < kPlanVariants; ++variant) {  // TensorContext::plan()
    const bool compressed = variant & 1, on_device = variant & 2, all_reduce = variant & 4,
               by_nccl = variant & 8;
    if (by_nccl && (!nccl || !on_device)) continue;
    StageList& plan = plans_[variant];
    bool passed[kGateCount] = {};  // a gate already waited for earlier in this plan
    for (const StageRow& row : StageTable::rows) {
      const StageSlot& slot = by_nccl ? row.nccl[layout] : row.where[layout];
      const int s = static_cast<int>(row.id);
      if (slot.entry == Entry::kAbsent || (row.compressed_only && !compressed) ||
          (row.device_only && !on_device) || !InPlan(row.schemes, all_reduce))
        continue;
      plan.stages[plan.size++] = row.id;
      if (slot.entry == Entry::kSequenced) {
        gate_before_[variant][s] = seq_gate_[s].get();
        continue;
      }
      const int g = static_cast<int>(slot.gate);
      if (!passed[g]) gate_before_[variant][s] = gates[g];
      passed[g] = g != static_cast<int>(GateKind::kNone);
    }
  }
  for (const StageRow& row : StageTable::rows) {
    const int s = static_cast<int>(row.id);
    // One entry per stage: the plans that have a stage enter it alike (stage_table.cc checks).
    entry_[s] = row.where[layout].entry != Entry::kAbsent ? row.where[layout].entry
                : nccl                                   ? row.nccl[layout].entry
                                                         : Entry::kAbsent;
    queues_[s] = std::make_unique<ScheduledQueue>(row.name, row.credit ? cfg_.credit_bytes : 0);
  }
  if (cfg_.adaptive_credit) {
    PushWindow::Config w;
    w.start_bytes = cfg_.credit_bytes;
    w.min_bytes = cfg_.partition_bound;
    w.max_bytes = cfg_.credit_max_bytes;
    push_window_ = std::make_unique<PushWindow>(w);
  }
}

StallGate WorkerCore::GateAt(const TensorContext* ctx, Stage s) const {
  StallGate g;
  g.gate = gate_before_[ctx->plan()][static_cast<int>(s)];
  if (!g.gate) return g;
  if (!cfg_.is_root() && g.gate == seq_gate_[static_cast<int>(s)].get())
    g.kind = StallGate::kRootOrders;
  else if (g.gate == pulled_gate_.get())
    g.kind = StallGate::kRootPulls;
  else
    g.kind = StallGate::kLocalRanks;
  return g;
}

Status WorkerCore::Start() {
  SetLogIdentity("worker " + std::to_string(cfg_.rank));
  BuildStagePlan();
  if (cfg_.local_size > 1) {
    BPS_RETURN_IF_ERROR(channel_.Open(cfg_.job, cfg_.worker_id, cfg_.local_rank));
    BPS_RETURN_IF_ERROR(LocalRendezvous());  // the root joins the job inside
  } else if (cfg_.distributed) {
    BPS_RETURN_IF_ERROR(ConnectToJob());
  }
  StartThreads();
  tuner_ = Autotuner::Start(
      cfg_, Autotuner::Hooks{[this](const PushPullArgs& a) {
                               int64_t h;
                               return Enqueue(a, &h);
                             },
                             [this](size_t credit) {
                               for (const StageRow& row : StageTable::rows)
                                 if (row.credit && queues_[static_cast<int>(row.id)])
                                   queues_[static_cast<int>(row.id)]->SetCredit(credit);
                             }});
  auto plan_text = [this](int v) {
    std::string text;
    for (int i = 0; i < plans_[v].size; ++i)
      text += std::string(i ? " -> " : "") + StageName(plans_[v].stages[i]);
    return text;
  };
  if (cfg_.nccl && cfg_.local_size == 1 && cfg_.local_rank == 0)
    BPS_LOG(WARNING) << "BYTEPS_NCCL=1 does nothing with BYTEPS_LOCAL_SIZE=1: the NCCL stages sum "
                        "the device tensors of a machine's several worker processes";
  std::string stages = plan_text(0);
  if (plans_[1].size != plans_[0].size) stages += " (compressed tensors: " + plan_text(1) + ")";
  stages += " (device tensors: " + plan_text(2) + ")";
  if (plans_[10].size) stages += " (device tensors, BYTEPS_NCCL: " + plan_text(10) + ")";
  if (cfg_.mesh) stages += " (all-reduce tensors: " + plan_text(4) + ")";
  BPS_LOG(INFO) << "rank " << cfg_.rank << "/" << cfg_.size << " (worker machine "
                << cfg_.worker_id << "/" << cfg_.num_worker << ", local " << cfg_.local_rank << "/"
                << cfg_.local_size << "), " << (cfg_.distributed ? "distributed" : "single machine")
                << ", partition " << cfg_.partition_bound << " B, credit " << cfg_.credit_bytes
                << (cfg_.adaptive_credit ? " B (adaptive, up to " +
                                               std::to_string(cfg_.credit_max_bytes) + " B)"
                                         : std::string(" B"))
                << ", stages " << stages;
  return Status::OK();
}

Status WorkerCore::LocalRendezvous() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg_.timeout_s);
  LocalSignal s;
  if (!cfg_.is_root()) {
    // Say HELLO until the root answers: it may not be listening yet, or may still be finishing
    // a previous session (init after shutdown) and drop the first one.
    s.type = static_cast<uint8_t>(LocalSignalType::kHello);
    s.from = static_cast<uint16_t>(cfg_.local_rank);
    auto next_hello = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < deadline) {
      if (std::chrono::steady_clock::now() >= next_hello) {
        channel_.Send(0, s);
        next_hello = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      }
      LocalSignal r;
      if (!channel_.Recv(&r, 50)) continue;
      if (r.type == static_cast<uint8_t>(LocalSignalType::kReady)) {
        num_servers_ = static_cast<int>(r.key >> 32);  // the root's ServerPlacement()
        cpu_only_servers_ = static_cast<int>(r.key & 0xffffffffu);
        return Status::OK();
      }
      if (r.type == static_cast<uint8_t>(LocalSignalType::kInitFailed))
        return Status(static_cast<StatusCode>(r.code), std::string("local root failed: ") + r.text);
    }
    return Status::Timeout("the local root (local rank 0 of worker machine " +
                           std::to_string(cfg_.worker_id) + ") did not complete init within " +
                           std::to_string(int(cfg_.timeout_s)) + " s");
  }
  std::vector<bool> seen(cfg_.local_size, false);
  int count = 0;
  while (count < cfg_.local_size - 1) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::string missing;
      for (int r = 1; r < cfg_.local_size; ++r)
        if (!seen[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return Status::Timeout("local ranks [" + missing + "] of worker machine " +
                             std::to_string(cfg_.worker_id) + " did not start within " +
                             std::to_string(int(cfg_.timeout_s)) + " s");
    }
    LocalSignal r;
    if (!channel_.Recv(&r, 200)) continue;
    if (r.type == static_cast<uint8_t>(LocalSignalType::kHello) && r.from < cfg_.local_size &&
        !seen[r.from]) {
      seen[r.from] = true;
      count++;
    }
  }
  Status st = cfg_.distributed ? ConnectToJob() : Status::OK();
  s.type = static_cast<uint8_t>(st.ok() ? LocalSignalType::kReady : LocalSignalType::kInitFailed);
  s.code = static_cast<uint8_t>(st.code());
  s.key = (static_cast<uint64_t>(num_servers_) << 32) | static_cast<uint32_t>(cpu_only_servers_);
  strncpy(s.text, st.message().c_str(), sizeof(s.text) - 1);
  for (int r = 1; r < cfg_.local_size; ++r) channel_.Send(r, s);
  return st;
}

Status WorkerCore::ConnectToJob() {
  PsClientConfig pc;
  pc.worker_id = cfg_.worker_id;
  pc.num_worker = cfg_.num_worker;
  pc.root_uri = cfg_.root_uri;
  pc.root_port = cfg_.root_port;
  pc.heartbeat_interval_s = cfg_.heartbeat_interval_s;
  pc.heartbeat_timeout_s = cfg_.heartbeat_timeout_s;
  pc.van = cfg_.van;
  if (cfg_.mesh) {
    pc.collective = this;
    pc.mesh_peers = CollectivePeers(cfg_.num_worker, cfg_.tree_width, cfg_.worker_id);
  }
  ps_ = std::make_unique<PsClient>(
      pc, this, [this](const Status& st, bool report) { Fatal(st, report); },
      [this] { return failed_.load(); }, [this] { return stopping_.load(); });
  RegisterMsg reg;
  reg.role = NodeRole::kWorker;
  reg.worker_id = cfg_.worker_id;
  reg.host = cfg_.node_host;  // empty: the address on the route to the scheduler
  if (reg.host.empty() && !cfg_.interface.empty()) reg.host = InterfaceAddress(cfg_.interface);
  reg.local_size = static_cast<uint32_t>(cfg_.local_size);
  reg.num_worker = static_cast<uint32_t>(cfg_.num_worker);
  reg.num_server = static_cast<uint32_t>(cfg_.num_server);
  reg.partition_bound = cfg_.register_bound;
  reg.pid = static_cast<uint32_t>(getpid());
  reg.async_mode = cfg_.async_mode;
  reg.max_staleness = cfg_.max_staleness;
  BPS_RETURN_IF_ERROR(ps_->Connect(reg, cfg_.timeout_s));
  num_servers_ = ps_->num_servers();
  cpu_only_servers_ = ps_->cpu_only_servers();
  return Status::OK();
}

void WorkerCore::StartThreads() {
  // One thread per stage that this layout queues partitions for (an awaited or inline stage
  // has none).
  for (int s = 0; s < kStageCount; ++s) {
    // A sequenced stage is queued on the root; the other processes run it as the GO comes.
    if (entry_[s] != Entry::kQueued && !(entry_[s] == Entry::kSequenced && cfg_.is_root()))
      continue;
    threads_.emplace_back([this, s] { StageLoop(static_cast<Stage>(s)); });
  }
  if (cfg_.local_size > 1) threads_.emplace_back([this] { ListenLoop(); });
  stall_ = std::make_unique<StallInspector>(
      cfg_, ps_.get(),
      StallInspector::Hooks{
          [this](const std::function<void(TensorContext*)>& f) {
            std::lock_guard<std::mutex> lk(ctx_mu_);
            for (auto& c : contexts_) f(c.get());
          },
          [this](const TensorContext* c, Stage s) { return GateAt(c, s); },
          [this](TensorContext* c, const Status& st) { FinishOp(c, st, true); },
          [this](TensorContext* c, const Status& st) { FailOpOnMachine(c, st); }});
  threads_.emplace_back([this] { WatchdogLoop(); });
}

void WorkerCore::Stop() {
  if (stopping_.exchange(true)) return;
  if (push_window_)
    BPS_LOG(INFO) << "rank " << cfg_.rank << ": adaptive push window: mean "
                  << static_cast<size_t>(push_window_->mean_window()) << " B, last "
                  << push_window_->window() << " B, " << push_window_->changes() << " changes";
  handles_.FailAll(Status::Shutdown("byteps was shut down while the operation was in flight"));
  if (cfg_.local_size > 1) {
    LocalSignal s;
    s.type = static_cast<uint8_t>(LocalSignalType::kBye);
    s.from = static_cast<uint16_t>(cfg_.local_rank);
    if (!cfg_.is_root()) {
      channel_.Send(0, s);
    } else {
      // Give the other local processes a moment to finish with the root's stage loops.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < deadline && !failed_) {
        bool all = true;
        for (int r = 1; r < cfg_.local_size; ++r) all = all && local_bye_[r];
        if (all) break;
        usleep(10000);
      }
    }
  }
  if (ps_) {
    ps_->Goodbye();
    if (!failed_) {
      Status st = ps_->Finalize(cfg_.timeout_s);
      if (!st.ok()) BPS_LOG(WARNING) << "shutdown: " << st.message();
    }
  }
  threads_stop_ = true;
  for (auto& q : queues_)
    if (q) q->Close();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
  d2h_waiter_.Stop();  // after the stage threads: nothing adds to them any more
  h2d_waiter_.Stop();
  nccl_.Stop();  // NCCL: ncclCommDestroy (a failed job's was aborted in Fatal)
  {
    std::vector<std::thread> aborts;
    {
      std::lock_guard<std::mutex> lk(abort_mu_);
      aborts.swap(abort_threads_);
    }
    for (auto& t : aborts) t.join();
  }
  if (ps_) ps_->Close();
  channel_.Close();
  timeline_.Finish();  // the window never closed: write what was recorded
  for (auto& ctx : contexts_) {
    if (ctx->staging_registered) ps_->UnregisterMemory(ctx->staging.data());
    if (!ctx->shm) continue;
    if (ctx->registered) ps_->UnregisterMemory(ctx->slot(cfg_.local_size));
    if (ctx->host_registered) ctx->device->UnregisterHost(ctx->slot(cfg_.local_size));
    if (cfg_.is_root()) ctx->shm->Unlink();
    ctx->shm->Close();
  }
}

}  // namespace byteps
