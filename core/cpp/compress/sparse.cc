// topk and randomk (upstream's TopkCompressor and RandomkCompressor): k (index, value) pairs
// of the n elements; decoded, the other elements are 0.
//
// topk keeps the k largest |x|, selected exactly as upstream: a binary min-heap of the first k
// elements (std::push_heap, comparator |a| > |b|), then every later element whose |x| is
// strictly greater than the heap's top replaces it (std::pop_heap, then std::push_heap). So an
// element never displaces an equal one seen before it; among equal values at the threshold the
// heap's internal order decides which stay (libstdc++'s algorithm, as upstream built with GCC).
// float16 compares |x| in float32 (the same order).
// Where the k-th largest |x| is not tied and no |x| is NaN the set does not depend on the
// heap's order, and it is found faster (SelectTopFast): one pass collects the elements at or
// above a bound taken from a sample, or, where the sample misleads, a histogram of the |x|
// bits' high bits and a second pass; nth_element then splits the candidates. Those pairs are
// written in index order, the heap's in heap order (k = n: all, in index order). Decoded
// values do not depend on the order.
//
// randomk draws k indices with replacement, index = Next() % n from the instance's
// xorshift128+ stream (rng.h; seed {s, s}), k draws per Compress, in upstream's order. A
// repeated index is written as often as drawn (with the same value).
//
// k: registry.cc computes it; when an absolute compressor_k exceeds a partition's element
// count the partition keeps all of its elements (upstream would abort on k > n/2).
//
// Wire (n elements, k pairs): k uint32 indices (little-endian), then k values in the
// tensor's type (float16 bits, float32, float64): exactly k * (4 + element size) bytes.
// Decoding checks the length and every index (< n); a repeated index takes its last value
// (Decompress and DecompressAdd agree). DecompressAdd leaves the other elements untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "internal.h"
#include "topk_heap.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace byteps {
namespace compress {
namespace detail {
namespace {

// Per-thread bitmap of the indices seen by one DecompressAdd (all bits 0 between calls).
std::vector<uint64_t>& SeenBits(size_t count) {
  thread_local std::vector<uint64_t> bits;
  const size_t words = (count + 63) / 64;
  if (bits.size() < words) bits.resize(words, 0);
  return bits;
}

// The bits of |x| in the compute type, as an unsigned integer: ordered as |x| for every
// non-NaN x; above kInf for NaN.
template <typename E>
struct TopKey {
  using C = typename E::Compute;
  using K = std::conditional_t<sizeof(C) == 8, uint64_t, uint32_t>;
  static constexpr K kInf = sizeof(K) == 8 ? K(0x7ff0000000000000ull) : K(0x7f800000u);
  static K Of(typename E::Storage v) {
    const C c = E::Load(v);
    K b;
    std::memcpy(&b, &c, sizeof(b));
    return static_cast<K>(b & (~K{0} >> 1));
  }
};

using Candidates = std::vector<std::pair<uint64_t, uint32_t>>;

// Appends (key, index) of the elements of x[begin, n) with key >= lo to *cand, in index
// order, stopping where it would exceed cap entries; *nan |= a NaN among those scanned.
// Returns false where it stopped at cap.
template <typename E>
bool ScanCandidatesGeneric(const typename E::Storage* x, size_t begin, size_t n,
                           typename TopKey<E>::K lo, size_t cap, Candidates* cand, bool* nan) {
  bool seen_nan = false, whole = true;
  for (size_t i = begin; i < n; ++i) {
    if (i % 16 == 0) PrefetchRead(x, i);
    const auto b = TopKey<E>::Of(x[i]);
    seen_nan |= b > TopKey<E>::kInf;
    if (b >= lo) {
      if (cand->size() == cap) {
        whole = false;
        break;
      }
      cand->emplace_back(b, static_cast<uint32_t>(i));
    }
  }
  *nan |= seen_nan;
  return whole;
}

template <typename E>
void ScanCandidates(const typename E::Storage* x, size_t n, typename TopKey<E>::K lo,
                    size_t cap, Candidates* cand, bool* nan) {
  ScanCandidatesGeneric<E>(x, 0, n, lo, cap, cand, nan);
}

#if defined(__x86_64__) || defined(__i386__)
bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

// float32, AVX2, elements [0, *end) with *end a multiple of 16: 16 keys per step compared at
// once (keys have the top bit clear, so signed compares order them); the few at or above lo
// are appended one by one. Returns false where it stopped at cap.
__attribute__((target("avx2"))) bool ScanFloatAvx2(const float* x, size_t end, uint32_t lo,
                                                   size_t cap, Candidates* cand, bool* nan) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i below = _mm256_set1_epi32(static_cast<int>(lo) - 1);  // key >= lo: key > lo-1
  __m256i nans = _mm256_setzero_si256();
  bool whole = true;
  for (size_t i = 0; i < end && whole; i += 16) {
    PrefetchRead(x, i);
    const __m256i k0 =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
    const __m256i k1 = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), abs_mask);
    nans = _mm256_or_si256(nans, _mm256_or_si256(_mm256_cmpgt_epi32(k0, inf),
                                                 _mm256_cmpgt_epi32(k1, inf)));
    uint32_t mask = static_cast<uint32_t>(
                        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k0, below)))) |
                    static_cast<uint32_t>(_mm256_movemask_ps(
                        _mm256_castsi256_ps(_mm256_cmpgt_epi32(k1, below))))
                        << 8;
    while (mask != 0) {
      const unsigned j = static_cast<unsigned>(__builtin_ctz(mask));
      mask &= mask - 1;
      if (cand->size() == cap) {
        whole = false;
        break;
      }
      cand->emplace_back(TopKey<Elem<float>>::Of(x[i + j]), static_cast<uint32_t>(i + j));
    }
  }
  *nan |= !_mm256_testz_si256(nans, nans);
  return whole;
}

