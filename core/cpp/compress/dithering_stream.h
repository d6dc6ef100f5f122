// dithering's bit stream (dithering.cc has the wire format): most significant bit first,
// Elias-delta codes. Internal to the dithering sources.
//
// * EliasCode: the code of x >= 1 as (bits, length), branch-free; kCodes: packed codes of the
//   small gaps and (sign, level) pairs, built at compile time.
// * BitWriter: a 64-bit accumulator stored 8 bytes at a time (big-endian). Put checks the room
//   left (byte by byte near the end of the buffer, never past it: overflow is reported
//   instead); PutUnchecked is for callers that checked Room() for a whole block.
// * BitReader: the checked reader (every read against the stream's bit count), which starts
//   at any bit; it decodes the tail of a stream and anything the fast path declines, so every
//   error is reported by one piece of code.
// * Peek / kSymbols / kSymbolPairs: the fast decoder's 64-bit window at a bit position (the
//   caller keeps 8 bytes of stream after it) and the whole-element codes (gap, sign, level)
//   of at most kSymbolBits bits, one or two of them looked up by the window's top bits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace byteps {
namespace compress {
namespace detail {
namespace dither {

constexpr int BitLength(uint64_t x) { return x == 0 ? 0 : 64 - __builtin_clzll(x); }
constexpr int FloorLog2(uint64_t x) { return BitLength(x) - 1; }
// Elias-delta length of x >= 1: L + 2 floor(log2 L), L = bit length of x.
constexpr uint64_t EliasBits(uint64_t x) {
  const int len = BitLength(x);
  return static_cast<uint64_t>(len + 2 * FloorLog2(static_cast<uint64_t>(len)));
}

struct Code {
  uint64_t bits;
  int len;
};

// x in [1, 2^33): floor(log2 L) zeros, L in floor(log2 L) + 1 bits, the low L - 1 bits of x,
// as one number of len bits: (L << (L - 1)) | (x - 2^(L-1)) = ((L - 1) << (L - 1)) + x.
constexpr Code EliasCode(uint64_t x) {
  const int len = 64 - __builtin_clzll(x);
  const int len_of_len = 31 - __builtin_clz(static_cast<unsigned>(len));
  return Code{(static_cast<uint64_t>(len - 1) << (len - 1)) + x, 2 * len_of_len + len};
}

// Codes packed as bits << 8 | length.
constexpr uint64_t PackedCode(uint64_t x) {
  const Code c = EliasCode(x);
  return c.bits << 8 | static_cast<uint64_t>(c.len);
}
// The sign bit, then Elias-delta(level).
constexpr uint64_t PackedSignLevel(uint64_t sign, uint64_t level) {
  const Code c = EliasCode(level);
  return ((sign << c.len) | c.bits) << 8 | static_cast<uint64_t>(c.len + 1);
}

constexpr uint64_t kGapCodes = 256, kLevelCodes = 64, kSmall = 16;
struct CodeTables {
  uint64_t gap[kGapCodes];              // PackedCode(gap), gap >= 1
  uint64_t sign_level[2][kLevelCodes];  // PackedSignLevel(sign, level), level >= 1
  uint64_t small[kSmall][2][kSmall];    // whole elements [gap][sign][level], <= 17 bits
};
constexpr CodeTables MakeCodeTables() {
  CodeTables t{};
  for (uint64_t g = 1; g < kGapCodes; ++g) t.gap[g] = PackedCode(g);
  for (uint64_t sign = 0; sign < 2; ++sign) {
    for (uint64_t q = 1; q < kLevelCodes; ++q) t.sign_level[sign][q] = PackedSignLevel(sign, q);
  }
  for (uint64_t g = 1; g < kSmall; ++g) {
    for (uint64_t sign = 0; sign < 2; ++sign) {
      for (uint64_t q = 1; q < kSmall; ++q) {
        const uint64_t gc = t.gap[g], sq = t.sign_level[sign][q];
        t.small[g][sign][q] = ((gc >> 8) << (sq & 255) | sq >> 8) << 8 | ((gc & 255) + (sq & 255));
      }
    }
  }
  return t;
}
inline constexpr CodeTables kCodes = MakeCodeTables();

inline uint64_t GapCode(uint64_t gap) {
  return __builtin_expect(gap < kGapCodes, 1) ? kCodes.gap[gap] : PackedCode(gap);
}

inline uint64_t LoadBigEndian64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return __builtin_bswap64(v);
}
inline void StoreBigEndian64(uint8_t* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, sizeof(v));
}

class BitWriter {
 public:
  BitWriter(uint8_t* out, size_t cap) : begin_(out), p_(out), end_(out + cap) {}

  // Bytes of room from the first incomplete byte on.
  size_t Room() const { return static_cast<size_t>(end_ - p_); }

