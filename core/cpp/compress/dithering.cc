// dithering (upstream's DitheringCompressor, "natural compression"): each |x| / scale is
// rounded stochastically to one of the levels, and only the non-zero levels are sent.
//
// Per Compress, in upstream's order and arithmetic:
//   scale   max: the largest |x| (float64, upstream's sequential max, NaN quirks included);
//           l2: sqrt of the float64 sum, in element order, of x*x computed in the compute type
//           (float32 for float16/float32 tensors; upstream squares float16 in float16).
//   linear  (s = compressor_k levels) normalized = |x| / scale * s, in float64 and then
//           rounded once to float32 for float16/float32 tensors (float64 for float64);
//           q = floor(normalized) + Bernoulli(normalized - floor(normalized)).
//   natural (s = 2^(k-1) levels) normalized = |x| / scale * s in float64; floor = the power of
//           two below ceil(normalized) (upstream's RoundNextPow2(ceil) >> 1, 0 below 1),
//           length = max(floor, 1); q = floor + length * Bernoulli((normalized - floor) / length).
//   One Bernoulli draw per element, zeros included (rng.h, the instance's stream).
//   Where upstream's arithmetic is undefined (0/0 for an all-zero tensor, NaN or infinite
//   values) normalized is taken as 0, and it is clamped to at most s (an l2 scale can fall an
//   ulp short of |x|): q is always in [0, s] and the draw is still made.
// Decoded: (q * scale / s) with the sign, computed in float32 from the float32 scale (float64
// for float64 tensors), as upstream.
//
// Wire (n elements): uint64 bit count B, the scale (float32; float64 for float64 tensors), then
// ceil(B/8) bytes of bits, most significant bit first: for each element with q > 0, in index
// order, Elias-delta(index - previous index, the previous of the first being -1), one sign bit
// (1 = negative), Elias-delta(q); padding bits 0. Elias-delta(x >= 1), L = bit length of x:
// floor(log2 L) zeros, L in floor(log2 L) + 1 bits, the low L - 1 bits of x.
// Largest encoding: each element costs at most 2 + EliasBits(s) bits (a gap of g >= 2 costs no
// more than g elements with gap 1), so MaxEncodedBytes = 8 + scale + ceil(n * (2 +
// EliasBits(s)) / 8). Decoding checks the length, B against that bound, every read against B,
// every index (< n, increasing), every level (1..s) and the padding.
//
// How it runs (the results are those of the element-by-element definition above, bit for bit):
// the encoder loop is dithering_quantize.cc (blocks of 64 elements, the levels branch-free,
// AVX-512 for float32 where the CPU has it, a 64-bit bit writer). Decoding looks whole
// elements of up to 12 bits up in a table, two at a time where two fit in 12 bits and up to 4
// lookups from one 64-bit window, decodes longer ones with count-leading-zeros, and leaves
// the last 176 bits of the stream and anything it declines to the checked bit reader
// (dithering_stream.h), which reports every error.
#include <cstdint>
#include <cstring>

#include "dithering_quantize.h"
#include "dithering_stream.h"
#include "internal.h"

namespace byteps {
namespace compress {
namespace detail {

namespace {

using dither::BitReader;
using dither::BitWriter;

class Dithering final : public Codec {
 public:
  Dithering(DType dtype, size_t count, uint32_t k, bool natural, bool l2, bool seeded,
            uint64_t seed)
      : Codec(dtype, count),
        levels_(natural ? (uint32_t{1} << (k - 1)) : k),
        natural_(natural),
        l2_(l2) {
    SeedRng(&rng_, seeded, seed);
  }

  size_t MaxEncodedBytes() const override { return kHeader + ScaleBytes() + MaxStreamBytes(); }

  Status Encode(const void* in, void* out, size_t* out_len) override {
    return EncodeTo(const_cast<void*>(in), out, out_len, nullptr);  // (in is only read)
  }

