// onebit (signSGD, upstream's OnebitCompressor): each element becomes its sign, decoded as
// +scale or -scale. Bit = 1 for x < 0 (so -0.0 and NaN encode as +); decoded value -scale for
// bit 1, +scale for bit 0. scale = mean(|x|) with compressor_onebit_scaling, else 1.
//
// mean(|x|): the |x| summed in float64 over 16 lanes (lane j takes the elements i = j mod 16
// in order, so the sum vectorises without reordering any lane), the lanes added 0..15 in order,
// divided by n in float64; float16/float32 tensors keep float32(mean), float64 the float64.
// (Upstream sums in one float64 chain; the results differ by float64 rounding only, well
// below the float32 scale's precision.)
//
// Wire (n elements): scale (float32, or float64 for float64 tensors), then ceil(n/8) bytes:
// element i is bit (i mod 8) of byte i/8; the unused high bits of the last byte are 0.
// Exactly 4 + ceil(n/8) bytes (12 + ceil(n/8) for float64); any other length, or a set
// padding bit, is an error. Any scale (NaN, infinite, negative) decodes without UB.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace byteps {
namespace compress {
namespace detail {
namespace {

constexpr int kLanes = 16;

// Packs the signs of elements [begin, n) into bytes begin/8.. (begin a multiple of 16); adds
// |x| into lane i mod 16 when sum.
template <typename E>
void PackGeneric(const typename E::Storage* x, size_t begin, size_t n, uint8_t* bits, bool sum,
                 double* lanes) {
  using C = typename E::Compute;
  size_t i = begin;
  for (; i + 16 <= n; i += 16) {
    PrefetchRead(x, i);
    if constexpr (sizeof(x[0]) == 8) PrefetchRead(x, i + 8);
    unsigned v = 0;
    for (int j = 0; j < 16; ++j) {
      const C c = E::Load(x[i + j]);
      v |= static_cast<unsigned>(c < 0) << j;
      if (sum) lanes[j] += static_cast<double>(std::fabs(c));
    }
    bits[i / 8] = static_cast<uint8_t>(v);
    bits[i / 8 + 1] = static_cast<uint8_t>(v >> 8);
  }
  for (int j = 0; i + j < n; ++j) {
    const C c = E::Load(x[i + j]);
    if (j % 8 == 0) bits[(i + j) / 8] = 0;
    bits[(i + j) / 8] |= static_cast<uint8_t>((c < 0) << (j % 8));
    if (sum) lanes[j] += static_cast<double>(std::fabs(c));
  }
}

template <typename E>
void Pack(const typename E::Storage* x, size_t n, uint8_t* bits, bool sum, double* lanes) {
  PackGeneric<E>(x, 0, n, bits, sum, lanes);
}

#if defined(__SSE2__)
// float32, SSE2: 16 elements per step from i (a multiple of 16): 4 compares packed to 16 sign
// bytes, one movemask; |x| into the 16 lanes, which carry on from `lanes`. Returns where it
// stopped.
size_t PackFloatSse2(const float* x, size_t i, size_t n, uint8_t* bits, bool sum,
                     double* lanes) {
  const __m128 zero = _mm_setzero_ps();
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128d acc[8];
  for (int a = 0; a < 8; ++a) acc[a] = _mm_loadu_pd(lanes + 2 * a);
  for (; i + 16 <= n; i += 16) {
    PrefetchRead(x, i);
    const __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
    const __m128 c = _mm_loadu_ps(x + i + 8), d = _mm_loadu_ps(x + i + 12);
    const __m128i ab = _mm_packs_epi32(_mm_castps_si128(_mm_cmplt_ps(a, zero)),
                                       _mm_castps_si128(_mm_cmplt_ps(b, zero)));
    const __m128i cd = _mm_packs_epi32(_mm_castps_si128(_mm_cmplt_ps(c, zero)),
                                       _mm_castps_si128(_mm_cmplt_ps(d, zero)));
    StoreRaw<uint16_t>(bits + i / 8,
                       static_cast<uint16_t>(_mm_movemask_epi8(_mm_packs_epi16(ab, cd))));
    if (sum) {
      const __m128 aa = _mm_and_ps(a, abs_mask), ba = _mm_and_ps(b, abs_mask);
      const __m128 ca = _mm_and_ps(c, abs_mask), da = _mm_and_ps(d, abs_mask);
      // Element i + j into lane j: one add per accumulator.
      acc[0] = _mm_add_pd(acc[0], _mm_cvtps_pd(aa));
      acc[1] = _mm_add_pd(acc[1], _mm_cvtps_pd(_mm_movehl_ps(aa, aa)));
      acc[2] = _mm_add_pd(acc[2], _mm_cvtps_pd(ba));
      acc[3] = _mm_add_pd(acc[3], _mm_cvtps_pd(_mm_movehl_ps(ba, ba)));
      acc[4] = _mm_add_pd(acc[4], _mm_cvtps_pd(ca));
      acc[5] = _mm_add_pd(acc[5], _mm_cvtps_pd(_mm_movehl_ps(ca, ca)));
      acc[6] = _mm_add_pd(acc[6], _mm_cvtps_pd(da));
      acc[7] = _mm_add_pd(acc[7], _mm_cvtps_pd(_mm_movehl_ps(da, da)));
    }
  }
  for (int a = 0; a < 8; ++a) _mm_storeu_pd(lanes + 2 * a, acc[a]);
  return i;
}
#endif

#if defined(__x86_64__) || defined(__i386__)
// float32, AVX2 (compiled for it by attribute, called only where the CPU has it): 32 elements
// per step from 0; the same bits and the same per-lane order as the SSE2 loop (elements
// i + j, then i + 16 + j, into lane j), with half the conversions.
__attribute__((target("avx2"))) size_t PackFloatAvx2(const float* x, size_t n, uint8_t* bits,
                                                      bool sum, double* lanes) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256d acc[4];
  for (int a = 0; a < 4; ++a) acc[a] = _mm256_loadu_pd(lanes + 4 * a);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    PrefetchRead(x, i);
    PrefetchRead(x, i + 16);
    __m256 v[4];
    uint32_t mask = 0;
    for (int q = 0; q < 4; ++q) {
      v[q] = _mm256_loadu_ps(x + i + 8 * q);
      mask |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v[q], zero, _CMP_LT_OQ)))
              << (8 * q);
    }
    StoreRaw<uint32_t>(bits + i / 8, mask);
    if (sum) {
      for (int q = 0; q < 4; ++q) {
        const __m256 a = _mm256_and_ps(v[q], abs_mask);
        const int lane = 2 * (q % 2);  // elements i + 8q.. go to lanes 8 (q % 2)..
        acc[lane] = _mm256_add_pd(acc[lane], _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
        acc[lane + 1] =
            _mm256_add_pd(acc[lane + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
      }
    }
  }
  for (int a = 0; a < 4; ++a) _mm256_storeu_pd(lanes + 4 * a, acc[a]);
  return i;
}

bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
#endif

template <>
void Pack<Elem<float>>(const float* x, size_t n, uint8_t* bits, bool sum, double* lanes) {
  size_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
  if (HasAvx2()) i = PackFloatAvx2(x, n, bits, sum, lanes);
#endif
#if defined(__SSE2__)
  i = PackFloatSse2(x, i, n, bits, sum, lanes);
#endif
  PackGeneric<Elem<float>>(x, i, n, bits, sum, lanes);
}

// What Unpack writes per element, d = bit ? neg : pos: out = d (kSet), out = out + d (kAdd),
// out = corrected - d (kResidual).
enum class Mode { kSet, kAdd, kResidual };

template <typename E, Mode kMode>
inline void Emit(typename E::Storage d, const typename E::Storage* corrected, size_t i,
                 typename E::Storage* out) {
  if constexpr (kMode == Mode::kSet) {
    out[i] = d;
  } else if constexpr (kMode == Mode::kAdd) {
    out[i] = E::Store(E::Load(out[i]) + E::Load(d));
  } else {
    out[i] = E::Store(E::Load(corrected[i]) - E::Load(d));
  }
}

template <typename E, Mode kMode>
void UnpackGeneric(const uint8_t* bits, size_t begin, size_t n, typename E::Storage pos,
                   typename E::Storage neg, const typename E::Storage* corrected,
                   typename E::Storage* out) {
  // Whole bytes, 8 elements each (constant shifts), then the tail.
  size_t i = begin;
  constexpr size_t kLine = 64 / sizeof(pos);  // elements per 64-byte line
  for (; i + 8 <= n; i += 8) {
    if (i % kLine < 8) {
      PrefetchWrite(out, i);
      if constexpr (kMode == Mode::kResidual) PrefetchRead(corrected, i);
    }
    const unsigned v = bits[i / 8];
    for (int j = 0; j < 8; ++j) Emit<E, kMode>(((v >> j) & 1u) ? neg : pos, corrected, i + j, out);
  }
  for (; i < n; ++i) {
    Emit<E, kMode>(((bits[i / 8] >> (i % 8)) & 1u) ? neg : pos, corrected, i, out);
  }
}

template <typename E, Mode kMode>
void Unpack(const uint8_t* bits, size_t n, typename E::Storage pos, typename E::Storage neg,
            const typename E::Storage* corrected, typename E::Storage* out) {
  UnpackGeneric<E, kMode>(bits, 0, n, pos, neg, corrected, out);
}

#if defined(__SSE2__)
template <Mode kMode>
void UnpackFloatSse2(const uint8_t* bits, size_t n, float pos, const float* corrected,
                     float* out) {
  const __m128i sel_lo = _mm_setr_epi32(1, 2, 4, 8);
  const __m128i sel_hi = _mm_setr_epi32(16, 32, 64, 128);
  const __m128i sign = _mm_set1_epi32(static_cast<int>(0x80000000u));
  const __m128i value = _mm_castps_si128(_mm_set1_ps(pos));
  // 8 elements from one byte of bits.
  auto eight = [&](size_t i) {
    const __m128i v = _mm_set1_epi32(bits[i / 8]);
    const __m128i mlo = _mm_cmpeq_epi32(_mm_and_si128(v, sel_lo), sel_lo);
    const __m128i mhi = _mm_cmpeq_epi32(_mm_and_si128(v, sel_hi), sel_hi);
    __m128 lo = _mm_castsi128_ps(_mm_xor_si128(value, _mm_and_si128(mlo, sign)));
    __m128 hi = _mm_castsi128_ps(_mm_xor_si128(value, _mm_and_si128(mhi, sign)));
    if constexpr (kMode == Mode::kAdd) {
      lo = _mm_add_ps(_mm_loadu_ps(out + i), lo);
      hi = _mm_add_ps(_mm_loadu_ps(out + i + 4), hi);
    } else if constexpr (kMode == Mode::kResidual) {
      lo = _mm_sub_ps(_mm_loadu_ps(corrected + i), lo);
      hi = _mm_sub_ps(_mm_loadu_ps(corrected + i + 4), hi);
    }
    _mm_storeu_ps(out + i, lo);
    _mm_storeu_ps(out + i + 4, hi);
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {  // one 64-byte line of output
    PrefetchWrite(out, i);
    if constexpr (kMode == Mode::kResidual) PrefetchRead(corrected, i);
    eight(i);
    eight(i + 8);
  }
  for (; i + 8 <= n; i += 8) eight(i);
  UnpackGeneric<Elem<float>, kMode>(bits, i, n, pos, -pos, corrected, out);
}

template <>
void Unpack<Elem<float>, Mode::kSet>(const uint8_t* bits, size_t n, float pos, float neg,
                                     const float* corrected, float* out) {
  UnpackFloatSse2<Mode::kSet>(bits, n, pos, corrected, out);
}
template <>
void Unpack<Elem<float>, Mode::kAdd>(const uint8_t* bits, size_t n, float pos, float neg,
                                     const float* corrected, float* out) {
  UnpackFloatSse2<Mode::kAdd>(bits, n, pos, corrected, out);
}
template <>
void Unpack<Elem<float>, Mode::kResidual>(const uint8_t* bits, size_t n, float pos, float neg,
                                          const float* corrected, float* out) {
  UnpackFloatSse2<Mode::kResidual>(bits, n, pos, corrected, out);
}
#endif

// The negation of a stored value: its sign bit flipped (NaN included).
template <typename S>
S FlipSign(S v) {
  if constexpr (sizeof(S) == 2) {
    return static_cast<S>(v ^ 0x8000u);
  } else {
    return -v;
  }
}

// ---- error feedback's fused step (Codec::EncodeWithFeedback) ---------------------------
// corrected = Store(Load(x) * s + f * Load(error)), what a pass does with it: kBits packs its
// signs, kSum adds |c| into the 16 lanes (as Pack), kResidual writes error = Store(c -
// Load(bit ? neg : pos)), kStore writes c over the error. Unscaled onebit: one pass doing bits
// and residual (pos = 1); scaled: bits, sums and c in place, then the scale, then the residual
// in place from c and the bits (Unpack's kResidual). No multiply feeds an add in one
// instruction (no FMA is compiled in).
template <typename E, bool kBits, bool kSum, bool kResidual, bool kStore>
void FeedbackGeneric(const typename E::Storage* x, typename E::Storage* err, size_t begin,
                     size_t n, typename E::Compute s, typename E::Compute f,
                     typename E::Storage pos, uint8_t* bits, double* lanes) {
  using C = typename E::Compute;
  using S = typename E::Storage;
  const S neg = FlipSign(pos);
  constexpr size_t kLine = 64 / sizeof(S);
  for (size_t i = begin; i < n; i += 8) {  // begin: a multiple of 16
    if (i % kLine < 8) {
      PrefetchRead(x, i);
      PrefetchWrite(err, i);
    }
    const size_t m = n - i < 8 ? n - i : 8;
    unsigned v = 0;
    for (size_t j = 0; j < m; ++j) {
      const S cs = E::Store(E::Load(x[i + j]) * s + f * E::Load(err[i + j]));
      if constexpr (kStore) err[i + j] = cs;
      const C c = E::Load(cs);
      const bool negative = c < 0;
      v |= static_cast<unsigned>(negative) << j;
      if constexpr (kSum) lanes[(i + j) % kLanes] += static_cast<double>(std::fabs(c));
      if constexpr (kResidual) err[i + j] = E::Store(c - E::Load(negative ? neg : pos));
    }
    if constexpr (kBits) bits[i / 8] = static_cast<uint8_t>(v);
  }
}

#if defined(__x86_64__) || defined(__i386__)
// float32, AVX2: 32 elements per step from 0 (the lanes as PackFloatAvx2's); returns where it
// stopped.
template <bool kBits, bool kSum, bool kResidual, bool kStore>
__attribute__((target("avx2"))) size_t FeedbackFloatAvx2(const float* x, float* err, size_t n,
                                                         float s, float f, float pos,
                                                         uint8_t* bits, double* lanes) {
  const __m256 zero = _mm256_setzero_ps(), s_v = _mm256_set1_ps(s), f_v = _mm256_set1_ps(f);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 pos_v = _mm256_set1_ps(pos);
  __m256d acc[4];
  if constexpr (kSum) {
    for (int a = 0; a < 4; ++a) acc[a] = _mm256_loadu_pd(lanes + 4 * a);
  }
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    PrefetchRead(x, i);
    PrefetchRead(x, i + 16);
    PrefetchWrite(err, i);
    PrefetchWrite(err, i + 16);
    uint32_t mask = 0;
    for (int q = 0; q < 4; ++q) {
      const __m256 c = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * q), s_v),
                                     _mm256_mul_ps(f_v, _mm256_loadu_ps(err + i + 8 * q)));
      if constexpr (kStore) _mm256_storeu_ps(err + i + 8 * q, c);
      const __m256 lt = _mm256_cmp_ps(c, zero, _CMP_LT_OQ);
      if constexpr (kBits) mask |= static_cast<uint32_t>(_mm256_movemask_ps(lt)) << (8 * q);
      if constexpr (kSum) {
        const __m256 a = _mm256_and_ps(c, abs_mask);
        const int lane = 2 * (q % 2);
        acc[lane] = _mm256_add_pd(acc[lane], _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
        acc[lane + 1] =
            _mm256_add_pd(acc[lane + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
      }
      if constexpr (kResidual) {
        const __m256 d = _mm256_xor_ps(pos_v, _mm256_and_ps(lt, sign));
        _mm256_storeu_ps(err + i + 8 * q, _mm256_sub_ps(c, d));
      }
    }
    if constexpr (kBits) StoreRaw<uint32_t>(bits + i / 8, mask);
  }
  if constexpr (kSum) {
    for (int a = 0; a < 4; ++a) _mm256_storeu_pd(lanes + 4 * a, acc[a]);
  }
  return i;
}
#endif

template <typename E, bool kBits, bool kSum, bool kResidual, bool kStore>
void Feedback(const typename E::Storage* x, typename E::Storage* err, size_t n,
              typename E::Compute s, typename E::Compute f, typename E::Storage pos,
              uint8_t* bits, double* lanes) {
  size_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (E::kType == DType::kFloat32) {
    if (HasAvx2()) {
      i = FeedbackFloatAvx2<kBits, kSum, kResidual, kStore>(x, err, n, s, f, pos, bits, lanes);
    }
  }
#endif
  FeedbackGeneric<E, kBits, kSum, kResidual, kStore>(x, err, i, n, s, f, pos, bits, lanes);
}

class Onebit final : public Codec {
 public:
  Onebit(DType dtype, size_t count, bool scaling) : Codec(dtype, count), scaling_(scaling) {}

  size_t MaxEncodedBytes() const override { return ScaleBytes() + BitBytes(); }

  Status Encode(const void* in, void* out, size_t* out_len) override {
    auto* o = static_cast<uint8_t*>(out);
    DispatchFloat(dtype(), [&](auto e) {
      using E = decltype(e);
      using C = typename E::Compute;
      double lanes[kLanes] = {};
      Pack<E>(static_cast<const typename E::Storage*>(in), count(), o + ScaleBytes(), scaling_,
              lanes);
      double scale = 1.0;
      if (scaling_) {
        double total = 0;
        for (double l : lanes) total += l;
        scale = total / static_cast<double>(count());
      }
      StoreRaw<C>(o, static_cast<C>(scale));
    });
    *out_len = MaxEncodedBytes();
    return Status::OK();
  }

  Status Decompress(const void* in, size_t len, void* dst) override {
    return Decode<false>(in, len, dst);
  }
  Status DecompressAdd(const void* in, size_t len, void* dst) override {
    return Decode<true>(in, len, dst);
  }

  // Fused: error = corrected - (bit ? -scale : +scale), in the tensor's type.
  void Residual(const void* corrected, const void* enc, size_t len, void* error) override {
    Unpacked<Mode::kResidual>(static_cast<const uint8_t*>(enc), corrected, error);
  }

  bool EncodeWithFeedback(const void* in, double scale, double factor, void* error, void* out,
                          size_t* out_len) override {
    auto* o = static_cast<uint8_t*>(out);
    DispatchFloat(dtype(), [&](auto e) {
      using E = decltype(e);
      using C = typename E::Compute;
      using S = typename E::Storage;
      const auto* x = static_cast<const S*>(in);
      auto* err = static_cast<S*>(error);
      const C s = static_cast<C>(scale), f = static_cast<C>(factor);
      uint8_t* bits = o + ScaleBytes();
      if (!scaling_) {
        StoreRaw<C>(o, static_cast<C>(1.0));
        const S pos = E::Store(static_cast<C>(1.0));
        Feedback<E, true, false, true, false>(x, err, count(), s, f, pos, bits, nullptr);
        return;
      }
      double lanes[kLanes] = {};
      Feedback<E, true, true, false, true>(x, err, count(), s, f, S{}, bits, lanes);
      double total = 0;
      for (double l : lanes) total += l;
      StoreRaw<C>(o, static_cast<C>(total / static_cast<double>(count())));
      const S pos = E::Store(LoadRaw<C>(o));
      Unpack<E, Mode::kResidual>(bits, count(), pos, FlipSign(pos), err, err);  // in place
    });
    *out_len = MaxEncodedBytes();
    return true;
  }

 private:
  size_t ScaleBytes() const { return dtype() == DType::kFloat64 ? 8 : 4; }
  size_t BitBytes() const { return (count() + 7) / 8; }

  template <bool kAdd>
  Status Decode(const void* in, size_t len, void* dst) {
    if (len != MaxEncodedBytes()) {
      return Status::InvalidArgument("onebit encoding of " + std::to_string(len) +
                                     " bytes; " + std::to_string(count()) + " elements take " +
                                     std::to_string(MaxEncodedBytes()));
    }
    const auto* e8 = static_cast<const uint8_t*>(in);
    const uint8_t* bits = e8 + ScaleBytes();
    if (count() % 8 != 0 && (bits[BitBytes() - 1] >> (count() % 8)) != 0) {
      return Status::InvalidArgument("onebit encoding has padding bits set");
    }
    Unpacked<kAdd ? Mode::kAdd : Mode::kSet>(e8, nullptr, dst);
    return Status::OK();
  }

  template <Mode kMode>
  void Unpacked(const uint8_t* enc, const void* corrected, void* out) {
    DispatchFloat(dtype(), [&](auto e) {
      using E = decltype(e);
      using S = typename E::Storage;
      const S pos = E::Store(LoadRaw<typename E::Compute>(enc));
      Unpack<E, kMode>(enc + ScaleBytes(), count(), pos, FlipSign(pos),
                       static_cast<const S*>(corrected), static_cast<S*>(out));
    });
  }

  bool scaling_;
};

}  // namespace

std::unique_ptr<Codec> MakeOnebit(DType dtype, size_t count, bool scaling) {
  return std::make_unique<Onebit>(dtype, count, scaling);
}

}  // namespace detail
}  // namespace compress
}  // namespace byteps
