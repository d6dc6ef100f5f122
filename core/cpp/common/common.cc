#include <cstdint>
#include <cstring>

#include "dtype.h"
#include "status.h"

namespace byteps {

const char* StatusCodeName(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kConfig: return "CONFIG";
    case StatusCode::kMismatch: return "MISMATCH";
    case StatusCode::kPeerLost: return "PEER_LOST";
    case StatusCode::kTimeout: return "TIMEOUT";
    case StatusCode::kShutdown: return "SHUTDOWN";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + msg_;
}

namespace {
struct DTypeInfo {
  const char* name;
  size_t size;
  bool is_float;
};
constexpr DTypeInfo kInfo[] = {
    {"float32", 4, true}, {"float64", 8, true}, {"float16", 2, true}, {"uint8", 1, false},
    {"int32", 4, false},  {"int8", 1, false},   {"int64", 8, false},  {"bfloat16", 2, true},
};
}  // namespace

bool DTypeValid(uint32_t raw) { return raw < static_cast<uint32_t>(DType::kCount); }
size_t DTypeSize(DType t) { return DTypeValid(static_cast<uint32_t>(t)) ? kInfo[int(t)].size : 0; }
const char* DTypeName(DType t) {
  return DTypeValid(static_cast<uint32_t>(t)) ? kInfo[int(t)].name : "invalid";
}
bool DTypeIsFloat(DType t) { return DTypeValid(static_cast<uint32_t>(t)) && kInfo[int(t)].is_float; }

bool ParseDType(const std::string& name, DType* out) {
  for (int i = 0; i < int(DType::kCount); ++i) {
    if (name == kInfo[i].name) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

std::string SupportedDTypeNames() {
  std::string s;
  for (int i = 0; i < int(DType::kCount); ++i) {
    if (i) s += ", ";
    s += kInfo[i].name;
  }
  return s;
}

}  // namespace byteps
