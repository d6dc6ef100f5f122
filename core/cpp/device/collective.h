// The collective seam among the GPUs of one machine (docs/gpu.md "NCCL among the GPUs of a
// machine"): the calls the REDUCE and BROADCAST stages make on one communicator per worker
// process, each queued on a device stream like a copy. Two backends: NCCL (nccl_collective.cc,
// loaded at run time, cuda_api.h) and the fake device's (fake_collective.cc: the local
// processes meet in a shared-memory segment, each call run by the stream's thread, so a call
// made in another order on another rank, or a rank that never comes, is seen).
//
// Every rank of a communicator must make the same calls in the same order (NCCL's rule); the
// worker pipeline keeps it by letting the local root order the calls (WorkerCore::RunReduce).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/dtype.h"
#include "common/status.h"
#include "device/device.h"

namespace byteps {
namespace device {

enum class ReduceOp : uint8_t { kSum, kAvg };

class Collective {
 public:
  virtual ~Collective() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }

  // The calls between GroupStart and GroupEnd are launched together (ncclGroupStart/End).
  virtual Status GroupStart() = 0;
  virtual Status GroupEnd() = 0;
  // recv[0, count) = the sum over ranks of their send[rank() * count, (rank() + 1) * count).
  // In place when recv == send + rank() * count elements.
  virtual Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                               Stream s) = 0;
  // recv[0, count) = the sum (kAvg: divided by size()) over ranks of send[0, count).
  virtual Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                           Stream s) = 0;
  // recv[r * count, (r + 1) * count) = rank r's send[0, count), for every r. In place when
  // send == recv + rank() * count elements.
  virtual Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                           Stream s) = 0;
  // recv[0, count) = rank `root`'s send[0, count).
  virtual Status Broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                           Stream s) = 0;
  // An error of the calls made so far that their events do not carry (NCCL's asynchronous
  // error, a rank that did not come); OK while none.
  virtual Status AsyncError() = 0;
  // From any thread: the calls in flight end (with an error saying `why`) and later ones fail
  // at once, on every rank it can reach. What a failed job does before it waits for its device
  // work.
  virtual void Abort(const std::string& why) = 0;

 protected:
  int rank_ = 0, size_ = 1;
};

// Whether a tensor of `dtype` can be summed by the backend of `kind` (NCCL: not every byteps
// dtype is an NCCL type on every version).
bool CollectiveSupports(Kind kind, DType dtype);

// The root's part of creating a communicator of `size` ranks: a fresh id for the others to join
// with (ncclGetUniqueId; the fake device: the name of the segment it makes), as bytes. Errors:
// the backend is off (NCCL not loaded, or older than 2.18: the reason).
Status NewCollectiveId(Kind kind, const std::string& job, int size, std::string* id);

// Creates this process's communicator: rank `rank` of `size`, on device `device` (the calling
// thread's current device is set to it), joined through `id`. Waits for every rank to join, at
// most `timeout_s` seconds, giving up early when `give_up()` turns true (another rank failed);
// a communicator half made is aborted, not left behind. Errors: Timeout, Internal (the
// backend's text).
Status CreateCollective(Kind kind, const std::string& id, int rank, int size, int device,
                        double timeout_s, const std::function<bool()>& give_up,
                        std::unique_ptr<Collective>* out);

}  // namespace device
}  // namespace byteps
