// The worker core: one per worker process. Owns the tensor table, the stage loops, gates,
// handles, the watchdog and the local signalling channel (local_channel.h), and the classes of
// its concerns: the stall inspector (stall_inspector.h), the NCCL sequencer (nccl_sequencer.h)
// and the autotuner (autotuner.h). On the local root of a distributed job it reaches the
// scheduler and the servers only through its PS client (ps/ps_client.h), whose PullSink it is.
// Entry points are the functions in api.h.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pipeline/autotuner.h"
#include "pipeline/context.h"
#include "pipeline/device_waiter.h"
#include "pipeline/gate.h"
#include "pipeline/handles.h"
#include "pipeline/local_channel.h"
#include "pipeline/nccl_sequencer.h"
#include "pipeline/push_pull_args.h"
#include "pipeline/stall_inspector.h"
#include "pipeline/telemetry.h"
#include "pipeline/timeline.h"
#include "pipeline/worker_config.h"
#include "ps/ps_client.h"
#include "scheduling/push_window.h"
#include "scheduling/scheduled_queue.h"

namespace byteps {

class WorkerCore : public PullSink, public CollectiveSink {
 public:
  explicit WorkerCore(WorkerConfig cfg);
  ~WorkerCore() override;

  Status Start();
  void Stop();
  const WorkerConfig& config() const { return cfg_; }
  // The job's servers and how many of them run on no worker machine's host (CPU-only), from
  // the scheduler's address book (the local root's; its other local ranks get them with READY):
  // the same on every rank. {0, 0} on a single machine.
  std::pair<int, int> ServerPlacement() const { return {num_servers_, cpu_only_servers_}; }
  // Whether a tensor of `nbytes` declared with a compressor is compressed (upstream's rule: only
  // a distributed job compresses, there being no wire to save on one machine, and not a tensor
  // below BYTEPS_MIN_COMPRESS_BYTES). Only the summation service (sync=ps) carries it.
  bool Compresses(size_t nbytes) const {
    return cfg_.distributed && nbytes >= cfg_.min_compress_bytes;
  }
  // The PUSH credit: (adaptive, current window bytes, mean window bytes over the pushes so
  // far, changes); a fixed credit reports its bytes as both windows and 0 changes.
  std::tuple<bool, size_t, double, uint64_t> PushCredit() const;

  // `compression`: the compressor's canonical kwargs (compress::FormatSpec), "" for none;
  // fixed by the first declaration or push_pull of the name (InvalidArgument on a change).
  // `sync`: the tensor's synchronization scheme ("ps", "ring", "tree", "hips"; "" = the job's
  // BYTEPS_SYNC), fixed by the first declaration that gives one (InvalidArgument on a change or
  // after the first push_pull).
  Status Declare(const std::string& name, const std::string& compression, uint32_t* key,
                 const std::string& sync = "", uint32_t process_set = 0);
  // Horovod's join (docs/collectives.md, "Join"; worker_join.cc): this machine has run out of
  // data. Blocks (the caller's thread) until every worker machine has joined; meanwhile the
  // others' operations complete without this machine, and its keys and rounds are brought in
  // line with theirs before it returns. *last_rank: the rank that joined last. ConfigError where
  // the job cannot (several processes per machine, BYTEPS_SYNC other than ps, asynchronous
  // training, BYTEPS_AUTOTUNE); InvalidArgument with an operation in flight; the job's failure.
  Status Join(int* last_rank);
  // Every tensor name declared so far, in key order (suspend/resume re-declares them).
  std::vector<std::string> DeclaredNames();
  // push_pulls of `name` started since init (0: none, or not declared). An asynchronous
  // parameter's next push is its initial value when this is 0 (docs/async.md).
  uint32_t Rounds(const std::string& name);
  Status Enqueue(const PushPullArgs& args, int64_t* handle);
  HandleTable& handles() { return handles_; }
  AutotuneReport AutotuneStatus() { return tuner_ ? tuner_->Report() : AutotuneReport{}; }
  // push_pull telemetry (docs/timeline.md): the speed samples, and per declared tensor
  // (name, bytes, completed push_pulls, their summed duration in ns).
  Telemetry& telemetry() { return telemetry_; }
  struct TensorTelemetry {
    std::string name;
    uint64_t bytes, count, ns;
  };
  std::vector<TensorTelemetry> TensorTelemetries();
  // Where this process's timeline goes, whether it has been written.
  std::string TracePath() const { return timeline_.Path(); }
  bool TraceWritten() { return timeline_.written(); }
  // Horovod's start_timeline / stop_timeline (Timeline::Start, Timeline::Stop).
  Status StartTimeline(const std::string& file) { return timeline_.Start(file); }
  Status StopTimeline() { return timeline_.Stop(); }

