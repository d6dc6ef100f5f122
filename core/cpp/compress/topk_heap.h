// topk's selection where the k-th largest |x| is tied or a NaN (sparse.cc): upstream's binary
// min-heap, operation for operation as libstdc++'s std::push_heap and std::pop_heap build it
// with the comparator a.key > b.key (GCC's bits/stl_heap.h: __push_heap, __adjust_heap,
// __pop_heap), so that among equal keys the same elements stay, in the same heap order.
// What differs from calling the library: the hole's way down a pop prefetches the entries two
// and three levels below it (a heap of k = 1 % of a large partition is megabytes; each level
// down is a cache miss otherwise), and a replacement of the top is one call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace byteps {
namespace compress {
namespace detail {

template <typename K>
class TopHeap {
 public:
  struct Entry {
    K key;
    uint32_t idx;
  };

  void Reset(size_t capacity) {
    heap_.resize(capacity);
    size_ = 0;
  }
  size_t size() const { return size_; }
  const Entry& operator[](size_t i) const { return heap_[i]; }
  K TopKey() const { return heap_[0].key; }

  // push_back, then std::push_heap.
  void Push(K key, uint32_t idx) {
    const size_t hole = size_++;
    SiftUp(hole, 0, Entry{key, idx});
  }

  // std::pop_heap, back() = {key, idx}, std::push_heap (upstream's replacement of the top).
  void ReplaceTop(K key, uint32_t idx) {
    Entry* h = heap_.data();
    const size_t len = size_;
    if (len > 1) {  // __pop_heap: the back's entry goes down from the top, the top to the back
      const Entry value = h[len - 1];
      h[len - 1] = h[0];
      Adjust(0, len - 1, value);
    }
    h[len - 1] = Entry{key, idx};
    SiftUp(len - 1, 0, h[len - 1]);  // push_heap of the new back
  }

 private:
  static bool Comp(const Entry& a, const Entry& b) { return a.key > b.key; }
  // (an address past the heap's end is harmless to a prefetch; computed as an integer)
  static void Prefetch(const Entry* h, size_t i) {
    __builtin_prefetch(
        reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(h) + i * sizeof(Entry)));
  }

  // __push_heap(first, hole, top, value).
  void SiftUp(size_t hole, size_t top, Entry value) {
    Entry* h = heap_.data();
    while (hole > top) {
      const size_t parent = (hole - 1) / 2;
      if (!Comp(h[parent], value)) break;
      h[hole] = h[parent];
      hole = parent;
    }
    h[hole] = value;
  }

  // __adjust_heap(first, hole, len, value).
  void Adjust(size_t hole, size_t len, Entry value) {
    Entry* h = heap_.data();
    const size_t top = hole;
    size_t second = hole;
    while (second < (len - 1) / 2) {
      Prefetch(h, 4 * second + 3);  // the next two levels below the hole
      Prefetch(h, 8 * second + 7);
      second = 2 * (second + 1);
      second -= static_cast<size_t>(Comp(h[second], h[second - 1]));  // (no branch to miss)
      h[hole] = h[second];
      hole = second;
    }
    if ((len & 1) == 0 && second == (len - 2) / 2) {
      second = 2 * (second + 1);
      h[hole] = h[second - 1];
      hole = second - 1;
    }
    SiftUp(hole, top, value);
  }

  std::vector<Entry> heap_;
  size_t size_ = 0;
};

}  // namespace detail
}  // namespace compress
}  // namespace byteps
