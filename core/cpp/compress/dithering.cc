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
#include <cmath>
#include <cstring>

#include "internal.h"

namespace byteps {
namespace compress {
namespace detail {
namespace {

int BitLength(uint64_t x) { return x == 0 ? 0 : 64 - __builtin_clzll(x); }
int FloorLog2(uint64_t x) { return BitLength(x) - 1; }
uint64_t EliasBits(uint64_t x) {
  const int len = BitLength(x);
  return static_cast<uint64_t>(len + 2 * FloorLog2(static_cast<uint64_t>(len)));
}

uint32_t RoundNextPow2(uint32_t v) {
  v -= 1;
  v |= v >> 1;
  v |= v >> 2;
  v |= v >> 4;
  v |= v >> 8;
  v |= v >> 16;
  return v + 1;
}

class BitWriter {
 public:
  BitWriter(uint8_t* out, size_t cap) : out_(out), cap_(cap) {}
  // Appends the low n (<= 56) bits of v, most significant first.
  void Put(uint64_t v, int n) {
    acc_ = (acc_ << n) | v;
    have_ += n;
    bits_ += static_cast<uint64_t>(n);
    while (have_ >= 8) {
      have_ -= 8;
      if (pos_ < cap_) {
        out_[pos_++] = static_cast<uint8_t>(acc_ >> have_);
      } else {
        overflow_ = true;
      }
    }
  }
  // x in [1, 2^33): at most 43 bits, one Put (the leading zeros are len's high bits).
  void EliasDelta(uint64_t x) {
    const int len = BitLength(x);
    const int len_of_len = FloorLog2(static_cast<uint64_t>(len));
    const uint64_t low = x & ((uint64_t{1} << (len - 1)) - 1);
    Put((static_cast<uint64_t>(len) << (len - 1)) | low, 2 * len_of_len + len);
  }
  // Writes the last partial byte, zero-padded (bits() stays the count of payload bits).
  void Flush() {
    if (have_ == 0) return;
    if (pos_ < cap_) {
      out_[pos_++] = static_cast<uint8_t>(acc_ << (8 - have_));
    } else {
      overflow_ = true;
    }
    have_ = 0;
  }
  uint64_t bits() const { return bits_; }
  bool overflow() const { return overflow_; }

 private:
  uint8_t* out_;
  size_t cap_;
  size_t pos_ = 0;
  uint64_t acc_ = 0;
  int have_ = 0;
  uint64_t bits_ = 0;
  bool overflow_ = false;
};

class BitReader {
 public:
  BitReader(const uint8_t* p, uint64_t bits)
      : p_(p), bytes_(static_cast<size_t>((bits + 7) / 8)), left_(bits) {}
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
    auto* o = static_cast<uint8_t*>(out);
    BitWriter writer(o + kHeader + ScaleBytes(), MaxStreamBytes());
    DispatchFloat(dtype(), [&](auto e) {
      using E = decltype(e);
      const auto* x = static_cast<const typename E::Storage*>(in);
      const double scale = Scale<E>(x);
      StoreRaw(o + kHeader, static_cast<typename E::Compute>(scale));
      if (natural_) {
        Quantize<E, true>(x, scale, &writer);
      } else {
        Quantize<E, false>(x, scale, &writer);
      }
    });
    writer.Flush();
    const uint64_t bits = writer.bits();
    if (writer.overflow()) {
      return Status::Internal("dithering encoding exceeded its bound of " +
                              std::to_string(MaxEncodedBytes()) + " bytes");
    }
    StoreRaw<uint64_t>(o, bits);
    *out_len = kHeader + ScaleBytes() + static_cast<size_t>((bits + 7) / 8);
    return Status::OK();
  }

  Status Decompress(const void* in, size_t len, void* dst) override {
    std::memset(dst, 0, raw_bytes());
    return Decode<false>(in, len, dst);
  }
  Status DecompressAdd(const void* in, size_t len, void* dst) override {
    return Decode<true>(in, len, dst);
  }

