// The process-wide learning rate for error feedback (compressor.h): one atomic float64, set
// by the adapters' optimizers every step and read by the workers' compress path.
#include <atomic>

#include "compressor.h"

namespace byteps {
namespace compress {

namespace {
std::atomic<double> g_learning_rate{0.0};
}  // namespace

void SetLearningRate(double lr) { g_learning_rate.store(lr, std::memory_order_relaxed); }

double LearningRate() { return g_learning_rate.load(std::memory_order_relaxed); }

}  // namespace compress
}  // namespace byteps