bool HasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
}

// As ScanFloatAvx2 with AVX-512, without a branch per step: the indices of the elements at
// or above lo are compressed into a buffer (16 per step), which is turned into candidates
// once per kScanChunk elements.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push  // GCC 12 on its own _mm512_undefined_* operands (bug 105593)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
constexpr size_t kScanChunk = 1024;
__attribute__((target("avx512f"))) bool ScanFloatAvx512(const float* x, size_t end, uint32_t lo,
                                                       size_t cap, Candidates* cand,
                                                       bool* nan) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i below = _mm512_set1_epi32(static_cast<int>(lo) - 1);  // key >= lo: key > lo-1
  const __m512i step = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __mmask16 nans = 0;
  uint32_t found[kScanChunk + 16];
  for (size_t begin = 0; begin < end; begin += kScanChunk) {
    const size_t stop = end - begin < kScanChunk ? end : begin + kScanChunk;
    size_t count = 0;
    for (size_t i = begin; i < stop; i += 16) {
      PrefetchRead(x, i);
      const __m512i k = _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask);
      nans |= _mm512_cmpgt_epi32_mask(k, inf);
      const __mmask16 m = _mm512_cmpgt_epi32_mask(k, below);
      const __m512i index = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i)), step);
      _mm512_storeu_si512(found + count, _mm512_maskz_compress_epi32(m, index));
      count += static_cast<size_t>(__builtin_popcount(m));
    }
    for (size_t c = 0; c < count; ++c) {
      if (cand->size() == cap) {
        *nan |= nans != 0;
        return false;
      }
      cand->emplace_back(TopKey<Elem<float>>::Of(x[found[c]]), found[c]);
    }
  }
  *nan |= nans != 0;
  return true;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

template <>
void ScanCandidates<Elem<float>>(const float* x, size_t n, uint32_t lo, size_t cap,
                                 Candidates* cand, bool* nan) {
  size_t i = 0;
  if (HasAvx512()) {
    i = n / 16 * 16;
    if (!ScanFloatAvx512(x, i, lo, cap, cand, nan)) return;
  } else if (HasAvx2()) {
    i = n / 16 * 16;
    if (!ScanFloatAvx2(x, i, lo, cap, cand, nan)) return;
  }
  ScanCandidatesGeneric<Elem<float>>(x, i, n, lo, cap, cand, nan);
}
#endif