  // Error feedback in place: the corrected values written over the error, encoded from
  // there, each replaced by its residual as its level is known (no decoding pass).
  bool EncodeWithFeedback(const void* x, double scale, double factor, void* error, void* out,
                          size_t* out_len) override {
    const Status st = EncodeTo(error, out, out_len, error, x, scale, factor);  // (cannot fail)
    (void)st;
    return true;
  }

  Status Decompress(const void* in, size_t len, void* dst) override {
    return Decode<false>(in, len, dst);
  }
  Status DecompressAdd(const void* in, size_t len, void* dst) override {
    return Decode<true>(in, len, dst);
  }

 private:
  static constexpr size_t kHeader = 8;

  // Encode; with `residual` (which may be `in`), residual[i] = Store(Load(in[i]) -
  // Load(decoded[i])) as well; with `uncorrected`, `in` (the error) is first corrected in
  // place from it, in the pass that finds the scale.
  Status EncodeTo(void* in, void* out, size_t* out_len, void* residual,
                  const void* uncorrected = nullptr, double scale_arg = 1.0,
                  double factor = 1.0) {
    auto* o = static_cast<uint8_t*>(out);
    BitWriter writer(o + kHeader + ScaleBytes(), MaxStreamBytes());
    DispatchFloat(dtype(), [&](auto e) {
      using E = decltype(e);
      using S = typename E::Storage;
      auto* x = static_cast<S*>(in);
      const double scale =
          uncorrected == nullptr
              ? dither::Scale<E>(x, count(), l2_)
              : dither::CorrectAndScale<E>(static_cast<const S*>(uncorrected), scale_arg,
                                           factor, x, count(), l2_);
      StoreRaw(o + kHeader, static_cast<typename E::Compute>(scale));
      dither::Quantize<E>(x, count(), scale, levels_, natural_, &rng_, &writer,
                          static_cast<S*>(residual));
    });
    const uint64_t bits = writer.Finish();
    if (writer.overflow()) {
      return Status::Internal("dithering encoding exceeded its bound of " +
                              std::to_string(MaxEncodedBytes()) + " bytes");
    }
    StoreRaw<uint64_t>(o, bits);
    *out_len = kHeader + ScaleBytes() + static_cast<size_t>((bits + 7) / 8);
    return Status::OK();
  }

  size_t ScaleBytes() const { return dtype() == DType::kFloat64 ? 8 : 4; }
  uint64_t MaxBits() const { return count() * (2 + dither::EliasBits(levels_)); }
  size_t MaxStreamBytes() const { return static_cast<size_t>((MaxBits() + 7) / 8); }

  template <bool kAdd>
  Status Decode(const void* in, size_t len, void* dst) {
    const auto* p = static_cast<const uint8_t*>(in);
    uint64_t bits = 0;
    Status st = CheckFraming(p, len, &bits);
    if (!st.ok()) {
      if (!kAdd) std::memset(dst, 0, raw_bytes());  // Decompress's output on error: zeros
      return st;
    }
    const size_t head = kHeader + ScaleBytes();
    DispatchFloat(dtype(), [&](auto e) {
      using C = typename decltype(e)::Compute;
      st = DecodeTyped<decltype(e), kAdd>(p + head, bits, LoadRaw<C>(p + kHeader), dst);
    });
    return st;
  }

