#include "pipeline/engine_bridge.h"

#include <stdexcept>

#include "pipeline/api.h"

namespace byteps {
namespace {

// Layout of mxnet::engine::CallbackOnComplete (see the header).
struct EngineCompletion {
  void (*callback)(void* engine, void* param, const std::runtime_error* error);
  void* engine;
  void* param;
};

void Complete(const EngineCompletion& done, const Status& st) {
  if (st.ok()) {
    done.callback(done.engine, done.param, nullptr);
    return;
  }
  const std::runtime_error error(st.ToString());
  done.callback(done.engine, done.param, &error);
}

}  // namespace
}  // namespace byteps

extern "C" void byteps_engine_push_pull(void* run_ctx, void* on_complete, void* op) {
  using namespace byteps;
  (void)run_ctx;
  const EngineCompletion done = *static_cast<const EngineCompletion*>(on_complete);
  const PushPullArgs& args = static_cast<EngineOp*>(op)->args;
  auto core = CoreInstance();
  if (!core) {
    Complete(done, Status::Shutdown("byteps is not initialised (shut down before the push_pull "
                                    "of '" + args.name + "' could start)"));
    return;
  }
  PushPullArgs a = args;
  a.on_done = [done](const Status& st) { Complete(done, st); };
  int64_t handle = 0;
  Status st = core->Enqueue(a, &handle);
  if (!st.ok()) Complete(done, st);
}

extern "C" void byteps_engine_op_delete(void* op) { delete static_cast<byteps::EngineOp*>(op); }
