#include "key_plan.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <sstream>

namespace byteps {

std::vector<double> ServerShares(int n, const std::vector<bool>& colocated) {
  size_t s = colocated.size();
  std::vector<double> w(s, 0.0);
  int k = static_cast<int>(std::count(colocated.begin(), colocated.end(), false));
  for (size_t i = 0; i < s; ++i)
    w[i] = colocated[i] ? std::max(n - k, 0) : 2.0 * std::max(n - 1, 0);
  double sum = std::accumulate(w.begin(), w.end(), 0.0);
  if (sum <= 0) std::fill(w.begin(), w.end(), 1.0), sum = static_cast<double>(s);
  for (auto& x : w) x /= sum;
  return w;
}

double OptimalCommTime(int n, int k, double model_bytes, double bandwidth) {
  double denom = static_cast<double>(n) * n + static_cast<double>(k) * n - 2.0 * k;
  if (denom <= 0 || bandwidth <= 0) return 0;
  return 2.0 * n * (n - 1) * model_bytes / (denom * bandwidth);
}

KeyPlanner::KeyPlanner(std::vector<double> shares)
    : shares_(std::move(shares)), assigned_(shares_.size(), 0) {}

std::vector<int> KeyPlanner::Assign(const std::vector<size_t>& partition_bytes) {
  std::vector<int> out(partition_bytes.size(), 0);
  if (shares_.empty()) return out;
  std::vector<size_t> order(partition_bytes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return partition_bytes[a] > partition_bytes[b]; });
  for (size_t idx : order) {
    uint64_t bytes = partition_bytes[idx];
    uint64_t total_after = total_ + bytes;
    int best = 0;
    double best_deficit = -1e300;
    for (size_t s = 0; s < shares_.size(); ++s) {
      double deficit = shares_[s] * static_cast<double>(total_after) -
                       static_cast<double>(assigned_[s]);
      if (deficit > best_deficit + 1e-9) {
        best_deficit = deficit;
        best = static_cast<int>(s);
      }
    }
    assigned_[best] += bytes;
    total_ = total_after;
    out[idx] = best;
  }
  return out;
}

std::string KeyPlanner::Describe() const {
  std::ostringstream os;
  for (size_t s = 0; s < shares_.size(); ++s)
    os << (s ? ", " : "") << "server " << s << ": target " << shares_[s] << ", bytes "
       << assigned_[s];
  return os.str();
}

}  // namespace byteps
