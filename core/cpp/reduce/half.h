// Scalar float16 <-> float32 and bfloat16 <-> float32 conversions (docs/architecture.md §7).
//
// Bit-exact IEEE behaviour: float32 -> float16/bfloat16 rounds to nearest, ties to even;
// overflow gives infinity; float16 subnormals are produced and read exactly; a NaN stays a
// NaN (quiet, sign and top payload bits kept, as F16C's vcvtps2ph does).
//
// The functions are `static inline` on purpose: this header is included by translation units
// compiled for different ISAs (-mavx2, -mavx512f...). With external linkage the linker could
// keep an AVX-512 copy of an inline function and hand it to the scalar code path.
#pragma once
#include <cstdint>
#include <cstring>

namespace byteps {
namespace half {

static inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

static inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// float16 bits -> float32 (exact: every float16 is a float32).
static inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);  // +-0
  // Subnormal: mant * 2^-24, exact in float32 (a normal float32).
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return BitsToFloat(sign | FloatBits(mag));
}

// float32 -> float16 bits, round to nearest even.
static inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN
    if (ax == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // quiet NaN
  }
  // 65520 = halfway between 65504 (max float16, odd mantissa) and 2^16: ties go to infinity.
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax >= 0x38800000u) {  // >= 2^-14: normal float16
    uint32_t r = ax - (112u << 23);  // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);  // RNE on the 13 dropped bits (carry may bump exponent)
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal float16 (or zero): value in units of 2^-24 is m * 2^(e - 126).
  const uint32_t e = ax >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14 .. 24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // may reach 0x400 = 2^-14: fine
  return static_cast<uint16_t>(sign | q);
}

// bfloat16 bits -> float32 (exact).
static inline float BFloat16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// float32 -> bfloat16 bits, round to nearest even; NaN stays NaN (quiet bit forced).
static inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace half
}  // namespace byteps
