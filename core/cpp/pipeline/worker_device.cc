// Device tensors in the worker pipeline (docs/gpu.md): COPY_D2H brings each partition from
// device memory into the tensor's pinned host buffer, after the producer's event; every stage
// after it works in that buffer as in a host tensor's memory; COPY_H2D takes the result back to
// the device. Each copy runs on the device's copy stream of its direction; the stage's thread
// queues it and records the task's event, and the direction's DeviceWaiter proceeds when the
// event completes, so copies of later partitions are queued while earlier ones run and
// overlap the pushes and pulls of the partitions before them. A one-process job (one machine,
// one process) sums nothing: its COPY_OUT copies each partition within the device instead
// (RunCopyWithinDevice), and the tensor has no pinned buffer.
#include "common/logging.h"
#include "pipeline/worker.h"

namespace byteps {

Status WorkerCore::InitDevice(TensorContext* ctx, const PushPullArgs& a) {
  ctx->device_kind = a.device_kind;
  ctx->device_id = a.device_id;
  if (a.device_kind == device::Kind::kHost) return Status::OK();
  device::Device* d = nullptr;
  BPS_RETURN_IF_ERROR(device::GetDevice(a.device_kind, &d));
  if (a.device_id < 0 || a.device_id >= d->count())
    return Status::InvalidArgument("tensor '" + a.name + "': " + device::KindName(a.device_kind) +
                                   " device " + std::to_string(a.device_id) +
                                   " does not exist (this process sees " +
                                   std::to_string(d->count()) + ")");
  ctx->device = d;
  BPS_RETURN_IF_ERROR(nccl_.Decide(ctx));  // nccl_sequencer.h
  if (!OneProcessJob() && !ctx->nccl) BPS_RETURN_IF_ERROR(ctx->staging.Allocate(d, a.nbytes));
  auto done = [this](PartTask* t, const Status& st) { OnCopied(t, st); };
  d2h_waiter_.Start(done);
  h2d_waiter_.Start(done);
  return Status::OK();
}

namespace {

// Queues one partition's copy on the device's stream of `dir` (after the producer's event for
// COPY_D2H and the copy within the device) and records the task's event behind it. Within the
// device, an output that is the input needs no copy: the event then marks the producer's
// work done. An NCCL tensor copies this process's shard, [begin, end) bytes of the partition,
// from the device output (where REDUCE left it) into the shared aggregate and back.
Status QueueCopy(PartTask* t, device::CopyDir dir, size_t begin, size_t end, char* aggregate) {
  TensorContext* ctx = t->ctx;
  device::Device* d = ctx->device;
  BPS_RETURN_IF_ERROR(d->Use(ctx->device_id));
  device::Stream s;
  BPS_RETURN_IF_ERROR(d->CopyStream(ctx->device_id, dir, &s));
  if (d->copy_timing() && !t->copy_start) {  // timing events around the copy from now on
    BPS_RETURN_IF_ERROR(d->CreateEvent(&t->copy_start, /*timing=*/true));
    if (t->copied) d->DestroyEvent(t->copied);  // complete: the task's last copy is done
    t->copied = nullptr;
    BPS_RETURN_IF_ERROR(d->CreateEvent(&t->copied, /*timing=*/true));
  }
  if (!t->copied) BPS_RETURN_IF_ERROR(d->CreateEvent(&t->copied));
  const size_t off = t->part.offset, len = t->part.length;
  if (t->ctx->nccl) {
    char* host = aggregate + off + begin;
    char* dev = ctx->device_output + off + begin;
    if (t->copy_start) BPS_RETURN_IF_ERROR(d->Record(t->copy_start, s));
    if (dir == device::CopyDir::kDeviceToHost) {
      BPS_RETURN_IF_ERROR(d->CopyAsync(host, dev, end - begin, dir, s));
    } else {
      BPS_RETURN_IF_ERROR(d->CopyAsync(dev, host, end - begin, dir, s));
    }
  } else if (dir == device::CopyDir::kDeviceToHost) {
    if (ctx->ready_event) BPS_RETURN_IF_ERROR(d->StreamWait(s, ctx->ready_event));
    if (t->copy_start) BPS_RETURN_IF_ERROR(d->Record(t->copy_start, s));
    BPS_RETURN_IF_ERROR(d->CopyAsync(ctx->staging.data() + off, ctx->device_input + off, len,
                                     dir, s));
  } else if (dir == device::CopyDir::kDeviceToDevice) {
    if (ctx->ready_event) BPS_RETURN_IF_ERROR(d->StreamWait(s, ctx->ready_event));
    if (t->copy_start) BPS_RETURN_IF_ERROR(d->Record(t->copy_start, s));
    if (ctx->device_output != ctx->device_input)
      BPS_RETURN_IF_ERROR(d->CopyAsync(ctx->device_output + off, ctx->device_input + off, len,
                                       dir, s));
  } else {
    if (t->copy_start) BPS_RETURN_IF_ERROR(d->Record(t->copy_start, s));
    BPS_RETURN_IF_ERROR(d->CopyAsync(ctx->device_output + off, ctx->staging.data() + off, len,
                                     dir, s));
  }
  return d->Record(t->copied, s);
}

}  // namespace

void WorkerCore::RunCopyD2H(PartTask* t) { RunCopyAcross(t, device::CopyDir::kDeviceToHost); }

void WorkerCore::RunCopyH2D(PartTask* t) { RunCopyAcross(t, device::CopyDir::kHostToDevice); }

void WorkerCore::RunCopyAcross(PartTask* t, device::CopyDir dir) {
  size_t begin = 0, end = t->part.length;
  char* aggregate = nullptr;
  if (t->ctx->nccl) {
    nccl_.Shard(t, &begin, &end);
    aggregate = t->ctx->aggregate(cfg_.local_size);
    if (end == begin) return OnCopied(t, Status::OK());  // a partition smaller than L elements
  }
  Status st = QueueCopy(t, dir, begin, end, aggregate);
  if (!st.ok()) return OnCopied(t, st);
  DeviceWaiter& w = dir == device::CopyDir::kDeviceToHost ? d2h_waiter_ : h2d_waiter_;
  w.Add(t->ctx->device, t->copied, t, t->copy_start, dir, end - begin);
}

void WorkerCore::RunCopyWithinDevice(PartTask* t) {
  Status st = QueueCopy(t, device::CopyDir::kDeviceToDevice, 0, t->part.length, nullptr);
  if (!st.ok()) return OnCopied(t, st);
  h2d_waiter_.Add(t->ctx->device, t->copied, t, t->copy_start, device::CopyDir::kDeviceToDevice,
                  t->ctx->device_output != t->ctx->device_input ? t->part.length : 0);
}

void WorkerCore::OnCopied(PartTask* t, const Status& st) {
  if (!st.ok()) {
    // A device error is the job's: every rank's operations fail with it (docs/gpu.md).
    if (!stopping_)
      Fatal(Status(st.code(), StageName(t->stages.current()) + std::string(" of '") +
                                  t->ctx->name + "': " + st.message()));
    return;
  }
  if (!t->ctx->in_flight) return;  // the operation failed meanwhile
  // An NCCL tensor's shard of the machine's sum is in the aggregate: the local root pushes once
  // every process's is (its PUSH gate).
  if (t->ctx->nccl && t->stages.current() == Stage::kCopyD2H && !cfg_.is_root())
    SendSignal(LocalSignalType::kReduced, t, 0);
  Proceed(t);
}

void WorkerCore::DrainDeviceCopies(TensorContext* ctx) {
  if (!ctx->device) return;
  for (auto& t : ctx->parts)
    if (t->copied) ctx->device->Synchronize(t->copied);
}

}  // namespace byteps
