// fp16: a cast to IEEE float16, round to nearest even (NumPy's astype(float16)): float32
// through reduce/half.h's FloatToHalf, or F16C's vcvtps2ph where the CPU has it (the same
// results, NaN payloads included); float64 straight to float16 (one rounding, not two through
// float32); a float16 tensor passes through unchanged. Decoded: the float16 value, exactly.
//
// Wire (n elements): n float16 values, 2n bytes exactly.
//
// The F16C kernels are compiled for that instruction set with a function attribute (the file
// itself is built with the portable flags) and called only when __builtin_cpu_supports says so.
#include <cstdint>
#include <cstring>

#include "../reduce/sum.h"
#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BPS_COMPRESS_F16C 1
#endif

namespace byteps {
namespace compress {
namespace detail {
namespace {

// float64 -> float16 bits, round to nearest even, with one rounding.
uint16_t DoubleToHalf(double v) {
  uint64_t x;
  std::memcpy(&x, &v, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 48) & 0x8000u);
  const uint64_t ax = x & 0x7fffffffffffffffull;
  if (ax >= 0x7ff0000000000000ull) {  // inf or NaN
    if (ax == 0x7ff0000000000000ull) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 42) & 0x3ffu));  // quiet NaN
  }
  if (ax >= 0x40effe0000000000ull) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520
  const uint64_t e = ax >> 52;
  if (e >= 1009) {  // >= 2^-14: normal float16
    uint64_t r = ax - (uint64_t{1008} << 52);
    r += (uint64_t{1} << 41) - 1 + ((r >> 42) & 1u);
    return static_cast<uint16_t>(sign | (r >> 42));
  }
  if (e < 998) return sign;  // < 2^-25: rounds to zero
  // Subnormal float16: the value in units of 2^-24 is m * 2^(e - 1051).
  const uint64_t m = (ax & 0xfffffffffffffull) | (uint64_t{1} << 52);
  const unsigned shift = static_cast<unsigned>(1051 - e);  // 43 .. 53
  uint64_t q = m >> shift;
  const uint64_t rem = m & ((uint64_t{1} << shift) - 1);
  const uint64_t halfway = uint64_t{1} << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

#ifdef BPS_COMPRESS_F16C
// Outputs of at least this many bytes (beyond a core's share of L2) are written with
// non-temporal stores (the encode's float16, a plain decode's float32): no read-for-ownership
// of lines about to be overwritten whole, which is a third of a large cast's memory traffic (64 MiB float32: +10-15 % measured here); smaller
// outputs stay in the cache for the send that follows.
constexpr size_t kStreamOutputBytes = size_t{4} << 20;

__attribute__((target("avx,f16c"))) void FloatToHalfF16c(const float* s, uint16_t* d,
                                                           size_t n) {
  size_t i = 0;
  if (2 * n >= kStreamOutputBytes) {
    for (; (reinterpret_cast<uintptr_t>(d + i) & 15u) != 0 && i < n; ++i) {
      d[i] = half::FloatToHalf(s[i]);
    }
    for (; i + 16 <= n; i += 16) {  // d + i is 16-byte aligned
      PrefetchRead(s, i);
      const __m128i h0 = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
      const __m128i h1 =
          _mm256_cvtps_ph(_mm256_loadu_ps(s + i + 8), _MM_FROUND_TO_NEAREST_INT);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), h0);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 8), h1);
    }
    _mm_sfence();  // the streamed lines are visible before anyone reads the output
  }
  for (; i + 16 <= n; i += 16) {  // a 64-byte line of input, half a line of output
    PrefetchRead(s, i);
    PrefetchWrite(d, i);
    const __m128i h0 = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    const __m128i h1 = _mm256_cvtps_ph(_mm256_loadu_ps(s + i + 8), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 8), h1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = half::FloatToHalf(s[i]);
}

// Elements i..i + 7.
template <bool kAdd>
__attribute__((target("avx,f16c"))) inline void HalfToFloatEight(const uint8_t* h, float* d,
                                                                 size_t i) {
  __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * i)));
  if constexpr (kAdd) v = _mm256_add_ps(_mm256_loadu_ps(d + i), v);
  _mm256_storeu_ps(d + i, v);
}

