// dithering's encoder loop. The results are those of the element-by-element definition in
// dithering.cc, bit for bit; what differs is the order of the work:
//
// * Blocks of 64 elements: the block's draws (in element order), then its levels (branch-
//   free), then the codes of the non-zero elements, walked by their bit mask, two small
//   elements per write of the 64-bit bit writer (without per-code room checks while a whole
//   block's worst case fits).
// * The divisions stay divisions (a multiply by a reciprocal would round differently);
//   natural's division by a power of two is a multiply by its exact reciprocal, which rounds
//   the same. Floor and ceil of values in [0, 2^30] go through uint32 (exact).
// * float32 with AVX-512 (F, DQ, VL, BW; with BMI2, LZCNT and MOVBE for the writer), where the
//   CPU has it: 8 elements per step, the draws 2048 at a time (rng_chunks.h), compiled by
//   function attribute and chosen at run time (the file is built with the portable flags).
//   No multiply feeds an add, so no contraction to FMA could change a result.
// * max: the maximum of the |x| in any order (SSE2 for float32) unless a NaN is present, then
//   upstream's sequential loop; l2: the squares of 64 elements at a time, then their float64
//   sum in element order (the sum's add chain alone, a few cycles shorter per element).
// * The passes over x prefetch it (internal.h).
// * Error feedback (Codec::EncodeWithFeedback): the correction in place in the pass that
//   finds the scale, and each block's residuals from its levels (the decoder's values) as it
//   is quantized, so there is no decoding pass.
#include "dithering_quantize.h"

#include "rng_chunks.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#if defined(__x86_64__) || defined(__i386__)
// GCC 12 reports its own AVX-512 intrinsics' _mm512_undefined_* operands as uninitialized
// where they are inlined (GCC bug 105593); the warning is about the header, not this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#define BPS_DITHER_X86 1
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace byteps {
namespace compress {
namespace detail {
namespace dither {
namespace {

constexpr double kDrawMax = static_cast<double>(~uint64_t{0});  // 2^64 as a double
constexpr int kBlock = 64;
// The most bytes one block's codes can take (83 bits an element), plus the 8-byte store.
constexpr size_t kBlockRoom = kBlock * 83 / 8 + 16;

uint32_t RoundNextPow2(uint32_t v) {
  v -= 1;
  v |= v >> 1;
  v |= v >> 2;
  v |= v >> 4;
  v |= v >> 8;
  v |= v >> 16;
  return v + 1;
}

// ---- scale ---------------------------------------------------------------------------

template <typename E>
double MaxAbsSequential(const typename E::Storage* x, size_t n) {
  double scale = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double a = static_cast<double>(std::fabs(E::Load(x[i])));
    scale = scale > a ? scale : a;
  }
  return scale;
}

template <typename E>
double MaxAbs(const typename E::Storage* x, size_t n) {
  return MaxAbsSequential<E>(x, n);
}

#if defined(__SSE2__)
template <>
double MaxAbs<Elem<float>>(const float* x, size_t n) {
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128 m[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
  __m128 nan = _mm_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    PrefetchRead(x, i);
    for (int k = 0; k < 4; ++k) {
      const __m128 v = _mm_loadu_ps(x + i + 4 * k);
      nan = _mm_or_ps(nan, _mm_cmpunord_ps(v, v));
      m[k] = _mm_max_ps(m[k], _mm_and_ps(v, abs_mask));
    }
  }
  if (_mm_movemask_ps(nan) != 0) return MaxAbsSequential<Elem<float>>(x, n);
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(m[0], m[1]), _mm_max_ps(m[2], m[3])));
  float best = lanes[0];
  for (int k = 1; k < 4; ++k) best = lanes[k] > best ? lanes[k] : best;
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a != a) return MaxAbsSequential<Elem<float>>(x, n);
    best = a > best ? a : best;
  }
  return static_cast<double>(best);
}
#endif

template <typename E>
double SumOfSquares(const typename E::Storage* x, size_t n) {
  using C = typename E::Compute;
  double sum = 0.0;
  double squares[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = n - base < kBlock ? n - base : kBlock;
    for (size_t j = 0; j < m; j += 64 / sizeof(x[0])) PrefetchRead(x, base + j);
    for (size_t j = 0; j < m; ++j) {
      const C v = E::Load(x[base + j]);
      squares[j] = static_cast<double>(v * v);
    }
    for (size_t j = 0; j < m; ++j) sum += squares[j];
  }
  return sum;
}

