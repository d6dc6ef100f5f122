// The allgather, broadcast and reducescatter programs (collective_programs.h).
#include "ps/collective_programs.h"

#include <algorithm>

namespace byteps {

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kAllgather: return "allgather";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReducescatter: return "reducescatter";
    case Collective::kAlltoall: return "alltoall";
  }
  return "?";
}

bool ParseCollective(const std::string& text, Collective* out) {
  for (int i = 0; i < kCollectiveCount; ++i) {
    if (text == CollectiveName(static_cast<Collective>(i))) {
      *out = static_cast<Collective>(i);
      return true;
    }
  }
  return false;
}

Status ValidateLayout(const CollLayout& layout, int n, size_t nbytes, size_t elem_size,
                      const std::string& name) {
  const std::string what = "tensor '" + name + "' (" + CollectiveName(layout.kind) + "): ";
  switch (layout.kind) {
    case Collective::kAllreduce:
      if (!layout.blocks.empty() || layout.root >= 0 || layout.root_rank >= 0)
        return Status::InvalidArgument(what + "an allreduce takes neither blocks nor a root");
      return Status::OK();
    case Collective::kBroadcast:
      if (!layout.blocks.empty())
        return Status::InvalidArgument(what + "a broadcast takes a root, not blocks");
      if (layout.root_rank < 0)
        return Status::InvalidArgument(what + "a broadcast needs its root rank");
      if (layout.root < 0 || layout.root >= n)
        return Status::InvalidArgument(what + "root machine " + std::to_string(layout.root) +
                                       " is not one of the job's " + std::to_string(n) +
                                       " worker machines");
      return Status::OK();
    case Collective::kAllgather:
    case Collective::kReducescatter:
    case Collective::kAlltoall:
      break;
  }
  if (layout.root >= 0 || layout.root_rank >= 0) return Status::InvalidArgument(what + "takes blocks, not a root");
  const size_t want = layout.kind == Collective::kAlltoall ? static_cast<size_t>(n) * n + 1
                                                           : static_cast<size_t>(n) + 1;
  if (layout.blocks.size() != want)
    return Status::InvalidArgument(what + std::to_string(layout.blocks.size()) +
                                   " block offsets for " + std::to_string(n) +
                                   " worker machines (needs " + std::to_string(want) + ")");
  if (layout.blocks.front() != 0 || layout.blocks.back() != nbytes)
    return Status::InvalidArgument(what + "the blocks must start at 0 and end at the tensor's " +
                                   std::to_string(nbytes) + " bytes");
  for (size_t m = 0; m + 1 < layout.blocks.size(); ++m)
    if (layout.blocks[m] > layout.blocks[m + 1] || layout.blocks[m] % elem_size != 0)
      return Status::InvalidArgument(what + "block offsets must rise and be multiples of the " +
                                     std::to_string(elem_size) + "-byte element");
  return Status::OK();
}

namespace {

struct Builder {
  CollProgram prog;
  int n, me;
  size_t offset, length;
  int mod(int x) const { return ((x % n) + n) % n; }
  int succ() const { return mod(me + 1); }
  int pred() const { return mod(me - 1); }
  // Block m clipped to the partition, as an offset and length within it.
  void Block(const CollLayout& l, int m, size_t* off, size_t* len) const {
    const size_t b = std::clamp<size_t>(l.blocks[m], offset, offset + length);
    const size_t e = std::clamp<size_t>(l.blocks[m + 1], offset, offset + length);
    *off = b - offset;
    *len = e - b;
  }
  void Add(CollOp::Kind kind, int peer, uint32_t phase, uint32_t step, size_t off, size_t len,
           bool from_input) {
    CollOp op;
    op.kind = kind;
    op.peer = static_cast<uint16_t>(peer);
    op.tag = phase << 16 | step;
    op.offset = off;
    op.length = len;
    op.scratch = off;  // the partition's ranges are disjoint: scratch mirrors them
    op.from_input = from_input;
    if (kind == CollOp::kRecvSum || kind == CollOp::kRecvPlace)
      prog.scratch_bytes = std::max(prog.scratch_bytes, off + len);
    prog.ops.push_back(op);
  }
};

}  // namespace

