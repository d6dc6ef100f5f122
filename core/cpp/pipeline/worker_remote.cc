// The local root's side of the distributed job: tensor declaration with the scheduler, push and
// pull with the servers (push straight from the buffer, pull straight into place).
#include <unistd.h>

#include <cstring>
#include <set>

#include "common/logging.h"
#include "pipeline/worker.h"
#include "reduce/copy.h"
#include "reduce/sum.h"
#include "ps/control_msgs.h"

namespace byteps {

void WorkerCore::SendDeclare(TensorContext* ctx) {
  DeclareMsg m;
  m.declared_key = ctx->declared_key;
  m.name = ctx->name;
  m.dtype = static_cast<uint8_t>(ctx->dtype);
  m.shape = ctx->shape;
  m.nbytes = ctx->nbytes;
  control_->Send(MsgType::kDeclare, Encode(m), ctx->declared_key);
}

void WorkerCore::OnControlMessage(const FrameHeader& h, const char* p, size_t len) {
  if (TypeOf(h) == MsgType::kWorkerLeft) {
    if (h.sender >= static_cast<uint32_t>(cfg_.num_worker)) return;
    std::lock_guard<std::mutex> lk(left_mu_);
    left_machines_.insert(static_cast<int>(h.sender));
    left_at_ = std::chrono::steady_clock::now();
    return;
  }
  if (TypeOf(h) != MsgType::kDeclareReply) return;
  TensorContext* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lk(ctx_mu_);
    if (h.key < contexts_.size()) ctx = contexts_[h.key].get();
  }
  if (!ctx) {
    BPS_LOG(WARNING) << "DECLARE_REPLY for unknown key " << h.key;
    return;
  }
  const auto reply = static_cast<DeclareReply>(h.aux);
  if (reply == DeclareReply::kStallWarning) {  // the workers that have not declared it yet
    std::vector<int> machines;
    std::set<int> ranks;
    if (DecodeWorkerIds(p, len, cfg_.num_worker, &machines).ok()) AddMachineRanks(machines, &ranks);
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
  std::vector<int64_t> servers;
  if (reply != DeclareReply::kOk) {
    std::string text = "rank " + std::to_string(cfg_.rank) + ": " + DecodeText(p, len);
    st = reply == DeclareReply::kTimeout ? Status::Timeout(text) : Status::Mismatch(text);
  } else {
    st = DecodeDeclareOk(p, len, &servers);
    if (st.ok() && servers.size() != ctx->parts.size())
      st = Status::Mismatch("rank " + std::to_string(cfg_.rank) + ": tensor '" + ctx->name +
                            "' has " + std::to_string(ctx->parts.size()) +
                            " partitions here but the plan has " + std::to_string(servers.size()));
    for (int64_t s : servers)
      if (st.ok() && (s < 0 || s >= static_cast<int64_t>(servers_.size())))
        st = Status::Internal("plan names server " + std::to_string(s) + " which does not exist");
  }
  if (!st.ok()) return FailOpOnMachine(ctx, st);
  bool dispatch;
  {
    std::lock_guard<std::mutex> lk(ctx->mu);
    for (size_t i = 0; i < servers.size(); ++i) ctx->parts[i]->server = static_cast<int>(servers[i]);
    ctx->declared = true;
    dispatch = ctx->waiting_for_declare && ctx->in_flight;
    ctx->waiting_for_declare = false;
  }
  if (!dispatch) return;
  for (auto& t : ctx->parts) {
    t->stages = plan_;
    Dispatch(t.get());
  }
}

void WorkerCore::RunPush(PartTask* t) {
  TensorContext* ctx = t->ctx;
  size_t off = t->part.offset;
  const char* src = cfg_.local_size > 1 ? ctx->aggregate(cfg_.local_size) + off : ctx->input + off;
  {
    std::lock_guard<std::mutex> lk(pull_mu_);
    pending_pulls_[t->key] = t;
    t->stall_reported = false;
    t->stall_missing.clear();
  }
  SendItem& item = t->push_item;
  item.hdr = FrameHeader();
  item.hdr.type = static_cast<uint16_t>(MsgType::kPush);
  item.hdr.flags = kPushFlagPull;
  item.hdr.dtype = static_cast<uint8_t>(ctx->dtype);
  item.hdr.key = t->key;
  item.hdr.round = ctx->round;
  item.hdr.sender = static_cast<uint32_t>(cfg_.worker_id);
  item.payload = src;
  item.len = t->part.length;
  item.done = &WorkerCore::PushSentThunk;
  item.arg = t;
  item.heap = false;
  t->stages.pos++;  // PUSH -> PULL before the bytes leave: the answer may beat OnPushSent
  servers_[t->server]->Send(&item);
}

void WorkerCore::OnPushSent(PartTask* t, const Status& st) {
  // The credit covers bytes queued for the wire, not the round trip: a pull waits for the
  // other workers' pushes, so holding credit until it returns lets two workers that produced
  // gradients in different orders each wait for a push the other cannot send (deadlock).
  // Upstream also returns it when the push completes.
  ScheduledQueue* q = queues_[static_cast<int>(Stage::kPush)].get();
  if (!st.ok()) {
    q->ReturnCredit(t->part.length);
    if (!stopping_) Fatal(st);
    return;
  }
  // The returned credit lets the next partitions leave: send them from this thread instead of
  // waking the PUSH stage thread for each (two thread hand-offs per partition become one).
  QueueItem item;
  if (!q->ReturnCreditAndTryPop(t->part.length, &item)) return;
  do RunStageItem(Stage::kPush, item);
  while (q->TryPop(&item));
}

Status WorkerCore::OnHeader(Connection* c, const FrameHeader& h, void** dest) {
  MsgType type = TypeOf(h);
  if (type == MsgType::kDataError) return Status::OK();
  if (type == MsgType::kStallReport) {
    if (h.payload_len % sizeof(uint32_t) != 0 ||
        h.payload_len > sizeof(uint32_t) * static_cast<uint64_t>(cfg_.num_worker))
      return Status::InvalidArgument("malformed STALL_REPORT from " + c->peer_name());
    return Status::OK();  // into the scratch buffer
  }
  if (type != MsgType::kPullResponse)
    return Status::InvalidArgument(std::string("unexpected ") + MsgTypeName(type) + " from " +
                                   c->peer_name());
  std::lock_guard<std::mutex> lk(pull_mu_);
  auto it = pending_pulls_.find(h.key);
  PartTask* t = it == pending_pulls_.end() ? nullptr : it->second;
  if (!t) {  // the operation failed meanwhile: read past the payload
    *dest = Connection::kDiscard;
    return Status::OK();
  }
  if (h.round != t->ctx->round || h.payload_len != t->part.length)
    return Status::InvalidArgument("pull response for key " + std::to_string(h.key) + " round " +
                                   std::to_string(h.round) + " with " +
                                   std::to_string(h.payload_len) + " bytes; expected round " +
                                   std::to_string(t->ctx->round) + " with " +
                                   std::to_string(t->part.length));
  t->receiving = true;
  size_t off = t->part.offset;
  if (cfg_.local_size > 1) {
    *dest = t->ctx->aggregate(cfg_.local_size) + off;  // read back at once by every process
  } else {
    // Final: not read again before the framework gets it. A large tensor bypasses the cache
    // and is averaged on the way in (no second pass over it in COPY_OUT).
    *dest = t->ctx->output + off;
    t->pulled_final = reduce::ShouldStream(t->ctx->nbytes) &&
                      h.payload_len >= Connection::kStreamMinPayload;
    if (t->pulled_final) c->StreamPayload(&WorkerCore::PullSink, t);
  }
  return Status::OK();
}

void WorkerCore::PullSink(void* arg, char* dst, char* chunk, size_t len) {
  auto* t = static_cast<PartTask*>(arg);
  const WorkerConfig& cfg = t->owner->cfg_;
  if (t->ctx->average && cfg.size > 1)
    reduce::DivideInPlace(chunk, len / DTypeSize(t->ctx->dtype), t->ctx->dtype, cfg.size);
  reduce::CopyStreaming(dst, chunk, len);
}

void WorkerCore::OnFrame(Connection* c, const FrameHeader& h, void* payload) {
  if (TypeOf(h) == MsgType::kDataError) {
    std::string text(static_cast<const char*>(payload), h.payload_len);
    if (static_cast<DataError>(h.aux) == DataError::kJobFailed)
      Fatal(Status::PeerLost(text), false);  // the server left: the job failed elsewhere
    else Fatal(Status::Internal(c->peer_name() + " rejected data: " + text));
    return;
  }
  if (TypeOf(h) == MsgType::kStallReport) {
    std::vector<int> missing;
    if (!DecodeWorkerIds(payload, h.payload_len, cfg_.num_worker, &missing).ok()) return;
    std::lock_guard<std::mutex> lk(pull_mu_);
    auto it = pending_pulls_.find(h.key);
    PartTask* t = it == pending_pulls_.end() ? nullptr : it->second;
    if (t && t->ctx->round == h.aux) {
      t->stall_missing = std::move(missing);
      t->stall_reported = true;
    }
    return;
  }
  PartTask* t;
  {
    std::lock_guard<std::mutex> lk(pull_mu_);
    auto it = pending_pulls_.find(h.key);
    t = it == pending_pulls_.end() ? nullptr : it->second;
    if (!t || !t->receiving) return;
    t->receiving = false;
    it->second = nullptr;
  }
  pull_cv_.notify_all();
  if (cfg_.local_size > 1) SendSignal(LocalSignalType::kPulled, t, -1);
  Proceed(t);
}

void WorkerCore::OnClosed(Connection* c, const Status& why) {
  {
    // A response cut off mid-payload will never complete: nothing writes into it any more.
    std::lock_guard<std::mutex> lk(pull_mu_);
    for (auto& [key, t] : pending_pulls_)
      if (t && t->server == c->tag) t->receiving = false;
  }
  pull_cv_.notify_all();
  if (stopping_) return;
  // A server also closes its connections when the job failed elsewhere (the scheduler told it
  // so); wait briefly for that news before blaming the server.
  for (int i = 0; i < 100 && !failed_ && !stopping_; ++i) usleep(10000);
  if (stopping_) return;
  Fatal(Status::PeerLost("lost the connection to " + c->peer_name() + " (" + why.message() + ")"));
}

void WorkerCore::PushSentThunk(void* arg, const Status& st) {
  auto* t = static_cast<PartTask*>(arg);
  t->owner->OnPushSent(t, st);
}

}  // namespace byteps
