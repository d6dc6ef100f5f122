// Min, max and product kernels (reduce/, docs/collectives.md "Reduction ops"), included by
// sum_kernels.h and so compiled once per ISA file with that file's -m flags, like the sums.
//
// One counted loop per (dtype, op), branch-free element operations (a compare and a select),
// which GCC's auto-vectoriser turns into packed min/max/blend and multiplies for the float and
// integer types. float16 and bfloat16 go through float32 and round to nearest-even (min and max
// are exact: the chosen value converts back unchanged); float16 in blocks converted by the ISA
// file's Fp16 policy (F16C / AVX-512 conversions), bfloat16 element by element.
//
// Semantics (torch.minimum / torch.maximum / torch.mul, which Horovod's Min, Max and Product
// follow on CPU): a NaN in either operand gives NaN; integers compare as signed where the dtype
// is signed; products of integers wrap modulo 2^bits.
//
// Aliasing: Op3(dst, a, b) accepts dst == a or dst == b exactly (each element is read before
// it is written); partially overlapping buffers are not supported.
#pragma once
#include <cstddef>
#include <cstdint>

#include "half.h"
#include "sum.h"

namespace byteps {
namespace reduce {
namespace {

struct MinOp {
  template <typename T>
  T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }  // a != a: NaN
};
struct MaxOp {
  template <typename T>
  T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
struct MulOp {  // unsigned types for the integers: defined wrap
  template <typename T>
  T operator()(T a, T b) const { return static_cast<T>(a * b); }
};

// No __restrict: dst may alias a or b exactly, and every element is read before it is written.
template <typename T, typename Op>
inline void OpLoop(T* d, const T* a, const T* b, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) d[i] = op(a[i], b[i]);
}

// float16 in blocks: both operands to float32 (Fp16::ToFloat), the float loop, back
// (Fp16::FromFloat). The block is read whole before it is written, so aliasing is fine.
template <class Fp16, typename Op>
inline void HalfOpLoop(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n, Op op) {
  constexpr size_t kBlock = 512;
  alignas(64) float fa[kBlock], fb[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = n - i < kBlock ? n - i : kBlock;
    Fp16::ToFloat(a + i, fa, m);
    Fp16::ToFloat(b + i, fb, m);
    OpLoop(fa, fa, fb, m, op);
    Fp16::FromFloat(fa, d + i, m);
  }
}

template <typename Op>
inline void Bf16OpLoop(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i)
    d[i] = half::FloatToBFloat16(op(half::BFloat16ToFloat(a[i]), half::BFloat16ToFloat(b[i])));
}

// `Signed` is the type min and max compare in, `Bits` the one products wrap in.
template <typename Signed, typename Bits>
inline void IntOp3(void* d, const void* a, const void* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return OpLoop(static_cast<Signed*>(d), static_cast<const Signed*>(a),
                    static_cast<const Signed*>(b), n, MinOp{});
    case ReduceOp::kMax:
      return OpLoop(static_cast<Signed*>(d), static_cast<const Signed*>(a),
                    static_cast<const Signed*>(b), n, MaxOp{});
    case ReduceOp::kProduct:
      return OpLoop(static_cast<Bits*>(d), static_cast<const Bits*>(a),
                    static_cast<const Bits*>(b), n, MulOp{});
    default:
      return;
  }
}

template <typename T>
inline void FloatOp3(void* d, const void* a, const void* b, size_t n, ReduceOp op) {
  IntOp3<T, T>(d, a, b, n, op);  // the same three loops, in T
}

template <typename Loop>
inline void HalfOp3(Loop loop, void* d, const void* a, const void* b, size_t n, ReduceOp op) {
  auto* dd = static_cast<uint16_t*>(d);
  auto* aa = static_cast<const uint16_t*>(a);
  auto* bb = static_cast<const uint16_t*>(b);
  switch (op) {
    case ReduceOp::kMin: return loop(dd, aa, bb, n, MinOp{});
    case ReduceOp::kMax: return loop(dd, aa, bb, n, MaxOp{});
    case ReduceOp::kProduct: return loop(dd, aa, bb, n, MulOp{});
    default: return;
  }
}

// dst[i] = a[i] op b[i] for op in {kMin, kMax, kProduct} (kSum goes to the sum kernels).
// Fp16 must provide ToFloat(const uint16_t*, float*, size_t) and FromFloat(const float*,
// uint16_t*, size_t) (round to nearest-even).
template <class Fp16>
inline void Op3(void* d, const void* a, const void* b, size_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::kFloat32: return FloatOp3<float>(d, a, b, n, op);
    case DType::kFloat64: return FloatOp3<double>(d, a, b, n, op);
    case DType::kFloat16:
      return HalfOp3([](auto... x) { HalfOpLoop<Fp16>(x...); }, d, a, b, n, op);
    case DType::kBFloat16:
      return HalfOp3([](auto... x) { Bf16OpLoop(x...); }, d, a, b, n, op);
    case DType::kUInt8: return IntOp3<uint8_t, uint8_t>(d, a, b, n, op);
    case DType::kInt8: return IntOp3<int8_t, uint8_t>(d, a, b, n, op);
    case DType::kInt32: return IntOp3<int32_t, uint32_t>(d, a, b, n, op);
    case DType::kInt64: return IntOp3<int64_t, uint64_t>(d, a, b, n, op);
    default: return;
  }
}

}  // namespace
}  // namespace reduce
}  // namespace byteps
