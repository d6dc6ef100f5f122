// Gradient compressors (docs/compression.md): upstream BytePS's onebit, topk, randomk and
// dithering, an fp16 cast, and the decorators error feedback (vanilla, with the learning-rate
// correction) and momentum (nesterov), composed as upstream does: Momentum(ErrorFeedback(C)).
//
// One Compressor instance serves one partition of one tensor for the whole job (its error,
// momentum and random-number state carry from round to round). A worker compresses each
// partition before PUSH and decompresses the pulled sum; a server decompresses every push,
// sums, and compresses the sum (two-level compression, upstream's scheme: a step applies
// C(Σᵢ C(gᵢ))). Encoded payloads travel on the wire, so every decoder is bound-checked: a
// malformed or hostile encoding is an error Status, never a read or write out of bounds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/dtype.h"
#include "common/status.h"

namespace byteps {
namespace compress {

// Upstream's compressor kwargs, string -> string: compressor_type (onebit | topk | randomk |
// dithering | fp16), compressor_k, compressor_onebit_scaling, seed, dithering_partition,
// dithering_normalize, ef_type (vanilla), momentum_type (nesterov), momentum_mu.
using Kwargs = std::map<std::string, std::string>;

// Which end of the two levels an instance serves. The server's chain has no momentum (upstream:
// momentum is the worker's), otherwise the same compressor and error feedback.
enum class Side : uint8_t { kWorker, kServer };

// The canonical text of a kwargs map, "key=value;key=value" in key order: what a declaration
// carries (compared across workers) and what a server is told per key.
std::string FormatSpec(const Kwargs& kw);
// Parses FormatSpec's text (from a peer: bound-checked, duplicates and malformed pairs refused).
Status ParseSpec(const std::string& spec, Kwargs* out);
// Checks every key and value (unknown keys, unknown types, missing or out-of-range parameters)
// for a tensor of `dtype`: InvalidArgument naming the key. Compressors take float16, float32
// and float64 tensors only (upstream).
Status Validate(const Kwargs& kw, DType dtype);

// Per-call inputs of Compress.
struct CompressArgs {
  // The input is multiplied by this first (1/size when the push_pull averages, so that a step
  // applies C(Σᵢ C(gᵢ / size)) as upstream's MXNet trainer does; 1 otherwise).
  double scale = 1.0;
  // The current learning rate, for error feedback's correction error *= prev_lr / lr
  // (upstream's vanilla error feedback). <= 0: unknown, no correction.
  double lr = 0.0;
};

class Compressor {
 public:
  virtual ~Compressor() = default;
  DType dtype() const { return dtype_; }
  size_t count() const { return count_; }          // elements of one partition
  size_t raw_bytes() const { return count_ * DTypeSize(dtype_); }
  // The largest encoding Compress may write (bytes): the size of the caller's buffers.
  virtual size_t MaxEncodedBytes() const = 0;
  // Encodes count() elements of dtype() at `in` (not modified) into `out` (MaxEncodedBytes()
  // bytes); *out_len = the bytes written. Updates the instance's state (error, momentum, RNG).
  virtual Status Compress(const void* in, const CompressArgs& args, void* out,
                          size_t* out_len) = 0;
  // Decodes `len` bytes at `in` into count() elements at `dst` (overwritten). Error on an
  // encoding that is malformed (wrong length, index out of range, truncated bit stream).
  virtual Status Decompress(const void* in, size_t len, void* dst) = 0;
  // As Decompress, but adds the decoded values to `dst` (the server's sum). On error `dst` may
  // be partly updated.
  virtual Status DecompressAdd(const void* in, size_t len, void* dst) = 0;

 protected:
  Compressor(DType dtype, size_t count) : dtype_(dtype), count_(count) {}

 private:
  DType dtype_;
  size_t count_;
};

// Makes the chain the kwargs name for one partition of `count` elements of `dtype`
// (Momentum(ErrorFeedback(Compressor)), each decorator only when its type key is present).
// InvalidArgument as Validate; also for count == 0.
Status Create(const Kwargs& kw, Side side, DType dtype, size_t count,
              std::unique_ptr<Compressor>* out);

// The process-wide learning rate that workers pass to error feedback (CompressArgs::lr); set by
// the adapters' optimizers every step (byteps.basics.set_learning_rate). 0 until set.
void SetLearningRate(double lr);
double LearningRate();

}  // namespace compress
}  // namespace byteps
