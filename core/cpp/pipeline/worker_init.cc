// Worker set-up and tear-down: configuration, local rendezvous, joining the job, stage plan.
#include <cstdint>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm/socket_util.h"
#include "common/logging.h"
#include "pipeline/worker.h"

namespace byteps {

Status LoadWorkerConfig(const Knobs& k, WorkerConfig* cfg) {
  if (k.Str("DMLC_ROLE") != "worker")
    return Status::Config("DMLC_ROLE=" + k.Str("DMLC_ROLE") +
                          ": this process calls the worker API, so DMLC_ROLE must be 'worker' "
                          "(servers and the scheduler run `python -m byteps.server`)");
  cfg->num_worker = static_cast<int>(k.Int("DMLC_NUM_WORKER"));
  cfg->num_server = static_cast<int>(k.Int("DMLC_NUM_SERVER"));
  cfg->worker_id = static_cast<int>(k.Int("DMLC_WORKER_ID"));
  cfg->local_size = static_cast<int>(k.Int("BYTEPS_LOCAL_SIZE"));
  cfg->local_rank = static_cast<int>(k.Int("BYTEPS_LOCAL_RANK"));
  cfg->async_mode = k.Bool("BYTEPS_ENABLE_ASYNC");
  cfg->max_staleness = static_cast<int>(k.Int("BYTEPS_ASYNC_MAX_STALENESS"));
  // Asynchronous training needs the servers (they keep the parameters), even on one machine.
  cfg->distributed =
      cfg->num_worker > 1 || k.Bool("BYTEPS_FORCE_DISTRIBUTED") || cfg->async_mode;
  if (cfg->local_rank >= cfg->local_size)
    return Status::Config("BYTEPS_LOCAL_RANK=" + std::to_string(cfg->local_rank) +
                          " must be smaller than BYTEPS_LOCAL_SIZE=" +
                          std::to_string(cfg->local_size));
  if (cfg->worker_id >= cfg->num_worker)
    return Status::Config("DMLC_WORKER_ID=" + std::to_string(cfg->worker_id) +
                          " must be smaller than DMLC_NUM_WORKER=" +
                          std::to_string(cfg->num_worker));
  if (cfg->num_worker > 1 && !k.IsSet("DMLC_WORKER_ID"))
    return Status::Config("DMLC_WORKER_ID is not set: it is required when DMLC_NUM_WORKER=" +
                          std::to_string(cfg->num_worker) + " > 1 (index of this worker machine)");
  if (cfg->distributed) {
    if (k.Str("DMLC_PS_ROOT_URI").empty())
      return Status::Config("DMLC_PS_ROOT_URI is not set: a distributed job (DMLC_NUM_WORKER=" +
                            std::to_string(cfg->num_worker) +
                            (k.Bool("BYTEPS_FORCE_DISTRIBUTED") ? ", BYTEPS_FORCE_DISTRIBUTED=1" : "") +
                            ") needs the scheduler's IP address");
    if (!k.IsSet("DMLC_PS_ROOT_PORT"))
      return Status::Config("DMLC_PS_ROOT_PORT is not set: a distributed job needs the "
                            "scheduler's TCP port");
  }
  // The synchronization scheme (docs/schemes.md).
  const std::string sync = k.Str("BYTEPS_SYNC");
  cfg->sync_auto = sync == "auto";
  if (!cfg->sync_auto && !ParseSyncScheme(sync, &cfg->sync))
    return Status::Config("BYTEPS_SYNC=" + sync + ": expected ps, ring, tree, hips or auto");
  // The width matters (and must divide the machine count) only where a tree may be used.
  const bool tree_possible = cfg->sync_auto || cfg->sync == SyncScheme::kTree;
  Status width = ResolveTreeWidth(cfg->num_worker, static_cast<int>(k.Int("BYTEPS_TREE_WIDTH")),
                                  &cfg->tree_width);
  if (!width.ok() && tree_possible) return width;
  if (!width.ok()) ResolveTreeWidth(cfg->num_worker, 0, &cfg->tree_width);
  cfg->nccl = k.Bool("BYTEPS_NCCL");
  cfg->hips_group = HipsGroupSize(cfg->num_worker, static_cast<int>(k.Int("BYTEPS_HIPS_GROUP")));
  if (cfg->async_mode && (cfg->sync_auto || cfg->sync != SyncScheme::kPs))
    return Status::Config("BYTEPS_ENABLE_ASYNC=1 needs BYTEPS_SYNC=ps (got " + sync +
                          "): the summation service's servers keep the parameters");
  const bool all_reduce_only = !cfg->sync_auto && IsCollective(cfg->sync);
  cfg->mesh = cfg->distributed && (cfg->sync_auto || IsCollective(cfg->sync));
  if (cfg->distributed && cfg->num_server < 1 && (!all_reduce_only || cfg->async_mode))
    return Status::Config(
        "DMLC_NUM_SERVER=" + std::to_string(cfg->num_server) +
        ": a distributed job needs at least one server (" +
        (cfg->async_mode ? std::string("BYTEPS_ENABLE_ASYNC=1: the servers keep the parameters")
                         : "BYTEPS_SYNC=" + sync + "; only ring and tree run without servers") +
        ")");
  cfg->root_uri = k.Str("DMLC_PS_ROOT_URI");
  cfg->root_port = static_cast<int>(k.Int("DMLC_PS_ROOT_PORT"));
  cfg->node_host = k.Str("DMLC_NODE_HOST");
  cfg->interface = k.Str("DMLC_INTERFACE");
  cfg->size = cfg->num_worker * cfg->local_size;
  int64_t global = k.Int("BYTEPS_GLOBAL_RANK");
  cfg->rank = global >= 0 ? static_cast<int>(global)
                          : cfg->worker_id * cfg->local_size + cfg->local_rank;
  // Partitions exist for the network (priority preemption, credit); a single-machine job only
  // pays their per-partition hand-offs, so unless set it uses larger ones (docs/performance.md).
  const int64_t partition_bytes = cfg->distributed || k.IsSet("BYTEPS_PARTITION_BYTES")
                                      ? k.Int("BYTEPS_PARTITION_BYTES")
                                      : kSingleMachinePartitionBytes;
  cfg->partition_bound = PartitionBound(partition_bytes, cfg->local_size);
  cfg->credit_bytes = static_cast<size_t>(k.Int("BYTEPS_SCHEDULING_CREDIT")) * cfg->partition_bound;
  cfg->register_bound = cfg->partition_bound;
  BPS_RETURN_IF_ERROR(LoadAutotuneConfig(k, cfg));
  // The user's credit is kept as given; the tuner sets its own. Otherwise the window adapts,
  // from the default credit, up to kAdaptiveCreditMaxBounds partition bounds.
  cfg->adaptive_credit = cfg->distributed && !k.IsSet("BYTEPS_SCHEDULING_CREDIT") &&
                         !cfg->autotune.enabled && cfg->credit_bytes > 0;
  cfg->credit_max_bytes = kAdaptiveCreditMaxBounds * cfg->partition_bound;
  if (cfg->autotune.enabled && (cfg->sync_auto || cfg->sync != SyncScheme::kPs))
    return Status::Config("BYTEPS_AUTOTUNE=1 works with BYTEPS_SYNC=ps only (BYTEPS_SYNC=" + sync +
                          ")");
  cfg->min_compress_bytes = static_cast<size_t>(k.Int("BYTEPS_MIN_COMPRESS_BYTES"));
  cfg->timeout_s = k.Float("BYTEPS_TIMEOUT");
  cfg->stall_warning_s = k.Float("BYTEPS_STALL_WARNING_SECONDS");
  cfg->heartbeat_interval_s = k.Float("BYTEPS_HEARTBEAT_INTERVAL");
  cfg->heartbeat_timeout_s = k.Float("BYTEPS_HEARTBEAT_TIMEOUT");
  BPS_RETURN_IF_ERROR(VanSpec::FromKnobs(k, &cfg->van));
  cfg->job = k.Str("BYTEPS_JOB_ID");
  if (cfg->job.empty()) {
    cfg->job = cfg->distributed ? cfg->root_uri + "-" + std::to_string(cfg->root_port)
                                : "p" + std::to_string(getppid());
  }
  for (auto& ch : cfg->job)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '-';
  cfg->trace.on = k.Bool("BYTEPS_TRACE_ON");
  cfg->trace.start_step = static_cast<uint32_t>(k.Int("BYTEPS_TRACE_START_STEP"));
  cfg->trace.end_step = static_cast<uint32_t>(k.Int("BYTEPS_TRACE_END_STEP"));
  cfg->trace.dir = k.Str("BYTEPS_TRACE_DIR");
  if (cfg->trace.dir.empty()) cfg->trace.dir = ".";
  cfg->trace.rank = cfg->rank;
  cfg->trace.local_rank = cfg->local_rank;
  cfg->trace.worker_id = cfg->worker_id;
  cfg->trace.local_size = cfg->local_size;
  if (cfg->trace.on && cfg->trace.end_step <= cfg->trace.start_step)
    return Status::Config("BYTEPS_TRACE_END_STEP=" + std::to_string(cfg->trace.end_step) +
                          " must be larger than BYTEPS_TRACE_START_STEP=" +
                          std::to_string(cfg->trace.start_step) + " (the window is [start, end))");
  cfg->telemetry_on = k.Bool("BYTEPS_TELEMETRY_ON");
  cfg->telemetry_interval_s = k.Float("BYTEPS_TELEMETRY_INTERVAL");
  return Status::OK();
}

WorkerCore::WorkerCore(WorkerConfig cfg) : cfg_(std::move(cfg)) {
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
  // the root's GO and makes the call in the thread the GO came in (worker_nccl.cc).
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
  StartAutotune();
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
  coll_waiter_.Stop();
  coll_live_ = nullptr;
  coll_.reset();  // NCCL: ncclCommDestroy (a failed job's was aborted in Fatal)
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