  // Appends the low n (1..56) bits of v (no higher bits set), most significant first; needs
  // Room() >= 8.
  void PutUnchecked(uint64_t v, int n) {
    have_ += n;
    acc_ |= v << (64 - have_);
    StoreBigEndian64(p_, acc_);
    p_ += have_ >> 3;
    acc_ <<= have_ & 56;
    have_ &= 7;
  }

  // As PutUnchecked, with any room.
  void Put(uint64_t v, int n) {
    if (Room() >= 8) return PutUnchecked(v, n);
    have_ += n;
    acc_ |= v << (64 - have_);
    const int whole = have_ >> 3;
    for (int b = 0; b < whole; ++b) {
      if (p_ < end_) {
        *p_++ = static_cast<uint8_t>(acc_ >> 56);
      } else {
        overflow_ = true;
      }
      acc_ <<= 8;
    }
    have_ &= 7;
  }

  // A packed gap code, then a packed sign-and-level code (Put, or PutUnchecked for kChecked
  // false: Room() >= 16).
  template <bool kChecked>
  void PutPair(uint64_t gap_code, uint64_t sign_level_code) {
    const int glen = static_cast<int>(gap_code & 255);
    const int sqlen = static_cast<int>(sign_level_code & 255);
    const uint64_t g = gap_code >> 8, sq = sign_level_code >> 8;
    if (__builtin_expect(glen + sqlen <= 56, 1)) {
      const uint64_t v = (g << sqlen) | sq;
      kChecked ? Put(v, glen + sqlen) : PutUnchecked(v, glen + sqlen);
    } else {
      kChecked ? Put(g, glen) : PutUnchecked(g, glen);
      kChecked ? Put(sq, sqlen) : PutUnchecked(sq, sqlen);
    }
  }

  // One element: Elias-delta(gap), the sign bit, Elias-delta(level) (gap, level >= 1).
  template <bool kChecked>
  void PutElement(uint64_t gap, uint64_t sign, uint64_t level) {
    const uint64_t sq = __builtin_expect(level < kLevelCodes, 1) ? kCodes.sign_level[sign][level]
                                                                 : PackedSignLevel(sign, level);
    PutPair<kChecked>(GapCode(gap), sq);
  }

  // Two elements with gaps and levels below kSmall (their codes take at most 34 bits).
  template <bool kChecked>
  void PutSmallPair(uint64_t gap1, uint64_t sign1, uint64_t level1, uint64_t gap2,
                    uint64_t sign2, uint64_t level2) {
    const uint64_t c1 = kCodes.small[gap1][sign1][level1], c2 = kCodes.small[gap2][sign2][level2];
    const int len2 = static_cast<int>(c2 & 255);
    const uint64_t v = ((c1 >> 8) << len2) | (c2 >> 8);
    const int n = static_cast<int>(c1 & 255) + len2;
    kChecked ? Put(v, n) : PutUnchecked(v, n);
  }

  // Writes the last partial byte, zero-padded; returns the payload bits written.
  uint64_t Finish() {
    const uint64_t bits = 8 * static_cast<uint64_t>(p_ - begin_) + static_cast<uint64_t>(have_);
    if (have_ != 0) {
      if (p_ < end_) {
        *p_++ = static_cast<uint8_t>(acc_ >> 56);
      } else {
        overflow_ = true;
      }
      acc_ = 0;
      have_ = 0;
    }
    return bits;
  }
  bool overflow() const { return overflow_; }

 private:
  uint8_t* begin_;
  uint8_t* p_;  // the first incomplete byte
  uint8_t* end_;
  uint64_t acc_ = 0;  // the pending bits, left-aligned
  int have_ = 0;      // pending bits: 0..7 between calls
  bool overflow_ = false;
};

// The checked reader over a stream of `bits` bits, from bit `start` (<= bits).
class BitReader {
 public:
  BitReader(const uint8_t* p, uint64_t bits, uint64_t start)
      : p_(p), bytes_(static_cast<size_t>((bits + 7) / 8)), left_(bits - start) {
    next_ = static_cast<size_t>(start / 8);
    const int skip = static_cast<int>(start % 8);
    if (skip != 0) {
      acc_ = p_[next_++];
      have_ = 8 - skip;
    }
  }
  // The next n (<= 32) bits; false past the end of the stream.
  bool Get(int n, uint64_t* v) {
    if (static_cast<uint64_t>(n) > left_) return false;
    if (have_ < n) Refill();
    have_ -= n;
    *v = n == 0 ? 0 : (acc_ >> have_) & ((uint64_t{1} << n) - 1);
    left_ -= static_cast<uint64_t>(n);
    return true;
  }
  // An Elias-delta value in [1, max]; false if malformed, truncated or above max.
  bool EliasDelta(uint64_t max, uint64_t* x) {
    const int max_len = BitLength(max);
    const int max_len_of_len = FloorLog2(static_cast<uint64_t>(max_len));
    // The run of zeros: at most max_len_of_len, and followed by a 1 within the stream.
    if (have_ <= max_len_of_len) Refill();
    const int avail = static_cast<int>(left_ < static_cast<uint64_t>(have_) ? left_ : have_);
    const uint64_t window = avail == 0 ? 0 : (acc_ << (64 - have_)) >> (64 - avail);
    const int zeros = avail - BitLength(window);  // zeros before the first 1 (all if none)
    if (zeros > max_len_of_len || zeros == avail) return false;
    uint64_t len;
    if (!Get(2 * zeros + 1, &len)) return false;  // the zeros, then len in zeros + 1 bits
    if (len > static_cast<uint64_t>(max_len)) return false;
    uint64_t rest;
    if (!Get(static_cast<int>(len - 1), &rest)) return false;
    *x = (uint64_t{1} << (len - 1)) | rest;
    return *x <= max;
  }
  uint64_t left() const { return left_; }

