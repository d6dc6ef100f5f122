// NCCL among the GPUs of one machine (docs/gpu.md; upstream's REDUCE and BROADCAST, its
// design §3.7): with BYTEPS_NCCL=1 a device tensor of a machine with several local processes
// is reduce-scattered among their GPUs (REDUCE), each process copies its shard of the
// machine's sum into the shared aggregate (COPY_D2H), the local root pushes and pulls the
// aggregate as for host tensors, each process divides its shard when averaging (COPY_OUT),
// copies it back (COPY_H2D), and the GPUs all-gather the shards (BROADCAST). On one machine
// REDUCE is an all-reduce, averaged by NCCL, and the whole plan.
//
// Every process must make the same collective calls in the same order. The local root orders
// them: a process whose partition reaches REDUCE or BROADCAST tells the root (kCollReady) and
// waits; the root's stage thread takes partitions whose every process is there, in priority
// order, and for each sends kCollGo to the others and makes its call, both under seq_mu_; the
// others make theirs in their listening thread, in the order the GOs come. The calls run on one
// stream per process and a waiter thread moves each partition on when its event completes.
#include "common/logging.h"
#include "pipeline/worker.h"

namespace byteps {

Status WorkerCore::DecideNccl(TensorContext* ctx, const PushPullArgs& a) {
  if (!cfg_.nccl || cfg_.local_size < 2 || a.nbytes == 0) return Status::OK();
  if (!device::CollectiveSupports(a.device_kind, a.dtype))
    return Status::InvalidArgument("tensor '" + a.name + "': NCCL does not sum " +
                                   DTypeName(a.dtype) + " (BYTEPS_NCCL=0 sums it in host memory)");
  BPS_RETURN_IF_ERROR(EnsureCollective(a.device_kind, a.device_id));
  ctx->nccl = true;
  return Status::OK();
}

Status WorkerCore::EnsureCollective(device::Kind kind, int device_id) {
  std::unique_lock<std::mutex> lk(coll_mu_);
  // Another thread's first NCCL tensor may be making it: one communicator per process.
  coll_cv_.wait(lk, [this] { return !coll_creating_; });
  if (!coll_status_.ok()) return coll_status_;
  if (coll_) {
    if (coll_kind_ == kind && coll_device_ == device_id) return Status::OK();
    return Status::InvalidArgument(
        std::string("this process sums its device tensors among the machine's GPUs on ") +
        device::KindName(coll_kind_) + ":" + std::to_string(coll_device_) + " (BYTEPS_NCCL=1: "
        "one communicator per process), not on " + device::KindName(kind) + ":" +
        std::to_string(device_id));
  }
  // This thread makes it; others wait above (also while this one waits for the id below).
  coll_creating_ = true;
  struct Done {
    WorkerCore* w;
    ~Done() {  // under coll_mu_ (every return below holds lk)
      w->coll_creating_ = false;
      w->coll_cv_.notify_all();
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
    for (int r = 1; r < L; ++r) channel_.Send(r, s);
  } else {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(cfg_.timeout_s);
    while (!coll_id_received_ && !failed_ && std::chrono::steady_clock::now() < deadline)
      coll_cv_.wait_for(lk, std::chrono::milliseconds(100));
    if (coll_id_received_) {
      st = coll_id_status_;
      id = coll_id_;
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
    lk.unlock();  // the listening thread may deliver a kFatal meanwhile (failed_: give up)
    std::unique_ptr<device::Collective> c;
    st = device::CreateCollective(kind, id, cfg_.local_rank, L, device_id, cfg_.timeout_s,
                                  [this] { return failed_.load(); }, &c);
    device::Stream stream = nullptr;
    if (st.ok()) st = d->CreateStream(device_id, &stream);
    lk.lock();
    if (st.ok()) {
      coll_ = std::move(c);
      coll_kind_ = kind;
      coll_device_ = device_id;
      coll_stream_ = stream;
      coll_live_ = coll_.get();
      coll_waiter_.Start([this](PartTask* t, const Status& done) {
        Status s = done;
        if (s.ok() && coll_) s = coll_->AsyncError();
        OnCopied(t, s);
      });
      BPS_LOG(INFO) << "rank " << cfg_.rank << ": device tensors are summed among the machine's "
                    << L << " GPUs (" << device::KindName(kind) << ":" << device_id
                    << ", local rank " << cfg_.local_rank << " of the communicator)";
      return Status::OK();
    }
  }
  coll_status_ = Status(st.code(), "NCCL stages (BYTEPS_NCCL=1) on local rank " +
                                       std::to_string(cfg_.local_rank) + ": " + st.message());
  const Status failed = coll_status_;
  // Every local process waits in the same set-up: the job cannot go on. Fatal fails every
  // operation, so it runs on a thread of its own: this one holds the tensor's lock (InitContext).
  std::lock_guard<std::mutex> alk(abort_mu_);
  abort_threads_.emplace_back([this, failed] { Fatal(failed); });
  return failed;
}

void WorkerCore::NcclShard(const PartTask* t, size_t* begin, size_t* end) const {
  const size_t es = DTypeSize(t->ctx->dtype), n = t->part.length / es;
  const size_t L = static_cast<size_t>(cfg_.local_size), r = static_cast<size_t>(cfg_.local_rank);
  const size_t c = n / L;
  *begin = r * c * es;
  *end = (r + 1 == L ? n : (r + 1) * c) * es;
}

void WorkerCore::RunReduce(PartTask* t) { RunSequenced(t, true); }
void WorkerCore::RunBroadcast(PartTask* t) { RunSequenced(t, false); }

void WorkerCore::RunSequenced(PartTask* t, bool reduce) {
  TensorContext* ctx = t->ctx;
  device::Device* d = ctx->device;
  device::Collective* c = coll_.get();
  const size_t es = DTypeSize(ctx->dtype), n = t->part.length / es;
  const size_t L = static_cast<size_t>(cfg_.local_size);
  const size_t per = n / L, rem = n - per * L;
  size_t mine, mine_end;  // this process's shard: where its reduce-scatter output goes
  NcclShard(t, &mine, &mine_end);
  char* out = ctx->device_output + t->part.offset;
  const char* in = ctx->device_input + t->part.offset;
  Status st;
  {
    std::lock_guard<std::mutex> lk(seq_mu_);
    if (cfg_.is_root())
      SendSignal(LocalSignalType::kCollGo, t, -1, static_cast<uint8_t>(t->stages.current()));
    if (!t->copied) st = d->CreateEvent(&t->copied);
    if (st.ok() && reduce && ctx->ready_event) st = d->StreamWait(coll_stream_, ctx->ready_event);
    const bool grouped = st.ok() && (st = c->GroupStart()).ok();
    if (st.ok() && reduce && !cfg_.distributed) {
      st = c->AllReduce(in, out, n, ctx->dtype,
                        ctx->average ? device::ReduceOp::kAvg : device::ReduceOp::kSum,
                        coll_stream_);
      d->CountCollective();
    } else if (st.ok()) {
      // The equal shards, then the remainder: all-reduced (REDUCE) so that the last process's
      // shard holds its sum, broadcast from it (BROADCAST).
      const size_t tail = L * per * es;
      if (per > 0) {
        st = reduce ? c->ReduceScatter(in, out + mine, per, ctx->dtype, coll_stream_)
                    : c->AllGather(out + mine, out, per, ctx->dtype, coll_stream_);
        d->CountCollective();
      }
      if (st.ok() && rem > 0) {
        st = reduce ? c->AllReduce(in + tail, out + tail, rem, ctx->dtype,
                                   device::ReduceOp::kSum, coll_stream_)
                    : c->Broadcast(out + tail, out + tail, rem, ctx->dtype,
                                   cfg_.local_size - 1, coll_stream_);
        d->CountCollective();
      }
    }
    if (grouped) {
      Status end = c->GroupEnd();
      if (st.ok()) st = end;
    }
    if (st.ok()) st = d->Record(t->copied, coll_stream_);
  }
  if (!st.ok()) return OnCopied(t, st);
  coll_waiter_.Add(d, t->copied, t);
}

}  // namespace byteps
