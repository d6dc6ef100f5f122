// The compressors' random-number stream: upstream BytePS's xorshift128+ (Vigna's xorshift+
// with shifts 23, 17, 26), bit for bit, so that a seeded randomk or dithering instance draws the
// same numbers as upstream's and as the NumPy reference (tests/compression_reference.py).
//
// Seeding: state {seed, seed}. A zero state would stay zero forever, so callers seed with a
// non-zero value or, without a seed, with two 32-bit draws of std::random_device (upstream).
#pragma once
#include <cstdint>
#include <limits>

namespace byteps {
namespace compress {

class XorShift128Plus {
 public:
  explicit XorShift128Plus(uint64_t a = 1, uint64_t b = 1) : s0_(a), s1_(b) {}

  void Seed(uint64_t seed) {
    s0_ = seed;
    s1_ = seed;
  }
  void SetState(uint64_t a, uint64_t b) {
    s0_ = a;
    s1_ = b;
  }
  uint64_t state0() const { return s0_; }
  uint64_t state1() const { return s1_; }

  uint64_t Next() {
    uint64_t t = s0_;
    const uint64_t s = s1_;
    s0_ = s;
    t ^= t << 23;
    t ^= t >> 17;
    // (t ^ s) ^ (s >> 26), in that order: the chain from one draw's s to the next is then two
    // operations deep (t comes from the draw before). The empty asm statements keep the
    // compiler from reassociating the xors into a deeper chain (3.3 -> 2 cycles per draw).
    Pin(&t);
    t ^= s;
    Pin(&t);
    t ^= s >> 26;
    s1_ = t;
    return t + s;
  }

  // Uniform integer in [low, high): Next() % (high - low) + low (upstream; high > low).
  uint64_t Randint(uint64_t low, uint64_t high) { return Next() % (high - low) + low; }

  // True with probability p: the next draw, as a double, below p * (2^64 - 1) as a double
  // (upstream's comparison of a uint64 with a double). p <= 0 or NaN never, p >= 1 almost
  // always (a draw that rounds to 2^64 is not below it).
  bool Bernoulli(double p) {
    constexpr double kMax = static_cast<double>(std::numeric_limits<uint64_t>::max());
    return ToDouble(Next()) < p * kMax;
  }

  // static_cast<double>(r) (round to nearest even), computed without a branch on the top bit
  // (a random draw's top bit mispredicts half the time): above 2^63 the value is halved with
  // the dropped bit kept as a sticky bit, converted as signed and doubled (exact).
  static double ToDouble(uint64_t r) {
    const double small = static_cast<double>(static_cast<int64_t>(r));
    const double big = static_cast<double>(static_cast<int64_t>((r >> 1) | (r & 1))) * 2.0;
    return static_cast<int64_t>(r) < 0 ? big : small;
  }

 private:
  static void Pin(uint64_t* v) {
#if defined(__GNUC__)
    __asm__("" : "+r"(*v));
#else
    (void)v;
#endif
  }

  uint64_t s0_, s1_;
};

}  // namespace compress
}  // namespace byteps
