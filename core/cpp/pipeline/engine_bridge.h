// push_pull as an operation of a framework's dependency engine (MXNet).
//
// MXNet orders every read and write of an NDArray through its engine. byteps.mxnet pushes
// push_pull as an asynchronous engine operation that mutates the tensor (MXEnginePushAsyncND):
// the engine calls byteps_engine_push_pull when every earlier write of the tensor is done; it
// enqueues the tensor (input = output) and returns at once, no engine thread waits; the core
// calls the engine's completion callback when the result is in place, and only then do later
// reads of the tensor run. These entry points are plain C so that Python hands their addresses
// to MXNet with ctypes and no engine thread ever takes the GIL.
//
// The completion callback is MXNet's engine::CallbackOnComplete (include/mxnet/engine.h in the
// 1.x wheels: three words, `void (*callback_)(Engine*, void*, const dmlc::Error*)`, `Engine*
// engine_`, `void* param_`; invoked as callback_(engine_, param_, error)). A failed operation
// completes with an error whose what() is Status::ToString() ("PEER_LOST: rank 0: ..."): MXNet
// stores it on the tensor and raises it at the next read, and byteps.mxnet registers those code
// names with MXNet so the read raises the byteps.errors class. dmlc::Error is std::runtime_error
// with no members of its own, which is what the callback receives.
#pragma once
#include <cstddef>
#include <cstdint>

#include "pipeline/worker.h"

namespace byteps {

// The libmxnet C API functions the bridge calls (addresses handed over by byteps.mxnet).
struct MXNetApi {
  int (*to_dlpack)(void* ndarray, void** dlpack) = nullptr;        // MXNDArrayToDLPack
  int (*call_dlpack_deleter)(void* dlpack) = nullptr;              // MXNDArrayCallDLPackDeleter
  int (*ndarray_free)(void* ndarray) = nullptr;                    // MXNDArrayFree
  const char* (*get_last_error)() = nullptr;                       // MXGetLastError
};

// One pushed operation: the arguments of its push_pull (without the completion callback).
// With `ndarray` set (an NDArray handle the operation owns, a shallow copy of the caller's),
// the buffer is looked up when the engine runs the operation, not when it is pushed: a pending
// operation may still allocate a new NDArray's storage (MXNet allocates lazily, on the engine
// thread), so a pointer taken at push time could name memory the data never reach. The lookup
// is MXNDArrayToDLPack (NDArray::data(): allocates if needed, converts an MKLDNN layout in
// place, never waits on the engine); the DLPack reference is held until completion.
struct EngineOp {
  PushPullArgs args;
  void* ndarray = nullptr;
  MXNetApi api;
};

}  // namespace byteps

extern "C" {
// MXNet EngineAsyncFunc: (RunContext* run_ctx, CallbackOnComplete* on_complete, EngineOp* op).
void byteps_engine_push_pull(void* run_ctx, void* on_complete, void* op);
// MXNet EngineFuncParamDeleter: frees the EngineOp once the engine is done with it.
void byteps_engine_op_delete(void* op);
}
