// The configuration of a worker process (WorkerConfig), read and checked once from the knobs by
// LoadWorkerConfig (worker_config.cc). The worker core and the classes it owns (the stall
// inspector, the NCCL sequencer, the autotuner) read it; nothing changes it after init.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/van.h"
#include "common/knobs.h"
#include "common/status.h"
#include "pipeline/autotuner.h"
#include "pipeline/timeline.h"
#include "ps/sync_scheme.h"

namespace byteps {

// BYTEPS_PARTITION_BYTES of a single-machine job when the variable is not set: with no network
// there is nothing to preempt, and every partition costs signals and thread hand-offs between
// the local processes (measured: docs/performance-notes.md, "Single-machine partitions").
constexpr int64_t kSingleMachinePartitionBytes = 4 << 20;

// Tensors whose name starts with this are asynchronous parameters when BYTEPS_ENABLE_ASYNC=1
// (docs/async.md): the servers keep their value; every other name stays synchronous.
constexpr const char* kAsyncParamPrefix = "AsyncParam.";

struct WorkerConfig {
  int num_worker = 1, worker_id = 0, local_size = 1, local_rank = 0, rank = 0, size = 1;
  // The launcher gave the rank (BYTEPS_GLOBAL_RANK); else it is worker_id * local_size +
  // local_rank, so the ranks are numbered machine by machine.
  bool rank_given = false;
  bool async_mode = false;  // BYTEPS_ENABLE_ASYNC
  int max_staleness = -1;   // BYTEPS_ASYNC_MAX_STALENESS
  int num_server = 0;
  bool distributed = false;
  size_t partition_bound = 0;
  size_t credit_bytes = 0;
  // BYTEPS_SCHEDULING_CREDIT unset (and no BYTEPS_AUTOTUNE): the PUSH credit follows the
  // acknowledgement delay (scheduling/push_window.h), from credit_bytes, within
  // [partition_bound, credit_max_bytes].
  bool adaptive_credit = false;
  size_t credit_max_bytes = 0;
  size_t min_compress_bytes = 65536;  // BYTEPS_MIN_COMPRESS_BYTES
  double timeout_s = 120, heartbeat_interval_s = 1, heartbeat_timeout_s = 15;
  VanSpec van;  // of every connection (VanSpec::FromKnobs)
  // BYTEPS_SYNC (docs/schemes.md): the scheme of a tensor not declared with one; sync_auto:
  // BYTEPS_SYNC=auto (every tensor must then be declared with one: the Python layer asks the
  // cost model). tree_width: BYTEPS_TREE_WIDTH resolved (ResolveTreeWidth). mesh: this local
  // root joins the worker mesh (ring, tree or auto in a distributed job).
  SyncScheme sync = SyncScheme::kPs;
  bool sync_auto = false;
  int tree_width = 1;
  int hips_group = 1;  // BYTEPS_HIPS_GROUP resolved (HipsGroupSize)
  // BYTEPS_NCCL: device tensors of a machine with several local processes are summed among
  // its GPUs by NCCL (the REDUCE and BROADCAST stages; docs/gpu.md).
  bool nccl = false;
  bool mesh = false;
  double stall_warning_s = 60;  // 0: no stall warning
  std::string job, root_uri, node_host, interface;
  int root_port = 0;
  // BYTEPS_AUTOTUNE (docs/autotune.md); register_bound: the partition bound this worker
  // registers (the largest the tuner may try; partition_bound otherwise).
  AutotuneConfig autotune;
  size_t register_bound = 0;
  TimelineConfig trace;  // BYTEPS_TRACE_* (docs/timeline.md)
  bool telemetry_on = true;
  double telemetry_interval_s = 10;
  bool is_root() const { return local_rank == 0; }
};

// Reads and validates every knob for a worker process (raises nothing; returns the error).
Status LoadWorkerConfig(const Knobs& knobs, WorkerConfig* cfg);

}  // namespace byteps
