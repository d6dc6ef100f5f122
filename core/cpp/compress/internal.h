// Pieces shared by the compressor implementations (compress/*.cc); not part of the interface.
//
// * Params: the kwargs, parsed and checked once (spec.cc), what Create builds from.
// * Elem<T>: the element types a compressor takes, their storage and the type computed in:
//   float16 is stored as IEEE half bits and computed in float32 (every stored intermediate
//   rounded to nearest even), float32 in float32, float64 in float64.
// * Codec: a base compressor (onebit, topk, randomk, dithering, fp16). Compress applies the
//   scale (into a scratch copy, only when it is not 1) and encodes; Residual is what error
//   feedback needs: error = corrected - decode(encoding), element-wise in the tensor's type.
// * The factories registry.cc composes.
//
// Threads: Compress changes an instance's state and scratch (one caller at a time);
// Decompress and DecompressAdd read no instance state that Compress writes, so they may run
// concurrently with each other and with Compress (a server decoding several pushes at once).
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../reduce/half.h"
#include "compressor.h"
#include "rng.h"

namespace byteps {
namespace compress {
namespace detail {

enum class CodecType : uint8_t { kOnebit, kTopk, kRandomk, kDithering, kFp16 };

struct Params {
  bool has_compressor = false;
  CodecType type = CodecType::kOnebit;
  // compressor_k: a fraction of the elements (topk / randomk, 0 < k < 1) or a count / levels.
  bool k_is_fraction = false;
  float k_fraction = 0;
  uint64_t k_count = 0;
  bool onebit_scaling = false;  // upstream's default
  bool has_seed = false;        // seed given and non-zero
  uint64_t seed = 0;
  bool dithering_natural = false;  // dithering_partition=1
  bool dithering_l2 = false;       // dithering_normalize=1
  bool error_feedback = false;     // ef_type=vanilla
  bool momentum = false;           // momentum_type=nesterov
  double momentum_mu = 0;          // as written (float64); float32 tensors use float(mu)
};

// Parses and checks kwargs for a tensor of `dtype` (what Validate reports).
Status ParseParams(const Kwargs& kw, DType dtype, Params* out);

// Largest accepted dithering compressor_k per partition type.
constexpr uint64_t kMaxLinearLevels = 1u << 24;  // a level count exact in float32
constexpr uint64_t kMaxNaturalK = 31;            // 2^30 levels

// ---- element types ---------------------------------------------------------------------

struct HalfBits {
  uint16_t bits;
};

template <typename T>
struct Elem;

template <>
struct Elem<HalfBits> {
  using Storage = uint16_t;
  using Compute = float;
  static constexpr DType kType = DType::kFloat16;
  static inline float Load(uint16_t h) { return half::HalfToFloat(h); }
  static inline uint16_t Store(float f) { return half::FloatToHalf(f); }
};

template <>
struct Elem<float> {
  using Storage = float;
  using Compute = float;
  static constexpr DType kType = DType::kFloat32;
  static inline float Load(float f) { return f; }
  static inline float Store(float f) { return f; }
};

template <>
struct Elem<double> {
  using Storage = double;
  using Compute = double;
  static constexpr DType kType = DType::kFloat64;
  static inline double Load(double f) { return f; }
  static inline double Store(double f) { return f; }
};

// Calls fn(Elem<T>{}) for the float type `dtype` (callers have validated it).
template <typename Fn>
auto DispatchFloat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16:
      return fn(Elem<HalfBits>{});
    case DType::kFloat64:
      return fn(Elem<double>{});
    default:
      return fn(Elem<float>{});
  }
}

// Unaligned little-endian-host loads and stores (encodings are byte streams).
template <typename T>
inline T LoadRaw(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void StoreRaw(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Software prefetch for the streaming loops, kPrefetchAhead bytes ahead of the element read
// or written, one per 64-byte line: the hardware prefetchers let a single core's streams
// over tens of MiB run at about half the rate (onebit's packing of 64 MiB of float32: 10 ->
// 25 GB/s, its unpacking 15 -> 26 GB/s with it, on the machine measured).
constexpr size_t kPrefetchAhead = 4096;
template <typename T>
inline void PrefetchRead(const T* p, size_t i) {
  // (an address past the buffer's end is harmless to a prefetch; computed as an integer)
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p + i) +
                                                   kPrefetchAhead),
                     0, 3);
}
template <typename T>
inline void PrefetchWrite(T* p, size_t i) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p + i) +
                                                   kPrefetchAhead),
                     1, 3);
}

// Error feedback's correction: out[i] = Store(Load(x[i]) * scale + factor * Load(error[i]))
// in the compute type (scale and factor as Compute); out may be error (in place).
void Correct(DType dtype, const void* x, double scale, double factor, const void* error,
             void* out, size_t count);

// dst[i] = Store(Load(src[i]) * scale) in the compute type (scale as Compute).
void ScaleInto(DType dtype, const void* src, double scale, size_t count, void* dst);

// ---- base compressors ------------------------------------------------------------------

class Codec : public Compressor {
 public:
  Status Compress(const void* in, const CompressArgs& args, void* out, size_t* out_len) final;
  // Encodes count() elements at `in` as they are (no scale).
  virtual Status Encode(const void* in, void* out, size_t* out_len) = 0;
  // error[i] = Store(Load(corrected[i]) - Load(decoded[i])) for an encoding this instance just
  // wrote from `corrected`. The default decodes into `error` and subtracts.
  virtual void Residual(const void* corrected, const void* enc, size_t len, void* error);
  // Error feedback's whole step, where a codec fuses it into fewer passes over memory, with
  // the results of the three passes: corrected[i] = Store(Load(x[i]) * scale + factor *
  // Load(error[i])) (scale and factor as Compute), the encoding of `corrected` into out
  // (Encode's), then error[i] = Store(Load(corrected[i]) - Load(decoded[i])). false: the codec
  // has no fused form and did nothing.
  virtual bool EncodeWithFeedback(const void* x, double scale, double factor, void* error,
                                  void* out, size_t* out_len) {
    return false;
  }

 protected:
  Codec(DType dtype, size_t count) : Compressor(dtype, count) {}

 private:
  std::vector<uint8_t> scaled_;  // the scaled input when CompressArgs::scale != 1
};

// Checks CompressArgs (a finite scale) naming what is wrong.
Status CheckArgs(const CompressArgs& args);

std::unique_ptr<Codec> MakeOnebit(DType dtype, size_t count, bool scaling);
// k elements per encoding (1 <= k <= count).
std::unique_ptr<Codec> MakeTopk(DType dtype, size_t count, size_t k);
std::unique_ptr<Codec> MakeRandomk(DType dtype, size_t count, size_t k, bool seeded,
                                   uint64_t seed);
// levels: compressor_k (linear: levels; natural: 2^(k-1) levels).
std::unique_ptr<Codec> MakeDithering(DType dtype, size_t count, uint32_t k, bool natural,
                                     bool l2, bool seeded, uint64_t seed);
std::unique_ptr<Codec> MakeFp16(DType dtype, size_t count);

std::unique_ptr<Compressor> MakeErrorFeedback(std::unique_ptr<Codec> inner);
std::unique_ptr<Compressor> MakeMomentum(std::unique_ptr<Compressor> inner, double mu);

// Seeds a stream: with the seed when given, else from std::random_device (upstream).
void SeedRng(XorShift128Plus* rng, bool seeded, uint64_t seed);

}  // namespace detail
}  // namespace compress
}  // namespace byteps
