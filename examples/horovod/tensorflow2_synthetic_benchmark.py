"""A Horovod TensorFlow 2 script on byteps: the only byteps line is the import.

It follows Horovod's TensorFlow 2 synthetic benchmark (``examples/tensorflow2/
tensorflow2_synthetic_benchmark.py`` of Horovod): a ``tf.function`` training step whose
``GradientTape`` is wrapped by Horovod's ``DistributedGradientTape`` (with ``compression``),
the model's and optimizer's variables broadcast from rank 0 after the first step, then timed
steps on fixed fake data; at the end the ranks' losses are averaged with ``hvd.allreduce`` and
gathered with ``hvd.allgather``, and ``hvd.join`` ends the job, as Horovod's examples do. The
model is ``--model`` of ``keras.applications`` (random weights, nothing downloaded) or, by
default, a small CNN of this file with ``hvd.SyncBatchNormalization``. Run it with the
launcher::

    bpslaunch --workers 2 --servers 1 python examples/horovod/tensorflow2_synthetic_benchmark.py
"""

import argparse
import timeit

import numpy as np
import tensorflow as tf

import byteps.tensorflow as hvd  # was: import horovod.tensorflow as hvd

parser = argparse.ArgumentParser(description="TensorFlow 2 Synthetic Benchmark (Horovod API)",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="",
                    help="a keras.applications model (default: a small CNN)")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size")
parser.add_argument("--image-size", type=int, default=32, help="input image height and width")
parser.add_argument("--num-warmup-batches", type=int, default=2,
                    help="number of warm-up batches that don't count towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=5,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=5, help="number of benchmark iterations")
args = parser.parse_args()

hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

tf.keras.utils.set_random_seed(hvd.rank())  # different initial weights: the broadcast fixes
if args.model:
    model = getattr(tf.keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3))
else:
    model = tf.keras.Sequential([
        tf.keras.Input((args.image_size, args.image_size, 3)),
        tf.keras.layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False),
        hvd.SyncBatchNormalization(), tf.keras.layers.ReLU(),
        tf.keras.layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False),
        hvd.SyncBatchNormalization(), tf.keras.layers.ReLU(),
        tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(1000)])
opt = tf.keras.optimizers.SGD(0.01 * hvd.size())

data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3], seed=1)
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64, seed=2)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
losses = []


@tf.function
def benchmark_step(first_batch):
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
            target, probs, from_logits=True))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    # The first step made the optimizer's variables: broadcast them, and the model's.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
    return loss


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


log(f"Model: {args.model or 'SmallNet'}")
log(f"Batch size: {args.batch_size}")
log(f"Number of CPUs: {hvd.size()}")

losses.append(float(benchmark_step(first_batch=True)))
log("Running warmup...")
timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(lambda: losses.append(float(benchmark_step(first_batch=False))),
                         number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log(f"Iter #{x}: {img_sec:.1f} img/sec per CPU")
    img_secs.append(img_sec)

img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log(f"Img/sec per CPU: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * img_sec_mean:.1f} "
    f"+-{hvd.size() * img_sec_conf:.1f}")

# Metrics as Horovod's examples report them: averaged and gathered over the ranks.
last = tf.constant([losses[-1]])
avg_loss = float(hvd.allreduce(last, name="avg_loss")[0])
all_losses = hvd.allgather(last, name="all_losses").numpy()
per_rank = ", ".join(f"{v:.4f}" for v in all_losses.tolist())
log(f"Average last loss over {hvd.size()} ranks: {avg_loss:.4f} (per rank: {per_rank})")
flat = tf.concat([tf.reshape(v, [-1]) for v in model.trainable_variables], 0)
gathered = hvd.allgather(tf.reshape(flat, [1, -1]), name="params").numpy()
log(f"Parameters identical on all ranks: {bool((gathered == gathered[0]).all())}")
log(f"Last rank to join: {hvd.join()}")