class Sparse final : public Codec {
 public:
  Sparse(DType dtype, size_t count, size_t k, bool random, bool seeded, uint64_t seed)
      : Codec(dtype, count), k_(k), random_(random) {
    if (random_) SeedRng(&rng_, seeded, seed);
  }

  size_t MaxEncodedBytes() const override { return k_ * PairBytes(); }

  Status Encode(const void* in, void* out, size_t* out_len) override {
    auto* o = static_cast<uint8_t*>(out);
    DispatchFloat(dtype(), [&](auto e) {
      using E = decltype(e);
      const auto* x = static_cast<const typename E::Storage*>(in);
      if (random_) {
        for (size_t j = 0; j < k_; ++j) {
          StoreRaw<uint32_t>(o + 4 * j, static_cast<uint32_t>(rng_.Randint(0, count())));
        }
      } else if (k_ == count()) {
        for (size_t j = 0; j < k_; ++j) StoreRaw<uint32_t>(o + 4 * j, static_cast<uint32_t>(j));
      } else if (!SelectTopFast<E>(x, o)) {
        SelectTop<E>(x, o);
      }
      uint8_t* values = o + 4 * k_;
      for (size_t j = 0; j < k_; ++j) {
        const uint32_t idx = LoadRaw<uint32_t>(o + 4 * j);
        StoreRaw(values + j * sizeof(x[0]), x[idx]);
      }
    });
    *out_len = MaxEncodedBytes();
    return Status::OK();
  }

  Status Decompress(const void* in, size_t len, void* dst) override {
    BPS_RETURN_IF_ERROR(Check(in, len));
    std::memset(dst, 0, raw_bytes());
    const auto* p = static_cast<const uint8_t*>(in);
    const uint8_t* values = p + 4 * k_;
    const size_t es = DTypeSize(dtype());
    auto* d = static_cast<uint8_t*>(dst);
    for (size_t j = 0; j < k_; ++j) {
      std::memcpy(d + LoadRaw<uint32_t>(p + 4 * j) * es, values + j * es, es);
    }
    return Status::OK();
  }

  Status DecompressAdd(const void* in, size_t len, void* dst) override {
    BPS_RETURN_IF_ERROR(Check(in, len));
    const auto* p = static_cast<const uint8_t*>(in);
    const uint8_t* values = p + 4 * k_;
    std::vector<uint64_t>& seen = SeenBits(count());
    DispatchFloat(dtype(), [&](auto e) {
      using E = decltype(e);
      using S = typename E::Storage;
      auto* d = static_cast<S*>(dst);
      for (size_t j = k_; j-- > 0;) {  // last pair first: a repeated index adds its last value
        const uint32_t idx = LoadRaw<uint32_t>(p + 4 * j);
        uint64_t& word = seen[idx / 64];
        const uint64_t bit = uint64_t{1} << (idx % 64);
        if (word & bit) continue;
        word |= bit;
        d[idx] = E::Store(E::Load(d[idx]) + E::Load(LoadRaw<S>(values + j * sizeof(S))));
      }
    });
    for (size_t j = 0; j < k_; ++j) {
      const uint32_t idx = LoadRaw<uint32_t>(p + 4 * j);
      seen[idx / 64] = 0;
    }
    return Status::OK();
  }

  // Error feedback in place: the corrected values written over the error, encoded from
  // there, then 0 at the sent indices (Residual's result without a copy).
  bool EncodeWithFeedback(const void* x, double scale, double factor, void* error, void* out,
                          size_t* out_len) override {
    Correct(dtype(), x, scale, factor, error, error, count());
    const Status st = Encode(error, out, out_len);  // (cannot fail)
    (void)st;
    ZeroSent(out, error);
    return true;
  }

  // Fused (upstream's FastUpdateError): error = corrected, 0 at the sent indices.
  void Residual(const void* corrected, const void* enc, size_t len, void* error) override {
    std::memcpy(error, corrected, raw_bytes());
    ZeroSent(enc, error);
  }

