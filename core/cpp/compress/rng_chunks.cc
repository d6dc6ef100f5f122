// DrawChunk (rng_chunks.h): kDrawChunk draws of one xorshift128+ stream as 8 sub-streams.
//
// xorshift128+'s step (a, b) -> (b, a ^ a<<23 ^ (a ^ a<<23)>>17 ^ b ^ b>>26) is linear over
// GF(2) on the 128-bit state, so advancing by kLane = kDrawChunk / 8 steps is a fixed 128x128
// bit matrix J, applied here as the xor of 32 table entries (one per 4-bit group of the state,
// the tables built once from J's columns). Lane k starts at the chunk's draw k * kLane (lane
// k - 1's start, jumped), all 8 lanes step together in one AVX-512 register pair (the same
// shifts and xors as rng.h, the output t + s), 8 steps at a time transposed 8x8 so that each
// lane's 8 draws land in order at out[k * kLane + t]. The stream then continues from lane 7's
// final state, the chunk's draw kDrawChunk. The draws are those of rng.h's Next, bit for bit
// (tests/test_compressors.py compares dithering's results with a reference drawing one at a
// time).
//
// Compiled with the portable flags; the kernel gets AVX-512 by function attribute and runs
// only where __builtin_cpu_supports says so.
#include "rng_chunks.h"

#if defined(__x86_64__) || defined(__i386__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports its own AVX-512 intrinsics' _mm512_undefined_* operands as uninitialized
// where they are inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <cstdint>
#include <immintrin.h>
#define BPS_RNG_CHUNKS 1
#endif

namespace byteps {
namespace compress {
namespace {

constexpr int kLanes = 8;
constexpr size_t kLane = kDrawChunk / kLanes;

struct State {
  uint64_t a, b;  // rng.h's s0, s1
};

State Step(State s) {
  uint64_t t = s.a;
  t ^= t << 23;
  t ^= t >> 17;
  t ^= s.b ^ (s.b >> 26);
  return State{s.b, t};
}

// J by 4-bit groups: group g < 16 is bits 4g.. of a, group g >= 16 bits 4(g - 16).. of b.
struct JumpTable {
  State entry[32][16];
};

const JumpTable& Jump() {
  static const JumpTable table = [] {
    JumpTable j{};
    State column[128];
    for (int i = 0; i < 128; ++i) {
      State s{i < 64 ? uint64_t{1} << i : 0, i >= 64 ? uint64_t{1} << (i - 64) : 0};
      for (size_t k = 0; k < kLane; ++k) s = Step(s);
      column[i] = s;
    }
    for (int g = 0; g < 32; ++g) {
      for (int v = 0; v < 16; ++v) {
        State sum{0, 0};
        for (int bit = 0; bit < 4; ++bit) {
          if ((v >> bit) & 1) {
            sum.a ^= column[4 * g + bit].a;
            sum.b ^= column[4 * g + bit].b;
          }
        }
        j.entry[g][v] = sum;
      }
    }
    return j;
  }();
  return table;
}

State JumpAhead(const JumpTable& j, State s) {
  State r{0, 0};
  for (int g = 0; g < 16; ++g) {
    const State& ea = j.entry[g][(s.a >> (4 * g)) & 15];
    const State& eb = j.entry[16 + g][(s.b >> (4 * g)) & 15];
    r.a ^= ea.a ^ eb.a;
    r.b ^= ea.b ^ eb.b;
  }
  return r;
}

#ifdef BPS_RNG_CHUNKS
__attribute__((target("avx512f,avx512dq"))) void DrawChunkAvx512(XorShift128Plus* rng,
                                                                 uint64_t* out) {
  const JumpTable& j = Jump();
  alignas(64) uint64_t start_a[kLanes], start_b[kLanes];
  State s{rng->state0(), rng->state1()};
  for (int k = 0; k < kLanes; ++k) {
    start_a[k] = s.a;
    start_b[k] = s.b;
    if (k + 1 < kLanes) s = JumpAhead(j, s);
  }
  __m512i a = _mm512_load_si512(start_a), b = _mm512_load_si512(start_b);
  for (size_t t = 0; t < kLane; t += 8) {
    __m512i r[8];
    for (int u = 0; u < 8; ++u) {
      __m512i x = a;
      const __m512i y = b;
      a = y;
      x = _mm512_xor_si512(x, _mm512_slli_epi64(x, 23));
      x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 17));
      x = _mm512_ternarylogic_epi64(x, y, _mm512_srli_epi64(y, 26), 0x96);  // x ^ y ^ (y>>26)
      b = x;
      r[u] = _mm512_add_epi64(x, y);
    }
    // r[u] holds draw k * kLane + t + u in lane k: transpose to lane k's 8 draws in order.
    __m512i p[8], q[8];
    for (int u = 0; u < 8; u += 2) {
      p[u] = _mm512_unpacklo_epi64(r[u], r[u + 1]);
      p[u + 1] = _mm512_unpackhi_epi64(r[u], r[u + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
      q[h] = _mm512_shuffle_i64x2(p[h], p[h + 2], 0x88);
      q[h + 1] = _mm512_shuffle_i64x2(p[h], p[h + 2], 0xdd);
      q[h + 2] = _mm512_shuffle_i64x2(p[h + 1], p[h + 3], 0x88);
      q[h + 3] = _mm512_shuffle_i64x2(p[h + 1], p[h + 3], 0xdd);
    }
    // q[i] holds steps 0..3 (q[4 + i] steps 4..7) of lanes lane_of[i] and lane_of[i] + 4.
    const int lane_of[4] = {0, 2, 1, 3};
    for (int i = 0; i < 4; ++i) {
      const int k = lane_of[i];
      _mm512_store_si512(out + k * kLane + t, _mm512_shuffle_i64x2(q[i], q[4 + i], 0x88));
      _mm512_store_si512(out + (k + 4) * kLane + t, _mm512_shuffle_i64x2(q[i], q[4 + i], 0xdd));
    }
  }
  alignas(64) uint64_t end_a[kLanes], end_b[kLanes];
  _mm512_store_si512(end_a, a);
  _mm512_store_si512(end_b, b);
  rng->SetState(end_a[kLanes - 1], end_b[kLanes - 1]);
}
#endif

}  // namespace

bool HasDrawChunk() {
#ifdef BPS_RNG_CHUNKS
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
#else
  return false;
#endif
}

void DrawChunk(XorShift128Plus* rng, uint64_t* out) {
#ifdef BPS_RNG_CHUNKS
  DrawChunkAvx512(rng, out);
#else
  (void)rng;
  (void)out;
#endif
}

}  // namespace compress
}  // namespace byteps
