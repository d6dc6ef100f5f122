// Process-wide entry points of the core, used by the Python bindings.
#pragma once
#include <memory>

#include "common/knobs.h"
#include "pipeline/worker.h"

namespace byteps {

// Reads every knob, validates it, then starts the worker core (idempotent).
Status CoreInit();
// Stops the worker core (no-op when not initialised).
void CoreShutdown();
// The running core, or null. Callers keep the shared_ptr for the duration of a call.
std::shared_ptr<WorkerCore> CoreInstance();
// Applies BYTEPS_LOG_LEVEL / BYTEPS_LOG_HIDE_TIME / BYTEPS_TCP_NOTSENT_LOWAT, then logs what
// k.notices() says about unknown and upstream-only variables (once per process).
void ApplyProcessKnobs(const Knobs& k);
// Runs a server or the scheduler (by DMLC_ROLE) until the job ends. Blocking.
Status RunNodeFromEnvironment();

}  // namespace byteps
