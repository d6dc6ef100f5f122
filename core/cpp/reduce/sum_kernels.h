// Generic summation / division kernels (reduce/, docs/architecture.md §7), included by each ISA
// file (sum_scalar.cc, sum_avx2.cc, sum_avx512.cc) and compiled there with that file's -m flags.
//
// The loops are written for GCC's auto-vectoriser: __restrict pointers, one simple counted
// loop, branch-free element operations (bfloat16 rounding is integer arithmetic + select).
// The plain adds (floats, unsigned integers) use GCC vector extensions instead, four vectors
// per step (Add2Blocked / Add3Blocked), which the auto-vectoriser did not produce.
// float16 is the one type the vectoriser cannot handle; each ISA file passes a `Fp16` policy
// (F16C / AVX-512 intrinsics, or the scalar half.h conversions) to KernelsFor<Fp16>.
//
// Everything here has internal linkage (anonymous namespace): the same templates are
// instantiated with different ISA flags in each translation unit and must never be merged by
// the linker (an AVX-512 instantiation reaching the scalar path would be SIGILL).
//
// Aliasing: SumInto(dst, src) and Sum3(dst, a, b) accept dst == src / dst == a / dst == b
// (exact aliasing: every element is read before the same element is written); partially
// overlapping buffers are not supported (the Python binding rejects them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "half.h"
#include "op_kernels.h"
#include "sum.h"

namespace byteps {
namespace reduce {
namespace {

// ---- element operations ----------------------------------------------------------------

struct AddOp {  // float32 / float64 / unsigned integers (wrap modulo 2^bits)
  template <typename T>
  T operator()(T a, T b) const { return static_cast<T>(a + b); }
};

// Branch-free float32 -> bfloat16 RNE (same result as half::FloatToBFloat16), vectorisable.
static inline uint16_t RoundToBf16(float f) {
  const uint32_t u = half::FloatBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

struct Bf16AddOp {
  uint16_t operator()(uint16_t a, uint16_t b) const {
    return RoundToBf16(half::BFloat16ToFloat(a) + half::BFloat16ToFloat(b));
  }
};

// Two bfloat16 values packed in one 32-bit word (little-endian: element 0 in the low half).
// The low element becomes a float by `<< 16`, the high one by masking, so a whole vector of
// words is converted, added and rounded with no widening/narrowing shuffles; about twice as
// fast as the element-wise loop. Same rounding as RoundToBf16.
static inline uint32_t Bf16PairRound(float f) {  // result bits in the high half
  const uint32_t u = half::FloatBits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

static inline uint32_t Bf16PairAdd(uint32_t x, uint32_t y) {
  const float lo = half::BitsToFloat(x << 16) + half::BitsToFloat(y << 16);
  const float hi = half::BitsToFloat(x & 0xffff0000u) + half::BitsToFloat(y & 0xffff0000u);
  return (Bf16PairRound(lo) >> 16) | Bf16PairRound(hi);
}

struct HalfAddOp {  // scalar float16 (tails, and the whole array on the scalar path)
  uint16_t operator()(uint16_t a, uint16_t b) const {
    return half::FloatToHalf(half::HalfToFloat(a) + half::HalfToFloat(b));
  }
};

// ---- loop shapes -------------------------------------------------------------------------

template <typename T, typename Op>
inline void Map2(T* __restrict d, const T* __restrict s, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) d[i] = op(d[i], s[i]);
}

// dst[i] += src[i] for the plain-add types (floats, unsigned integers), in blocks of four
// 32-byte vectors (GCC vector extensions: ymm registers in the AVX2/AVX-512 files, pairs of xmm
// in the scalar one): the four loads of each operand first, then the adds and stores. This keeps
// more loads in flight than the auto-vectorised one-vector loop (measured in
// docs/performance-notes.md, "Summation kernel: four vectors per step").
template <typename T>
inline void Add2Blocked(T* __restrict d, const T* __restrict s, size_t n) {
  typedef T V __attribute__((vector_size(32), aligned(alignof(T)), may_alias));
  constexpr size_t kLanes = 32 / sizeof(T);
  size_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    V* vd = reinterpret_cast<V*>(d + i);
    const V* vs = reinterpret_cast<const V*>(s + i);
    const V x0 = vd[0], x1 = vd[1], x2 = vd[2], x3 = vd[3];
    const V y0 = vs[0], y1 = vs[1], y2 = vs[2], y3 = vs[3];
    vd[0] = x0 + y0;
    vd[1] = x1 + y1;
    vd[2] = x2 + y2;
    vd[3] = x3 + y3;
  }
  for (; i < n; ++i) d[i] = static_cast<T>(d[i] + s[i]);
}

// dst[i] = a[i] + b[i], blocked as Add2Blocked (Sum3 sends exact aliasing to SumInto).
template <typename T>
inline void Add3Blocked(T* __restrict d, const T* __restrict a, const T* __restrict b,
                        size_t n) {
  typedef T V __attribute__((vector_size(32), aligned(alignof(T)), may_alias));
  constexpr size_t kLanes = 32 / sizeof(T);
  size_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    V* vd = reinterpret_cast<V*>(d + i);
    const V* va = reinterpret_cast<const V*>(a + i);
    const V* vb = reinterpret_cast<const V*>(b + i);
    const V x0 = va[0], x1 = va[1], x2 = va[2], x3 = va[3];
    const V y0 = vb[0], y1 = vb[1], y2 = vb[2], y3 = vb[3];
    vd[0] = x0 + y0;
    vd[1] = x1 + y1;
    vd[2] = x2 + y2;
    vd[3] = x3 + y3;
  }
  for (; i < n; ++i) d[i] = static_cast<T>(a[i] + b[i]);
}

template <typename T, typename Op>
inline void Map3(T* __restrict d, const T* __restrict a, const T* __restrict b, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) d[i] = op(a[i], b[i]);
}

// bfloat16 arrays are only 2-byte aligned: read them as pairs through this 2-aligned type.
typedef uint32_t __attribute__((may_alias, aligned(2))) Bf16Pair;

inline void Bf16SumInto(uint16_t* __restrict d, const uint16_t* __restrict s, size_t n) {
  const size_t pairs = n / 2;
  Bf16Pair* __restrict dp = reinterpret_cast<Bf16Pair*>(d);
  const Bf16Pair* __restrict sp = reinterpret_cast<const Bf16Pair*>(s);
  for (size_t i = 0; i < pairs; ++i) dp[i] = Bf16PairAdd(dp[i], sp[i]);
  if (n & 1) d[n - 1] = Bf16AddOp{}(d[n - 1], s[n - 1]);
}

inline void Bf16Sum3(uint16_t* __restrict d, const uint16_t* __restrict a,
                     const uint16_t* __restrict b, size_t n) {
  const size_t pairs = n / 2;
  Bf16Pair* __restrict dp = reinterpret_cast<Bf16Pair*>(d);
  const Bf16Pair* __restrict ap = reinterpret_cast<const Bf16Pair*>(a);
  const Bf16Pair* __restrict bp = reinterpret_cast<const Bf16Pair*>(b);
  for (size_t i = 0; i < pairs; ++i) dp[i] = Bf16PairAdd(ap[i], bp[i]);
  if (n & 1) d[n - 1] = Bf16AddOp{}(a[n - 1], b[n - 1]);
}

// ---- division ----------------------------------------------------------------------------

template <typename T>
inline void DivideFloat(T* __restrict d, size_t n, T divisor) {
  for (size_t i = 0; i < n; ++i) d[i] = d[i] / divisor;  // true division, never x * (1/d)
}

inline void DivideBf16(uint16_t* __restrict d, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) d[i] = RoundToBf16(half::BFloat16ToFloat(d[i]) / divisor);
}

