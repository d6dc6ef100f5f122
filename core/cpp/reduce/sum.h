// SIMD summation for the summation service and the local reduce (docs/architecture.md §7).
// Kernels are compiled per ISA (scalar, AVX2+F16C, AVX-512) in separate translation units and
// chosen once at run time from the CPU's features; nothing ships built with -march=native.
//
// All functions take element counts (not bytes) and never fail: callers validate the dtype.
// float16 / bfloat16 are computed in float32 and rounded to nearest-even, element by element,
// exactly as NumPy's float16 arithmetic does; integers wrap modulo 2^bits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "../common/dtype.h"

namespace byteps {
namespace reduce {

// How the values of a key are combined (Horovod's Sum, Min, Max, Product; Average is kSum
// divided by the number of ranks). The numeric values travel on the wire (ps/protocol.h).
enum class ReduceOp : uint8_t { kSum = 0, kMin = 1, kMax = 2, kProduct = 3 };
constexpr int kReduceOpCount = 4;
// "sum", "min", "max", "product".
const char* ReduceOpName(ReduceOp op);
// Parses one of ReduceOpName's names; false for another string.
bool ParseReduceOp(const std::string& name, ReduceOp* out);

// dst[i] += src[i]
void SumInto(void* dst, const void* src, size_t count, DType dtype);
// dst[i] = a[i] + b[i]   (dst may alias a or b)
void Sum3(void* dst, const void* a, const void* b, size_t count, DType dtype);
// dst[i] /= divisor. Floating types: true division (float16/bfloat16 through float32).
// Integer types: floor division (Python / torch.floor_divide semantics).
void DivideInPlace(void* dst, size_t count, DType dtype, int64_t divisor);
// dst[i] = dst[i] op src[i], and dst[i] = a[i] op b[i] (dst may alias a or b exactly): kSum is
// SumInto / Sum3; kMin, kMax (a NaN wins) and kProduct (integers wrap) as in op_kernels.h.
void ReduceInto(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);
void Reduce3(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

// Name of the ISA the dispatcher chose: "avx512", "avx2" or "scalar".
const char* ActiveIsa();
// Comma-separated ISAs usable on this CPU, best first (e.g. "avx512,avx2,scalar").
const char* AvailableIsas();
// Force an ISA (tests and benchmarks). Returns false if it is not available here.
bool ForceIsa(const char* name);

// Table of kernels for one ISA; each ISA translation unit defines one.
struct KernelTable {
  const char* name;
  void (*sum_into)(void* dst, const void* src, size_t count, DType dtype);
  void (*sum3)(void* dst, const void* a, const void* b, size_t count, DType dtype);
  void (*divide)(void* dst, size_t count, DType dtype, int64_t divisor);
  void (*op3)(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);
};

}  // namespace reduce
}  // namespace byteps