  // error[i] = 0 (zero bits) at the indices of an encoding this instance wrote.
  void ZeroSent(const void* enc, void* error) const {
    const auto* p = static_cast<const uint8_t*>(enc);
    const size_t es = DTypeSize(dtype());
    auto* e = static_cast<uint8_t*>(error);
    for (size_t j = 0; j < k_; ++j) std::memset(e + LoadRaw<uint32_t>(p + 4 * j) * es, 0, es);
  }

 private:
  size_t PairBytes() const { return 4 + DTypeSize(dtype()); }

  Status Check(const void* in, size_t len) const {
    if (len != MaxEncodedBytes()) {
      return Status::InvalidArgument(std::string(random_ ? "randomk" : "topk") + " encoding of " +
                                     std::to_string(len) + " bytes; " + std::to_string(k_) +
                                     " pairs take " + std::to_string(MaxEncodedBytes()));
    }
    const auto* p = static_cast<const uint8_t*>(in);
    for (size_t j = 0; j < k_; ++j) {
      const uint32_t idx = LoadRaw<uint32_t>(p + 4 * j);
      if (idx >= count()) {
        return Status::InvalidArgument(std::string(random_ ? "randomk" : "topk") + " pair " +
                                       std::to_string(j) + " has index " + std::to_string(idx) +
                                       " out of range for " + std::to_string(count()) +
                                       " elements");
      }
    }
    return Status::OK();
  }

  // The set upstream's heap keeps where it does not depend on the heap's order, written in
  // index order: true; false (nothing written) on a tie at the k-th largest |x| or a NaN.
  // One pass where a sample of the elements predicts the threshold well, else two.
  template <typename E>
  bool SelectTopFast(const typename E::Storage* x, uint8_t* idx_out) {
    using K = typename TopKey<E>::K;
    const size_t n = count(), k = k_;
    above_.clear();
    cand_.clear();
    // 1. A lower bound from a sample (up to 64 Ki elements in blocks of 256 spread over the
    // tensor): its rank is the expected one for k plus 4 standard deviations, so about k to
    // 1.6 k elements lie above it; with fewer than k or more than 2 k + 4096 of them, the
    // histogram below decides instead.
    const size_t m = std::min<size_t>(size_t{1} << 16, n / 16) / 256 * 256;
    if (m >= 1024 && 2 * k < n) {
      sample_.clear();
      const size_t blocks = m / 256;
      for (size_t bl = 0; bl < blocks; ++bl) {
        const size_t begin = bl * (n / blocks);
        for (size_t j = begin; j < begin + 256; ++j) sample_.push_back(TopKey<E>::Of(x[j]));
      }
      const double expect = static_cast<double>(m) * static_cast<double>(k) / n;
      const size_t rank = std::min(m - 1, static_cast<size_t>(expect + 4 * std::sqrt(expect) + 8));
      std::nth_element(sample_.begin(), sample_.begin() + rank, sample_.end(),
                       [](uint64_t a, uint64_t b) { return a > b; });
      const K lo = static_cast<K>(sample_[rank]);
      const size_t cap = 2 * k + 4096;
      cand_.reserve(cap);
      bool nan = false;
      ScanCandidates<E>(x, n, lo, cap, &cand_, &nan);  // stops at cap: a poor sample
      if (nan) return false;
      if (cand_.size() >= k && cand_.size() < cap) return FinishTop(k, idx_out);
      cand_.clear();
    }
    // 2. A histogram of the keys' high bits finds the bin that holds the k-th largest; a
    // second pass takes the elements of the bins above it and the candidates of that bin.
    // float32 counts into 4 interleaved histograms (neighbours often share a bin; one
    // histogram would serialise on its counters), summed after.
    constexpr int kBinBits = sizeof(K) == 8 ? 16 : 12;  // exponent + 4 mantissa bits
    constexpr int kShift = static_cast<int>(sizeof(K)) * 8 - 1 - kBinBits;
    constexpr size_t kBins = size_t{1} << kBinBits, kWays = sizeof(K) == 8 ? 1 : 4;
    hist_.assign(kBins * kWays, 0);
    uint32_t* h = hist_.data();
    bool nan = false;
    size_t i = 0;
    for (; i + kWays <= n; i += kWays) {
      for (size_t w = 0; w < kWays; ++w) {
        const K b = TopKey<E>::Of(x[i + w]);
        nan |= b > TopKey<E>::kInf;
        ++h[w * kBins + (b >> kShift)];
      }
    }
    for (; i < n; ++i) {
      const K b = TopKey<E>::Of(x[i]);
      nan |= b > TopKey<E>::kInf;
      ++h[b >> kShift];
    }
    if (nan) return false;
    for (size_t w = 1; w < kWays; ++w) {
      for (size_t b = 0; b < kBins; ++b) h[b] += h[w * kBins + b];
    }
    size_t above = 0, bin = kBins - 1;
    while (above + h[bin] < k) above += h[bin--];
    cand_.reserve(h[bin]);
    above_.reserve(above);
    for (i = 0; i < n; ++i) {
      const K b = TopKey<E>::Of(x[i]);
      const size_t bb = static_cast<size_t>(b >> kShift);
      if (bb > bin) {
        above_.push_back(static_cast<uint32_t>(i));
      } else if (bb == bin) {
        cand_.emplace_back(b, static_cast<uint32_t>(i));
      }
    }
    return FinishTop(k - above, idx_out);
  }

