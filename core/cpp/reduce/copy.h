// Large copies that bypass the cache (reduce/, docs/architecture.md §7).
//
// A plain memcpy of a block smaller than glibc's non-temporal threshold (the pipeline copies
// partitions of 256 KiB to 4 MiB) reads every destination line before overwriting it (the
// read-for-ownership of a write-allocate cache): 3 memory streams for a 2-stream copy.
// CopyStreaming writes with non-temporal stores instead, so the destination costs one stream.
// Use it only where the destination is not read again soon and the data set is larger than
// the last-level cache (ShouldStream); otherwise the stores miss the cache for nothing.
#pragma once
#include <cstddef>

namespace byteps {
namespace reduce {

// Tensors of at least this many bytes have their outputs written with streaming stores (local
// COPY_OUT, distributed pull responses). Below it the working set of a push_pull (input, slots,
// aggregate) can stay in a 32 MiB last-level cache, which streaming stores would bypass for
// nothing (a threshold chosen from that, not swept); above it plain stores cost a
// read-for-ownership per line (measured: docs/performance-notes.md, "Local path").
constexpr size_t kStreamingMinBytes = 8u << 20;

inline bool ShouldStream(size_t tensor_bytes) { return tensor_bytes >= kStreamingMinBytes; }

// memcpy(dst, src, n) with non-temporal stores for the 64-byte-aligned middle of dst, and a
// store fence at the end (the data is globally visible when it returns, as after memcpy).
// dst and src must not overlap. Falls back to memcpy where the CPU has no streaming stores.
void CopyStreaming(void* dst, const void* src, size_t n);

}  // namespace reduce
}  // namespace byteps
