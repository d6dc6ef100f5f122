// Key -> server placement (BytePS, OSDI'20 §4.1; docs/architecture.md §4).
//
// With n worker machines and k CPU-only servers, a CPU-only server should carry the share
// 2(n-1)/(n^2+kn-2k) of the bytes and a server colocated on a worker machine (n-k)/(n^2+kn-2k).
// Here the shares come from per-server weights 2(n-1) (CPU-only) and max(n-k, 0) (colocated),
// normalised to sum to 1, so any mix of servers gets a consistent plan. Partitions are placed by
// bytes against those targets (greedy, largest partition first, to the server furthest below
// its target), never by a string hash, so every model is balanced.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace byteps {

// Shares (summing to 1) for servers flagged colocated / CPU-only, with n worker machines.
std::vector<double> ServerShares(int num_worker_machines, const std::vector<bool>& colocated);

// The paper's optimal communication time per iteration (seconds) for M bytes at B bytes/s.
double OptimalCommTime(int n, int k, double model_bytes, double bandwidth);

class KeyPlanner {
 public:
  explicit KeyPlanner(std::vector<double> shares);
  // Places the partitions of one tensor; returns the server index of each, in input order.
  std::vector<int> Assign(const std::vector<size_t>& partition_bytes);
  const std::vector<uint64_t>& assigned_bytes() const { return assigned_; }
  const std::vector<double>& shares() const { return shares_; }
  std::string Describe() const;

 private:
  std::vector<double> shares_;
  std::vector<uint64_t> assigned_;
  uint64_t total_ = 0;
};

}  // namespace byteps
