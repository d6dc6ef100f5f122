"""A Horovod PyTorch script on byteps: the only byteps line is the import.

It follows Horovod's synthetic benchmark (``examples/pytorch/pytorch_synthetic_benchmark.py``
of Horovod): the model's batch norm is ``hvd.SyncBatchNorm``, the optimizer Horovod's
``DistributedOptimizer`` with ``named_parameters``, ``compression`` and ``op``, the parameters
and optimizer state broadcast from rank 0, then timed steps on fixed fake data; at the end the
ranks' losses are averaged with ``hvd.allreduce`` and gathered with ``hvd.allgather``, as
Horovod's examples report metrics. The model is a small CNN of this file (Horovod's takes one
from torchvision). Run it with the launcher::

    bpslaunch --workers 2 --servers 1 python examples/horovod/pytorch_synthetic_benchmark.py
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import byteps.torch as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark (Horovod API)",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=2,
                    help="number of warm-up batches that don't count towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=5,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=5, help="number of benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="use adasum algorithm to do reduction")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()
torch.set_num_threads(1)
if args.cuda:
    torch.cuda.set_device(hvd.local_rank())


class SmallNet(nn.Module):
    """Two convolutions with batch norm and a classifier over 1000 classes."""

    def __init__(self, norm_layer=nn.BatchNorm2d):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
        self.bn1 = norm_layer(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
        self.bn2 = norm_layer(32)
        self.fc = nn.Linear(32, 1000)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


torch.manual_seed(hvd.rank())  # different initial parameters: the broadcast must fix them
model = SmallNet(norm_layer=hvd.SyncBatchNorm)

# By default, Adasum doesn't need scaling up learning rate.
lr_scaler = hvd.size() if not args.use_adasum else 1
if args.cuda:
    model.cuda()
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler, momentum=0.9)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, 32, 32)
target = torch.LongTensor(args.batch_size).random_() % 1000
if args.cuda:
    data, target = data.cuda(), target.cuda()
losses = []


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


log("Model: SmallNet")
log(f"Batch size: {args.batch_size}")
device = "GPU" if args.cuda else "CPU"
log(f"Number of {device}s: {hvd.size()}")

log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
    img_secs.append(img_sec)

img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} "
    f"+-{hvd.size() * img_sec_conf:.1f}")

# Metrics as Horovod's examples report them: averaged and gathered over the ranks.
last = torch.tensor(losses[-1])
avg_loss = hvd.allreduce(last, name="avg_loss").item()
all_losses = hvd.allgather(last.reshape(1), name="all_losses")
per_rank = ", ".join(f"{v:.4f}" for v in all_losses.tolist())
log(f"Average last loss over {hvd.size()} ranks: {avg_loss:.4f} (per rank: {per_rank})")
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(params.reshape(1, -1), name="params")
log(f"Parameters identical on all ranks: {bool((gathered == gathered[0]).all())}")
