// All-reduce tensors (ring, tree; docs/schemes.md) on the local root of a distributed job: each
// partition walks its program (ps/sync_scheme.h) over the worker mesh (ps/peer_mesh.h).
//
// REDUCE_SCATTER (queued, in priority order, holding the stage's credit until the program's
// first sends are written) starts the walk; ALL_GATHER (awaited) is where the walk is once the
// sums are complete; the partition is done when the last message is in and every send of the
// round is written. A step waits only for a message: arrivals of this round move the walk on,
// on the receiving thread; the next round's early messages are kept by round parity. Summed
// receives land in the partition's scratch and are added with the SIMD kernels; final ones
// land straight in the output (or the aggregate, on a machine with several processes).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "pipeline/worker.h"
#include "reduce/sum.h"

namespace byteps {
namespace {

// The partition's bytes in the buffer the program sums into and reads final results from, and
// the caller's input (the same buffer on a machine with several processes or for a device
// tensor: the aggregate, the pinned buffer).
char* DataOf(const PartTask* t, int local_size) {
  return (local_size > 1 ? t->ctx->aggregate(local_size) : t->ctx->output) + t->part.offset;
}
const char* InputOf(const PartTask* t, int local_size) {
  return (local_size > 1 ? t->ctx->aggregate(local_size) : t->ctx->input) + t->part.offset;
}

// The receive op of (peer, tag), or ops.size().
size_t RecvIndex(const CollProgram& prog, int peer, uint64_t tag) {
  for (size_t i = 0; i < prog.ops.size(); ++i) {
    const CollOp& op = prog.ops[i];
    if (op.kind != CollOp::kSend && op.kind != CollOp::kCopyInput && op.peer == peer &&
        op.tag == tag)
      return i;
  }
  return prog.ops.size();
}

}  // namespace

Status WorkerCore::DecideSync(TensorContext* ctx) {
  if (ctx->layout.kind != Collective::kAllreduce) {
    // allgather, broadcast, reducescatter: the worker mesh, whatever the scheme.
    ctx->all_reduce = cfg_.distributed;
    if (!cfg_.distributed) return Status::OK();
    const std::string what =
        "tensor '" + ctx->name + "' (" + CollectiveName(ctx->layout.kind) + ")";
    if (ctx->compressed)
      return Status::InvalidArgument(what + " is declared with compression: only allreduce "
                                     "(push_pull) compresses");
    if (!cfg_.mesh)
      return Status::Config(what + " needs the worker mesh, which asynchronous training "
                            "(BYTEPS_ENABLE_ASYNC=1) does not set up");
    return Status::OK();
  }
  if (ctx->process_set != 0) {
    // A process set's all-reduce: the summation service, whose keys count the set's machines
    // (docs/collectives.md, "Process sets").
    if (ctx->sync_declared && ctx->sync != SyncScheme::kPs)
      return Status::InvalidArgument("tensor '" + ctx->name + "' of process set " +
                                     std::to_string(ctx->process_set) + " is declared with sync=" +
                                     SyncSchemeName(ctx->sync) +
                                     ": a process set's allreduce goes through the servers (ps)");
    ctx->sync = SyncScheme::kPs;
    ctx->all_reduce = false;
    if (cfg_.distributed && cfg_.num_server < 1)
      return Status::Config("tensor '" + ctx->name + "' of process set " +
                            std::to_string(ctx->process_set) + ": a process set's allreduce "
                            "goes through the servers; the job has none (DMLC_NUM_SERVER=0)");
    return Status::OK();
  }
  if (!ctx->sync_declared) {
    if (cfg_.sync_auto)
      return Status::Config(
          "tensor '" + ctx->name +
          "': BYTEPS_SYNC=auto chooses each tensor's scheme through the cost model "
          "(byteps.cost_model.choose), which declares it before its first push_pull; this "
          "tensor reached the core without a scheme (declare it with sync=...)");
    ctx->sync = cfg_.sync;
  }
  ctx->all_reduce = cfg_.distributed && IsCollective(ctx->sync);
  if (!cfg_.distributed) return Status::OK();
  if (ctx->sync == SyncScheme::kHips) {
    if (ctx->compressed)
      return Status::InvalidArgument("tensor '" + ctx->name +
                                     "' is declared with compression and sync=hips: "
                                     "compression needs sync=ps");
    const int need = HipsServersNeeded(cfg_.num_worker, cfg_.hips_group);
    if (cfg_.num_server < need)
      return Status::Config("tensor '" + ctx->name + "': sync=hips with " +
                            std::to_string(cfg_.num_worker) + " worker machines in groups of " +
                            std::to_string(cfg_.hips_group) + " (BYTEPS_HIPS_GROUP) needs " +
                            std::to_string(need) + " servers (one per group, one on top); "
                            "DMLC_NUM_SERVER=" + std::to_string(cfg_.num_server));
    if (tuner_)
      return Status::Config("tensor '" + ctx->name +
                            "': BYTEPS_AUTOTUNE works with sync=ps only");
  }
  if (!ctx->all_reduce) return Status::OK();
  if (ctx->compressed)
    return Status::InvalidArgument(
        "tensor '" + ctx->name + "' is declared with compression and sync=" +
        SyncSchemeName(ctx->sync) +
        ": compression needs the summation service (sync=ps); the all-reduces sum exactly");
  if (!cfg_.mesh)
    return Status::Config("tensor '" + ctx->name + "' is declared with sync=" +
                          SyncSchemeName(ctx->sync) +
                          ", which needs the worker mesh, which asynchronous training "
                          "(BYTEPS_ENABLE_ASYNC=1) does not set up");
  if (tuner_)
    return Status::Config("tensor '" + ctx->name + "': BYTEPS_AUTOTUNE works with sync=ps only");
  return Status::OK();
}

CollProgram WorkerCore::LayoutProgramOf(const TensorContext* ctx, const PartTask* t) const {
  const auto& machines = ctx->set_machines;
  if (machines.empty())
    return BuildLayoutProgram(ctx->layout, cfg_.num_worker, cfg_.worker_id, t->part.offset,
                              t->part.length);
  const int me = static_cast<int>(std::lower_bound(machines.begin(), machines.end(),
                                                   cfg_.worker_id) - machines.begin());
  CollProgram prog = BuildLayoutProgram(ctx->layout, static_cast<int>(machines.size()), me,
                                        t->part.offset, t->part.length);
  for (auto& op : prog.ops)
    if (op.kind != CollOp::kCopyInput) op.peer = static_cast<uint16_t>(machines[op.peer]);
  return prog;
}

void WorkerCore::SetUpCollective(TensorContext* ctx) {
  const size_t es = DTypeSize(ctx->dtype);
  // An allgather's or reducescatter's blocks are contiguous per machine, so a partition lies
  // in one machine's block and its ring carries data over n - 1 links only (a chain from, or
  // to, that machine). Queued round-robin over the owners (the first partition of each
  // machine's block, then the second of each, ...), the partitions in flight keep every link
  // busy.
  // An alltoall's buffer is destination-major (block d * n + s: what s sends d); its partitions
  // are queued phase by phase, block (d, s) in phase (d - s) mod n, in buffer order within a
  // phase (collective_programs.h).
  std::vector<std::pair<uint64_t, size_t>> rounds;  // (round within its owner, owner) by index
  const auto& l = ctx->layout;
  const bool alltoall = l.kind == Collective::kAlltoall;
  const bool interleave = l.kind == Collective::kAllgather || l.kind == Collective::kReducescatter;
  const size_t n =
      ctx->set_machines.empty() ? static_cast<size_t>(cfg_.num_worker) : ctx->set_machines.size();
  size_t owner = 0, first = 0;
  for (size_t i = 0; i < ctx->parts.size(); ++i) {
    const size_t off = ctx->parts[i]->part.offset;
    size_t o = owner;
    while ((interleave || alltoall) && o + 1 < l.blocks.size() - 1 && off >= l.blocks[o + 1]) ++o;
    if (alltoall) {  // (phase, index)
      owner = o;
      rounds.emplace_back((o / n + n - o % n) % n, i);
      continue;
    }
    if (o != owner || i == 0) {
      owner = o;
      first = i;
    }
    rounds.emplace_back(interleave ? i - first : i, owner);
  }
  std::vector<size_t> by_order(ctx->parts.size());
  for (size_t i = 0; i < by_order.size(); ++i) by_order[i] = i;
  std::stable_sort(by_order.begin(), by_order.end(),
                   [&](size_t a, size_t b) { return rounds[a] < rounds[b]; });
  for (size_t pos = 0; pos < by_order.size(); ++pos)
    ctx->parts[by_order[pos]]->coll_position = static_cast<uint32_t>(pos);
  for (auto& t : ctx->parts) {
    auto c = std::make_unique<CollTask>();
    c->prog = ctx->layout.kind == Collective::kAllreduce
                  ? BuildCollProgram(ctx->sync, cfg_.num_worker, cfg_.tree_width,
                                     cfg_.worker_id, t->part.length, es)
                  : LayoutProgramOf(ctx, t.get());
    c->sends.resize(c->prog.ops.size());
    for (size_t i = 0; i < c->sends.size(); ++i) {
      c->sends[i].task = t.get();
      c->sends[i].index = i;
    }
    c->scratch.assign(2 * c->prog.scratch_bytes, 0);
    c->arrived.assign(2 * c->prog.ops.size(), 0);
    c->staged.assign(2 * c->prog.ops.size(), 0);
    c->counted.assign(c->prog.ops.size(), 0);
    t->coll = std::move(c);
  }
}

void WorkerCore::RunReduceScatter(PartTask* t) {
  TensorContext* ctx = t->ctx;
  CollTask* c = t->coll.get();
  {
    std::lock_guard<std::mutex> lk(c->mu);
    c->round = ctx->round;
    c->pc = 0;
    c->active = true;
    c->in_gather = false;
    c->walked = false;
    c->credit_held = true;
    c->outstanding = 1;
    c->credit_sends = static_cast<int>(c->prog.initial_sends);
    if (c->prog.ops.empty()) {  // one worker machine: the sum is the input
      const char* in = InputOf(t, cfg_.local_size);
      char* data = DataOf(t, cfg_.local_size);
      if (in != data) memcpy(data, in, t->part.length);
    }
  }
  if (c->prog.initial_sends == 0) ReturnCollCredit(t);
  CollAdvance(t);
}

void WorkerCore::ReturnCollCredit(PartTask* t) {
  {
    std::lock_guard<std::mutex> lk(t->coll->mu);
    if (!t->coll->credit_held) return;
    t->coll->credit_held = false;
  }
  // As PUSH's acknowledgement does: the next partitions the credit allows leave from here.
  ScheduledQueue* q = queues_[static_cast<int>(Stage::kReduceScatter)].get();
  QueueItem item;
  if (!q->ReturnCreditAndTryPop(t->part.length, &item)) return;
  do RunStageItem(Stage::kReduceScatter, item);
  while (q->TryPop(&item));
}

void WorkerCore::CollAdvance(PartTask* t) {
  TensorContext* ctx = t->ctx;
  CollTask* c = t->coll.get();
  const size_t es = DTypeSize(ctx->dtype);
  // Sends leave after the lock is released (a send to a closed connection fails at once, and
  // its failure fails the operation, which takes the lock): at most kBatch per pass.
  constexpr int kBatch = 16;
  CollSend* out[kBatch];
  int peers[kBatch];
  for (;;) {
    Status fail;
    bool done = false, more = false;
    int nout = 0;
    uint32_t walked_round = 0;
    {
      std::unique_lock<std::mutex> lk(c->mu);
      if (!c->active) return;
      const uint32_t r = c->round;
      walked_round = r;
      const size_t n = c->prog.ops.size();
      const size_t base = (r & 1) * n;
      char* data = DataOf(t, cfg_.local_size);
      const char* in = InputOf(t, cfg_.local_size);
      for (;;) {
        if (c->pc == c->prog.gather_begin && !c->in_gather) {
          c->in_gather = true;
          Proceed(t);  // REDUCE_SCATTER -> ALL_GATHER (awaited)
        }
        if (c->pc >= n) break;
        const CollOp& op = c->prog.ops[c->pc];
        if (op.kind == CollOp::kCopyInput) {
          if (in != data && op.length > 0) memcpy(data + op.offset, in + op.offset, op.length);
          c->pc++;
          continue;
        }
        if (op.kind == CollOp::kSend) {
          if (nout == kBatch) {
            more = true;
            break;
          }
          CollSend& s = c->sends[c->pc];
          s.item.hdr = FrameHeader();
          s.item.hdr.type = static_cast<uint16_t>(MsgType::kCollective);
          s.item.hdr.dtype = static_cast<uint8_t>(ctx->dtype);
          s.item.hdr.key = t->key;
          s.item.hdr.round = r;
          s.item.hdr.sender = static_cast<uint32_t>(cfg_.worker_id);
          s.item.hdr.aux = op.tag;
          s.item.payload = (op.from_input ? in : data) + op.offset;
          s.item.len = op.length;
          s.item.done = &WorkerCore::CollSentThunk;
          s.item.arg = &s;
          s.item.heap = false;
          c->outstanding++;
          c->pc++;
          peers[nout] = op.peer;
          out[nout++] = &s;
          continue;
        }
        if (c->arrived[base + c->pc] != r) {
          if (peer_left_[op.peer])
            fail = Status::PeerLost("rank " + std::to_string(cfg_.rank) + ": " +
                                    MachineText(op.peer, cfg_.local_size) +
                                    " has shut down (called shutdown() or exited) before "
                                    "push_pull of '" + ctx->name +
                                    "' could complete; every rank must make the same "
                                    "push_pull calls");
          break;  // the message's arrival moves the walk on
        }
        if (op.kind == CollOp::kRecvSum) {
          char* dst = data + op.offset;
          const char* a = op.from_input ? in + op.offset : dst;
          const char* b = c->scratch_of(r) + op.scratch;
          if (a == dst) reduce::ReduceInto(dst, b, op.length / es, ctx->dtype, ctx->op);
          else reduce::Reduce3(dst, a, b, op.length / es, ctx->dtype, ctx->op);
        } else if (op.kind == CollOp::kRecvPlace && c->staged[base + c->pc]) {
          c->staged[base + c->pc] = 0;  // it came before this round began here
          if (op.length > 0) memcpy(data + op.offset, c->scratch_of(r) + op.scratch, op.length);
        }
        c->pc++;
      }
      if (!more && c->pc >= n && !c->walked && fail.ok()) {
        c->walked = true;
        done = --c->outstanding == 0;
      }
    }
    for (int i = 0; i < nout; ++i) ps_->mesh()->Send(peers[i], &out[i]->item);
    if (!fail.ok()) return AbortCollective(ctx, walked_round, fail);
    if (done) return CollFinished(t);
    if (!more) return;
  }
}

void WorkerCore::CollSentThunk(void* arg, const Status& st) {
  auto* s = static_cast<CollSend*>(arg);
  PartTask* t = s->task;
  WorkerCore* self = t->owner;
  CollTask* c = t->coll.get();
  if (!st.ok()) {
    const int peer = c->prog.ops[s->index].peer;
    if (self->peer_left_[peer])
      self->AbortCollective(
          t->ctx, c->round, Status::PeerLost("rank " + std::to_string(self->cfg_.rank) + ": " +
                                   MachineText(peer, self->cfg_.local_size) +
                                   " has shut down during push_pull of '" + t->ctx->name +
                                   "': " + st.message()));
    else if (!self->stopping_)
      self->Fatal(st);
  }
  if (s->index < c->prog.initial_sends && --c->credit_sends == 0) self->ReturnCollCredit(t);
  if (--c->outstanding == 0) self->CollFinished(t);
}

void WorkerCore::CollFinished(PartTask* t) {
  {
    std::lock_guard<std::mutex> lk(t->coll->mu);
    if (!t->coll->active) return;  // given up meanwhile
    t->coll->active = false;
  }
  if (cfg_.local_size > 1) SendSignal(LocalSignalType::kPulled, t, -1);
  Proceed(t);  // ALL_GATHER -> COPY_OUT
}

PartTask* WorkerCore::CollTaskOf(uint64_t key) {
  const uint32_t index = PartitionIndexOf(key);
  std::lock_guard<std::mutex> lk(ctx_mu_);
  auto it = by_key_.find(KeyTensor(key));
  if (it == by_key_.end()) return nullptr;
  TensorContext* ctx = it->second;
  if (index >= ctx->parts.size()) return nullptr;
  PartTask* t = ctx->parts[index].get();
  return t->key == key && t->coll ? t : nullptr;
}

Status WorkerCore::CollectiveDestination(int peer, const FrameHeader& h, void** dest) {
  PartTask* t = CollTaskOf(h.key);
  if (!t)
    return Status::InvalidArgument("COLLECTIVE from worker machine " + std::to_string(peer) +
                                   " for key " + std::to_string(h.key) +
                                   ", which is not an all-reduce partition here");
  CollTask* c = t->coll.get();
  std::lock_guard<std::mutex> lk(c->mu);
  const size_t i = RecvIndex(c->prog, peer, h.aux);
  if (i == c->prog.ops.size() || h.payload_len != c->prog.ops[i].length ||
      h.dtype != static_cast<uint8_t>(t->ctx->dtype))
    return Status::InvalidArgument("COLLECTIVE from worker machine " + std::to_string(peer) +
                                   " for key " + std::to_string(h.key) + " step " +
                                   std::to_string(h.aux) + " with " +
                                   std::to_string(h.payload_len) +
                                   " bytes does not match this machine's program");
  const CollOp& op = c->prog.ops[i];
  const bool early = !c->active || c->round != h.round;
  if (op.kind == CollOp::kRecvSum || (op.kind == CollOp::kRecvPlace && early)) {
    if (op.kind == CollOp::kRecvPlace) c->staged[(h.round & 1) * c->prog.ops.size() + i] = 1;
    *dest = c->scratch_of(h.round) + op.scratch;
    return Status::OK();
  }
  if (c->active && c->round == h.round) {  // a final result, straight into place
    *dest = DataOf(t, cfg_.local_size) + op.offset;
    c->receiving++;
    c->counted[i] = 1;
    return Status::OK();
  }
  *dest = Connection::kDiscard;  // the operation failed meanwhile
  return Status::OK();
}

void WorkerCore::OnCollective(int peer, const FrameHeader& h) {
  PartTask* t = CollTaskOf(h.key);
  if (!t) return;
  CollTask* c = t->coll.get();
  {
    std::lock_guard<std::mutex> lk(c->mu);
    const size_t i = RecvIndex(c->prog, peer, h.aux);
    if (i == c->prog.ops.size()) return;
    const bool into_place = c->counted[i];
    if (into_place) {  // a final result received into place: no longer under way
      c->counted[i] = 0;
      if (--c->receiving == 0) c->cv.notify_all();
    }
    const CollOp::Kind kind = c->prog.ops[i].kind;
    if ((kind == CollOp::kRecvCopy || (kind == CollOp::kRecvPlace && into_place)) &&
        (!c->active || c->round != h.round))
      return;  // read past: the operation failed meanwhile
    c->arrived[(h.round & 1) * c->prog.ops.size() + i] = h.round;
  }
  CollAdvance(t);
}

void WorkerCore::OnPeerLeft(int peer) {
  peer_left_[peer] = true;
  // Partitions waiting for its message now can never finish.
  std::vector<PartTask*> waiting;
  {
    std::lock_guard<std::mutex> lk(ctx_mu_);
    for (auto& ctx : contexts_)
      if (ctx->all_reduce && ctx->in_flight)
        for (auto& t : ctx->parts)
          if (t->coll) waiting.push_back(t.get());
  }
  for (PartTask* t : waiting) CollAdvance(t);
}

void WorkerCore::AbortCollective(TensorContext* ctx, uint32_t round, const Status& st) {
  {
    // The round in flight, or the next one (not started here yet: it fails when it is, through
    // the sticky error); once per tensor (the sticky error is set below).
    std::lock_guard<std::mutex> lk(ctx->mu);
    const bool current = ctx->in_flight && ctx->round == round;
    const bool next = !ctx->in_flight && ctx->round + 1 == round;
    if (!ctx->sticky.ok() || !(current || next) || ctx->aborting) return;
    ctx->aborting = true;
  }
  // On a thread of its own: failing the operation waits until no message is being received
  // into its buffers, which a van that runs every handler on one thread (UCX) could otherwise
  // not deliver while this handler waits. Joined by Stop().
  std::lock_guard<std::mutex> lk(abort_mu_);
  abort_threads_.emplace_back([this, ctx, round, st] {
    FailOpOnMachine(ctx, st);  // sticky, on every process of this machine
    ps_->mesh()->Abort(ctx->declared_key, round, st.message());
  });
}

void WorkerCore::OnPeerAbort(int peer, uint32_t key, uint32_t round, const std::string& text) {
  TensorContext* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lk(ctx_mu_);
    auto it = by_key_.find(key);
    if (it != by_key_.end()) ctx = it->second;
  }
  if (!ctx || !ctx->all_reduce) return;
  BPS_LOG(DEBUG) << "worker machine " << peer << " gave up on '" << ctx->name << "'";
  // Its text already names the machine that left (and the rank that saw it).
  AbortCollective(ctx, round,
                  Status::PeerLost("rank " + std::to_string(cfg_.rank) + ": " + text));
}

