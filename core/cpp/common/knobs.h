// The knob registry: every BYTEPS_* / DMLC_* environment variable the project reads is declared
// exactly once here (name, type, default, range, one-line doc, legacy aliases). Values are read
// once, validated against their declaration, and logged at INFO. docs/env.md is rendered from
// this table (python -m byteps.knobs --markdown). No raw getenv elsewhere
// (docs/architecture.md §10).
//
// Next to it (upstream_knobs.cc) is the table of upstream BytePS's variables and what each does
// here. Every BYTEPS_*/DMLC_* variable a process finds that is not a knob is named in a warning
// (with the closest known name); an upstream variable whose value would ask for behaviour this
// project does not have would be refused with ConfigError (none is at present).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "status.h"

namespace byteps {

enum class KnobType { kInt, kFloat, kBool, kString, kChoice };

struct KnobSpec {
  std::string name;
  KnobType type;
  std::string default_value;  // "" = unset
  std::string doc;
  std::string used_by;        // "worker", "server", "scheduler", "launcher", combinations
  double min = 0, max = 0;    // inclusive range for kInt / kFloat (ignored when min > max)
  std::vector<std::string> choices;  // for kChoice
  std::vector<std::string> aliases;  // legacy names, read when `name` is unset
};

const std::vector<KnobSpec>& AllKnobs();
const KnobSpec* FindKnob(const std::string& name);
const char* KnobTypeName(KnobType t);

// What an upstream BytePS (or ps-lite, or upstream launcher/build) variable does here.
enum class UpstreamStatus {
  kImplemented,  // a knob of the same name and meaning (notes name any difference)
  kReplaced,     // not read; another variable or mechanism does its job (replaced_by)
  kIgnored,      // not read; it has no effect (`here` says what happens instead)
  kRefused,      // a value other than `same` asks for what is not implemented: ConfigError
};

struct UpstreamVar {
  std::string name;
  UpstreamStatus status;
  std::string here;         // what happens here instead, or how the knob differs
  std::string replaced_by;  // kReplaced: the variable (or mechanism) that does its job
  // Values that ask for exactly what happens here anyway (e.g. BYTEPS_ENABLE_ASYNC=0): noted
  // at INFO instead of a warning, and never refused. `same_off`: every false spelling too.
  std::vector<std::string> same;
  bool same_off = false;
  // False for generic names not specific to BytePS (NVIDIA_VISIBLE_DEVICES, UCX_*, ...):
  // documented, but a process does not look for them.
  bool checked = true;
};

const std::vector<UpstreamVar>& UpstreamVars();
const UpstreamVar* FindUpstreamVar(const std::string& name);
const char* UpstreamStatusName(UpstreamStatus s);
// True when `value` of `v` asks for what happens here anyway (see UpstreamVar::same).
bool UpstreamValueIsSame(const UpstreamVar& v, const std::string& value);

// One finding about a variable's name (not its value).
struct EnvNotice {
  std::string name;
  bool warning = true;  // false: INFO (an upstream variable set to a value that changes nothing)
  std::string text;
};

// Closest knob or upstream name to `name` (edit distance, case-insensitive), or "" when none is
// close enough to be a plausible misspelling.
std::string ClosestKnownName(const std::string& name);
// Looks at the names in `env` that are neither knobs nor their aliases: an unknown BYTEPS_* /
// DMLC_* name, or a checked upstream variable, gets one notice in *notices; a refused upstream
// variable set to a value other than its `same` ones returns ConfigError naming it and why.
Status CheckEnvironmentNames(const std::map<std::string, std::string>& env,
                             std::vector<EnvNotice>* notices);
// True for a name a process collects from its environment: BYTEPS_*, DMLC_*, checked upstream.
bool IsWatchedName(const std::string& name);

// Parsed, validated values of every knob.
class Knobs {
 public:
  // Reads each knob from the process environment (name first, then its aliases), then checks
  // the other names (CheckEnvironmentNames): ConfigError for a bad value or a refused variable.
  static Status FromEnvironment(Knobs* out);
  // Same, from an explicit map (tests, the launcher).
  static Status FromMap(const std::map<std::string, std::string>& env, Knobs* out);

  int64_t Int(const std::string& name) const;
  double Float(const std::string& name) const;
  bool Bool(const std::string& name) const;
  const std::string& Str(const std::string& name) const;
  // True when the variable (or an alias) was present in the environment.
  bool IsSet(const std::string& name) const;
  // name -> textual value for every knob (defaults included), for logging and Python.
  std::map<std::string, std::string> AsStrings() const { return raw_; }
  // Findings about the other names of the environment read (CheckEnvironmentNames).
  const std::vector<EnvNotice>& notices() const { return notices_; }

 private:
  std::vector<EnvNotice> notices_;
  std::map<std::string, std::string> raw_;
  std::map<std::string, bool> set_;
};

// Logs each of k.notices() (WARNING or INFO) unless the same variable was already reported by
// this process: every role calls it once its log level is set.
void LogEnvironmentNotices(const Knobs& k);

}  // namespace byteps