 private:
  static constexpr size_t kHeader = 8;
  size_t ScaleBytes() const { return dtype() == DType::kFloat64 ? 8 : 4; }
  uint64_t MaxBits() const { return count() * (2 + EliasBits(levels_)); }
  size_t MaxStreamBytes() const { return static_cast<size_t>((MaxBits() + 7) / 8); }

  template <typename E>
  double Scale(const typename E::Storage* x) const {
    using C = typename E::Compute;
    double scale = 0.0;
    const size_t n = count();
    if (l2_) {
      for (size_t i = 0; i < n; ++i) {
        const C v = E::Load(x[i]);
        scale += static_cast<double>(v * v);
      }
      return std::sqrt(scale);
    }
    for (size_t i = 0; i < n; ++i) {
      const double a = static_cast<double>(std::fabs(E::Load(x[i])));
      scale = scale > a ? scale : a;
    }
    return scale;
  }

  template <typename E, bool kNatural>
  void Quantize(const typename E::Storage* x, double scale, BitWriter* w) {
    using C = typename E::Compute;
    const double s = static_cast<double>(levels_);
    XorShift128Plus rng = rng_;  // a local copy stays in registers (stores may alias members)
    uint64_t previous_plus_one = 0;  // index of the previous element sent, + 1
    const size_t n = count();
    for (size_t i = 0; i < n; ++i) {
      const C v = E::Load(x[i]);
      const double a = static_cast<double>(std::fabs(v));
      uint32_t q;
      if constexpr (kNatural) {
        double normalized = a / scale * s;
        if (!(normalized >= 0)) normalized = 0;
        if (normalized > s) normalized = s;
        const uint32_t floor = RoundNextPow2(static_cast<uint32_t>(std::ceil(normalized))) >> 1;
        const uint32_t length = floor != 0 ? floor : 1;
        const double p = (normalized - floor) / length;
        q = floor + length * static_cast<uint32_t>(rng.Bernoulli(p));
      } else {
        C normalized = static_cast<C>(a / scale * s);
        if (!(normalized >= 0)) normalized = 0;
        if (normalized > static_cast<C>(s)) normalized = static_cast<C>(s);
        const C floor = std::floor(normalized);
        q = static_cast<uint32_t>(floor) +
            static_cast<uint32_t>(rng.Bernoulli(static_cast<double>(normalized - floor)));
      }
      if (q != 0) {
        w->EliasDelta(i + 1 - previous_plus_one);
        w->Put(std::signbit(v) ? 1 : 0, 1);
        w->EliasDelta(q);
        previous_plus_one = i + 1;
      }
    }
    rng_ = rng;
  }

  template <bool kAdd>
  Status Decode(const void* in, size_t len, void* dst) {
    const size_t head = kHeader + ScaleBytes();
    if (len < head) {
      return Status::InvalidArgument("dithering encoding of " + std::to_string(len) +
                                     " bytes is shorter than its " + std::to_string(head) +
                                     "-byte header");
    }
    const auto* p = static_cast<const uint8_t*>(in);
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
    Status st;
    DispatchFloat(dtype(), [&](auto e) {
      using E = decltype(e);
      using C = typename E::Compute;
      using S = typename E::Storage;
      const C scale = LoadRaw<C>(p + kHeader);
      const C s = static_cast<C>(levels_);
      auto* d = static_cast<S*>(dst);
      BitReader r(p + head, bits);
      uint64_t next = 0;  // smallest index the next element may have
      while (r.left() > 0) {
        uint64_t gap, sign, q;
        if (next >= count() || !r.EliasDelta(count() - next, &gap)) {
          st = Status::InvalidArgument("dithering encoding has a bad index gap at bit " +
                                       std::to_string(bits - r.left()));
          return;
        }
        const uint64_t i = next + gap - 1;
        if (!r.Get(1, &sign) || !r.EliasDelta(levels_, &q)) {
          st = Status::InvalidArgument("dithering encoding has a bad level for element " +
                                       std::to_string(i));
          return;
        }
        const C num = static_cast<C>(q) * scale / s;
        const S value = E::Store(sign ? -num : num);
        if constexpr (kAdd) {
          d[i] = E::Store(E::Load(d[i]) + E::Load(value));
        } else {
          d[i] = value;
        }
        next = i + 1;
      }
    });
    return st;
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