template <bool kAdd>
__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const uint8_t* h, float* d, size_t n) {
  size_t i = 0;
  if (!kAdd && 4 * n >= kStreamOutputBytes) {  // a plain decode overwrites its output whole
    for (; (reinterpret_cast<uintptr_t>(d + i) & 31u) != 0 && i < n; ++i) {
      d[i] = half::HalfToFloat(LoadRaw<uint16_t>(h + 2 * i));
    }
    for (; i + 16 <= n; i += 16) {  // d + i is 32-byte aligned
      PrefetchRead(h, 2 * i);
      _mm256_stream_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                  reinterpret_cast<const __m128i*>(h + 2 * i))));
      _mm256_stream_ps(d + i + 8, _mm256_cvtph_ps(_mm_loadu_si128(
                                      reinterpret_cast<const __m128i*>(h + 2 * i + 16))));
    }
    _mm_sfence();  // the streamed lines are visible before anyone reads the output
  }
  for (; i + 16 <= n; i += 16) {  // a 64-byte line of output, half a line of input
    PrefetchRead(h, 2 * i);
    PrefetchWrite(d, i);
    HalfToFloatEight<kAdd>(h, d, i);
    HalfToFloatEight<kAdd>(h, d, i + 8);
  }
  for (; i + 8 <= n; i += 8) HalfToFloatEight<kAdd>(h, d, i);
  for (; i < n; ++i) {
    const float f = half::HalfToFloat(LoadRaw<uint16_t>(h + 2 * i));
    d[i] = kAdd ? d[i] + f : f;
  }
}

bool HasF16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return has;
}
#endif

void FloatToHalfArray(const float* s, uint8_t* d, size_t n) {
#ifdef BPS_COMPRESS_F16C
  if (HasF16c() && reinterpret_cast<uintptr_t>(d) % 2 == 0) {
    FloatToHalfF16c(s, reinterpret_cast<uint16_t*>(d), n);
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) StoreRaw<uint16_t>(d + 2 * i, half::FloatToHalf(s[i]));
}

template <bool kAdd>
void HalfToFloatArray(const uint8_t* h, float* d, size_t n) {
#ifdef BPS_COMPRESS_F16C
  if (HasF16c()) {
    HalfToFloatF16c<kAdd>(h, d, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) {
    const float f = half::HalfToFloat(LoadRaw<uint16_t>(h + 2 * i));
    d[i] = kAdd ? d[i] + f : f;
  }
}

class Fp16 final : public Codec {
 public:
  Fp16(DType dtype, size_t count) : Codec(dtype, count) {}

  size_t MaxEncodedBytes() const override { return 2 * count(); }

  Status Encode(const void* in, void* out, size_t* out_len) override {
    auto* o = static_cast<uint8_t*>(out);
    switch (dtype()) {
      case DType::kFloat16:
        std::memcpy(o, in, 2 * count());
        break;
      case DType::kFloat64: {
        const auto* x = static_cast<const double*>(in);
        const size_t n = count();
        for (size_t i = 0; i < n; ++i) StoreRaw<uint16_t>(o + 2 * i, DoubleToHalf(x[i]));
        break;
      }
      default:
        FloatToHalfArray(static_cast<const float*>(in), o, count());
    }
    *out_len = 2 * count();
    return Status::OK();
  }

  Status Decompress(const void* in, size_t len, void* dst) override {
    return Decode<false>(in, len, dst);
  }
  Status DecompressAdd(const void* in, size_t len, void* dst) override {
    return Decode<true>(in, len, dst);
  }

 private:
  template <bool kAdd>
  Status Decode(const void* in, size_t len, void* dst) {
    if (len != 2 * count()) {
      return Status::InvalidArgument("fp16 encoding of " + std::to_string(len) + " bytes; " +
                                     std::to_string(count()) + " elements take " +
                                     std::to_string(2 * count()));
    }
    const auto* h = static_cast<const uint8_t*>(in);
    switch (dtype()) {
      case DType::kFloat16:
        if constexpr (kAdd) {
          // The summation kernels: float32 adds rounded to float16, as Elem<HalfBits> does.
          reduce::SumInto(dst, in, count(), DType::kFloat16);
        } else {
          std::memcpy(dst, in, len);
        }
        break;
      case DType::kFloat64: {
        auto* d = static_cast<double*>(dst);
        const size_t n = count();
        for (size_t i = 0; i < n; ++i) {
          const double v = half::HalfToFloat(LoadRaw<uint16_t>(h + 2 * i));
          d[i] = kAdd ? d[i] + v : v;
        }
        break;
      }
      default:
        HalfToFloatArray<kAdd>(h, static_cast<float*>(dst), count());
    }
    return Status::OK();
  }
};

}  // namespace

std::unique_ptr<Codec> MakeFp16(DType dtype, size_t count) {
  return std::make_unique<Fp16>(dtype, count);
}

}  // namespace detail
}  // namespace compress
}  // namespace byteps