CollProgram BuildLayoutProgram(const CollLayout& layout, int n, int me, size_t offset,
                               size_t length) {
  Builder b{CollProgram(), n, me, offset, length};
  if (n <= 1) return b.prog;  // one machine: the walk copies the input
  size_t off, len;
  switch (layout.kind) {
    case Collective::kAllreduce:
      break;
    case Collective::kAllgather: {
      b.Block(layout, me, &off, &len);
      b.Add(CollOp::kSend, b.succ(), kPhaseGather, 0, off, len, /*from_input=*/true);
      b.Add(CollOp::kCopyInput, me, 0, 0, off, len, true);
      for (int k = 0; k + 1 < n; ++k) {
        b.Block(layout, b.mod(me - k - 1), &off, &len);
        b.Add(CollOp::kRecvPlace, b.pred(), kPhaseGather, k, off, len, false);
        if (k + 2 < n) b.Add(CollOp::kSend, b.succ(), kPhaseGather, k + 1, off, len, false);
      }
      break;
    }
    case Collective::kBroadcast: {
      const int pos = b.mod(me - layout.root);
      if (pos == 0) {
        b.Add(CollOp::kSend, b.succ(), kPhaseDown, 0, 0, length, true);
        b.Add(CollOp::kCopyInput, me, 0, 0, 0, length, true);
        b.Add(CollOp::kRecvPlace, b.pred(), kPhaseUp, 0, 0, 0, false);  // the acknowledgement
      } else {
        b.Add(CollOp::kRecvPlace, b.pred(), kPhaseDown, 0, 0, length, false);
        if (pos + 1 < n) b.Add(CollOp::kSend, b.succ(), kPhaseDown, 0, 0, length, false);
        else b.Add(CollOp::kSend, b.succ(), kPhaseUp, 0, 0, 0, false);
      }
      break;
    }
    case Collective::kReducescatter: {
      std::vector<bool> written(static_cast<size_t>(n), false);
      for (int k = 0; k + 1 < n; ++k) {
        const int out = b.mod(me - k - 1), in = b.mod(me - k - 2);
        b.Block(layout, out, &off, &len);
        b.Add(CollOp::kSend, b.succ(), kPhaseScatter, k, off, len, !written[out]);
        b.Block(layout, in, &off, &len);
        b.Add(CollOp::kRecvSum, b.pred(), kPhaseScatter, k, off, len, !written[in]);
        written[in] = true;
      }
      b.prog.gather_begin = b.prog.ops.size();  // nothing to spread: each keeps its block
      break;
    }
    case Collective::kAlltoall: {
      // What s sends d (block d * n + s), clipped to the partition. Every machine skips the
      // same empty ones.
      auto cell = [&](int d, int s, size_t* o, size_t* l) {
        const int i = d * n + s;
        CollLayout one;
        one.blocks = {layout.blocks[i], layout.blocks[i + 1]};
        b.Block(one, 0, o, l);
      };
      for (int k = 1; k < n; ++k) {  // its sends first, starting with its successor's
        const int d = b.mod(me + k);
        cell(d, me, &off, &len);
        if (len > 0) b.Add(CollOp::kSend, d, kPhaseScatter, 0, off, len, true);
      }
      cell(me, me, &off, &len);
      if (len > 0) b.Add(CollOp::kCopyInput, me, 0, 0, off, len, true);
      for (int k = 1; k < n; ++k) {  // each block that comes, then its acknowledgement
        const int s = b.mod(me - k);
        cell(me, s, &off, &len);
        if (len == 0) continue;
        b.Add(CollOp::kRecvPlace, s, kPhaseScatter, 0, off, len, false);
        b.Add(CollOp::kSend, s, kPhaseUp, 0, 0, 0, false);
      }
      for (int k = 1; k < n; ++k) {  // the acknowledgements of its sends
        const int d = b.mod(me + k);
        cell(d, me, &off, &len);
        if (len > 0) b.Add(CollOp::kRecvPlace, d, kPhaseUp, 0, 0, 0, false);
      }
      break;
    }
  }
  while (b.prog.initial_sends < b.prog.ops.size() &&
         b.prog.ops[b.prog.initial_sends].kind == CollOp::kSend)
    b.prog.initial_sends++;
  return b.prog;
}

}  // namespace byteps
