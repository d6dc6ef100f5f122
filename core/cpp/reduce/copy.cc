// Non-temporal copy (reduce/copy.h). SSE2 streaming stores are part of the x86-64 baseline,
// so this file needs no ISA dispatch; other architectures use memcpy.
#include "copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace byteps {
namespace reduce {

void CopyStreaming(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  constexpr size_t kLine = 64;
  const size_t head = (kLine - (reinterpret_cast<uintptr_t>(d) & (kLine - 1))) & (kLine - 1);
  if (n < head + 4 * kLine) {  // too short to gain anything
    memcpy(d, s, n);
    return;
  }
  memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + kLine <= n; i += kLine) {  // one cache line per iteration
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), x0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), x1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), x2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), x3);
  }
  memcpy(d + i, s + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered: publish them before we signal
#else
  memcpy(dst, src, n);
#endif
}

}  // namespace reduce
}  // namespace byteps