inline void DivideHalfScalar(uint16_t* __restrict d, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) d[i] = half::FloatToHalf(half::HalfToFloat(d[i]) / divisor);
}

// Floor division (Python semantics: rounds toward -inf) of a signed integer array, computed in
// int64 so any int64 divisor works (a divisor wider than T simply gives 0 or -1).
template <typename T>
inline void FloorDivideSigned(T* __restrict d, size_t n, int64_t divisor) {
  if (divisor == 0 || divisor == 1) return;  // 0: callers reject it; never trap here
  if (divisor == -1) {  // the only overflowing case (INT_MIN / -1): wrap like NumPy
    using U = std::make_unsigned_t<T>;
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(U(0) - static_cast<U>(d[i]));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = d[i];
    int64_t q = x / divisor;
    const int64_t r = x % divisor;
    if (r != 0 && ((r < 0) != (divisor < 0))) --q;
    d[i] = static_cast<T>(q);
  }
}

template <typename T>
inline void FloorDivideUnsigned(T* __restrict d, size_t n, int64_t divisor) {
  if (divisor <= 1) return;  // <= 0: callers reject it
  if (static_cast<uint64_t>(divisor) > std::numeric_limits<T>::max()) {
    for (size_t i = 0; i < n; ++i) d[i] = 0;
    return;
  }
  const T dv = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / dv);
}

// ---- the table ---------------------------------------------------------------------------

