// dithering's encoder loop (dithering_quantize.cc): the scale, then per element the level,
// drawn from the instance's stream, and the codes of the non-zero levels (dithering.cc states
// the arithmetic and the wire format). Internal to the dithering sources.
#pragma once
#include <cstddef>

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

// Encodes n elements of x with `levels` levels (linear, or natural's 2^(k-1)) and the given
// scale into w; one draw of *rng per element, in element order.
template <typename E>
void Quantize(const typename E::Storage* x, size_t n, double scale, uint32_t levels,
              bool natural, XorShift128Plus* rng, BitWriter* w);

}  // namespace dither
}  // namespace detail
}  // namespace compress
}  // namespace byteps
