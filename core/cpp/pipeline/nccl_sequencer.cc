// The NCCL sequencer (nccl_sequencer.h; docs/gpu.md): the communicator among the machine's
// GPUs, made once per process, and the calls of REDUCE and BROADCAST in the local root's order.
#include "pipeline/nccl_sequencer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/logging.h"
#include "pipeline/context.h"
#include "pipeline/worker_config.h"

namespace byteps {

NcclSequencer::NcclSequencer(const WorkerConfig& cfg, Hooks hooks)
    : cfg_(cfg), hooks_(std::move(hooks)) {}

Status NcclSequencer::Decide(TensorContext* ctx) {
  // NCCL's stages sum; another op is reduced in host memory (the local reduce).
  if (!cfg_.nccl || cfg_.local_size < 2 || ctx->nbytes == 0 || ctx->op != reduce::ReduceOp::kSum ||
      ctx->layout.kind != Collective::kAllreduce)
    return Status::OK();
  if (!device::CollectiveSupports(ctx->device_kind, ctx->dtype))
    return Status::InvalidArgument("tensor '" + ctx->name + "': NCCL does not sum " +
                                   DTypeName(ctx->dtype) +
                                   " (BYTEPS_NCCL=0 sums it in host memory)");
  BPS_RETURN_IF_ERROR(Ensure(ctx->device_kind, ctx->device_id));
  ctx->nccl = true;
  return Status::OK();
}

Status NcclSequencer::Ensure(device::Kind kind, int device_id) {
  std::unique_lock<std::mutex> lk(mu_);
  // Another thread's first NCCL tensor may be making it: one communicator per process.
  cv_.wait(lk, [this] { return !creating_; });
  if (!status_.ok()) return status_;
  if (coll_) {
    if (kind_ == kind && device_ == device_id) return Status::OK();
    return Status::InvalidArgument(
        std::string("this process sums its device tensors among the machine's GPUs on ") +
        device::KindName(kind_) + ":" + std::to_string(device_) + " (BYTEPS_NCCL=1: "
        "one communicator per process), not on " + device::KindName(kind) + ":" +
        std::to_string(device_id));
  }
  // This thread makes it; others wait above (also while this one waits for the id below).
  creating_ = true;
  struct Done {
    NcclSequencer* s;
    ~Done() {  // under mu_ (every return below holds lk)
      s->creating_ = false;
      s->cv_.notify_all();
    }
  } done{this};
  const int L = cfg_.local_size;
  std::string id;
  Status st;
  if (cfg_.is_root()) {
    st = device::NewCollectiveId(kind, cfg_.job, L, &id);
    LocalSignal s;
    s.type = static_cast<uint8_t>(LocalSignalType::kCollInit);
    s.from = 0;
    s.code = static_cast<uint8_t>(st.code());
    const std::string& body = st.ok() ? id : st.message();
    s.key = std::min(body.size(), sizeof(s.text) - 1);
    memcpy(s.text, body.data(), s.key);
    for (int r = 1; r < L; ++r) hooks_.send(r, s);
  } else {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(cfg_.timeout_s);
    while (!id_received_ && !hooks_.failed() && std::chrono::steady_clock::now() < deadline)
      cv_.wait_for(lk, std::chrono::milliseconds(100));
    if (id_received_) {
      st = id_status_;
      id = id_;
    } else {
      st = Status::Timeout("the local root (rank " + std::to_string(cfg_.worker_id * L) +
                           ") sent no NCCL communicator id within " +
                           std::to_string(static_cast<int>(cfg_.timeout_s)) +
                           " s: does it push_pull device tensors too?");
    }
  }
  device::Device* d = nullptr;
  if (st.ok()) st = device::GetDevice(kind, &d);
  if (st.ok()) {
    lk.unlock();  // the listening thread may deliver a kFatal meanwhile (failed: give up)
    std::unique_ptr<device::Collective> c;
    st = device::CreateCollective(kind, id, cfg_.local_rank, L, device_id, cfg_.timeout_s,
                                  hooks_.failed, &c);
    device::Stream stream = nullptr;
    if (st.ok()) st = d->CreateStream(device_id, &stream);
    lk.lock();
    if (st.ok()) {
      coll_ = std::move(c);
      kind_ = kind;
      device_ = device_id;
      stream_ = stream;
      live_ = coll_.get();
      waiter_.Start([this](PartTask* t, const Status& finished) {
        Status s = finished;
        if (s.ok() && coll_) s = coll_->AsyncError();
        hooks_.done(t, s);
      });
      BPS_LOG(INFO) << "rank " << cfg_.rank << ": device tensors are summed among the machine's "
                    << L << " GPUs (" << device::KindName(kind) << ":" << device_id
                    << ", local rank " << cfg_.local_rank << " of the communicator)";
      return Status::OK();
    }
  }
  status_ = Status(st.code(), "NCCL stages (BYTEPS_NCCL=1) on local rank " +
                                  std::to_string(cfg_.local_rank) + ": " + st.message());
  // Every local process waits in the same set-up: the job cannot go on.
  hooks_.fail_job(status_);
  return status_;
}

void NcclSequencer::OnCollInit(const LocalSignal& s) {
  std::lock_guard<std::mutex> lk(mu_);
  id_received_ = true;
  const size_t n = std::min<size_t>(s.key, sizeof(s.text));
  if (s.code == 0) {
    id_.assign(s.text, n);
  } else {
    id_status_ = Status(static_cast<StatusCode>(s.code),
                        "the local root could not set it up: " + std::string(s.text, n));
  }
  cv_.notify_all();
}

void NcclSequencer::Abort(const std::string& why) {
  if (device::Collective* c = live_.load()) c->Abort(why);
}

void NcclSequencer::Stop() {
  waiter_.Stop();
  live_ = nullptr;
  coll_.reset();
}

void NcclSequencer::Shard(const PartTask* t, size_t* begin, size_t* end) const {
  const size_t es = DTypeSize(t->ctx->dtype), n = t->part.length / es;
  const size_t L = static_cast<size_t>(cfg_.local_size), r = static_cast<size_t>(cfg_.local_rank);
  const size_t c = n / L;
  *begin = r * c * es;
  *end = (r + 1 == L ? n : (r + 1) * c) * es;
}

void NcclSequencer::Run(PartTask* t, bool reduce) {
  TensorContext* ctx = t->ctx;
  device::Device* d = ctx->device;
  device::Collective* c = coll_.get();
  const size_t es = DTypeSize(ctx->dtype), n = t->part.length / es;
  const size_t L = static_cast<size_t>(cfg_.local_size);
  const size_t per = n / L, rem = n - per * L;
  size_t mine, mine_end;  // this process's shard: where its reduce-scatter output goes
  Shard(t, &mine, &mine_end);
  char* out = ctx->device_output + t->part.offset;
  const char* in = ctx->device_input + t->part.offset;
  Status st;
  {
    std::lock_guard<std::mutex> lk(seq_mu_);
    if (cfg_.is_root()) hooks_.send_go(t, static_cast<uint8_t>(t->stages.current()));
    if (!t->copied) st = d->CreateEvent(&t->copied);
    if (st.ok() && reduce && ctx->ready_event) st = d->StreamWait(stream_, ctx->ready_event);
    const bool grouped = st.ok() && (st = c->GroupStart()).ok();
    if (st.ok() && reduce && !cfg_.distributed) {
      st = c->AllReduce(in, out, n, ctx->dtype,
                        ctx->average ? device::ReduceOp::kAvg : device::ReduceOp::kSum,
                        stream_);
      d->CountCollective();
    } else if (st.ok()) {
      // The equal shards, then the remainder: all-reduced (REDUCE) so that the last process's
      // shard holds its sum, broadcast from it (BROADCAST).
      const size_t tail = L * per * es;
      if (per > 0) {
        st = reduce ? c->ReduceScatter(in, out + mine, per, ctx->dtype, stream_)
                    : c->AllGather(out + mine, out, per, ctx->dtype, stream_);
        d->CountCollective();
      }
      if (st.ok() && rem > 0) {
        st = reduce ? c->AllReduce(in + tail, out + tail, rem, ctx->dtype,
                                   device::ReduceOp::kSum, stream_)
                    : c->Broadcast(out + tail, out + tail, rem, ctx->dtype,
                                   cfg_.local_size - 1, stream_);
        d->CountCollective();
      }
    }
    if (grouped) {
      Status end = c->GroupEnd();
      if (st.ok()) st = end;
    }
    if (st.ok()) st = d->Record(t->copied, stream_);
  }
  if (!st.ok()) return hooks_.done(t, st);
  waiter_.Add(d, t->copied, t);
}

}  // namespace byteps