// The largest |x| of blocks added one by one (Add), as MaxAbs finds it: the plain maximum
// when no NaN was seen (nan()), else the caller runs MaxAbsSequential.
template <typename E>
class MaxAccumulator {
 public:
  void Add(const typename E::Storage* x, size_t m) {
    for (size_t j = 0; j < m; ++j) {
      const double a = static_cast<double>(std::fabs(E::Load(x[j])));
      nan_ |= a != a;
      best_ = a > best_ ? a : best_;
    }
  }
  bool nan() const { return nan_; }
  double Result() const { return best_; }

 private:
  double best_ = 0.0;
  bool nan_ = false;
};

#if defined(__SSE2__)
template <>
class MaxAccumulator<Elem<float>> {
 public:
  void Add(const float* x, size_t m) {
    const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    size_t j = 0;
    for (; j + 8 <= m; j += 8) {
      const __m128 a = _mm_loadu_ps(x + j), b = _mm_loadu_ps(x + j + 4);
      nan_ = _mm_or_ps(nan_, _mm_or_ps(_mm_cmpunord_ps(a, a), _mm_cmpunord_ps(b, b)));
      m0_ = _mm_max_ps(m0_, _mm_and_ps(a, abs_mask));
      m1_ = _mm_max_ps(m1_, _mm_and_ps(b, abs_mask));
    }
    for (; j < m; ++j) {
      const float a = std::fabs(x[j]);
      tail_nan_ |= a != a;
      tail_ = a > tail_ ? a : tail_;
    }
  }
  bool nan() const { return tail_nan_ || _mm_movemask_ps(nan_) != 0; }
  double Result() const {
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_max_ps(m0_, m1_));
    float best = tail_;
    for (float l : lanes) best = l > best ? l : best;
    return static_cast<double>(best);
  }

 private:
  __m128 m0_ = _mm_setzero_ps(), m1_ = _mm_setzero_ps(), nan_ = _mm_setzero_ps();
  float tail_ = 0.0f;
  bool tail_nan_ = false;
};
#endif

// ---- levels --------------------------------------------------------------------------

// The levels of elements [0, m) of one block, with draws r[j], into q[j]; bit j of *nonzero
// is q[j] != 0, of *negative the sign bit of x[j].
template <typename E, bool kNatural>
inline void LevelsGeneric(const typename E::Storage* x, int m, double scale, double s,
                          const uint64_t* r, uint32_t* q, uint64_t* nonzero,
                          uint64_t* negative) {
  using C = typename E::Compute;
  uint64_t nz = 0, neg = 0;
  for (int j = 0; j < m; ++j) {
    const C v = E::Load(x[j]);
    const double a = static_cast<double>(std::fabs(v));
    const double draw = XorShift128Plus::ToDouble(r[j]);
    uint32_t level;
    if constexpr (kNatural) {
      double normalized = a / scale * s;
      normalized = normalized >= 0 ? normalized : 0.0;
      normalized = normalized > s ? s : normalized;
      uint32_t up = static_cast<uint32_t>(normalized);  // ceil
      up += static_cast<double>(up) < normalized;
      const uint32_t floor = RoundNextPow2(up) >> 1;
      const uint32_t length = floor != 0 ? floor : 1;
      const uint64_t recip_bits = static_cast<uint64_t>(1023 - __builtin_ctz(length)) << 52;
      double recip;  // 1 / length, exact
      std::memcpy(&recip, &recip_bits, sizeof(recip));
      const double p = (normalized - floor) * recip;
      level = floor + (draw < p * kDrawMax ? length : 0u);
    } else {
      C normalized = static_cast<C>(a / scale * s);
      normalized = normalized >= 0 ? normalized : C(0);
      normalized = normalized > static_cast<C>(s) ? static_cast<C>(s) : normalized;
      const uint32_t whole = static_cast<uint32_t>(normalized);  // floor
      const C p = normalized - static_cast<C>(whole);
      level = whole + (draw < static_cast<double>(p) * kDrawMax ? 1u : 0u);
    }
    q[j] = level;
    nz |= static_cast<uint64_t>(level != 0) << j;
    neg |= static_cast<uint64_t>(std::signbit(v) ? 1 : 0) << j;
  }
  *nonzero = nz;
  *negative = neg;
}