  // The `need` largest of cand_ (in index order) with above_ (in index order, all taken):
  // false on a tie at the threshold.
  bool FinishTop(size_t need, uint8_t* idx_out) {
    // The need-th largest key (the keys alone: half the bytes to move).
    keys_.resize(cand_.size());
    for (size_t c = 0; c < cand_.size(); ++c) keys_[c] = cand_[c].first;
    std::nth_element(keys_.begin(), keys_.begin() + (need - 1), keys_.end(),
                     [](uint64_t a, uint64_t b) { return a > b; });
    const uint64_t threshold = keys_[need - 1];
    size_t taken = 0;
    for (const auto& c : cand_) taken += c.first >= threshold;
    if (taken != need) return false;  // tied at the threshold: the heap's order decides
    size_t a = 0, j = 0;
    for (const auto& c : cand_) {
      if (c.first < threshold) continue;
      while (a < above_.size() && above_[a] < c.second) {
        StoreRaw<uint32_t>(idx_out + 4 * j++, above_[a++]);
      }
      StoreRaw<uint32_t>(idx_out + 4 * j++, c.second);
    }
    while (a < above_.size()) StoreRaw<uint32_t>(idx_out + 4 * j++, above_[a++]);
    return true;
  }

  // Upstream's heap selection (topk_heap.h); writes the k indices in heap order.
  template <typename E>
  void SelectTop(const typename E::Storage* x, uint8_t* idx_out) {
    using C = typename E::Compute;
    TopHeap<C> heap;
    heap.Reset(k_);
    for (size_t i = 0; i < k_; ++i) heap.Push(std::abs(E::Load(x[i])), static_cast<uint32_t>(i));
    const size_t n = count();
    for (size_t i = k_; i < n; ++i) {
      if (i % 16 == 0) PrefetchRead(x, i);
      const C key = std::abs(E::Load(x[i]));
      if (key > heap.TopKey()) heap.ReplaceTop(key, static_cast<uint32_t>(i));
    }
    for (size_t j = 0; j < k_; ++j) StoreRaw<uint32_t>(idx_out + 4 * j, heap[j].idx);
  }


  size_t k_;
  bool random_;
  XorShift128Plus rng_;
  // topk's scratch (Compress only): keys as uint64 (float32 keys widened).
  std::vector<uint32_t> hist_, above_;
  std::vector<uint64_t> sample_, keys_;
  Candidates cand_;
};

}  // namespace

std::unique_ptr<Codec> MakeTopk(DType dtype, size_t count, size_t k) {
  return std::make_unique<Sparse>(dtype, count, k, false, false, 0);
}

std::unique_ptr<Codec> MakeRandomk(DType dtype, size_t count, size_t k, bool seeded,
                                   uint64_t seed) {
  return std::make_unique<Sparse>(dtype, count, k, true, seeded, seed);
}

}  // namespace detail
}  // namespace compress
}  // namespace byteps
