// AVX2 + FMA + F16C summation kernels (reduce/, docs/architecture.md §7). Only this file is
// compiled with -mavx2 -mfma -mf16c; sum_dispatch.cc calls it only on CPUs that have those
// features. The generic loops of sum_kernels.h auto-vectorise to 256-bit; float16 uses F16C
// (_mm256_cvtph_ps / _mm256_cvtps_ph, 8 elements per conversion) with a scalar half.h tail.
#include <cstdint>
#include <immintrin.h>

#include "sum_kernels.h"

namespace byteps {
namespace reduce {
namespace {

constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

inline __m256 Load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void Store8(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kRne));
}

struct Fp16Avx2 {
  static void Sum3(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {  // two independent vectors per iteration
      const __m256 x0 = _mm256_add_ps(Load8(a + i), Load8(b + i));
      const __m256 x1 = _mm256_add_ps(Load8(a + i + 8), Load8(b + i + 8));
      Store8(d + i, x0);
      Store8(d + i + 8, x1);
    }
    if (i + 8 <= n) {
      Store8(d + i, _mm256_add_ps(Load8(a + i), Load8(b + i)));
      i += 8;
    }
    if (d == a) {  // SumInto: the tail loop must not see aliased __restrict pointers
      Map2(d + i, b + i, n - i, HalfAddOp{});
    } else {
      Map3(d + i, a + i, b + i, n - i, HalfAddOp{});
    }
  }
  static void SumInto(uint16_t* d, const uint16_t* s, size_t n) { Sum3(d, d, s, n); }
  static void Divide(uint16_t* d, size_t n, float divisor) {
    const __m256 dv = _mm256_set1_ps(divisor);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) Store8(d + i, _mm256_div_ps(Load8(d + i), dv));
    DivideHalfScalar(d + i, n - i, divisor);
  }
  static void ToFloat(const uint16_t* s, float* f, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, Load8(s + i));
    Fp16Scalar::ToFloat(s + i, f + i, n - i);
  }
  static void FromFloat(const float* f, uint16_t* d, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) Store8(d + i, _mm256_loadu_ps(f + i));
    Fp16Scalar::FromFloat(f + i, d + i, n - i);
  }
};

}  // namespace

const KernelTable* Avx2Kernels() {
  static const KernelTable table = KernelsFor<Fp16Avx2>::Make("avx2");
  return &table;
}

}  // namespace reduce
}  // namespace byteps
