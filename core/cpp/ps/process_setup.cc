#include "ps/process_setup.h"

#include <mutex>
#include <string>

#include "comm/auth.h"
#include "comm/socket_util.h"
#include "common/logging.h"

namespace byteps {

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

}  // namespace byteps
