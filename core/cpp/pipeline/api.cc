#include "pipeline/api.h"

#include <mutex>

#include "common/logging.h"
#include "ps/process_setup.h"

namespace byteps {
namespace {
std::mutex g_mu;
std::shared_ptr<WorkerCore> g_core;
}  // namespace

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

}  // namespace byteps