// The codes of one block's non-zero elements (block starting at element `base`), two
// elements per write where both are small (one write, half the bit writer's dependency chain).
template <bool kChecked>
inline void EmitBlock(uint64_t nonzero, uint64_t negative, const uint32_t* q, uint64_t base,
                      uint64_t* previous_plus_one, BitWriter* w) {
  uint64_t previous = *previous_plus_one;  // index of the previous element sent, + 1
  while (nonzero != 0) {
    const int j1 = __builtin_ctzll(nonzero);
    nonzero &= nonzero - 1;
    const uint64_t i1 = base + static_cast<uint64_t>(j1) + 1, gap1 = i1 - previous;
    const uint64_t sign1 = (negative >> j1) & 1, level1 = q[j1];
    previous = i1;
    if (nonzero == 0) {
      w->PutElement<kChecked>(gap1, sign1, level1);
      break;
    }
    const int j2 = __builtin_ctzll(nonzero);
    nonzero &= nonzero - 1;
    const uint64_t i2 = base + static_cast<uint64_t>(j2) + 1, gap2 = i2 - previous;
    const uint64_t sign2 = (negative >> j2) & 1, level2 = q[j2];
    previous = i2;
    if (__builtin_expect((gap1 | level1 | gap2 | level2) < kSmall, 1)) {
      w->PutSmallPair<kChecked>(gap1, sign1, level1, gap2, sign2, level2);
    } else {
      w->PutElement<kChecked>(gap1, sign1, level1);
      w->PutElement<kChecked>(gap2, sign2, level2);
    }
  }
  *previous_plus_one = previous;
}

// The decoder's values (dithering.cc): 0 (zero bits) for level 0, else Store(+-num) with
// num = level * scale / s in the compute type, the scale as stored; small levels tabled.
template <typename E>
class Decoded {
 public:
  using C = typename E::Compute;
  using S = typename E::Storage;
  Decoded(double scale, uint32_t levels)
      : scale_(static_cast<C>(scale)), s_(static_cast<C>(levels)) {
    for (uint32_t q = 1; q < kLevelCodes && q <= levels; ++q) {
      const C num = static_cast<C>(q) * scale_ / s_;
      values_[0][q] = E::Store(num);
      values_[1][q] = E::Store(-num);
    }
  }
  S Value(uint32_t level, uint64_t sign) const {
    if (level < kLevelCodes) return values_[sign][level];
    const C num = static_cast<C>(level) * scale_ / s_;
    return E::Store(sign ? -num : num);
  }

 private:
  C scale_, s_;
  S values_[2][kLevelCodes] = {};  // level 0: zero bits
};

// Error feedback's residual of one block (elements [0, m)): out[j] = Store(Load(x[j]) -
// Load(decoded j)). out may be x (each element is read before it is written).
template <typename E>
inline void ResidualBlock(const typename E::Storage* x, int m, const uint32_t* q,
                          uint64_t negative, const Decoded<E>& decoded,
                          typename E::Storage* out) {
  for (int j = 0; j < m; ++j) {
    const auto v = decoded.Value(q[j], (negative >> j) & 1);
    out[j] = E::Store(E::Load(x[j]) - E::Load(v));
  }
}

template <typename E, bool kNatural>
void QuantizeGeneric(const typename E::Storage* x, size_t n, double scale, double s,
                     XorShift128Plus* state, BitWriter* out, const Decoded<E>* decoded,
                     typename E::Storage* residual) {
  XorShift128Plus rng = *state;  // local copies stay in registers
  BitWriter w = *out;
  uint64_t draws[kBlock];
  uint32_t q[kBlock];
  uint64_t previous_plus_one = 0;
  for (size_t base = 0; base < n; base += kBlock) {
    const int m = n - base < kBlock ? static_cast<int>(n - base) : kBlock;
    for (int j = 0; j < m; j += 64 / static_cast<int>(sizeof(x[0]))) PrefetchRead(x, base + j);
    for (int j = 0; j < m; ++j) draws[j] = rng.Next();
    uint64_t nonzero, negative;
    LevelsGeneric<E, kNatural>(x + base, m, scale, s, draws, q, &nonzero, &negative);
    if (residual != nullptr) ResidualBlock<E>(x + base, m, q, negative, *decoded, residual + base);
    if (w.Room() >= kBlockRoom) {
      EmitBlock<false>(nonzero, negative, q, base, &previous_plus_one, &w);
    } else {
      EmitBlock<true>(nonzero, negative, q, base, &previous_plus_one, &w);
    }
  }
  *state = rng;
  *out = w;
}

#ifdef BPS_DITHER_X86
#define BPS_AVX512 \
  __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,bmi,bmi2,lzcnt,movbe")))

bool HasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("lzcnt") && __builtin_cpu_supports("movbe");
  }();
  return has;
}

