// Process-wide entry points of the worker core, used by the Python bindings and the engine
// bridge. Servers and the scheduler start through ps/node_main.h.
#pragma once
#include <memory>

#include "pipeline/worker.h"

namespace byteps {

// Reads every knob, validates it, then starts the worker core (idempotent).
Status CoreInit();
// Stops the worker core (no-op when not initialised).
void CoreShutdown();
// The running core, or null. Callers keep the shared_ptr for the duration of a call.
std::shared_ptr<WorkerCore> CoreInstance();

}  // namespace byteps
