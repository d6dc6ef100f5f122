// The NCCL backend of the collective seam (collective.h), through the library loaded at run
// time (cuda_api.h), and the choice of backend by device kind. The communicator is
// nonblocking (ncclCommInitRankConfig, blocking = 0), so that creating it waits with a timeout
// and can be given up, and a call that settles later (ncclInProgress) is polled to its end;
// ncclCommAbort from any thread ends the kernels of a failed job, which would otherwise wait
// for a rank that is gone. ncclCommAbort frees the communicator, so every call that uses it
// holds comm_mu_ (a group's calls from GroupStart to GroupEnd, whose launch names it), and the
// abort takes comm_mu_ too: no call can use a freed communicator, and an abort waits at most
// for one nonblocking call (or one group's enqueueing) to return.
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "device/collective.h"
#include "device/cuda_api.h"

namespace byteps {
namespace device {

// fake_collective.cc
Status NewFakeCollectiveId(const std::string& job, int size, std::string* id);
Status CreateFakeCollective(const std::string& id, int rank, int size, double timeout_s,
                            const std::function<bool()>& give_up,
                            std::unique_ptr<Collective>* out);

namespace {

int NcclType(DType t) {
  switch (t) {
    case DType::kFloat32: return kNcclFloat32;
    case DType::kFloat64: return kNcclFloat64;
    case DType::kFloat16: return kNcclFloat16;
    case DType::kBFloat16: return kNcclBfloat16;
    case DType::kUInt8: return kNcclUint8;
    case DType::kInt8: return kNcclInt8;
    case DType::kInt32: return kNcclInt32;
    case DType::kInt64: return kNcclInt64;
    default: return -1;
  }
}

// The loaded NCCL if the NCCL stages can use it; else null and the reason.
const NcclApi* UsableNccl(std::string* why) {
  const NcclApi* api = LoadedNccl();
  if (!api) {
    *why = "NCCL is not loaded (byteps.cuda.nccl_status() says why)";
    return nullptr;
  }
  if (api->version < kNcclMinVersion || !api->CommInitRankConfig || !api->CommGetAsyncError) {
    *why = "NCCL " + std::to_string(api->version) + " (" + api->library +
           ") is older than " + std::to_string(kNcclMinVersion / 10000) + "." +
           std::to_string(kNcclMinVersion / 100 % 100) + ", which the NCCL stages need";
    return nullptr;
  }
  if (!LoadedCuda()) {
    *why = "the CUDA runtime is not loaded";
    return nullptr;
  }
  return api;
}

class NcclCollective : public Collective {
 public:
  NcclCollective(const NcclApi* nccl, const CudaApi* cuda, int rank, int size, int device)
      : nccl_(nccl), cuda_(cuda), device_(device) {
    rank_ = rank;
    size_ = size;
  }
  ~NcclCollective() override {
    if (comm_) nccl_->CommDestroy(comm_);
  }

