#include "ps/node_main.h"

#include <string>

#include "common/knobs.h"
#include "common/logging.h"
#include "ps/process_setup.h"
#include "ps/scheduler.h"
#include "ps/server.h"
#include "ps/sync_scheme.h"

namespace byteps {

Status RunNodeFromEnvironment() {
  Knobs k;
  BPS_RETURN_IF_ERROR(Knobs::FromEnvironment(&k));
  ApplyProcessKnobs(k);
  const std::string role = k.Str("DMLC_ROLE");
  if (role == "worker")
    return Status::Config("DMLC_ROLE=worker: `python -m byteps.server` runs a server or the "
                          "scheduler; set DMLC_ROLE=server or DMLC_ROLE=scheduler");
  if (k.Str("DMLC_PS_ROOT_URI").empty())
    return Status::Config("DMLC_PS_ROOT_URI is not set: the " + role +
                          " needs the scheduler's IP address");
  if (!k.IsSet("DMLC_PS_ROOT_PORT"))
    return Status::Config("DMLC_PS_ROOT_PORT is not set: the " + role +
                          " needs the scheduler's TCP port");
  // Only the all-reduces (docs/schemes.md) run without servers.
  const std::string sync = k.Str("BYTEPS_SYNC");
  if (k.Int("DMLC_NUM_SERVER") < 1 && !(role == "scheduler" && (sync == "ring" || sync == "tree")))
    return Status::Config("DMLC_NUM_SERVER=" + k.Str("DMLC_NUM_SERVER") +
                          ": a distributed job needs at least one server (BYTEPS_SYNC=" + sync +
                          "; only ring and tree run without servers)");
  BPS_RETURN_IF_ERROR(ApplyJobSecret(k, true));
  if (role == "scheduler") {
    SetLogIdentity("scheduler");
    SchedulerOptions o;
    o.host = k.Str("DMLC_PS_ROOT_URI");
    o.port = static_cast<int>(k.Int("DMLC_PS_ROOT_PORT"));
    o.num_worker = static_cast<int>(k.Int("DMLC_NUM_WORKER"));
    o.num_server = static_cast<int>(k.Int("DMLC_NUM_SERVER"));
    o.timeout_s = k.Float("BYTEPS_TIMEOUT");
    o.heartbeat_timeout_s = k.Float("BYTEPS_HEARTBEAT_TIMEOUT");
    o.stall_warning_s = k.Float("BYTEPS_STALL_WARNING_SECONDS");
    o.async_mode = k.Bool("BYTEPS_ENABLE_ASYNC");
    o.max_staleness = static_cast<int>(k.Int("BYTEPS_ASYNC_MAX_STALENESS"));
    BPS_RETURN_IF_ERROR(VanSpec::FromKnobs(k, &o.van));
    Scheduler sched(o);
    return sched.Run();
  }
  SetLogIdentity("server");
  ServerOptions o;
  o.scheduler_host = k.Str("DMLC_PS_ROOT_URI");
  o.scheduler_port = static_cast<int>(k.Int("DMLC_PS_ROOT_PORT"));
  o.node_host = k.Str("DMLC_NODE_HOST");
  o.interface = k.Str("DMLC_INTERFACE");
  o.port = static_cast<int>(k.Int("DMLC_PORT"));
  o.num_worker = static_cast<int>(k.Int("DMLC_NUM_WORKER"));
  o.num_server = static_cast<int>(k.Int("DMLC_NUM_SERVER"));
  o.engine_threads = static_cast<int>(k.Int("BYTEPS_SERVER_ENGINE_THREAD"));
  o.trace = k.Bool("BYTEPS_TRACE_ON");
  o.async_mode = k.Bool("BYTEPS_ENABLE_ASYNC");
  o.max_staleness = static_cast<int>(k.Int("BYTEPS_ASYNC_MAX_STALENESS"));
  o.timeout_s = k.Float("BYTEPS_TIMEOUT");
  o.heartbeat_interval_s = k.Float("BYTEPS_HEARTBEAT_INTERVAL");
  o.heartbeat_timeout_s = k.Float("BYTEPS_HEARTBEAT_TIMEOUT");
  BPS_RETURN_IF_ERROR(VanSpec::FromKnobs(k, &o.van));
  // HiPS (docs/schemes.md): the servers' levels follow from the group size (a tensor may be
  // declared with sync=hips whatever BYTEPS_SYNC says; with too few servers for the levels,
  // HiPS tensors are refused).
  o.hips_group = HipsGroupSize(o.num_worker, static_cast<int>(k.Int("BYTEPS_HIPS_GROUP")));
  SummationServer server(o);
  return server.Run();
}

}  // namespace byteps
