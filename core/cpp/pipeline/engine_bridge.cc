#include "pipeline/engine_bridge.h"

#include <cstdint>
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

// The head of DLPack's DLManagedTensor (dlpack.h v0.x, the version MXNet 1.x ships).
struct DLTensorHead {
  void* data;
  int32_t device_type, device_id;
  int32_t ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
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
  const EngineOp& e = *static_cast<EngineOp*>(op);
  void* dlpack = nullptr;
  if (e.ndarray) {
    if (e.api.to_dlpack(e.ndarray, &dlpack) != 0) {
      Complete(done, Status::Internal("push_pull of '" + args.name + "': MXNDArrayToDLPack " +
                                      "failed: " + e.api.get_last_error()));
      return;
    }
    const auto* t = static_cast<const DLTensorHead*>(dlpack);
    a.input = a.output = static_cast<char*>(t->data) + t->byte_offset;
  }
  auto release = e.api.call_dlpack_deleter;
  a.on_done = [done, dlpack, release](const Status& st) {
    if (dlpack) release(dlpack);
    Complete(done, st);
  };
  int64_t handle = 0;
  Status st = core->Enqueue(a, &handle);
  if (!st.ok()) {
    if (dlpack) release(dlpack);
    Complete(done, st);
  }
}

extern "C" void byteps_engine_op_delete(void* op) {
  auto* e = static_cast<byteps::EngineOp*>(op);
  if (e->ndarray) e->api.ndarray_free(e->ndarray);
  delete e;
}