void WorkerCore::OnPeerLost(int peer, const Status& why) {
  // A message cut off mid-payload will never complete: nothing writes into it any more.
  std::vector<CollTask*> all;
  {
    std::lock_guard<std::mutex> lk(ctx_mu_);
    for (auto& ctx : contexts_)
      for (auto& t : ctx->parts)
        if (t->coll) all.push_back(t->coll.get());
  }
  for (CollTask* c : all) {
    std::lock_guard<std::mutex> lk(c->mu);
    for (size_t i = 0; i < c->counted.size(); ++i) {
      if (!c->counted[i] || c->prog.ops[i].peer != peer) continue;
      c->counted[i] = 0;
      if (--c->receiving == 0) c->cv.notify_all();
    }
  }
  Fatal(why);
}

void WorkerCore::CancelCollective(TensorContext* ctx) {
  for (auto& t : ctx->parts) {
    CollTask* c = t->coll.get();
    if (!c) continue;
    bool credit;
    {
      std::unique_lock<std::mutex> lk(c->mu);
      c->active = false;
      credit = c->credit_held;
      c->credit_held = false;
      c->cv.wait_for(lk, std::chrono::duration<double>(cfg_.timeout_s),
                     [c] { return c->receiving == 0; });
    }
    if (credit) queues_[static_cast<int>(Stage::kReduceScatter)]->ReturnCredit(t->part.length);
  }
}

}  // namespace byteps
