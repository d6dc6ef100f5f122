// The summation service's half of two-level compression (docs/compression.md; upstream
// BytePS's server: every push is decompressed before it is summed, and the complete sum is
// compressed once for the pulls): KEY_CONFIG, decoding pushes into the round's sum, encoding
// the sum. Part of SummationEngine (ps/summation_engine.h); runs on the key's engine thread,
// except ConfigureKey (the receiving thread).
#include <algorithm>

#include "common/logging.h"
#include <cstdint>
#include "ps/summation_engine.h"

namespace byteps {

void SummationEngine::ConfigureKey(uint64_t key, const KeyConfigMsg& m, int worker) {
  if (worker < 0 || worker >= num_worker_) return;
  const DType dtype = static_cast<DType>(m.dtype);  // checked by Decode
  const std::string what = Name() + ": KEY_CONFIG of key " + std::to_string(key) +
                           " from worker " + std::to_string(worker);
  // A process set's key (docs/collectives.md, "Process sets"): only its machines push it.
  KeyRole role;
  for (size_t i = 0; i < m.members.size(); ++i)
    if (m.members[i] < 0 || m.members[i] >= num_worker_ ||
        (i > 0 && m.members[i] <= m.members[i - 1]))
      return sink_->SendError(worker, what + ": its worker machines must ascend within 0 to " +
                                          std::to_string(num_worker_ - 1));
  for (int64_t w : m.members) role.senders.push_back(static_cast<int>(w));
  if (!m.members.empty() &&
      std::find(role.senders.begin(), role.senders.end(), worker) == role.senders.end())
    return sink_->SendError(worker, what + ": the worker is not one of the key's machines");
  const uint64_t bound = partition_bound_.load();
  const size_t es = DTypeSize(dtype);
  Status st;
  if (m.count == 0 || es == 0 || m.count > bound / es)
    st = Status::InvalidArgument(std::to_string(m.count) + " elements of " + DTypeName(dtype) +
                                 " do not fit the job's partitions (" + std::to_string(bound) +
                                 " bytes)");
  compress::Kwargs kw;
  if (st.ok() && !m.compression.empty()) {
    st = compress::ParseSpec(m.compression, &kw);
    if (st.ok()) st = compress::Validate(kw, dtype);
  }
  if (!st.ok()) return sink_->SendError(worker, what + ": " + st.message());
  const std::string canonical = m.compression.empty() ? std::string() : compress::FormatSpec(kw);
  const reduce::ReduceOp op = static_cast<reduce::ReduceOp>(m.op);
  const KeyRole* with = m.members.empty() ? nullptr : &role;
  RoundKey* ks = FindKey(key);
  if (!ks) {
    if (canonical.empty()) {
      st = CreateKey(key, dtype, m.count * es, &ks, nullptr, std::string(), with, false, op);
    } else {
      std::unique_ptr<compress::Compressor> codec;
      st = compress::Create(kw, compress::Side::kServer, dtype, m.count, &codec);
      if (st.ok()) {
        const size_t max_encoded = codec->MaxEncodedBytes();  // before the codec is moved
        st = CreateKey(key, dtype, max_encoded, &ks, std::move(codec), canonical, with);
      }
    }
    if (!st.ok()) return sink_->SendError(worker, what + ": " + st.message());
  }
  // The key exists: made by this config, another worker's, or a plain push.
  // (A key made without a role has every worker machine as its senders, ascending.)
  const bool same_senders = m.members.empty()
                                ? ks->senders.size() == static_cast<size_t>(num_worker_)
                                : ks->senders == role.senders;
  const bool same = canonical.empty()
                        ? !ks->compressed() && ks->dtype == dtype && ks->len == m.count * es &&
                              ks->op == op
                        : ks->compressed() && ks->compression == canonical &&
                              ks->dtype == dtype && ks->raw_len == m.count * es;
  if (!same || !same_senders) {
    return sink_->SendError(
        worker, what + " (" + (canonical.empty() ? std::string("uncompressed") : m.compression) +
                    ", " + std::to_string(m.count) + " x " + DTypeName(dtype) + ", " +
                    std::to_string(m.members.empty() ? num_worker_ : m.members.size()) +
                    " pushing machines) does not match the key's " +
                    (ks->compressed() ? "(" + ks->compression + ", " +
                                            std::to_string(ks->raw_len / DTypeSize(ks->dtype)) +
                                            " x " + DTypeName(ks->dtype) + ")"
                                      : std::string("uncompressed pushes")) +
                    " from " + std::to_string(ks->senders.size()) + " machines");
  }
  // Written before the worker's first push of the key is read (same connection, in order).
  if (ks->compressed()) ks->configured[worker] = 1;
}

bool SummationEngine::DecodePush(RoundKey* ks, const Event& ev, int parity, bool first) {
  const char* in = ks->staging[ev.worker].load(std::memory_order_acquire);
  Status st = first ? ks->codec->Decompress(in, ev.len, ks->sum[parity])
                    : ks->codec->DecompressAdd(in, ev.len, ks->sum[parity]);
  if (!st.ok()) {
    sink_->SendError(ev.worker, Name() + ": push of compressed key " + std::to_string(ks->key) +
                                    " round " + std::to_string(ev.round) + " from worker " +
                                    std::to_string(ev.worker) + " is not a valid encoding (" +
                                    ks->compression + "): " + st.message());
    return false;
  }
  ks->lr = ev.lr;
  return true;
}

void SummationEngine::EncodeSum(RoundKey* ks, int parity) {
  compress::CompressArgs args;
  args.lr = ks->lr;
  size_t n = 0;
  Status st = ks->codec->Compress(ks->sum[parity], args, ks->encoded[parity], &n);
  if (!st.ok() || n > ks->len) {  // our own encoder failed: nothing a worker could fix
    BPS_LOG(ERROR) << Name() << ": cannot encode the sum of key " << ks->key << " round "
                   << ks->round[parity] << ": "
                   << (st.ok() ? "encoding larger than its bound" : st.message());
    for (int w : ks->waiting[parity])
      sink_->SendError(w, Name() + ": cannot encode the sum of key " + std::to_string(ks->key));
    ks->waiting[parity].clear();
    n = 0;
  }
  ks->encoded_len[parity] = n;
}

}  // namespace byteps
