// Start-up of the job's nodes other than workers: a server or the scheduler, by DMLC_ROLE
// (`python -m byteps.server`). Workers start through the worker API (pipeline/api.h).
#pragma once
#include "common/status.h"

namespace byteps {

// Reads and validates the knobs, then runs a server or the scheduler until the job ends.
// Blocking. ConfigError for DMLC_ROLE=worker or a missing DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT /
// DMLC_NUM_SERVER / BYTEPS_SECRET; otherwise the outcome of the job (PeerLost, Timeout...).
Status RunNodeFromEnvironment();

}  // namespace byteps
