// Operations: declaration, enqueueing a push_pull, moving partitions along their stage list,
// completion, failures, and a tensor cut anew for the autotuner's next point (Repartition).
#include <algorithm>
#include <cstdint>
#include <unistd.h>

#include <cstring>

#include "common/logging.h"
#include "pipeline/worker.h"

namespace byteps {

namespace {
uint64_t Fnv1a(uint64_t h, const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
}  // namespace

TensorContext* WorkerCore::MakeContextLocked(const std::string& name, uint32_t key) {
  auto ctx = std::make_unique<TensorContext>();
  ctx->name = name;
  ctx->process_set = DeclaredKeySet(key);
  ctx->declared_key = key;
  uint32_t& made = set_tensors_[ctx->process_set];
  made = std::max(made, (key & 0xffff) + 1);
  TensorContext* raw = ctx.get();
  by_key_[key] = raw;
  auto early = early_errors_.find(key);
  if (early != early_errors_.end()) raw->sticky = early->second;
  by_name_[name] = raw;
  contexts_.push_back(std::move(ctx));
  return raw;
}

Status WorkerCore::ContextOf(const std::string& name, uint32_t process_set, TensorContext** out) {
  std::lock_guard<std::mutex> lk(ctx_mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    // Keys are numbered per process set: the ranks of a set make its tensors in the same
    // order, whatever the other sets' tensors are.
    const uint32_t made = set_tensors_[process_set];
    if (made >= (1u << 16) - 1 || process_set > 0xffff)
      return Status::InvalidArgument("too many tensors declared in process set " +
                                     std::to_string(process_set) + " (at most 65535)");
    *out = MakeContextLocked(name, process_set << 16 | made);
    return Status::OK();
  }
  *out = it->second;
  if ((*out)->process_set != process_set)
    return Status::InvalidArgument("tensor '" + name + "' belongs to process set " +
                                   std::to_string((*out)->process_set) + ", not " +
                                   std::to_string(process_set));
  return Status::OK();
}

Status WorkerCore::Declare(const std::string& name, const std::string& compression,
                           uint32_t* key, const std::string& sync, uint32_t process_set) {
  if (name.empty()) return Status::InvalidArgument("tensor name must not be empty");
  SyncScheme scheme = SyncScheme::kPs;
  if (!sync.empty() && !ParseSyncScheme(sync, &scheme))
    return Status::InvalidArgument("tensor '" + name + "': sync='" + sync +
                                   "' is not a scheme (ps, ring, tree, hips)");
  std::string canonical;
  if (!compression.empty()) {
    compress::Kwargs kw;
    Status st = compress::ParseSpec(compression, &kw);
    if (st.ok()) st = compress::Validate(kw, DType::kFloat32);  // the dtype: at first use
    if (!st.ok())
      return Status::InvalidArgument("tensor '" + name + "': compression: " + st.message());
    canonical = compress::FormatSpec(kw);
  }
  TensorContext* ctx;
  BPS_RETURN_IF_ERROR(ContextOf(name, process_set, &ctx));
  *key = ctx->declared_key;
  std::lock_guard<std::mutex> lk(ctx->mu);
  if (!sync.empty() && !(ctx->sync_declared && ctx->sync == scheme)) {
    if (ctx->initialized || ctx->sync_declared)
      return Status::InvalidArgument(
          "tensor '" + name + "' is already " +
          (ctx->sync_declared ? "declared with sync=" + std::string(SyncSchemeName(ctx->sync))
                              : std::string("in use with sync=") + SyncSchemeName(ctx->sync)) +
          "; declare its scheme once, before its first push_pull");
    ctx->sync = scheme;
    ctx->sync_declared = true;
  }
  if (canonical.empty()) return Status::OK();  // declaring again without one changes nothing
  if (canonical == ctx->compression) return Status::OK();
  if (ctx->initialized || !ctx->compression.empty())
    return Status::InvalidArgument(
        "tensor '" + name + "' is already " +
        (ctx->compression.empty() ? std::string("in use without compression")
                                  : "declared with compression '" + ctx->compression + "'") +
        "; declare its compressor once, before its first push_pull");
  ctx->compression = canonical;
  return Status::OK();
}

uint32_t WorkerCore::Rounds(const std::string& name) {
  TensorContext* ctx;
  {
    std::lock_guard<std::mutex> lk(ctx_mu_);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return 0;
    ctx = it->second;
  }
  std::lock_guard<std::mutex> lk(ctx->mu);
  return ctx->round;
}

std::vector<std::string> WorkerCore::DeclaredNames() {
  std::lock_guard<std::mutex> lk(ctx_mu_);
  std::vector<std::string> names;
  for (auto& c : contexts_) names.push_back(c->name);
  return names;
}

Status WorkerCore::InitContext(TensorContext* ctx, const PushPullArgs& a) {
  std::vector<Partition> parts;
  // BYTEPS_AUTOTUNE: the bound of the point in use (docs/autotune.md).
  ctx->job_bound = tuner_ ? tuner_->bound() : cfg_.partition_bound;
  if (tuner_) ctx->tune_epoch = tuner_->epoch();
  ctx->dtype = a.dtype;
  ctx->shape = a.shape;
  ctx->nbytes = a.nbytes;
  ctx->op = a.op;
  ctx->layout = a.layout;
  BPS_RETURN_IF_ERROR(CheckProcessSet(a));
  ctx->set_machines = a.set_machines;
  ctx->set_size = a.set_size;
  const int machines = a.set_machines.empty() ? cfg_.num_worker
                                              : static_cast<int>(a.set_machines.size());
  BPS_RETURN_IF_ERROR(ValidateLayout(a.layout, machines, a.nbytes, DTypeSize(a.dtype), a.name));
  BPS_RETURN_IF_ERROR(DecideCompression(ctx));
  if (ctx->compressed && ctx->op != reduce::ReduceOp::kSum)
    return Status::InvalidArgument("tensor '" + a.name + "' is compressed ('" +
                                   ctx->compression + "'): compressors sum or average, not " +
                                   reduce::ReduceOpName(ctx->op));
  const size_t bound = cfg_.distributed
                           ? TensorPartitionBound(a.nbytes, ctx->job_bound, cfg_.num_worker,
                                                  cfg_.local_size, ctx->compressed)
                           : ctx->job_bound;
  BPS_RETURN_IF_ERROR(PartitionTensor(a.nbytes, bound, DTypeSize(a.dtype), &parts));
  BPS_RETURN_IF_ERROR(DecideSync(ctx));
  ctx->async_param = cfg_.async_mode && a.name.rfind(kAsyncParamPrefix, 0) == 0;
  if (ctx->async_param && ctx->layout.kind != Collective::kAllreduce)
    return Status::InvalidArgument("tensor '" + a.name + "' is an asynchronous parameter "
                                   "(BYTEPS_ENABLE_ASYNC=1): only push_pull adds deltas, not " +
                                   CollectiveName(ctx->layout.kind));
  if (ctx->async_param && ctx->op != reduce::ReduceOp::kSum)
    return Status::InvalidArgument("tensor '" + a.name + "' is an asynchronous parameter "
                                   "(BYTEPS_ENABLE_ASYNC=1): the servers add deltas, so op " +
                                   reduce::ReduceOpName(ctx->op) + " is refused");
  if (ctx->async_param && ctx->compressed)
    return Status::InvalidArgument("tensor '" + a.name + "' is an asynchronous parameter "
                                   "(BYTEPS_ENABLE_ASYNC=1): it cannot be compressed");
  if (ctx->async_param && ctx->sync != SyncScheme::kPs)
    return Status::InvalidArgument("tensor '" + a.name + "' is an asynchronous parameter "
                                   "(BYTEPS_ENABLE_ASYNC=1): only the summation service keeps "
                                   "parameters, not BYTEPS_SYNC=" + SyncSchemeName(ctx->sync));
  BPS_RETURN_IF_ERROR(InitDevice(ctx, a));
  // A lone process's device tensor: pushes leave from and sums land in its pinned buffer.
  if (ctx->device && cfg_.local_size == 1 && cfg_.distributed && a.nbytes > 0)
    ctx->staging_registered = ps_->RegisterMemory(ctx->staging.data(), a.nbytes).ok();
  uint64_t h = Fnv1a(1469598103934665603ull, a.name.data(), a.name.size());
  uint8_t dt = static_cast<uint8_t>(a.dtype);
  h = Fnv1a(h, &dt, 1);
  h = Fnv1a(h, a.shape.data(), a.shape.size() * sizeof(int64_t));
  // Local processes that disagree on compressing it would disagree on averaging it.
  if (ctx->compressed) h = Fnv1a(h, ctx->compression.data(), ctx->compression.size());
  // ... and on its scheme, on where its sum comes from.
  if (ctx->sync != SyncScheme::kPs) {
    const uint8_t sync = static_cast<uint8_t>(ctx->sync);
    h = Fnv1a(h, &sync, 1);
  }
  // ... and on how it is reduced.
  if (ctx->op != reduce::ReduceOp::kSum) {
    const uint8_t op = static_cast<uint8_t>(ctx->op);
    h = Fnv1a(h, &op, 1);
  }
  // ... and on which collective it is, and its layout.
  if (ctx->layout.kind != Collective::kAllreduce) {
    const uint8_t kind = static_cast<uint8_t>(ctx->layout.kind);
    h = Fnv1a(h, &kind, 1);
    h = Fnv1a(h, &ctx->layout.root, sizeof(ctx->layout.root));
    h = Fnv1a(h, &ctx->layout.root_rank, sizeof(ctx->layout.root_rank));
    h = Fnv1a(h, ctx->layout.blocks.data(), ctx->layout.blocks.size() * sizeof(uint64_t));
  }
  // ... and on its process set.
  if (ctx->process_set != 0) {
    h = Fnv1a(h, &ctx->process_set, sizeof(ctx->process_set));
    h = Fnv1a(h, ctx->set_machines.data(), ctx->set_machines.size() * sizeof(int));
  }
  // ... and on where it is summed (NCCL or host memory).
  if (ctx->nccl) h = Fnv1a(h, "nccl", 4);
  ctx->sig = h | 1;  // never 0 (0 means "no signature")
  MakeTasks(ctx, parts);
  if (ctx->all_reduce && cfg_.is_root()) SetUpCollective(ctx);
  // An NCCL tensor of a single machine never leaves its GPUs.
  if (cfg_.local_size > 1 && a.nbytes > 0 && (!ctx->nccl || cfg_.distributed)) {
    ctx->region = (a.nbytes + 63) / 64 * 64;
    ctx->shm = std::make_unique<ShmSegment>();
    BPS_RETURN_IF_ERROR(ctx->shm->Open(ShmName(cfg_.job, cfg_.worker_id, ctx->declared_key),
                                       ctx->region * static_cast<size_t>(cfg_.local_size + 2)));
    // An NCCL tensor's shards are copied straight into the aggregates: page-locked in place.
    if (ctx->nccl) {
      BPS_RETURN_IF_ERROR(ctx->device->RegisterHost(ctx->slot(cfg_.local_size), 2 * ctx->region));
      ctx->host_registered = true;
    }
    // The aggregates are what the local root pushes from and pulls into, every round.
    if (cfg_.distributed && cfg_.is_root())
      ctx->registered = ps_->RegisterMemory(ctx->slot(cfg_.local_size), 2 * ctx->region).ok();
  }
  if (!cfg_.distributed || !cfg_.is_root()) ctx->declared = true;
  if (cfg_.distributed && cfg_.is_root()) {
    std::vector<uint64_t> keys;
    for (auto& t : ctx->parts) keys.push_back(t->key);
    ps_->ReservePulls(keys);  // no rehash in steady state
  }
  ctx->initialized = true;
  return Status::OK();
}

void WorkerCore::MakeTasks(TensorContext* ctx, const std::vector<Partition>& parts) {
  for (auto& p : parts) {
    auto t = std::make_unique<PartTask>();
    t->owner = this;
    t->ctx = ctx;
    t->part = p;
    t->key = PartitionKey(ctx->declared_key, p.index, ctx->key_gen);
    t->pull.key = t->key;
    t->pull.arg = t.get();
    ctx->parts.push_back(std::move(t));
  }
}

Status WorkerCore::Repartition(TensorContext* ctx) {
  ctx->tune_epoch = tuner_->epoch();
  // A compressed tensor keeps its cut (its partitions' compressors carry state across rounds);
  // the measurement's tensor too.
  if (ctx->compressed || !cfg_.distributed || !cfg_.is_root() || ctx->name == kAutotuneTensor ||
      ctx->layout.kind != Collective::kAllreduce)
    return Status::OK();
  const size_t job_bound = tuner_->bound();
  std::vector<Partition> parts;
  BPS_RETURN_IF_ERROR(PartitionTensor(
      ctx->nbytes, TensorPartitionBound(ctx->nbytes, job_bound, cfg_.num_worker, cfg_.local_size),
      DTypeSize(ctx->dtype), &parts));
  bool same = parts.size() == ctx->parts.size();
  for (size_t i = 0; same && i < parts.size(); ++i)
    same = parts[i].length == ctx->parts[i]->part.length;
  if (same) return Status::OK();  // the same cut (a small tensor): same keys, no re-declaration
  for (auto& t : ctx->parts) ctx->retired.push_back(std::move(t));
  ctx->parts.clear();
  ctx->key_gen++;
  ctx->job_bound = job_bound;
  MakeTasks(ctx, parts);
  std::vector<uint64_t> keys;
  for (auto& t : ctx->parts) keys.push_back(t->key);
  ps_->ReservePulls(keys);
  ctx->declared = false;  // the next push_pull declares the new cut
  ctx->declare_sent = false;
  return Status::OK();
}

Status WorkerCore::Enqueue(const PushPullArgs& a, int64_t* handle) {
  if (failed_) {
    std::lock_guard<std::mutex> lk(fatal_mu_);
    return Status(fatal_.code(), fatal_.message() + " (push_pull of '" + a.name + "' refused)");
  }
  if (stopping_) return Status::Shutdown("byteps is shutting down");
  if (a.name.empty()) return Status::InvalidArgument("tensor name must not be empty");
  size_t elems = 1;
  for (int64_t d : a.shape) {
    if (d < 0) return Status::InvalidArgument("negative dimension in shape " + ShapeString(a.shape));
    elems *= static_cast<size_t>(d);
  }
  if (elems * DTypeSize(a.dtype) != a.nbytes)
    return Status::InvalidArgument("tensor '" + a.name + "': " + std::to_string(a.nbytes) +
                                   " bytes do not match shape " + ShapeString(a.shape) + " of " +
                                   DTypeName(a.dtype));
  if (a.nbytes > 0 && (!a.input || !a.output))
    return Status::InvalidArgument("tensor '" + a.name + "': null buffer");
  if (a.op != reduce::ReduceOp::kSum && a.average)
    return Status::InvalidArgument("tensor '" + a.name + "': average applies to op sum only, "
                                   "not " + reduce::ReduceOpName(a.op));
  const Collective kind = a.layout.kind;
  if ((kind == Collective::kAllgather || kind == Collective::kBroadcast) &&
      (a.average || a.op != reduce::ReduceOp::kSum))
    return Status::InvalidArgument("tensor '" + a.name + "': " + CollectiveName(kind) +
                                   " combines nothing: average=False and op sum");
  TensorContext* ctx;
  BPS_RETURN_IF_ERROR(ContextOf(a.name, a.process_set, &ctx));
  if (tuner_ && !tuner_->done()) {
    uint32_t round;
    {
      std::lock_guard<std::mutex> lk(ctx->mu);
      round = ctx->round;
    }
    tuner_->OnEnqueue(ctx, round);  // may wait for the trial's measurement (docs/autotune.md)
  }
  std::unique_lock<std::mutex> lk(ctx->mu);
  if (!ctx->sticky.ok()) return ctx->sticky;
  if (ctx->in_flight)
    return Status::InvalidArgument("a push_pull of tensor '" + a.name +
                                   "' is already in flight; synchronize it before starting "
                                   "another one with the same name");
  if (!ctx->initialized) {
    BPS_RETURN_IF_ERROR(InitContext(ctx, a));
  } else if (tuner_ && ctx->tune_epoch != tuner_->epoch() && ctx->dtype == a.dtype &&
             ctx->shape == a.shape) {
    BPS_RETURN_IF_ERROR(Repartition(ctx));
  } else if (ctx->dtype != a.dtype || ctx->shape != a.shape) {
    return Status::InvalidArgument("tensor '" + a.name + "' was first used as " +
                                   DTypeName(ctx->dtype) + ShapeString(ctx->shape) +
                                   " and is now " + DTypeName(a.dtype) + ShapeString(a.shape));
  }
  if (ctx->layout.kind != a.layout.kind || ctx->layout.blocks != a.layout.blocks ||
      ctx->layout.root != a.layout.root || ctx->layout.root_rank != a.layout.root_rank)
    return Status::InvalidArgument(
        "tensor '" + a.name + "' was first used as " + CollectiveName(ctx->layout.kind) +
        (ctx->layout.kind == a.layout.kind ? " with another layout (blocks or root)" : "") +
        " and now as " + CollectiveName(a.layout.kind) +
        "; a name keeps one collective and layout (use another name)");
  if (ctx->op != a.op)
    return Status::InvalidArgument("tensor '" + a.name + "' was first reduced with op " +
                                   reduce::ReduceOpName(ctx->op) + " and now with op " +
                                   reduce::ReduceOpName(a.op) +
                                   "; a tensor name keeps one op (use another name)");
  if (ctx->async_param && a.average)
    return Status::InvalidArgument("tensor '" + a.name + "' is an asynchronous parameter "
                                   "(BYTEPS_ENABLE_ASYNC=1): the servers add every worker's "
                                   "delta, so it is pushed with average=False");
  if (ctx->device_kind != a.device_kind || ctx->device_id != a.device_id)
    return Status::InvalidArgument(
        "tensor '" + a.name + "' was first used on " + device::KindName(ctx->device_kind) +
        (ctx->device ? ":" + std::to_string(ctx->device_id) : "") + " and is now on " +
        device::KindName(a.device_kind) +
        (a.device_kind != device::Kind::kHost ? ":" + std::to_string(a.device_id) : ""));
  if (ctx->nccl && !cfg_.distributed && a.average && !DTypeIsFloat(ctx->dtype))
    return Status::InvalidArgument(
        "tensor '" + a.name + "': the NCCL stages average floating-point tensors only (NCCL "
        "divides on the GPU); push_pull " + DTypeName(ctx->dtype) + " with average=False, or "
        "set BYTEPS_NCCL=0 to sum it in host memory");
  ctx->in_flight = true;
  ctx->handle = handles_.Create(a.on_done);
  ctx->round++;
  ctx->input = a.input;
  ctx->output = a.output;
  if (ctx->device) {  // the stages between the copies work in the pinned host buffer
    ctx->device_input = a.input;
    ctx->device_output = a.output;
    ctx->input = ctx->output = ctx->staging.data();  // none for an NCCL tensor
    ctx->ready_event = a.ready_event;
  }
  ctx->average = a.average;
  ctx->priority = a.has_priority ? a.priority : -static_cast<int64_t>(ctx->declared_key);
  ctx->remaining = static_cast<int>(ctx->parts.size());
  ctx->started = std::chrono::steady_clock::now();
  ctx->stall_queried = ctx->stall_warned = false;
  ctx->traced = timeline_.InWindow(ctx->round - 1);  // its step: rounds completed before it
  if (ctx->traced)
    for (auto& t : ctx->parts) t->trace.Reset();
  *handle = ctx->handle;
  if (ctx->parts.empty()) {
    ctx->in_flight = false;
    lk.unlock();  // MarkDone may run a completion callback
    handles_.MarkDone(*handle, Status::OK());
    return Status::OK();
  }
  if (!ctx->declared) {
    ctx->waiting_for_declare = true;
    if (!ctx->declare_sent) {
      ctx->declare_sent = true;
      SendDeclare(ctx);
    }
    return Status::OK();
  }
  lk.unlock();
  for (auto& t : ctx->parts) {
    t->stages = plans_[ctx->plan()];
    Dispatch(t.get());
  }
  return Status::OK();
}

void WorkerCore::Dispatch(PartTask* t) {
  const int s = static_cast<int>(t->stages.current());
  if (t->ctx->traced) {
    const int64_t now = TraceNowNs();
    t->trace.enter[s] = now;
    if (entry_[s] == Entry::kInline) t->trace.start[s] = now;
  }
  switch (entry_[s]) {
    case Entry::kAwaited: return;  // the previous stage's work completes it (stage_table.h)
    case Entry::kInline: return (this->*StageTable::rows[s].run)(t);
    default: break;
  }
  Gate* g = gate_before_[t->ctx->plan()][s];
  if (entry_[s] == Entry::kSequenced) {  // the local root orders it (nccl_sequencer.cc)
    g->Arrive(t, t->key, cfg_.is_root() ? t->ctx->sig : 0);
    if (!cfg_.is_root()) SendSignal(LocalSignalType::kCollReady, t, 0, static_cast<uint8_t>(s));
    return;
  }
  if (g) {
    g->Arrive(t, t->key, g == written_gate_.get() ? t->ctx->sig : 0);
    return;
  }
  // PUSH: among equal priorities, in this worker machine's rotation of the tensor's partitions;
  // REDUCE_SCATTER: in the collective's order (coll_position).
  const uint64_t order =
      t->stages.current() == Stage::kPush
          ? PartitionKey(t->ctx->declared_key,
                         StaggeredPushPosition(t->part.index, t->ctx->parts.size(),
                                               cfg_.worker_id))
      : t->stages.current() == Stage::kReduceScatter && t->coll
          ? PartitionKey(t->ctx->declared_key, t->coll_position)
          : t->key;
  queues_[s]->Push(QueueItem{t->ctx->priority, order,
                             t->stages.current() == Stage::kPush ? PushBytes(t) : t->part.length,
                             t});
}

void WorkerCore::Proceed(PartTask* t) {
  if (t->ctx->traced) t->trace.end[static_cast<int>(t->stages.current())] = TraceNowNs();
  if (++t->stages.pos >= t->stages.size) return PartitionDone(t);
  Dispatch(t);
}

void WorkerCore::PartitionDone(PartTask* t) {
  TensorContext* ctx = t->ctx;
  // Before the count: once the last partition is counted, the next operation may reuse t.
  if (ctx->traced) timeline_.RecordPartition(*t);
  if (ctx->remaining.fetch_sub(1) == 1) {
    if (ctx->traced || telemetry_.on()) OpCompleted(ctx);
    FinishOp(ctx, Status::OK(), false);
  }
}

void WorkerCore::OpCompleted(TensorContext* ctx) {
  if (!ctx->in_flight) return;  // failed meanwhile
  const int64_t now = TraceNowNs();
  const int64_t start =
      std::chrono::duration_cast<std::chrono::nanoseconds>(ctx->started.time_since_epoch())
          .count();
  if (ctx->traced) timeline_.RecordTensor(*ctx, start, now);
  if (telemetry_.on()) {
    ctx->done_count.fetch_add(1, std::memory_order_relaxed);
    ctx->done_bytes.fetch_add(ctx->nbytes, std::memory_order_relaxed);
    ctx->done_ns.fetch_add(static_cast<uint64_t>(now - start), std::memory_order_relaxed);
    telemetry_.Record(ctx->nbytes, now);
  }
}

std::vector<WorkerCore::TensorTelemetry> WorkerCore::TensorTelemetries() {
  std::vector<TensorTelemetry> out;
  std::lock_guard<std::mutex> lk(ctx_mu_);
  for (auto& c : contexts_) {
    const uint64_t n = c->done_count.load(std::memory_order_relaxed);
    if (n == 0) continue;
    out.push_back(TensorTelemetry{c->name, c->done_bytes.load(std::memory_order_relaxed), n,
                                  c->done_ns.load(std::memory_order_relaxed)});
  }
  return out;
}

void WorkerCore::FinishOp(TensorContext* ctx, const Status& st, bool sticky) {
  int64_t h;
  {
    std::lock_guard<std::mutex> lk(ctx->mu);
    if (sticky && ctx->sticky.ok()) ctx->sticky = st;
    if (!ctx->in_flight) return;
    ctx->in_flight = false;
    h = ctx->handle;
  }
  if (!st.ok()) {
    // No late pull response may write into the caller's buffers after we report the failure.
    if (ps_) {
      std::vector<PendingPull*> pulls, unacked;
      for (auto& t : ctx->parts) pulls.push_back(&t->pull);
      ps_->CancelPulls(pulls, cfg_.timeout_s, &unacked);
      for (PendingPull* p : unacked) {
        auto* t = static_cast<PartTask*>(p->arg);
        queues_[static_cast<int>(Stage::kPush)]->ReturnCredit(PushBytes(t));
        if (push_window_) push_window_->OnLost(t->server, PushBytes(t));
      }
    }
    if (ctx->all_reduce) CancelCollective(ctx);
    // An NCCL tensor's calls may be in flight here or on another local process, which would
    // wait for this one's forever: the communicator is aborted, and with it the job (the
    // machine's processes can no longer keep one order of calls; docs/gpu.md).
    if (ctx->nccl) nccl_.Abort(st.message());
    DrainDeviceCopies(ctx);
    BPS_LOG(DEBUG) << "push_pull of '" << ctx->name << "' failed: " << st.message();
  }
  handles_.MarkDone(h, st);
}

void WorkerCore::FailOpOnMachine(TensorContext* ctx, const Status& st) {
  LocalSignal s;
  s.type = static_cast<uint8_t>(LocalSignalType::kOpError);
  s.code = static_cast<uint8_t>(st.code());
  s.key = ctx->declared_key;
  strncpy(s.text, st.message().c_str(), sizeof(s.text) - 1);
  for (int r = 1; r < cfg_.local_size; ++r) channel_.Send(r, s);
  FinishOp(ctx, st, true);
}

void WorkerCore::Fatal(const Status& st, bool report) {
  {
    std::lock_guard<std::mutex> lk(fatal_mu_);
    if (failed_) return;
    fatal_ = Status(st.code(), "rank " + std::to_string(cfg_.rank) + ": " + st.message());
    failed_ = true;
  }
  BPS_LOG(ERROR) << fatal_.message();
  // The collective calls in flight would wait for a process that is gone: they end now, before
  // the failed operations wait for their device work.
  nccl_.Abort(fatal_.message());
  if (report && ps_) ps_->ReportFailure(fatal_.message());
  if (cfg_.local_size > 1) {
    LocalSignal s;
    s.type = static_cast<uint8_t>(LocalSignalType::kFatal);
    s.code = static_cast<uint8_t>(st.code());
    s.from = static_cast<uint16_t>(cfg_.local_rank);
    strncpy(s.text, st.message().c_str(), sizeof(s.text) - 1);
    for (int r = 0; r < cfg_.local_size; ++r)
      if (r != cfg_.local_rank) channel_.Send(r, s);
  }
  std::vector<TensorContext*> all;
  {
    std::lock_guard<std::mutex> lk(ctx_mu_);
    for (auto& c : contexts_) all.push_back(c.get());
  }
  // Each operation's error names the peer (above) and the operation it hit.
  for (auto* c : all)
    FinishOp(c, Status(fatal_.code(), fatal_.message() + " (during push_pull of '" + c->name + "')"),
             true);
  handles_.FailAll(fatal_);
}

Status WorkerCore::CheckProcessSet(const PushPullArgs& a) const {
  if (a.process_set == 0 && a.set_machines.empty() && a.set_size == 0) return Status::OK();
  const std::string what = "tensor '" + a.name + "' of process set " +
                           std::to_string(a.process_set);
  if (a.process_set == 0 || a.process_set > 0xffff)
    return Status::InvalidArgument(what + ": a process set's id is 1 to 65535 (0 is the "
                                   "global set, which names no machines)");
  if (a.set_machines.empty() || a.set_size < 1 || a.set_size > cfg_.size)
    return Status::InvalidArgument(what + ": needs its worker machines and 1 to " +
                                   std::to_string(cfg_.size) + " ranks");
  for (size_t i = 0; i < a.set_machines.size(); ++i)
    if (a.set_machines[i] < 0 || a.set_machines[i] >= cfg_.num_worker ||
        (i > 0 && a.set_machines[i] <= a.set_machines[i - 1]))
      return Status::InvalidArgument(what + ": its worker machines must ascend within 0 to " +
                                     std::to_string(cfg_.num_worker - 1));
  if (!std::binary_search(a.set_machines.begin(), a.set_machines.end(), cfg_.worker_id))
    return Status::InvalidArgument(what + ": rank " + std::to_string(cfg_.rank) +
                                   " (worker machine " + std::to_string(cfg_.worker_id) +
                                   ") is not in the set");
  if (tuner_)
    return Status::Config(what + ": BYTEPS_AUTOTUNE re-cuts every tensor of the job at once; "
                          "process sets are not available with it");
  if (cfg_.async_mode)
    return Status::Config(what + ": asynchronous training (BYTEPS_ENABLE_ASYNC=1) has no "
                          "process sets");
  return Status::OK();
}

}  // namespace byteps
