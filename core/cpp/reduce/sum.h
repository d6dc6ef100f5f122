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

#include "../common/dtype.h"

namespace byteps {
namespace reduce {

// dst[i] += src[i]
void SumInto(void* dst, const void* src, size_t count, DType dtype);
// dst[i] = a[i] + b[i]   (dst may alias a or b)
void Sum3(void* dst, const void* a, const void* b, size_t count, DType dtype);
// dst[i] /= divisor. Floating types: true division (float16/bfloat16 through float32).
// Integer types: floor division (Python / torch.floor_divide semantics).
void DivideInPlace(void* dst, size_t count, DType dtype, int64_t divisor);

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
};

}  // namespace reduce
}  // namespace byteps
