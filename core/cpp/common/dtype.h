// Element types the summation service understands. The numeric values travel on the wire.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace byteps {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kUInt8 = 3,
  kInt32 = 4,
  kInt8 = 5,
  kInt64 = 6,
  kBFloat16 = 7,
  kCount = 8,
};

// Size of one element in bytes; 0 for an invalid type.
size_t DTypeSize(DType t);
const char* DTypeName(DType t);
// Parses "float32", "float16", ... Returns false for an unknown name.
bool ParseDType(const std::string& name, DType* out);
bool DTypeValid(uint32_t raw);
bool DTypeIsFloat(DType t);
// Comma-separated list of the supported names, for error messages.
std::string SupportedDTypeNames();

}  // namespace byteps