  // PullSink (the PS client's receiving threads): a pull response goes into the aggregate
  // (local_size > 1) or the output, a large one streamed and averaged on the way in.
  PullDest PullDestination(PendingPull* p, uint64_t payload_len, bool written) override;
  void OnPulled(PendingPull* p) override;
  void OnPushAcked(PendingPull* p) override;

  // CollectiveSink (the worker mesh's receiving threads; worker_collective.cc).
  Status CollectiveDestination(int peer, const FrameHeader& h, void** dest) override;
  void OnCollective(int peer, const FrameHeader& h) override;
  void OnPeerLeft(int peer) override;
  void OnPeerAbort(int peer, uint32_t key, uint32_t round, const std::string& text) override;
  void OnPeerLost(int peer, const Status& why) override;

 private:
  friend struct StageTable;  // its rows name the Run* members
  // --- set-up (worker_init.cc) ---
  Status LocalRendezvous();
  Status ConnectToJob();
  void StartThreads();
  void BuildStagePlan();
  // --- operations (worker_ops.cc) ---
  // *out: the tensor `name` of `process_set`, made with the set's next declared key when new.
  // InvalidArgument when the set has 65535 tensors already or `name` belongs to another set.
  Status ContextOf(const std::string& name, uint32_t process_set, TensorContext** out);
  // Makes and registers the tensor `name` under declared key `key` (its set's next keys come
  // after it), under ctx_mu_.
  TensorContext* MakeContextLocked(const std::string& name, uint32_t key);
  // Join: the others declared `name` as `key` while this machine was joined (worker_join.cc).
  void AdoptTensor(uint32_t key, const std::string& name);
  // A tensor's process set checked against this job and machine (InitContext).
  Status CheckProcessSet(const PushPullArgs& a) const;
  // The ranks an average divides by: the process set's, or the job's.
  int AverageDivisor(const TensorContext* ctx) const {
    return ctx->set_size > 0 ? ctx->set_size : cfg_.size;
  }
  Status InitContext(TensorContext* ctx, const PushPullArgs& args);
  // The tasks of `parts` for ctx (keys of generation ctx->key_gen).
  void MakeTasks(TensorContext* ctx, const std::vector<Partition>& parts);
  // BYTEPS_AUTOTUNE (docs/autotune.md), under ctx->mu, no operation in flight: cuts the tensor
  // with the autotuner's point in use, under new keys, when the cut differs (a re-declaration
  // follows).
  Status Repartition(TensorContext* ctx);
  void Dispatch(PartTask* t);
  void Proceed(PartTask* t);
  void PartitionDone(PartTask* t);
  // The last partition of an operation finished: the timeline's tensor event, telemetry.
  void OpCompleted(TensorContext* ctx);
  void FinishOp(TensorContext* ctx, const Status& st, bool sticky);
  // The local root fails an operation for good on every process of this machine (OP_ERROR to
  // the other local ranks, then FinishOp, sticky).
  void FailOpOnMachine(TensorContext* ctx, const Status& st);
  // `report`: tell the scheduler (and so every node) the cause; false when it came from there.
  void Fatal(const Status& st, bool report = true);
  // The watchdog thread, once a second: the stall inspector's check (operation timeouts,
  // stall warnings, left workers), then the liveness of the other local processes.
  void WatchdogLoop();
  // The gate in front of stage s in ctx's plan, for the stall inspector.
  StallGate GateAt(const TensorContext* ctx, Stage s) const;
  // --- stages (worker_stages.cc) ---
  void StageLoop(Stage s);
  void RunStageItem(Stage s, const QueueItem& item);
  // The stages' run functions (StageTable::rows[].run; PUSH's is in worker_remote.cc).
  void RunCopyIn(PartTask* t);
  void RunLocalReduce(PartTask* t);
  void RunPush(PartTask* t);
  void RunCopyOut(PartTask* t);
  void RunCopyOutShard(PartTask* t);  // an NCCL tensor's COPY_OUT
  // --- device tensors (worker_device.cc; docs/gpu.md) ---
  void RunCopyD2H(PartTask* t);
  void RunCopyH2D(PartTask* t);
  // Either: the partition (an NCCL tensor: this process's shard) between device and host.
  void RunCopyAcross(PartTask* t, device::CopyDir dir);
  // One process on one machine (Layout::kOneProcess): nothing is summed, a device tensor stays
  // on its device (no COPY_D2H / COPY_H2D in the layout's plan).
  bool OneProcessJob() const {
    return LayoutOf(cfg_.local_size, cfg_.distributed, true) == Layout::kOneProcess;
  }
  // COPY_OUT of a device tensor in a one-process job: the partition from the device input to
  // the device output on the device's own copy stream, after the producer's event.
  void RunCopyWithinDevice(PartTask* t);
  // InitContext of a device tensor: its backend, its pinned host buffer (not in a one-process
  // job), the copy threads.
  Status InitDevice(TensorContext* ctx, const PushPullArgs& a);
  // Before a failed device operation is reported: its copies still queued on the device are
  // waited for (no late copy into memory the caller may free).
  void DrainDeviceCopies(TensorContext* ctx);
  // --- NCCL among the machine's GPUs (the NCCL sequencer's calls; docs/gpu.md) ---
  void RunReduce(PartTask* t) { nccl_.Run(t, true); }
  void RunBroadcast(PartTask* t) { nccl_.Run(t, false); }
  // A copy stage's event completed (or its copy failed): the next stage, or Fatal.
  void OnCopied(PartTask* t, const Status& st);
  // --- compressed tensors (worker_compress.cc; docs/compression.md) ---
  void RunCompress(PartTask* t);
  void RunDecompress(PartTask* t);
  // InitContext: whether the tensor is compressed (distributed, declared with a compressor, at
  // least BYTEPS_MIN_COMPRESS_BYTES), checking the compressor against its dtype.
  Status DecideCompression(TensorContext* ctx);
  // The local root, once the plan names each partition's server: the partitions' compressors
  // and buffers, and KEY_CONFIG to their servers.
  Status SetUpCompression(TensorContext* ctx);
  // Bytes a partition's push puts on the wire (its encoding for a compressed tensor): what it
  // holds of the PUSH queue's credit.
  static size_t PushBytes(const PartTask* t);
  // to < 0: every other local rank; `code`: the signal's code byte (kCollReady, kCollGo: the
  // stage).
  void SendSignal(LocalSignalType type, PartTask* t, int to, uint8_t code = 0);
  void ListenLoop();
  void OnLocalSignal(const LocalSignal& s);
  // --- remote: the PS client's side of the stages (worker_remote.cc) ---
  void SendDeclare(TensorContext* ctx);
  void OnDeclareAnswer(TensorContext* ctx, const DeclareAnswer& a);
  void OnPushSent(PartTask* t, const Status& st);
  // --- all-reduce tensors: ring, tree (worker_collective.cc; docs/schemes.md) ---
  // InitContext: the scheme of the tensor, checked against the job and its compression.
  Status DecideSync(TensorContext* ctx);
  // The local root: each partition's program and buffers.
  void SetUpCollective(TensorContext* ctx);
  // The mesh program of partition t of a collective (not allreduce): over the job's worker
  // machines, or a process set's, built on the set's numbering and sent to the real machines.
  CollProgram LayoutProgramOf(const TensorContext* ctx, const PartTask* t) const;
  void RunReduceScatter(PartTask* t);
  // Walks t's program as far as the messages in allow (any thread).
  void CollAdvance(PartTask* t);
  // The program ended and its sends are written: ALL_GATHER is done.
  void CollFinished(PartTask* t);
  void ReturnCollCredit(PartTask* t);
  static void CollSentThunk(void* arg, const Status& st);
  // The task and receive op a COLLECTIVE frame is for (null: none).
  PartTask* CollTaskOf(uint64_t key);
  // A failed operation: its partitions stop walking; returns once nothing is received into the
  // caller's buffers any more (or after timeout_s).
  void CancelCollective(TensorContext* ctx);
  // An all-reduce operation fails because a machine shut down before it could complete: on
  // this machine, and (PEER_ABORT) on every mesh peer, which passes it on.
  void AbortCollective(TensorContext* ctx, uint32_t round, const Status& st);
  static void PushSentThunk(void* arg, const Status& st);

