// The knob registry: every BYTEPS_* / DMLC_* environment variable the project reads is declared
// exactly once here (name, type, default, range, one-line doc, legacy aliases). Values are read
// once, validated against their declaration, and logged at INFO. docs/env.md is rendered from
// this table (python -m byteps.knobs --markdown). No raw getenv elsewhere (DESIGN.md §1).
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

// Parsed, validated values of every knob.
class Knobs {
 public:
  // Reads each knob from the process environment (name first, then its aliases).
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

 private:
  std::map<std::string, std::string> raw_;
  std::map<std::string, bool> set_;
};

}  // namespace byteps