// LevelsGeneric<Elem<float>> for a whole block, 8 elements per step, with the same IEEE
// operations: float64 division and multiply, one rounding to float32 (linear), the unsigned
// draws converted to float64 round-to-nearest-even as static_cast<double> does. Where they
// differ in form, the results are the same:
//   clamp: max(v, 0) is 0 for NaN and max(v, s) is v for v <= s (MAXPD/MINPD return the
//     second operand for NaN), as the two conditionals are (v is never -0: |x| / scale).
//   natural: floor = the power of two below ceil(normalized), 0 for ceil <= 1: ceil - 1 (an
//     exact integer) with its mantissa cleared, then max(., 0); length = max(., 1); the
//     threshold (normalized - floor) / length * 2^64 as one multiply by 2^(64 - log2 length)
//     (scalings by powers of two, exact here: normalized - floor is 0 or at least 2^-52 and
//     the product is at most 2^64).
template <bool kNatural>
BPS_AVX512 inline void LevelsFloatAvx512(const float* x, double scale, double s,
                                         const uint64_t* r, uint32_t* q, uint64_t* nonzero,
                                         uint64_t* negative) {
  const __m512d scale_v = _mm512_set1_pd(scale), s_v = _mm512_set1_pd(s);
  const __m512d zero = _mm512_setzero_pd(), one = _mm512_set1_pd(1.0);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  uint64_t nz = 0, neg = 0;
  for (int j = 0; j < kBlock; j += 8) {
    if (j % 16 == 0) PrefetchRead(x, j);
    const __m256 v = _mm256_loadu_ps(x + j);
    const __m512d a = _mm512_cvtps_pd(_mm256_and_ps(v, abs_mask));
    const __m512d draw = _mm512_cvtepu64_pd(_mm512_loadu_si512(r + j));
    const __m512d normalized = _mm512_mul_pd(_mm512_div_pd(a, scale_v), s_v);
    __m256i level;
    if constexpr (kNatural) {
      const __m512d clamped = _mm512_min_pd(_mm512_max_pd(normalized, zero), s_v);
      const __m512d up =
          _mm512_roundscale_pd(clamped, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
      const __m512i exp_mask = _mm512_set1_epi64(static_cast<int64_t>(0xfff0000000000000ull));
      const __m512d pow2 = _mm512_castsi512_pd(
          _mm512_and_si512(_mm512_castpd_si512(_mm512_sub_pd(up, one)), exp_mask));
      const __m512d floor = _mm512_max_pd(pow2, zero);
      const __m512d length = _mm512_max_pd(pow2, one);
      const __m512i recip_base = _mm512_set1_epi64(static_cast<int64_t>(uint64_t{2046 + 64} << 52));
      const __m512d scaled_recip =
          _mm512_castsi512_pd(_mm512_sub_epi64(recip_base, _mm512_castpd_si512(length)));
      const __m512d threshold = _mm512_mul_pd(_mm512_sub_pd(clamped, floor), scaled_recip);
      const __mmask8 hit = _mm512_cmp_pd_mask(draw, threshold, _CMP_LT_OQ);
      level = _mm512_cvttpd_epu32(_mm512_mask_add_pd(floor, hit, floor, length));
    } else {
      const __m256 sf = _mm256_set1_ps(static_cast<float>(s));
      const __m256 nf =
          _mm256_min_ps(_mm256_max_ps(_mm512_cvtpd_ps(normalized), _mm256_setzero_ps()), sf);
      const __m256i whole = _mm256_cvttps_epi32(nf);
      const __m256 p = _mm256_sub_ps(nf, _mm256_cvtepi32_ps(whole));
      const __mmask8 hit = _mm512_cmp_pd_mask(
          draw, _mm512_mul_pd(_mm512_cvtps_pd(p), _mm512_set1_pd(kDrawMax)), _CMP_LT_OQ);
      level = _mm256_mask_add_epi32(whole, hit, whole, _mm256_set1_epi32(1));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), level);
    nz |= static_cast<uint64_t>(_mm256_test_epi32_mask(level, level)) << j;
    neg |= static_cast<uint64_t>(_mm256_movemask_ps(v)) << j;
  }
  *nonzero = nz;
  *negative = neg;
}