  WorkerConfig cfg_;
  HandleTable handles_;
  Timeline timeline_;
  Telemetry telemetry_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> threads_stop_{false};
  std::mutex fatal_mu_;
  Status fatal_;
  std::atomic<bool> failed_{false};

  // tensors
  std::mutex ctx_mu_;
  std::unordered_map<std::string, TensorContext*> by_name_;
  std::vector<std::unique_ptr<TensorContext>> contexts_;  // in creation order
  std::unordered_map<uint32_t, TensorContext*> by_key_;    // by declared key
  std::map<uint32_t, uint32_t> set_tensors_;               // tensors made, per process set
  // join (worker_join.cc): set by JOIN_DONE
  std::mutex join_mu_;
  std::condition_variable join_cv_;
  bool join_done_ = false;
  int join_last_ = -1;
  std::map<uint32_t, Status> early_errors_;               // OP_ERROR before the tensor existed

  // stage plan (from this process's layout column of the stage table): the list every task
  // walks, how a task enters each stage, and the gate in front of it
  // Indexed by TensorContext::plan(): [0] a plain tensor's plan, [1] a compressed tensor's
  // (with COMPRESS and DECOMPRESS), [2] and [3] the same on a device (with COPY_D2H, COPY_H2D).
  // [4..7]: the same for an all-reduce tensor (REDUCE_SCATTER, ALL_GATHER instead of PUSH, PULL).
  // [8..15]: the same from the NCCL columns (only the device ones are used).
  static constexpr int kPlanVariants = 16;
  StageList plans_[kPlanVariants];
  Entry entry_[kStageCount] = {};
  Gate* gate_before_[kPlanVariants][kStageCount] = {};
  std::unique_ptr<Gate> written_gate_, reduced_gate_, pulled_gate_;
  // A sequenced stage's gate (BYTEPS_NCCL): on the root, the other local processes' READY; on
  // the others, the root's GO (its release runs the stage in the listening thread, in the order
  // the GOs came).
  std::unique_ptr<Gate> seq_gate_[kStageCount];
  std::unique_ptr<ScheduledQueue> queues_[kStageCount];
  std::vector<std::thread> threads_;

