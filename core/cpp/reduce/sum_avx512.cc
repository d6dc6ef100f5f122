// AVX-512 (F, BW, VL) summation kernels (reduce/, docs/architecture.md §7). Only this file is
// compiled with -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c; sum_dispatch.cc calls it only
// on CPUs (and OSes) with those features. The generic loops of sum_kernels.h auto-vectorise;
// float16 uses _mm512_cvtph_ps / _mm512_cvtps_ph (16 elements per conversion) with a scalar half.h
// tail.
#include <cstdint>
#include <immintrin.h>

// GCC's generic tuning keeps auto-vectorised loops at 256 bits even with -mavx512f; this
// file exists to use the full 512-bit registers.
#pragma GCC target("prefer-vector-width=512")

#include "sum_kernels.h"

namespace byteps {
namespace reduce {
namespace {

constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

inline __m512 Load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void Store16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, kRne));
}

struct Fp16Avx512 {
  static void Sum3(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {  // two independent vectors per iteration
      const __m512 x0 = _mm512_add_ps(Load16(a + i), Load16(b + i));
      const __m512 x1 = _mm512_add_ps(Load16(a + i + 16), Load16(b + i + 16));
      Store16(d + i, x0);
      Store16(d + i + 16, x1);
    }
    if (i + 16 <= n) {
      Store16(d + i, _mm512_add_ps(Load16(a + i), Load16(b + i)));
      i += 16;
    }
    if (d == a) {  // SumInto: the tail loop must not see aliased __restrict pointers
      Map2(d + i, b + i, n - i, HalfAddOp{});
    } else {
      Map3(d + i, a + i, b + i, n - i, HalfAddOp{});
    }
  }
  static void SumInto(uint16_t* d, const uint16_t* s, size_t n) { Sum3(d, d, s, n); }
  static void Divide(uint16_t* d, size_t n, float divisor) {
    const __m512 dv = _mm512_set1_ps(divisor);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) Store16(d + i, _mm512_div_ps(Load16(d + i), dv));
    DivideHalfScalar(d + i, n - i, divisor);
  }
  static void ToFloat(const uint16_t* s, float* f, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(f + i, Load16(s + i));
    Fp16Scalar::ToFloat(s + i, f + i, n - i);
  }
  static void FromFloat(const float* f, uint16_t* d, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) Store16(d + i, _mm512_loadu_ps(f + i));
    Fp16Scalar::FromFloat(f + i, d + i, n - i);
  }
};

}  // namespace

const KernelTable* Avx512Kernels() {
  static const KernelTable table = KernelsFor<Fp16Avx512>::Make("avx512");
  return &table;
}

}  // namespace reduce
}  // namespace byteps