  Status Init(const NcclUniqueId& id, double timeout_s, const std::function<bool()>& give_up) {
    BPS_RETURN_IF_ERROR(Use());
    NcclConfig config;
    config.blocking = 0;
    ncclResult_t r = nccl_->CommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != 0 && r != kNcclInProgress) {
      comm_ = nullptr;
      return Check("ncclCommInitRankConfig", r);
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      ncclResult_t state = 0;
      r = nccl_->CommGetAsyncError(comm_, &state);
      if (r == 0 && state == 0) return Status::OK();
      Status st;
      if (r != 0 || state != kNcclInProgress) {
        st = Check("ncclCommInitRankConfig", r != 0 ? r : state);
      } else if (give_up && give_up()) {
        st = Status::Internal("NCCL: creating the communicator was given up (the job failed)");
      } else if (std::chrono::steady_clock::now() > deadline) {
        st = Status::Timeout("NCCL: not every local rank joined the communicator within " +
                             std::to_string(static_cast<int>(timeout_s)) + " s");
      }
      if (!st.ok()) {
        nccl_->CommAbort(comm_);  // nothing half made is left
        comm_ = nullptr;
        return st;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // The group holds comm_mu_ until GroupEnd has launched it (the same thread: the lock is
  // recursive, so the grouped calls take it again).
  Status GroupStart() override {
    BPS_RETURN_IF_ERROR(Use());
    comm_mu_.lock();
    if (!comm_) {
      comm_mu_.unlock();
      return Aborted();
    }
    Status st = Check("ncclGroupStart", nccl_->GroupStart());
    if (!st.ok()) comm_mu_.unlock();
    return st;
  }
  Status GroupEnd() override {
    ncclResult_t r = nccl_->GroupEnd();
    comm_mu_.unlock();
    return Settle("ncclGroupEnd", r);
  }
  Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                       Stream s) override {
    return Call("ncclReduceScatter", [&] {
      return nccl_->ReduceScatter(send, recv, count, NcclType(dtype), kNcclSum, comm_, s);
    });
  }
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                   Stream s) override {
    return Call("ncclAllReduce", [&] {
      return nccl_->AllReduce(send, recv, count, NcclType(dtype),
                              op == ReduceOp::kAvg ? kNcclAvg : kNcclSum, comm_, s);
    });
  }
  Status AllGather(const void* send, void* recv, size_t count, DType dtype, Stream s) override {
    return Call("ncclAllGather", [&] {
      return nccl_->AllGather(send, recv, count, NcclType(dtype), comm_, s);
    });
  }
  Status Broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                   Stream s) override {
    return Call("ncclBroadcast", [&] {
      return nccl_->Broadcast(send, recv, count, NcclType(dtype), root, comm_, s);
    });
  }
  Status AsyncError() override {
    ncclResult_t r = 0, state = 0;
    {
      std::lock_guard<std::recursive_mutex> lk(comm_mu_);
      if (!comm_) return Aborted();
      r = nccl_->CommGetAsyncError(comm_, &state);
    }
    if (r != 0) return Check("ncclCommGetAsyncError", r);
    if (state != 0 && state != kNcclInProgress) return Check("an NCCL call", state);
    return Status::OK();
  }
  void Abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lk(why_mu_);
      if (why_.empty()) why_ = why;
    }
    aborted_ = true;  // later calls fail at once, without waiting for comm_mu_
    std::lock_guard<std::recursive_mutex> lk(comm_mu_);
    if (!comm_) return;
    nccl_->CommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  Status Aborted() { return Status::Internal("NCCL: the communicator was aborted: " + Why()); }
  Status Use() {
    if (aborted_) return Aborted();
    cudaError_t e = cuda_->SetDevice(device_);
    if (e != 0) return Status::Internal("CUDA: " + cuda_->Error("cudaSetDevice", e));
    return Status::OK();
  }
  Status Check(const char* call, ncclResult_t r) const {
    if (r == 0) return Status::OK();
    return Status::Internal("NCCL: " + nccl_->Error(call, r));
  }
  // One collective call on the communicator, under comm_mu_, then settled.
  template <typename F>
  Status Call(const char* call, F&& f) {
    BPS_RETURN_IF_ERROR(Use());
    ncclResult_t r;
    {
      std::lock_guard<std::recursive_mutex> lk(comm_mu_);
      if (!comm_) return Aborted();
      r = f();
    }
    return Settle(call, r);
  }
  // A nonblocking communicator's call may return ncclInProgress: it is queued once the
  // communicator's state leaves that. Each poll holds comm_mu_, so an abort can come between.
  Status Settle(const char* call, ncclResult_t r) {
    while (r == kNcclInProgress) {
      ncclResult_t state = 0, q;
      {
        std::lock_guard<std::recursive_mutex> lk(comm_mu_);
        if (!comm_) return Aborted();
        q = nccl_->CommGetAsyncError(comm_, &state);
      }
      r = q != 0 ? q : state;
      if (r == kNcclInProgress) std::this_thread::yield();
    }
    return Check(call, r);
  }

  const NcclApi* nccl_;
  const CudaApi* cuda_;
  int device_;
  std::string Why() {
    std::lock_guard<std::mutex> lk(why_mu_);
    return why_;
  }

  std::recursive_mutex comm_mu_;
  ncclComm_t comm_ = nullptr;  // null once aborted (under comm_mu_)
  std::atomic<bool> aborted_{false};
  std::mutex why_mu_;
  std::string why_;  // the first Abort's reason
};

}  // namespace

bool CollectiveSupports(Kind kind, DType dtype) {
  if (kind == Kind::kFake) return DTypeSize(dtype) > 0;
  return kind == Kind::kCuda && NcclType(dtype) >= 0;
}

Status NewCollectiveId(Kind kind, const std::string& job, int size, std::string* id) {
  if (kind == Kind::kFake) return NewFakeCollectiveId(job, size, id);
  std::string why;
  const NcclApi* api = kind == Kind::kCuda ? UsableNccl(&why) : nullptr;
  if (!api) return Status::InvalidArgument("NCCL stages are off: " + why);
  NcclUniqueId u;
  ncclResult_t r = api->GetUniqueId(&u);
  if (r != 0) return Status::Internal("NCCL: " + api->Error("ncclGetUniqueId", r));
  id->assign(u.internal, sizeof(u.internal));
  return Status::OK();
}

Status CreateCollective(Kind kind, const std::string& id, int rank, int size, int device,
                        double timeout_s, const std::function<bool()>& give_up,
                        std::unique_ptr<Collective>* out) {
  if (kind == Kind::kFake) return CreateFakeCollective(id, rank, size, timeout_s, give_up, out);
  std::string why;
  const NcclApi* api = kind == Kind::kCuda ? UsableNccl(&why) : nullptr;
  if (!api) return Status::InvalidArgument("NCCL stages are off: " + why);
  NcclUniqueId u;
  if (id.size() != sizeof(u.internal))
    return Status::Internal("NCCL: the communicator id received has " +
                            std::to_string(id.size()) + " bytes, not " +
                            std::to_string(sizeof(u.internal)));
  memcpy(u.internal, id.data(), sizeof(u.internal));
  auto c = std::make_unique<NcclCollective>(api, LoadedCuda(), rank, size, device);
  BPS_RETURN_IF_ERROR(c->Init(u, timeout_s, give_up));
  *out = std::move(c);
  return Status::OK();
}

}  // namespace device
}  // namespace byteps
