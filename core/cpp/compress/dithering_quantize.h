// dithering's encoder loop (dithering_quantize.cc): the scale, then per element the level,
// drawn from the instance's stream, and the codes of the non-zero levels (dithering.cc states
// the arithmetic and the wire format). Internal to the dithering sources.
#pragma once
#include <cstddef>
#include <cstdint>

#include "dithering_stream.h"
#include "internal.h"

namespace byteps {
namespace compress {
namespace detail {
namespace dither {

// max: the largest |x| (upstream's sequential max over float64 values, NaN quirks included);
// l2: sqrt of the float64 sum, in element order, of the squares in the compute type.
template <typename E>
double Scale(const typename E::Storage* x, size_t n, bool l2);

// Error feedback's correction in place, error[i] = Store(Load(in[i]) * scale + factor *
// Load(error[i])) (as Correct, internal.h), and Scale of the corrected values, in one pass.
template <typename E>
double CorrectAndScale(const typename E::Storage* in, double scale, double factor,
                       typename E::Storage* error, size_t n, bool l2);

// Encodes n elements of x with `levels` levels (linear, or natural's 2^(k-1)) and the given
// scale into w; one draw of *rng per element, in element order. With `residual` (which may
// be x), residual[i] = Store(Load(x[i]) - Load(decoded[i])): error feedback's residual, the
// decoded value 0 for level 0, else Store(+-(level * scale / levels)) in the compute type
// from the scale as stored (the decoder's arithmetic).
template <typename E>
void Quantize(const typename E::Storage* x, size_t n, double scale, uint32_t levels,
              bool natural, XorShift128Plus* rng, BitWriter* w,
              typename E::Storage* residual);

}  // namespace dither
}  // namespace detail
}  // namespace compress
}  // namespace byteps
