// Process-wide set-up shared by every role (worker, server, scheduler): the knobs that act on the
// whole process and the job secret. Here, not in pipeline/, so that node start-up (node_main.h)
// does not depend on the worker pipeline; not in common/, because it configures comm/ (the TCP
// send bound, the handshake's secret) and common/ sits below comm/ (docs/architecture.md §2).
#pragma once
#include "common/knobs.h"
#include "common/status.h"

namespace byteps {

// Applies BYTEPS_LOG_LEVEL / BYTEPS_LOG_HIDE_TIME / BYTEPS_TCP_NOTSENT_LOWAT, then logs what
// k.notices() says about unknown and upstream-only variables (once per process).
void ApplyProcessKnobs(const Knobs& k);

// Installs BYTEPS_SECRET for every connection this process makes or accepts (comm/auth.h).
// A distributed job without a secret is a ConfigError unless BYTEPS_ALLOW_UNAUTHENTICATED=1
// (then a warning, once per process); a single-machine job needs none.
Status ApplyJobSecret(const Knobs& k, bool distributed);

}  // namespace byteps