template <bool kNatural>
BPS_AVX512 void QuantizeFloatAvx512(const float* x, size_t n, double scale, double s,
                                    XorShift128Plus* state, BitWriter* out,
                                    const Decoded<Elem<float>>* decoded, float* residual) {
  XorShift128Plus rng = *state;  // local copies stay in registers
  BitWriter w = *out;
  // The draws of kDrawChunk elements at a time (rng_chunks.h); the last elements' one by one.
  alignas(64) uint64_t draws[kDrawChunk];
  uint32_t q[kBlock];
  uint64_t previous_plus_one = 0;
  size_t base = 0;
  while (base < n) {
    size_t chunk;
    if (n - base >= kDrawChunk) {
      chunk = kDrawChunk;
      DrawChunk(&rng, draws);
    } else {
      chunk = n - base;
      for (size_t j = 0; j < chunk; ++j) draws[j] = rng.Next();
    }
    for (size_t off = 0; off < chunk; off += kBlock) {
      uint64_t nonzero, negative;
      if (chunk - off >= kBlock) {
        LevelsFloatAvx512<kNatural>(x + base + off, scale, s, draws + off, q, &nonzero,
                                    &negative);
      } else {
        LevelsGeneric<Elem<float>, kNatural>(x + base + off, static_cast<int>(chunk - off),
                                             scale, s, draws + off, q, &nonzero, &negative);
      }
      if (residual != nullptr) {
        const int m = chunk - off < kBlock ? static_cast<int>(chunk - off) : kBlock;
        ResidualBlock<Elem<float>>(x + base + off, m, q, negative, *decoded,
                                   residual + base + off);
      }
      if (w.Room() >= kBlockRoom) {
        EmitBlock<false>(nonzero, negative, q, base + off, &previous_plus_one, &w);
      } else {
        EmitBlock<true>(nonzero, negative, q, base + off, &previous_plus_one, &w);
      }
    }
    base += chunk;
  }
  *state = rng;
  *out = w;
}
#endif

}  // namespace

template <typename E>
double Scale(const typename E::Storage* x, size_t n, bool l2) {
  return l2 ? std::sqrt(SumOfSquares<E>(x, n)) : MaxAbs<E>(x, n);
}

template <typename E>
double CorrectAndScale(const typename E::Storage* in, double scale, double factor,
                       typename E::Storage* error, size_t n, bool l2) {
  using C = typename E::Compute;
  using S = typename E::Storage;
  const S* __restrict x = in;
  S* __restrict err = error;
  const C s = static_cast<C>(scale), f = static_cast<C>(factor);
  double sum = 0.0;
  double squares[kBlock];
  MaxAccumulator<E> max;
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = n - base < kBlock ? n - base : kBlock;
    for (size_t j = 0; j < m; j += 64 / sizeof(S)) {
      PrefetchRead(x, base + j);
      PrefetchWrite(err, base + j);
    }
    for (size_t j = 0; j < m; ++j) {
      err[base + j] = E::Store(E::Load(x[base + j]) * s + f * E::Load(err[base + j]));
    }
    if (l2) {
      for (size_t j = 0; j < m; ++j) {
        const C v = E::Load(err[base + j]);
        squares[j] = static_cast<double>(v * v);
      }
      for (size_t j = 0; j < m; ++j) sum += squares[j];
    } else {
      max.Add(err + base, m);
    }
  }
  if (l2) return std::sqrt(sum);
  return max.nan() ? MaxAbsSequential<E>(err, n) : max.Result();
}

template <typename E>
void Quantize(const typename E::Storage* x, size_t n, double scale, uint32_t levels,
              bool natural, XorShift128Plus* rng, BitWriter* w,
              typename E::Storage* residual) {
  const double s = static_cast<double>(levels);
  std::unique_ptr<Decoded<E>> decoded;
  if (residual != nullptr) decoded = std::make_unique<Decoded<E>>(scale, levels);
  const Decoded<E>* d = decoded.get();
#ifdef BPS_DITHER_X86
  if constexpr (E::kType == DType::kFloat32) {
    if (HasAvx512() && HasDrawChunk()) {
      return natural ? QuantizeFloatAvx512<true>(x, n, scale, s, rng, w, d, residual)
                     : QuantizeFloatAvx512<false>(x, n, scale, s, rng, w, d, residual);
    }
  }
#endif
  return natural ? QuantizeGeneric<E, true>(x, n, scale, s, rng, w, d, residual)
                 : QuantizeGeneric<E, false>(x, n, scale, s, rng, w, d, residual);
}

#define BPS_DITHER_INSTANTIATE(E)                                                        \
  template double Scale<E>(const E::Storage* x, size_t n, bool l2);                      \
  template double CorrectAndScale<E>(const E::Storage* in, double scale, double factor,  \
                                     E::Storage* error, size_t n, bool l2);              \
  template void Quantize<E>(const E::Storage* x, size_t n, double scale, uint32_t levels, \
                            bool natural, XorShift128Plus* rng, BitWriter* w,           \
                            E::Storage* residual);
BPS_DITHER_INSTANTIATE(Elem<HalfBits>)
BPS_DITHER_INSTANTIATE(Elem<float>)
BPS_DITHER_INSTANTIATE(Elem<double>)
#undef BPS_DITHER_INSTANTIATE

}  // namespace dither
}  // namespace detail
}  // namespace compress
}  // namespace byteps
