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
//
// The sequencer owns the process's communicator and that order; the gates that hold the
// partitions until their turn are the worker core's (WorkerCore::BuildStagePlan), which owns
// one sequencer.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "device/collective.h"
#include "device/device.h"
#include "pipeline/device_waiter.h"
#include "pipeline/local_channel.h"

namespace byteps {

struct PartTask;
struct TensorContext;
struct WorkerConfig;

class NcclSequencer {
 public:
  // What the sequencer needs from the worker core.
  struct Hooks {
    // Sends a signal to one local rank over the machine's channel (the root's kCollInit).
    std::function<Status(int local_rank, const LocalSignal&)> send;
    // The root's GO for t's call at stage `stage` (a Stage) to every other local process
    // (kCollGo; WorkerCore::SendSignal, which fails the job when one of them is gone).
    std::function<void(PartTask* t, uint8_t stage)> send_go;
    // t's call completed on the device, or failed (WorkerCore::OnCopied: the next stage, or
    // the job fails).
    std::function<void(PartTask* t, const Status&)> done;
    // Whether the job has failed: the wait for the communicator's id, and its making, give up.
    std::function<bool()> failed;
    // The communicator could not be made: the job fails (WorkerCore::Fatal), on a thread of its
    // own (the caller holds the tensor's lock).
    std::function<void(const Status&)> fail_job;
  };
  // `cfg` outlives the sequencer.
  NcclSequencer(const WorkerConfig& cfg, Hooks hooks);

  // InitDevice of a device tensor whose name, dtype, size, device kind and id are set: whether
  // it is summed by NCCL (ctx->nccl); if so the communicator, made with the first such tensor.
  // InvalidArgument for a dtype NCCL does not sum or a second device; the communicator's error.
  Status Decide(TensorContext* ctx);
  // The call of REDUCE (reduce) or BROADCAST for partition t (WorkerCore::RunReduce,
  // RunBroadcast): on the root (its stage thread) first GO to the others, under seq_mu_ so
  // that the order of the GOs is the order of the calls; `done` follows when the call's event
  // completes.
  void Run(PartTask* t, bool reduce);
  // This process's shard of partition t (bytes from the partition's start): equal shards of
  // the partition's elements, the last process's with the remainder.
  void Shard(const PartTask* t, size_t* begin, size_t* end) const;
  // The listening thread's kCollInit from the local root: the communicator's id, or why it
  // could not make one.
  void OnCollInit(const LocalSignal& s);
  // Ends the calls in flight (any thread): a failed NCCL operation, or the job's failure.
  void Abort(const std::string& why);
  // Shutdown, after the stage threads: waits for the calls' events, then destroys the
  // communicator (ncclCommDestroy; a failed job's was aborted).
  void Stop();

 private:
  // This process's communicator among the machine's local processes, made once (the root makes
  // the id and sends it, kCollInit); later calls return it, or the error it failed with.
  Status Ensure(device::Kind kind, int device_id);

  const WorkerConfig& cfg_;
  Hooks hooks_;
  // The thread that waits for the calls' events.
  DeviceWaiter waiter_;
  // The communicator once made (live_: the same, for Abort from any thread), its backend and
  // device, its stream; the error it failed with; the id the root sent (non-roots), and seq_mu_
  // ordering the root's GOs and calls.
  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<device::Collective> coll_;
  std::atomic<device::Collective*> live_{nullptr};
  device::Kind kind_ = device::Kind::kHost;
  int device_ = -1;
  device::Stream stream_ = nullptr;
  Status status_;
  bool creating_ = false;  // a thread is making the communicator (mu_ released)
  bool id_received_ = false;
  Status id_status_;
  std::string id_;
  std::mutex seq_mu_;
};

}  // namespace byteps