 private:
  // Tops the accumulator up to at least 57 bits, or to the end of the stream.
  void Refill() {
    while (have_ <= 56 && next_ < bytes_) {
      acc_ = (acc_ << 8) | p_[next_++];
      have_ += 8;
    }
  }

  const uint8_t* p_;
  size_t bytes_;
  size_t next_ = 0;
  uint64_t acc_ = 0;
  int have_ = 0;
  uint64_t left_;
};

// The 64 stream bits from bit `pos` (at least 57 of them meaningful), most significant first;
// reads the 8 bytes from pos / 8.
inline uint64_t Peek(const uint8_t* p, uint64_t pos) {
  return LoadBigEndian64(p + (pos >> 3)) << (pos & 7);
}

// Whole elements whose code (gap, sign, level) takes at most kSymbolBits bits, by the top
// kSymbolBits bits of a window.
constexpr int kSymbolBits = 12;
struct Symbol {
  uint8_t gap;    // 1..63
  uint8_t level;  // 1..63
  uint8_t sign;
  uint8_t len;    // 0: not in the table
};
struct SymbolTable {
  Symbol at[1u << kSymbolBits];
};
constexpr SymbolTable MakeSymbolTable() {
  SymbolTable t{};
  for (uint64_t gap = 1; gap < 64; ++gap) {
    for (uint64_t level = 1; level < 64; ++level) {
      for (uint64_t sign = 0; sign < 2; ++sign) {
        const Code g = EliasCode(gap), q = EliasCode(level);
        const int n = g.len + 1 + q.len;
        if (n > kSymbolBits) continue;
        const uint64_t code = (((g.bits << 1) | sign) << q.len) | q.bits;
        const uint64_t first = code << (kSymbolBits - n);
        for (uint64_t k = 0; k < (uint64_t{1} << (kSymbolBits - n)); ++k) {
          t.at[first + k] = Symbol{static_cast<uint8_t>(gap), static_cast<uint8_t>(level),
                                   static_cast<uint8_t>(sign), static_cast<uint8_t>(n)};
        }
      }
    }
  }
  return t;
}
inline constexpr SymbolTable kSymbols = MakeSymbolTable();

// Two whole elements at once where both codes lie within the top kSymbolBits bits of a
// window, else one (count 1) or none (count 0: the first is not in kSymbols).
struct SymbolPair {
  uint8_t gap1, level1, gap2, level2;
  uint8_t flags;  // sign1 | sign2 << 1 | count << 2
  uint8_t len1;   // bits of the first element
  uint8_t len;    // bits of the count elements
  uint8_t unused;
};
struct SymbolPairTable {
  SymbolPair at[1u << kSymbolBits];
};
constexpr SymbolPairTable MakeSymbolPairTable() {
  SymbolPairTable t{};
  constexpr uint64_t kMask = (uint64_t{1} << kSymbolBits) - 1;
  for (uint64_t v = 0; v <= kMask; ++v) {
    const Symbol a = kSymbols.at[v];
    if (a.len == 0) continue;
    const Symbol b = kSymbols.at[(v << a.len) & kMask];  // the bits after it, zero-padded
    const bool two = b.len != 0 && b.len <= kSymbolBits - a.len;
    const int flags = a.sign | (two ? b.sign : 0) << 1 | (two ? 2 : 1) << 2;
    t.at[v] = SymbolPair{a.gap,
                         a.level,
                         two ? b.gap : uint8_t{0},
                         two ? b.level : uint8_t{0},
                         static_cast<uint8_t>(flags),
                         a.len,
                         static_cast<uint8_t>(two ? a.len + b.len : a.len),
                         0};
  }
  return t;
}
inline constexpr SymbolPairTable kSymbolPairs = MakeSymbolPairTable();

}  // namespace dither
}  // namespace detail
}  // namespace compress
}  // namespace byteps
