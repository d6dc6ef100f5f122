#include "pipeline/api.h"

#include <mutex>

#include "comm/auth.h"
#include "comm/socket_util.h"
#include "common/logging.h"
#include "ps/scheduler.h"
#include "ps/server.h"

namespace byteps {
namespace {
std::mutex g_mu;
std::shared_ptr<WorkerCore> g_core;
}  // namespace

void ApplyProcessKnobs(const Knobs& k) {
  LogLevel level;
  if (ParseLogLevel(k.Str("BYTEPS_LOG_LEVEL"), &level)) SetLogLevel(level);
  SetLogHideTime(k.Bool("BYTEPS_LOG_HIDE_TIME"));
  SetTcpNotSentLowat(k.Int("BYTEPS_TCP_NOTSENT_LOWAT"));
  LogEnvironmentNotices(k);  // unknown and upstream-only variables, once per process
}

Status ApplyJobSecret(const Knobs& k, bool distributed) {
  const std::string secret = k.Str("BYTEPS_SECRET");
  SetJobSecret(secret);
  if (!secret.empty() || !distributed) return Status::OK();
  if (!k.Bool("BYTEPS_ALLOW_UNAUTHENTICATED"))
    return Status::Config(
        "BYTEPS_SECRET is not set: every connection of a distributed job proves knowledge of "
        "the job secret. bpslaunch generates one; for a manual (upstream-style) launch put the "
        "same BYTEPS_SECRET in the environment of every process (e.g. the output of `python -c "
        "'import secrets; print(secrets.token_hex(32))'`), or set "
        "BYTEPS_ALLOW_UNAUTHENTICATED=1 to run without authentication");
  static std::once_flag warned;
  std::call_once(warned, [] {
    BPS_LOG(WARNING) << "BYTEPS_SECRET is not set and BYTEPS_ALLOW_UNAUTHENTICATED=1: this "
                        "process makes and accepts unauthenticated connections";
  });
  return Status::OK();
}

Status CoreInit() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_core) return Status::OK();
  Knobs knobs;
  BPS_RETURN_IF_ERROR(Knobs::FromEnvironment(&knobs));
  ApplyProcessKnobs(knobs);
  WorkerConfig cfg;
  BPS_RETURN_IF_ERROR(LoadWorkerConfig(knobs, &cfg));
  BPS_RETURN_IF_ERROR(ApplyJobSecret(knobs, cfg.distributed));
  for (auto& [name, value] : knobs.AsStrings())
    if (knobs.IsSet(name) && name != "BYTEPS_SECRET") BPS_LOG(INFO) << name << "=" << value;
  auto core = std::make_shared<WorkerCore>(cfg);
  Status st = core->Start();
  if (!st.ok()) {
    core->Stop();
    return st;
  }
  g_core = std::move(core);
  return Status::OK();
}

void CoreShutdown() {
  std::shared_ptr<WorkerCore> core;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    core.swap(g_core);
  }
  if (core) core->Stop();
}

std::shared_ptr<WorkerCore> CoreInstance() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_core;
}

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
  if (k.Int("DMLC_NUM_SERVER") < 1)
    return Status::Config("DMLC_NUM_SERVER=" + k.Str("DMLC_NUM_SERVER") +
                          ": a distributed job needs at least one server");
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
  o.timeout_s = k.Float("BYTEPS_TIMEOUT");
  o.heartbeat_interval_s = k.Float("BYTEPS_HEARTBEAT_INTERVAL");
  o.heartbeat_timeout_s = k.Float("BYTEPS_HEARTBEAT_TIMEOUT");
  SummationServer server(o);
  return server.Run();
}

}  // namespace byteps