  // The length, the bit count B against its bound and the length it implies, the padding.
  Status CheckFraming(const uint8_t* p, size_t len, uint64_t* bits_out) const {
    const size_t head = kHeader + ScaleBytes();
    if (len < head) {
      return Status::InvalidArgument("dithering encoding of " + std::to_string(len) +
                                     " bytes is shorter than its " + std::to_string(head) +
                                     "-byte header");
    }
    const uint64_t bits = LoadRaw<uint64_t>(p);
    if (bits > MaxBits()) {
      return Status::InvalidArgument("dithering encoding claims " + std::to_string(bits) +
                                     " bits; " + std::to_string(count()) +
                                     " elements take at most " + std::to_string(MaxBits()));
    }
    const size_t stream = static_cast<size_t>((bits + 7) / 8);
    if (len != head + stream) {
      return Status::InvalidArgument("dithering encoding of " + std::to_string(len) +
                                     " bytes; its " + std::to_string(bits) + " bits take " +
                                     std::to_string(head + stream));
    }
    if (bits % 8 != 0 && (p[head + stream - 1] & ((1u << (8 - bits % 8)) - 1)) != 0) {
      return Status::InvalidArgument("dithering encoding has padding bits set");
    }
    *bits_out = bits;
    return Status::OK();
  }

  // Values of the small levels, stored with either sign.
  static constexpr int kSmallLevels = 64;

  template <typename E, bool kAdd>
  Status DecodeTyped(const uint8_t* p, uint64_t bits, typename E::Compute scale, void* dst) {
    using C = typename E::Compute;
    using S = typename E::Storage;
    const C s = static_cast<C>(levels_);
    auto* d = static_cast<S*>(dst);
    const uint64_t n = count(), levels = levels_;
    S values[2][kSmallLevels];
    for (uint64_t q = 1; q < kSmallLevels && q <= levels; ++q) {
      const C num = static_cast<C>(q) * scale / s;
      values[0][q] = E::Store(num);
      values[1][q] = E::Store(-num);
    }
    auto emit = [&](uint64_t i, uint64_t sign, uint64_t q) {
      S value;
      if (q < kSmallLevels) {
        value = values[sign][q];
      } else {
        const C num = static_cast<C>(q) * scale / s;
        value = E::Store(sign ? -num : num);
      }
      if constexpr (kAdd) {
        d[i] = E::Store(E::Load(d[i]) + E::Load(value));
      } else {
        d[i] = value;
      }
    };
    // Decompress overwrites: the elements between those sent become 0 (DecompressAdd leaves
    // them), also on an error (the elements before it decoded, as the definition reads).
    // A sparse stream (under a bit per element) is cleared in one go first; a dense one as
    // decoding goes (one pass over the output instead of two).
    const bool cleared = !kAdd && bits < n;
    if (cleared) std::memset(d, 0, n * sizeof(S));
    auto zeros = [&](uint64_t from, uint64_t to) {
      if (!kAdd && !cleared) std::memset(d + from, 0, (to - from) * sizeof(S));
    };
    // Zeros up to element i, the next to be written.
    auto zeros_before = [&](uint64_t next, uint64_t i) {
      if (!kAdd && !cleared) {
        if (__builtin_expect(next + 8 <= n, 1)) {
          std::memset(d + next, 0, 8 * sizeof(S));  // one store (may reach past i: later ones)
          if (i > next + 8) zeros(next + 8, i);
        } else {
          zeros(next, i);
        }
      }
    };
    uint64_t next = 0;  // smallest index the next element may have
    uint64_t pos = 0;   // bits read
    // The fast path, while 176 bits remain: a 64-bit window at pos gives up to 4 lookups of
    // one or two elements (at most 12 bits a lookup, so the 4th still sees 21 valid bits); an
    // element not in the table is decoded from windows with clz (at most 83 bits). Anything
    // malformed or out of range goes to the checked reader below, from that element on.
    const dither::SymbolPair* table = dither::kSymbolPairs.at;
    const uint64_t fast_end = bits > 176 ? bits - 176 : 0;
    bool declined = false;
    while (pos < fast_end && !declined) {
      PrefetchWrite(d, next);
      uint64_t w = dither::Peek(p, pos);
      int k = 0;
      for (; k < 4; ++k) {
        const dither::SymbolPair e = table[w >> (64 - dither::kSymbolBits)];
        const unsigned count = e.flags >> 2;
        if (count == 0) break;
        if (e.gap1 > n - next || e.level1 > levels) {
          declined = true;
          break;
        }
        uint64_t i = next + e.gap1 - 1;
        zeros_before(next, i);
        emit(i, e.flags & 1, e.level1);
        next = i + 1;
        if (count == 2) {
          if (e.gap2 > n - next || e.level2 > levels) {
            pos += e.len1;
            declined = true;
            break;
          }
          i = next + e.gap2 - 1;
          zeros_before(next, i);
          emit(i, (e.flags >> 1) & 1, e.level2);
          next = i + 1;
        }
        w <<= e.len;
        pos += e.len;
      }
      if (k == 4 || declined) continue;
      uint64_t gap, sign, q;
      int used;
      if (!LongElement(p, pos, &gap, &sign, &q, &used) || gap > n - next || q > levels) break;
      const uint64_t i = next + gap - 1;
      zeros_before(next, i);
      emit(i, sign, q);
      next = i + 1;
      pos += static_cast<uint64_t>(used);
    }
    // The rest (and whatever the fast path declined), checked.
    BitReader r(p, bits, pos);
    while (r.left() > 0) {
      uint64_t gap, sign, q;
      if (next >= n || !r.EliasDelta(n - next, &gap)) {
        zeros(next, n);
        return Status::InvalidArgument("dithering encoding has a bad index gap at bit " +
                                       std::to_string(bits - r.left()));
      }
      const uint64_t i = next + gap - 1;
      if (!r.Get(1, &sign) || !r.EliasDelta(levels, &q)) {
        zeros(next, n);
        return Status::InvalidArgument("dithering encoding has a bad level for element " +
                                       std::to_string(i));
      }
      zeros(next, i);
      emit(i, sign, q);
      next = i + 1;
    }
    zeros(next, n);
    return Status::OK();
  }

