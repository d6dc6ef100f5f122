// The synchronization schemes' names and the all-reduce programs (sync_scheme.h).
#include "ps/sync_scheme.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>

#include "scheduling/partitioner.h"

namespace byteps {

const char* SyncSchemeName(SyncScheme s) {
  switch (s) {
    case SyncScheme::kPs: return "ps";
    case SyncScheme::kRing: return "ring";
    case SyncScheme::kTree: return "tree";
    case SyncScheme::kHips: return "hips";
  }
  return "?";
}

bool ParseSyncScheme(const std::string& text, SyncScheme* out) {
  for (int i = 0; i < kSyncSchemeCount; ++i) {
    if (text == SyncSchemeName(static_cast<SyncScheme>(i))) {
      *out = static_cast<SyncScheme>(i);
      return true;
    }
  }
  return false;
}

Status ResolveTreeWidth(int n, int requested, int* width) {
  std::string divisors;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
  if (requested > 0) {
    if (requested > n || n % requested != 0)
      return Status::Config("BYTEPS_TREE_WIDTH=" + std::to_string(requested) +
                            " must divide DMLC_NUM_WORKER=" + std::to_string(n) +
                            " (the groups are equal): use one of " + divisors +
                            ", or 0 for the default");
    *width = requested;
    return Status::OK();
  }
  const int target = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n)) - 1e-9));
  int w = 1;
  for (int d = 1; d <= target; ++d)
    if (n % d == 0) w = d;
  *width = w;
  return Status::OK();
}

int HipsGroupSize(int n, int requested) {
  if (requested > 0) return std::min(requested, std::max(n, 1));
  return std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n)) - 1e-9)));
}

CollProgram BuildCollProgram(SyncScheme scheme, int n, int width, int me, size_t bytes,
                             size_t elem_size) {
  CollProgram prog;
  const int w = scheme == SyncScheme::kRing ? n : std::max(1, std::min(width, n));
  if (n <= 1 || w < 1 || n % w != 0) return prog;
  const int groups = n / w, g = me / w, p = me % w;
  const size_t count = bytes / elem_size;
  std::vector<size_t> off(w), len(w);
  size_t max_chunk = 0;
  for (int c = 0; c < w; ++c) {
    size_t b, e;
    ShardRange(count, w, c, &b, &e);
    off[c] = b * elem_size;
    len[c] = (e - b) * elem_size;
    max_chunk = std::max(max_chunk, len[c]);
  }
  std::vector<bool> written(w, false);
  auto mod = [w](int x) { return ((x % w) + w) % w; };
  auto add = [&](CollOp::Kind kind, int peer, uint32_t phase, uint32_t step, int chunk,
                 size_t scratch) {
    CollOp op;
    op.kind = kind;
    op.peer = static_cast<uint16_t>(peer);
    op.tag = phase << 16 | step;
    op.offset = off[chunk];
    op.length = len[chunk];
    op.scratch = scratch;
    op.from_input = !written[chunk];
    if (kind != CollOp::kSend) written[chunk] = true;
    if (kind == CollOp::kRecvSum)
      prog.scratch_bytes = std::max(prog.scratch_bytes, scratch + op.length);
    prog.ops.push_back(op);
  };
  const int succ = g * w + mod(p + 1), pred = g * w + mod(p - 1);
  // Reduce-scatter inside the group: after it, member p holds chunk p + 1 summed over the group.
  for (int k = 0; k + 1 < w; ++k) {
    add(CollOp::kSend, succ, kPhaseScatter, k, mod(p - k), 0);
    const int c = mod(p - k - 1);
    add(CollOp::kRecvSum, pred, kPhaseScatter, k, c, off[c]);
  }
  // A binary tree across the groups (group 0 the root) on that chunk, among the members at
  // position p of every group.
  const int shard = mod(p + 1);
  std::vector<int> children;
  for (int c : {2 * g + 1, 2 * g + 2})
    if (c < groups) children.push_back(c);
  const size_t up_base = w > 1 ? bytes : 0;
  for (size_t i = 0; i < children.size(); ++i)
    add(CollOp::kRecvSum, children[i] * w + p, kPhaseUp, 0, shard, up_base + i * max_chunk);
  const int parent = (g - 1) / 2;
  if (g > 0) add(CollOp::kSend, parent * w + p, kPhaseUp, 0, shard, 0);
  prog.gather_begin = prog.ops.size();
  if (g > 0) add(CollOp::kRecvCopy, parent * w + p, kPhaseDown, 0, shard, 0);
  for (int c : children) add(CollOp::kSend, c * w + p, kPhaseDown, 0, shard, 0);
  // All-gather inside the group.
  for (int k = 0; k + 1 < w; ++k) {
    add(CollOp::kSend, succ, kPhaseGather, k, mod(p + 1 - k), 0);
    add(CollOp::kRecvCopy, pred, kPhaseGather, k, mod(p - k), 0);
  }
  while (prog.initial_sends < prog.ops.size() &&
         prog.ops[prog.initial_sends].kind == CollOp::kSend)
    prog.initial_sends++;
  return prog;
}

std::vector<int> CollectivePeers(int n, int width, int me) {
  // alltoall (ps/collective_programs.h) sends from every machine to every other: the whole
  // mesh, which covers the ring's and the tree's neighbours.
  (void)width;
  std::vector<int> peers;
  for (int p = 0; p < n; ++p)
    if (p != me) peers.push_back(p);
  return peers;
}

}  // namespace byteps