  // local machine
  LocalChannel channel_;
  std::unique_ptr<std::atomic<bool>[]> local_bye_;

  // distributed (local root): the scheduler and the servers
  std::unique_ptr<PsClient> ps_;
  int num_servers_ = 0, cpu_only_servers_ = 0;  // ServerPlacement()
  // Worker machines that said PEER_GOODBYE (the worker mesh), by worker id.
  std::unique_ptr<std::atomic<bool>[]> peer_left_;
  // AbortCollective's threads (rare: a peer shut down mid-operation), joined by Stop().
  std::mutex abort_mu_;
  std::vector<std::thread> abort_threads_;

  std::unique_ptr<Autotuner> tuner_;  // BYTEPS_AUTOTUNE only
  std::unique_ptr<PushWindow> push_window_;  // WorkerConfig::adaptive_credit only

  // Device tensors: the threads that wait for the copies' events, one per direction, started
  // with the first device tensor.
  DeviceWaiter d2h_waiter_, h2d_waiter_;
  // NCCL among the machine's GPUs (BYTEPS_NCCL): the communicator and the order of its calls.
  NcclSequencer nccl_;
  // The watchdog's stall inspector, made when the threads start (after the PS client).
  std::unique_ptr<StallInspector> stall_;
};

}  // namespace byteps