  // An element at bit pos (the stream holds at least 128 bits from there) from 64-bit
  // windows: false where its codes are malformed or longer than a partition's can be (the
  // checked reader then decides).
  static bool LongElement(const uint8_t* p, uint64_t pos, uint64_t* gap, uint64_t* sign,
                          uint64_t* q, int* used) {
    int a, b;
    const uint64_t w = dither::Peek(p, pos);
    if (!DeltaFromWindow(w, 32, gap, &a)) return false;  // gaps < 2^32: L <= 32, <= 42 bits
    const uint64_t w2 = dither::Peek(p, pos + static_cast<uint64_t>(a));
    *sign = w2 >> 63;
    if (!DeltaFromWindow(w2 << 1, 31, q, &b)) return false;  // levels <= 2^30: <= 39 bits
    *used = a + 1 + b;
    return true;
  }

  // The Elias-delta value at the top of w (at least 57 valid bits) with a length of at most
  // max_len bits (<= 32): value and bits used.
  static bool DeltaFromWindow(uint64_t w, int max_len, uint64_t* x, int* used) {
    if (w == 0) return false;
    const int zeros = __builtin_clzll(w);
    if (zeros > 5) return false;
    const uint64_t len = w >> (63 - 2 * zeros);
    if (len > static_cast<uint64_t>(max_len)) return false;
    const int head = 2 * zeros + 1;
    const int rest = static_cast<int>(len) - 1;
    const uint64_t low = rest == 0 ? 0 : (w << head) >> (64 - rest);
    *x = (uint64_t{1} << rest) | low;
    *used = head + rest;
    return true;
  }

  uint32_t levels_;
  bool natural_;
  bool l2_;
  XorShift128Plus rng_;
};

}  // namespace

std::unique_ptr<Codec> MakeDithering(DType dtype, size_t count, uint32_t k, bool natural,
                                     bool l2, bool seeded, uint64_t seed) {
  return std::make_unique<Dithering>(dtype, count, k, natural, l2, seeded, seed);
}

}  // namespace detail
}  // namespace compress
}  // namespace byteps
