// The local root's side of the distributed job, over its PS client (ps/ps_client.h): the
// declaration's answer, the PUSH stage, where pull responses go and what follows them.
#include <cstdint>
#include <set>

#include "common/logging.h"
#include "pipeline/worker.h"
#include "reduce/copy.h"

namespace byteps {

void WorkerCore::SendDeclare(TensorContext* ctx) {
  DeclareMsg m;
  m.declared_key = ctx->declared_key;
  m.name = ctx->name;
  m.dtype = static_cast<uint8_t>(ctx->dtype);
  m.shape = ctx->shape;
  m.nbytes = ctx->nbytes;
  if (ctx->compressed) m.compression = ctx->compression;
  m.partition_bound = ctx->job_bound;  // as cut here (BYTEPS_AUTOTUNE may change it)
  m.generation = ctx->key_gen;
  m.sync = static_cast<uint8_t>(ctx->sync);
  m.op = static_cast<uint8_t>(ctx->op);
  m.collective = static_cast<uint8_t>(ctx->layout.kind);
  m.root = ctx->layout.root;
  m.root_rank = ctx->layout.root_rank;
  m.blocks = ctx->layout.blocks;
  m.members.assign(ctx->set_machines.begin(), ctx->set_machines.end());
  m.sync_param = ctx->sync == SyncScheme::kTree   ? static_cast<uint32_t>(cfg_.tree_width)
                 : ctx->sync == SyncScheme::kHips ? static_cast<uint32_t>(cfg_.hips_group)
                                                  : 0;
  ps_->Declare(ctx->declared_key, m, [this, ctx](const DeclareAnswer& a) { OnDeclareAnswer(ctx, a); });
}

void WorkerCore::OnDeclareAnswer(TensorContext* ctx, const DeclareAnswer& a) {
  if (a.reply == DeclareReply::kStallWarning) {  // the workers that have not declared it yet
    std::set<int> ranks;
    AddMachineRanks(a.not_declared, cfg_.local_size, &ranks);
    {
      std::lock_guard<std::mutex> lk(ctx->mu);
      ctx->stall_warned = true;
    }
    BPS_LOG(WARNING) << "rank " << cfg_.rank << ": push_pull of '" << ctx->name
                     << "' has waited " << static_cast<int>(cfg_.stall_warning_s)
                     << " s (BYTEPS_STALL_WARNING_SECONDS) for the other workers to declare it; "
                     << (ranks.empty() ? "" : NotSubmittedBy(ranks) + "; ") << "it fails after "
                     << static_cast<int>(cfg_.timeout_s) << " s (BYTEPS_TIMEOUT)";
    return;
  }
  Status st;
  const std::vector<int64_t>& servers = a.servers;
  if (a.reply != DeclareReply::kOk) {
    std::string text = "rank " + std::to_string(cfg_.rank) + ": " + a.text;
    st = a.reply == DeclareReply::kTimeout ? Status::Timeout(text) : Status::Mismatch(text);
  } else {
    st = a.decoded;
    if (st.ok() && servers.size() != ctx->parts.size())
      st = Status::Mismatch("rank " + std::to_string(cfg_.rank) + ": tensor '" + ctx->name +
                            "' has " + std::to_string(ctx->parts.size()) +
                            " partitions here but the plan has " + std::to_string(servers.size()));
    for (int64_t s : servers)
      if (st.ok() && !ctx->all_reduce && (s < 0 || s >= ps_->num_servers()))
        st = Status::Internal("plan names server " + std::to_string(s) + " which does not exist");
  }
  if (!st.ok()) return FailOpOnMachine(ctx, st);
  bool dispatch;
  {
    std::lock_guard<std::mutex> lk(ctx->mu);
    for (size_t i = 0; i < servers.size(); ++i) {
      ctx->parts[i]->server = static_cast<int>(servers[i]);
      if (ctx->sync == SyncScheme::kHips) {  // pushed to the group's first-level server
        ctx->parts[i]->upper = ctx->parts[i]->server;
        ctx->parts[i]->server = cfg_.worker_id / cfg_.hips_group;
      }
    }
    if (ctx->compressed) {
      st = SetUpCompression(ctx);
    } else if (!ctx->set_machines.empty() && !ctx->all_reduce &&
               ctx->layout.kind == Collective::kAllreduce) {
      // A process set's keys: the servers count its machines' pushes only.
      KeyConfigMsg m;
      m.dtype = static_cast<uint8_t>(ctx->dtype);
      m.members.assign(ctx->set_machines.begin(), ctx->set_machines.end());
      m.op = static_cast<uint8_t>(ctx->op);
      for (auto& t : ctx->parts) {
        m.count = t->part.length / DTypeSize(ctx->dtype);
        ps_->ConfigureKey(t->server, t->key, m);  // on the connection its pushes take
      }
    }
    ctx->declared = st.ok();
    dispatch = ctx->waiting_for_declare && ctx->in_flight;
    ctx->waiting_for_declare = false;
  }
  if (!st.ok()) return FailOpOnMachine(ctx, st);
  if (!dispatch) return;
  for (auto& t : ctx->parts) {
    t->stages = plans_[ctx->plan()];
    Dispatch(t.get());
  }
}

void WorkerCore::RunPush(PartTask* t) {
  TensorContext* ctx = t->ctx;
  t->stages.pos++;  // PUSH -> PULL before the bytes leave: the answer may beat OnPushSent
  if (push_window_) {
    t->push_sent_ns = TraceNowNs();
    push_window_->OnSend(t->server, ps_->server_on_this_host(t->server), PushBytes(t));
  }
  if (ctx->traced) t->trace.enter[static_cast<int>(Stage::kPull)] = TraceNowNs();
  if (ctx->compressed)  // the encoding COMPRESS made; the sum comes back encoded
    return ps_->Push(t->server, t->key, ctx->round, ctx->dtype, t->encoded.data(),
                     t->encoded_len, &t->pull, &t->push_item, &WorkerCore::PushSentThunk, t,
                     t->push_aux, t->received.size());
  const size_t off = t->part.offset;
  const char* src = cfg_.local_size > 1 ? ctx->aggregate(cfg_.local_size) + off : ctx->input + off;
  if (ctx->sync == SyncScheme::kHips)  // aux: the top-level server (docs/schemes.md)
    return ps_->Push(t->server, t->key, ctx->round, ctx->dtype, src, t->part.length, &t->pull,
                     &t->push_item, &WorkerCore::PushSentThunk, t,
                     static_cast<uint64_t>(t->upper), 0, kPushFlagHips | PushOpFlags(ctx->op));
  // The local root takes the sum into the aggregates, the same two places every round, and a
  // lone process the sum of a device tensor into its pinned buffer, the same place every
  // round: the server may write it there one-way (docs/rdma.md).
  if ((ctx->registered || ctx->staging_registered) && !ctx->async_param &&
      t->pull_window_server != t->server && ps_->one_way_writes()) {
    t->pull_window_server = t->server;
    if (cfg_.local_size > 1)
      ps_->OfferPullWindow(t->server, t->key, ctx->slot(cfg_.local_size) + off, t->part.length,
                           ctx->region);
    else
      ps_->OfferPullWindow(t->server, t->key, ctx->staging.data() + off, t->part.length, 0);
  }
  ps_->Push(t->server, t->key, ctx->round, ctx->dtype, src, t->part.length, &t->pull,
            &t->push_item, &WorkerCore::PushSentThunk, t, 0, 0,
            ctx->async_param ? kPushFlagAsync : PushOpFlags(ctx->op));
}

void WorkerCore::OnPushSent(PartTask* t, const Status& st) {
  if (st.ok()) return;  // its credit comes back with the server's acknowledgement
  if (ps_->ClaimPushAck(&t->pull)) {
    queues_[static_cast<int>(Stage::kPush)]->ReturnCredit(PushBytes(t));
    if (push_window_) push_window_->OnLost(t->server, PushBytes(t));
  }
  if (!stopping_) Fatal(st);
}

void WorkerCore::OnPushAcked(PendingPull* p) {
  // The credit covers a push until the server has it, not the round trip: a pull waits for the
  // other workers' pushes, so holding credit until it returns lets two workers that produced
  // gradients in different orders each wait for a push the other cannot send (deadlock).
  // Until the server has it, though: returned when the bytes were merely handed to the kernel
  // (or to UCX), the credit bounded nothing on the wire, and a worker's whole tensor sat in its
  // host's queues, delaying every pull and acknowledgement behind it. Upstream returns it with
  // ps-lite's push response, the server's acknowledgement.
  auto* t = static_cast<PartTask*>(p->arg);
  // The timeline: PUSH ends when the server has the bytes, PULL (its wait for the sum) starts
  // (the same receiving thread delivers the pull response later).
  if (t->ctx->traced)
    t->trace.end[static_cast<int>(Stage::kPush)] = t->trace.start[static_cast<int>(Stage::kPull)] =
        TraceNowNs();
  ScheduledQueue* q = queues_[static_cast<int>(Stage::kPush)].get();
  if (push_window_) {  // the acknowledgement delay sizes the window (scheduling/push_window.h)
    const size_t w = push_window_->OnAck(t->server, PushBytes(t),
                                         TraceNowNs() - t->push_sent_ns, q->size() > 0);
    if (w) q->SetCredit(w);
  }
  // The returned credit lets the next partitions leave: send them from this thread instead of
  // waking the PUSH stage thread for each (two thread hand-offs per partition become one).
  QueueItem item;
  if (!q->ReturnCreditAndTryPop(PushBytes(t), &item)) return;
  do RunStageItem(Stage::kPush, item);
  while (q->TryPop(&item));
}

PullDest WorkerCore::PullDestination(PendingPull* p, uint64_t payload_len, bool written) {
  auto* t = static_cast<PartTask*>(p->arg);
  PullDest d;
  size_t off = t->part.offset;
  if (t->ctx->compressed) {  // the encoded sum: DECOMPRESS decodes it into place
    d.data = t->received.data();
    return d;
  }
  if (cfg_.local_size > 1) {
    d.data = t->ctx->aggregate(cfg_.local_size) + off;  // read back at once by every process
    return d;
  }
  // Final: not read again before the framework gets it. A large tensor bypasses the cache and
  // is averaged on the way in (no second pass over it in COPY_OUT).
  d.data = t->ctx->output + off;
  t->pulled_final = !written && reduce::ShouldStream(t->ctx->nbytes) &&
                    payload_len >= Connection::kStreamMinPayload;
  if (t->pulled_final) {
    d.stream = true;
    d.divide_by = t->ctx->average && AverageDivisor(t->ctx) > 1 ? AverageDivisor(t->ctx) : 0;
    d.dtype = t->ctx->dtype;
  }
  return d;
}

void WorkerCore::OnPulled(PendingPull* p) {
  auto* t = static_cast<PartTask*>(p->arg);
  // A compressed partition is in place only after DECOMPRESS, which signals then.
  if (cfg_.local_size > 1 && !t->ctx->compressed) SendSignal(LocalSignalType::kPulled, t, -1);
  if (t->ctx->traced) t->trace.server_aux = p->reply_aux;
  Proceed(t);
}

std::tuple<bool, size_t, double, uint64_t> WorkerCore::PushCredit() const {
  if (push_window_)
    return {true, push_window_->window(), push_window_->mean_window(), push_window_->changes()};
  const ScheduledQueue* q = queues_[static_cast<int>(Stage::kPush)].get();
  const size_t c = q ? q->credit() : cfg_.credit_bytes;
  return {false, c, static_cast<double>(c), 0};
}

void WorkerCore::PushSentThunk(void* arg, const Status& st) {
  auto* t = static_cast<PartTask*>(arg);
  t->owner->OnPushSent(t, st);
}

}  // namespace byteps
