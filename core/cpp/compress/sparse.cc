// topk and randomk (upstream's TopkCompressor and RandomkCompressor): k (index, value) pairs
// of the n elements; decoded, the other elements are 0.
//
// topk keeps the k largest |x|, selected exactly as upstream: a binary min-heap of the first k
// elements (std::push_heap, comparator |a| > |b|), then every later element whose |x| is
// strictly greater than the heap's top replaces it (std::pop_heap, then std::push_heap). So an
// element never displaces an equal one seen before it; among equal values at the threshold the
// heap's internal order decides which stay (libstdc++'s algorithm, as upstream built with GCC).
// Pairs are written in heap order. float16 compares |x| in float32 (the same order).
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
#include <cstring>
#include <vector>

#include "internal.h"

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
      } else {
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

  // Fused (upstream's FastUpdateError): error = corrected, 0 at the sent indices.
  void Residual(const void* corrected, const void* enc, size_t len, void* error) override {
    std::memcpy(error, corrected, raw_bytes());
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

  // Upstream's heap selection; writes the k indices in heap order.
  template <typename E>
  void SelectTop(const typename E::Storage* x, uint8_t* idx_out) {
    using C = typename E::Compute;
    struct Entry {
      C key;
      uint32_t idx;
    };
    auto comp = [](const Entry& a, const Entry& b) { return a.key > b.key; };
    std::vector<Entry> heap;
    heap.reserve(k_);
    for (size_t i = 0; i < k_; ++i) {
      heap.push_back(Entry{std::abs(E::Load(x[i])), static_cast<uint32_t>(i)});
      std::push_heap(heap.begin(), heap.end(), comp);
    }
    const size_t n = count();
    for (size_t i = k_; i < n; ++i) {
      const C key = std::abs(E::Load(x[i]));
      if (key > heap.front().key) {
        std::pop_heap(heap.begin(), heap.end(), comp);
        heap.back() = Entry{key, static_cast<uint32_t>(i)};
        std::push_heap(heap.begin(), heap.end(), comp);
      }
    }
    for (size_t j = 0; j < k_; ++j) StoreRaw<uint32_t>(idx_out + 4 * j, heap[j].idx);
  }

  size_t k_;
  bool random_;
  XorShift128Plus rng_;
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
