// Portable summation kernels (reduce/, docs/architecture.md §7): the baseline every x86-64 CPU
// runs. Built with the project's default flags only (SSE2 at most, which GCC still auto-vectorises
// to); float16 goes through the scalar half.h conversions.
#include "sum_kernels.h"

namespace byteps {
namespace reduce {

const KernelTable* ScalarKernels() {
  static const KernelTable table = KernelsFor<Fp16Scalar>::Make("scalar");
  return &table;
}

}  // namespace reduce
}  // namespace byteps
