// Runtime CPU dispatch of the summation kernels (reduce/, docs/architecture.md §7).
//
// The per-ISA kernel tables (sum_scalar.cc, sum_avx2.cc, sum_avx512.cc) are probed once, on
// first use (thread-safe static initialisation), with __builtin_cpu_supports, which also
// checks that the OS saves the wide registers. This file itself is built with the portable
// baseline flags, so it runs on any x86-64 CPU; an ISA table is only called when supported.
// ForceIsa (tests, benchmarks) swaps the active table atomically.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "sum.h"

namespace byteps {
namespace reduce {

const KernelTable* ScalarKernels();
#if defined(__x86_64__) || defined(__i386__)
const KernelTable* Avx2Kernels();
const KernelTable* Avx512Kernels();
#endif

namespace {

struct Registry {
  // Usable tables, best first; scalar is always last.
  const KernelTable* tables[3] = {nullptr, nullptr, nullptr};
  int count = 0;
  std::string available;  // "avx512,avx2,scalar"
  std::atomic<const KernelTable*> active{nullptr};

  Registry() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");
    if (avx512) Add(Avx512Kernels());
    if (avx2) Add(Avx2Kernels());
#endif
    Add(ScalarKernels());
    active.store(tables[0], std::memory_order_release);
  }

  void Add(const KernelTable* t) {
    tables[count++] = t;
    if (!available.empty()) available += ",";
    available += t->name;
  }

  const KernelTable* Find(const char* name) const {
    for (int i = 0; i < count; ++i) {
      if (std::strcmp(tables[i]->name, name) == 0) return tables[i];
    }
    return nullptr;
  }
};

Registry& Reg() {
  static Registry registry;
  return registry;
}

inline const KernelTable* Active() { return Reg().active.load(std::memory_order_acquire); }

}  // namespace

void SumInto(void* dst, const void* src, size_t count, DType dtype) {
  if (count == 0) return;
  Active()->sum_into(dst, src, count, dtype);
}

void Sum3(void* dst, const void* a, const void* b, size_t count, DType dtype) {
  if (count == 0) return;
  Active()->sum3(dst, a, b, count, dtype);
}

void DivideInPlace(void* dst, size_t count, DType dtype, int64_t divisor) {
  if (count == 0) return;
  Active()->divide(dst, count, dtype, divisor);
}

void ReduceInto(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  if (op == ReduceOp::kSum) return SumInto(dst, src, count, dtype);
  if (count == 0) return;
  Active()->op3(dst, dst, src, count, dtype, op);
}

void Reduce3(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  if (op == ReduceOp::kSum) return Sum3(dst, a, b, count, dtype);
  if (count == 0) return;
  Active()->op3(dst, a, b, count, dtype, op);
}

namespace {
constexpr const char* kReduceOpNames[kReduceOpCount] = {"sum", "min", "max", "product"};
}  // namespace

const char* ReduceOpName(ReduceOp op) {
  const int i = static_cast<int>(op);
  return i < kReduceOpCount ? kReduceOpNames[i] : "unknown";
}

bool ParseReduceOp(const std::string& name, ReduceOp* out) {
  for (int i = 0; i < kReduceOpCount; ++i) {
    if (name == kReduceOpNames[i]) {
      *out = static_cast<ReduceOp>(i);
      return true;
    }
  }
  return false;
}

const char* ActiveIsa() { return Active()->name; }

const char* AvailableIsas() { return Reg().available.c_str(); }

bool ForceIsa(const char* name) {
  if (name == nullptr) return false;
  const KernelTable* t = Reg().Find(name);
  if (t == nullptr) return false;
  Reg().active.store(t, std::memory_order_release);
  return true;
}

}  // namespace reduce
}  // namespace byteps
