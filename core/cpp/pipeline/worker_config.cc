// The worker's configuration (LoadWorkerConfig, from the knobs: common/knobs.h): every knob of
// a worker process read and checked once, at init.
#include "pipeline/worker_config.h"

#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <string>

#include "scheduling/partitioner.h"
#include "scheduling/push_window.h"

namespace byteps {

Status LoadWorkerConfig(const Knobs& k, WorkerConfig* cfg) {
  if (k.Str("DMLC_ROLE") != "worker")
    return Status::Config("DMLC_ROLE=" + k.Str("DMLC_ROLE") +
                          ": this process calls the worker API, so DMLC_ROLE must be 'worker' "
                          "(servers and the scheduler run `python -m byteps.server`)");
  cfg->num_worker = static_cast<int>(k.Int("DMLC_NUM_WORKER"));
  cfg->num_server = static_cast<int>(k.Int("DMLC_NUM_SERVER"));
  cfg->worker_id = static_cast<int>(k.Int("DMLC_WORKER_ID"));
  cfg->local_size = static_cast<int>(k.Int("BYTEPS_LOCAL_SIZE"));
  cfg->local_rank = static_cast<int>(k.Int("BYTEPS_LOCAL_RANK"));
  cfg->async_mode = k.Bool("BYTEPS_ENABLE_ASYNC");
  cfg->max_staleness = static_cast<int>(k.Int("BYTEPS_ASYNC_MAX_STALENESS"));
  // Asynchronous training needs the servers (they keep the parameters), even on one machine.
  cfg->distributed =
      cfg->num_worker > 1 || k.Bool("BYTEPS_FORCE_DISTRIBUTED") || cfg->async_mode;
  if (cfg->local_rank >= cfg->local_size)
    return Status::Config("BYTEPS_LOCAL_RANK=" + std::to_string(cfg->local_rank) +
                          " must be smaller than BYTEPS_LOCAL_SIZE=" +
                          std::to_string(cfg->local_size));
  if (cfg->worker_id >= cfg->num_worker)
    return Status::Config("DMLC_WORKER_ID=" + std::to_string(cfg->worker_id) +
                          " must be smaller than DMLC_NUM_WORKER=" +
                          std::to_string(cfg->num_worker));
  if (cfg->num_worker > 1 && !k.IsSet("DMLC_WORKER_ID"))
    return Status::Config("DMLC_WORKER_ID is not set: it is required when DMLC_NUM_WORKER=" +
                          std::to_string(cfg->num_worker) + " > 1 (index of this worker machine)");
  if (cfg->distributed) {
    if (k.Str("DMLC_PS_ROOT_URI").empty())
      return Status::Config("DMLC_PS_ROOT_URI is not set: a distributed job (DMLC_NUM_WORKER=" +
                            std::to_string(cfg->num_worker) +
                            (k.Bool("BYTEPS_FORCE_DISTRIBUTED") ? ", BYTEPS_FORCE_DISTRIBUTED=1" : "") +
                            ") needs the scheduler's IP address");
    if (!k.IsSet("DMLC_PS_ROOT_PORT"))
      return Status::Config("DMLC_PS_ROOT_PORT is not set: a distributed job needs the "
                            "scheduler's TCP port");
  }
  // The synchronization scheme (docs/schemes.md).
  const std::string sync = k.Str("BYTEPS_SYNC");
  cfg->sync_auto = sync == "auto";
  if (!cfg->sync_auto && !ParseSyncScheme(sync, &cfg->sync))
    return Status::Config("BYTEPS_SYNC=" + sync + ": expected ps, ring, tree, hips or auto");
  // The width matters (and must divide the machine count) only where a tree may be used.
  const bool tree_possible = cfg->sync_auto || cfg->sync == SyncScheme::kTree;
  Status width = ResolveTreeWidth(cfg->num_worker, static_cast<int>(k.Int("BYTEPS_TREE_WIDTH")),
                                  &cfg->tree_width);
  if (!width.ok() && tree_possible) return width;
  if (!width.ok()) ResolveTreeWidth(cfg->num_worker, 0, &cfg->tree_width);
  cfg->nccl = k.Bool("BYTEPS_NCCL");
  cfg->hips_group = HipsGroupSize(cfg->num_worker, static_cast<int>(k.Int("BYTEPS_HIPS_GROUP")));
  if (cfg->async_mode && (cfg->sync_auto || cfg->sync != SyncScheme::kPs))
    return Status::Config("BYTEPS_ENABLE_ASYNC=1 needs BYTEPS_SYNC=ps (got " + sync +
                          "): the summation service's servers keep the parameters");
  const bool all_reduce_only = !cfg->sync_auto && IsCollective(cfg->sync);
  // The worker mesh carries the ring and tree all-reduces and the collectives beside
  // allreduce (allgather, broadcast, reducescatter: docs/collectives.md), so every distributed
  // job has it, except asynchronous training, whose workers may leave without failing the job.
  cfg->mesh = cfg->distributed && !cfg->async_mode;
  if (cfg->distributed && cfg->num_server < 1 && (!all_reduce_only || cfg->async_mode))
    return Status::Config(
        "DMLC_NUM_SERVER=" + std::to_string(cfg->num_server) +
        ": a distributed job needs at least one server (" +
        (cfg->async_mode ? std::string("BYTEPS_ENABLE_ASYNC=1: the servers keep the parameters")
                         : "BYTEPS_SYNC=" + sync + "; only ring and tree run without servers") +
        ")");
  cfg->root_uri = k.Str("DMLC_PS_ROOT_URI");
  cfg->root_port = static_cast<int>(k.Int("DMLC_PS_ROOT_PORT"));
  cfg->node_host = k.Str("DMLC_NODE_HOST");
  cfg->interface = k.Str("DMLC_INTERFACE");
  cfg->size = cfg->num_worker * cfg->local_size;
  int64_t global = k.Int("BYTEPS_GLOBAL_RANK");
  cfg->rank_given = global >= 0;
  cfg->rank = global >= 0 ? static_cast<int>(global)
                          : cfg->worker_id * cfg->local_size + cfg->local_rank;
  // Partitions exist for the network (priority preemption, credit); a single-machine job only
  // pays their per-partition hand-offs, so unless set it uses larger ones
  // (kSingleMachinePartitionBytes; docs/performance-notes.md).
  const int64_t partition_bytes = cfg->distributed || k.IsSet("BYTEPS_PARTITION_BYTES")
                                      ? k.Int("BYTEPS_PARTITION_BYTES")
                                      : kSingleMachinePartitionBytes;
  cfg->partition_bound = PartitionBound(partition_bytes, cfg->local_size);
  cfg->credit_bytes = static_cast<size_t>(k.Int("BYTEPS_SCHEDULING_CREDIT")) * cfg->partition_bound;
  cfg->register_bound = cfg->partition_bound;
  BPS_RETURN_IF_ERROR(LoadAutotuneConfig(k, cfg));
  // The user's credit is kept as given; the tuner sets its own. Otherwise the window adapts,
  // from the default credit, up to kAdaptiveCreditMaxBounds partition bounds.
  cfg->adaptive_credit = cfg->distributed && !k.IsSet("BYTEPS_SCHEDULING_CREDIT") &&
                         !cfg->autotune.enabled && cfg->credit_bytes > 0;
  cfg->credit_max_bytes = kAdaptiveCreditMaxBounds * cfg->partition_bound;
  if (cfg->autotune.enabled && (cfg->sync_auto || cfg->sync != SyncScheme::kPs))
    return Status::Config("BYTEPS_AUTOTUNE=1 works with BYTEPS_SYNC=ps only (BYTEPS_SYNC=" + sync +
                          ")");
  cfg->min_compress_bytes = static_cast<size_t>(k.Int("BYTEPS_MIN_COMPRESS_BYTES"));
  cfg->timeout_s = k.Float("BYTEPS_TIMEOUT");
  cfg->stall_warning_s = k.Float("BYTEPS_STALL_WARNING_SECONDS");
  cfg->heartbeat_interval_s = k.Float("BYTEPS_HEARTBEAT_INTERVAL");
  cfg->heartbeat_timeout_s = k.Float("BYTEPS_HEARTBEAT_TIMEOUT");
  BPS_RETURN_IF_ERROR(VanSpec::FromKnobs(k, &cfg->van));
  cfg->job = k.Str("BYTEPS_JOB_ID");
  if (cfg->job.empty()) {
    cfg->job = cfg->distributed ? cfg->root_uri + "-" + std::to_string(cfg->root_port)
                                : "p" + std::to_string(getppid());
  }
  for (auto& ch : cfg->job)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '-';
  cfg->trace.on = k.Bool("BYTEPS_TRACE_ON");
  cfg->trace.start_step = static_cast<uint32_t>(k.Int("BYTEPS_TRACE_START_STEP"));
  cfg->trace.end_step = static_cast<uint32_t>(k.Int("BYTEPS_TRACE_END_STEP"));
  cfg->trace.dir = k.Str("BYTEPS_TRACE_DIR");
  if (cfg->trace.dir.empty()) cfg->trace.dir = ".";
  cfg->trace.rank = cfg->rank;
  cfg->trace.local_rank = cfg->local_rank;
  cfg->trace.worker_id = cfg->worker_id;
  cfg->trace.local_size = cfg->local_size;
  if (cfg->trace.on && cfg->trace.end_step <= cfg->trace.start_step)
    return Status::Config("BYTEPS_TRACE_END_STEP=" + std::to_string(cfg->trace.end_step) +
                          " must be larger than BYTEPS_TRACE_START_STEP=" +
                          std::to_string(cfg->trace.start_step) + " (the window is [start, end))");
  cfg->telemetry_on = k.Bool("BYTEPS_TELEMETRY_ON");
  cfg->telemetry_interval_s = k.Float("BYTEPS_TELEMETRY_INTERVAL");
  return Status::OK();
}

}  // namespace byteps
