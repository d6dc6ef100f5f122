// The worker's half of two-level compression (docs/compression.md; upstream BytePS's COMPRESS
// and DECOMPRESS stages): which tensors are compressed, their partitions' compressors and
// KEY_CONFIG, and the two stages. The local root encodes each partition of the input (or of the
// local sum) before PUSH, divided by size first when the push_pull averages, so that an SGD
// step applies C(Σᵢ C(gᵢ / size)); the server decodes, sums and encodes the sum; DECOMPRESS
// decodes it into the output (or the aggregate the other local processes copy from).
#include <cstdint>
#include <cstring>

#include "common/logging.h"
#include "pipeline/worker.h"

namespace byteps {

Status WorkerCore::DecideCompression(TensorContext* ctx) {
  ctx->compressed = false;
  if (ctx->compression.empty()) return Status::OK();
  compress::Kwargs kw;
  Status st = compress::ParseSpec(ctx->compression, &kw);
  if (st.ok()) st = compress::Validate(kw, ctx->dtype);
  if (!st.ok())
    return Status::InvalidArgument("tensor '" + ctx->name + "' (" + DTypeName(ctx->dtype) +
                                   ShapeString(ctx->shape) + "): compression: " + st.message());
  ctx->compressed = Compresses(ctx->nbytes);
  return Status::OK();
}

Status WorkerCore::SetUpCompression(TensorContext* ctx) {
  compress::Kwargs kw;
  BPS_RETURN_IF_ERROR(compress::ParseSpec(ctx->compression, &kw));
  const size_t es = DTypeSize(ctx->dtype);
  for (auto& t : ctx->parts) {
    const size_t count = t->part.length / es;
    Status st = compress::Create(kw, compress::Side::kWorker, ctx->dtype, count, &t->codec);
    if (!st.ok())
      return Status::InvalidArgument("tensor '" + ctx->name + "' partition " +
                                     std::to_string(t->part.index) + ": " + st.message());
    t->encoded.assign(t->codec->MaxEncodedBytes(), 0);
    t->received.assign(t->codec->MaxEncodedBytes(), 0);
    KeyConfigMsg m;
    m.dtype = static_cast<uint8_t>(ctx->dtype);
    m.count = count;
    m.compression = ctx->compression;
    m.members.assign(ctx->set_machines.begin(), ctx->set_machines.end());
    ps_->ConfigureKey(t->server, t->key, m);  // on the connection its pushes take, before them
  }
  return Status::OK();
}

size_t WorkerCore::PushBytes(const PartTask* t) {
  return t->ctx->compressed ? t->encoded_len : t->part.length;
}

void WorkerCore::RunCompress(PartTask* t) {
  TensorContext* ctx = t->ctx;
  const size_t off = t->part.offset;
  const char* src = cfg_.local_size > 1 ? ctx->aggregate(cfg_.local_size) + off : ctx->input + off;
  compress::CompressArgs args;
  args.scale = ctx->average && AverageDivisor(ctx) > 1 ? 1.0 / AverageDivisor(ctx) : 1.0;
  args.lr = compress::LearningRate();
  memcpy(&t->push_aux, &args.lr, sizeof(args.lr));  // the server's error feedback reads it
  Status st = t->codec->Compress(src, args, t->encoded.data(), &t->encoded_len);
  if (!st.ok())
    return FailOpOnMachine(ctx, Status::Internal("rank " + std::to_string(cfg_.rank) +
                                                 ": cannot compress tensor '" + ctx->name +
                                                 "': " + st.message()));
  Proceed(t);
}

void WorkerCore::RunDecompress(PartTask* t) {
  TensorContext* ctx = t->ctx;
  const size_t off = t->part.offset;
  char* dst = cfg_.local_size > 1 ? ctx->aggregate(cfg_.local_size) + off : ctx->output + off;
  Status st = t->codec->Decompress(t->received.data(), t->pull.received, dst);
  if (!st.ok())
    return FailOpOnMachine(
        ctx, Status::Internal("rank " + std::to_string(cfg_.rank) + ": server " +
                              std::to_string(t->server) + " sent tensor '" + ctx->name +
                              "' a sum that is not a valid encoding (" + ctx->compression +
                              "): " + st.message()));
  t->pulled_final = cfg_.local_size == 1;  // in the output, already divided: COPY_OUT is done
  if (cfg_.local_size > 1) SendSignal(LocalSignalType::kPulled, t, -1);
  Proceed(t);
}

}  // namespace byteps