// Fp16 must provide:
//   static void SumInto(uint16_t* d, const uint16_t* s, size_t n);
//   static void Sum3(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n);
//   static void Divide(uint16_t* d, size_t n, float divisor);
//   static void ToFloat(const uint16_t* s, float* f, size_t n);    (op_kernels.h)
//   static void FromFloat(const float* f, uint16_t* d, size_t n);  (round to nearest-even)
template <class Fp16>
struct KernelsFor {
  static void SumInto(void* dst, const void* src, size_t n, DType t) {
    switch (t) {
      case DType::kFloat32:
        Add2Blocked(static_cast<float*>(dst), static_cast<const float*>(src), n);
        break;
      case DType::kFloat64:
        Add2Blocked(static_cast<double*>(dst), static_cast<const double*>(src), n);
        break;
      case DType::kFloat16:
        Fp16::SumInto(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
        break;
      case DType::kBFloat16:
        Bf16SumInto(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n);
        break;
      case DType::kUInt8:
      case DType::kInt8:  // two's complement: add the bit patterns unsigned (defined wrap)
        Add2Blocked(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
        break;
      case DType::kInt32:
        Add2Blocked(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), n);
        break;
      case DType::kInt64:
        Add2Blocked(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), n);
        break;
      default:
        break;
    }
  }

  static void Sum3(void* dst, const void* a, const void* b, size_t n, DType t) {
    // Exact aliasing goes through the in-place loop (addition is commutative, bit for bit).
    if (dst == a) return SumInto(dst, b, n, t);
    if (dst == b) return SumInto(dst, a, n, t);
    switch (t) {
      case DType::kFloat32:
        Add3Blocked(static_cast<float*>(dst), static_cast<const float*>(a),
                    static_cast<const float*>(b), n);
        break;
      case DType::kFloat64:
        Add3Blocked(static_cast<double*>(dst), static_cast<const double*>(a),
                    static_cast<const double*>(b), n);
        break;
      case DType::kFloat16:
        Fp16::Sum3(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                   static_cast<const uint16_t*>(b), n);
        break;
      case DType::kBFloat16:
        Bf16Sum3(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                 static_cast<const uint16_t*>(b), n);
        break;
      case DType::kUInt8:
      case DType::kInt8:
        Add3Blocked(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                    static_cast<const uint8_t*>(b), n);
        break;
      case DType::kInt32:
        Add3Blocked(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(a),
                    static_cast<const uint32_t*>(b), n);
        break;
      case DType::kInt64:
        Add3Blocked(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(a),
                    static_cast<const uint64_t*>(b), n);
        break;
      default:
        break;
    }
  }

  static void Divide(void* dst, size_t n, DType t, int64_t divisor) {
    switch (t) {
      case DType::kFloat32:  // NumPy: float32 array / Python int -> float32 division
        DivideFloat(static_cast<float*>(dst), n, static_cast<float>(divisor));
        break;
      case DType::kFloat64:
        DivideFloat(static_cast<double*>(dst), n, static_cast<double>(divisor));
        break;
      case DType::kFloat16:
        Fp16::Divide(static_cast<uint16_t*>(dst), n, static_cast<float>(divisor));
        break;
      case DType::kBFloat16:
        DivideBf16(static_cast<uint16_t*>(dst), n, static_cast<float>(divisor));
        break;
      case DType::kUInt8:
        FloorDivideUnsigned(static_cast<uint8_t*>(dst), n, divisor);
        break;
      case DType::kInt8:
        FloorDivideSigned(static_cast<int8_t*>(dst), n, divisor);
        break;
      case DType::kInt32:
        FloorDivideSigned(static_cast<int32_t*>(dst), n, divisor);
        break;
      case DType::kInt64:
        FloorDivideSigned(static_cast<int64_t*>(dst), n, divisor);
        break;
      default:
        break;
    }
  }

  static KernelTable Make(const char* name) {
    return KernelTable{name, &SumInto, &Sum3, &Divide, &Op3<Fp16>};
  }
};

// Scalar float16 policy (also the tail handler of the SIMD policies).
struct Fp16Scalar {
  static void SumInto(uint16_t* d, const uint16_t* s, size_t n) { Map2(d, s, n, HalfAddOp{}); }
  static void Sum3(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
    Map3(d, a, b, n, HalfAddOp{});
  }
  static void Divide(uint16_t* d, size_t n, float divisor) { DivideHalfScalar(d, n, divisor); }
  static void ToFloat(const uint16_t* s, float* f, size_t n) {
    for (size_t i = 0; i < n; ++i) f[i] = half::HalfToFloat(s[i]);
  }
  static void FromFloat(const float* f, uint16_t* d, size_t n) {
    for (size_t i = 0; i < n; ++i) d[i] = half::FloatToHalf(f[i]);
  }
};

}  // namespace
}  // namespace reduce
}  // namespace byteps
