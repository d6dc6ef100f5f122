// Many xorshift128+ draws at once (rng_chunks.cc): the draws of one stream, in stream order,
// exactly those of XorShift128Plus::Next (rng.h), produced 8 sub-streams at a time with
// AVX-512 where the CPU has it. For the dithering encoder, which needs one draw per element.
#pragma once
#include <cstddef>
#include <cstdint>

#include "rng.h"

namespace byteps {
namespace compress {

// Draws per DrawChunk call.
constexpr size_t kDrawChunk = 2048;

// True where DrawChunk runs (x86 with AVX-512 F, DQ; otherwise callers draw one at a time).
bool HasDrawChunk();

// The next kDrawChunk draws of *rng into out (64-byte aligned), in order; *rng advances by
// kDrawChunk draws. Only where HasDrawChunk().
void DrawChunk(XorShift128Plus* rng, uint64_t* out);

}  // namespace compress
}  // namespace byteps
