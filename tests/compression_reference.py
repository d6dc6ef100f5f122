"""NumPy reference of the core's gradient compressors (core/cpp/compress/, upstream BytePS's).

What the core decodes after each ``Compress`` call, computed from the same definitions in
NumPy, element for element and rounding for rounding (the same float32 / float64 operations in
the same order), so a test can require the core's decoded values to be *equal*:

* ``reference_compressor(kwargs, side, dtype, count)`` -> :class:`Reference`, the chain the
  kwargs name (``Momentum(ErrorFeedback(base))``; the server side has no momentum), with its
  state (error, momentum, random stream) carried from call to call like the core's instance.
  ``Reference.roundtrip(x, scale=1.0, lr=0.0)`` -> the decoded values of the call's encoding
  (``numpy.ndarray`` of ``dtype``, ``count`` elements); ``Reference.decode_add(decoded, dst)``
  -> ``dst`` plus ``decoded``, as the core's ``DecompressAdd``.
* ``XorShift128Plus``: upstream's random stream (state ``{seed, seed}``).
* ``sparse_k(kwargs, dtype, count)``: the number of pairs topk / randomk send per partition.
* ``encoded_nbytes(kwargs, dtype, count)``: the exact encoding size of onebit, topk, randomk
  and fp16 (``None`` for dithering, whose size depends on the values).

kwargs are the core's (``compressor_type``, ``compressor_k``, ``compressor_onebit_scaling``,
``seed``, ``dithering_partition``, ``dithering_normalize``, ``ef_type``, ``momentum_type``,
``momentum_mu``; str -> str) and assumed valid; randomk and dithering need a non-zero ``seed``
here (the core seeds from ``std::random_device`` without one). dtype: ``"float16"``,
``"float32"`` or ``"float64"``; float16 is computed in float32 and every stored tensor rounded
to float16, float32 in float32, float64 in float64. The definitions are in the headers of
core/cpp/compress/*.cc; the comments below only say where the NumPy spelling is not obvious.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "Reference",
    "XorShift128Plus",
    "encoded_nbytes",
    "reference_compressor",
    "sparse_k",
]

MASK64 = (1 << 64) - 1
UINT64_MAX_AS_DOUBLE = float(MASK64)  # 2^64 as a double, what C++ compares draws against
LANES = 16  # onebit's float64 partial sums of |x|


def _compute_type(dtype: np.dtype) -> type:
    return np.float64 if dtype == np.float64 else np.float32


class XorShift128Plus:
    """Upstream's xorshift128+ (byteps/common/compressor/utils.h); state ``{seed, seed}``."""

    def __init__(self, seed: int):
        self.s0 = seed & MASK64
        self.s1 = seed & MASK64

    def next(self) -> int:
        return int(self.draws(1)[0])

    def draws(self, n: int) -> np.ndarray:
        """The next n draws, uint64."""
        s0, s1 = self.s0, self.s1
        out = [0] * n
        for i in range(n):
            t = s0
            s0 = s1
            t ^= (t << 23) & MASK64
            t ^= t >> 17
            t ^= s1 ^ (s1 >> 26)
            s1 = t
            out[i] = (t + s0) & MASK64
        self.s0, self.s1 = s0, s1
        return np.array(out, dtype=np.uint64)

    def bernoulli(self, p: np.ndarray) -> np.ndarray:
        """One draw per element of p (float64): draw as double < p * (2^64 - 1) as double."""
        return self.draws(len(p)).astype(np.float64) < p * UINT64_MAX_AS_DOUBLE


def sparse_k(kwargs: dict, dtype: str, count: int) -> int:
    """Pairs per encoding of topk / randomk for a partition of count elements."""
    d = float(kwargs["compressor_k"])
    f = np.float32(d)
    if f < 1:
        es = np.dtype(dtype).itemsize
        v = f * np.float32(count * es) / np.float32(es)  # float32 arithmetic, as upstream
        k = int(v) if v >= 1 else 0
        k = max(k, 1)
    else:
        k = int(d)
    return min(k, count)


def _levels(kwargs: dict) -> int:
    k = int(float(kwargs["compressor_k"]))
    return 1 << (k - 1) if kwargs.get("dithering_partition", "0") == "1" else k


def encoded_nbytes(kwargs: dict, dtype: str, count: int):
    """Exact encoding size in bytes (None for dithering: it depends on the values)."""
    t = kwargs["compressor_type"]
    es = np.dtype(dtype).itemsize
    scale_bytes = 8 if dtype == "float64" else 4
    if t == "onebit":
        return scale_bytes + (count + 7) // 8
    if t in ("topk", "randomk"):
        return sparse_k(kwargs, dtype, count) * (4 + es)
    if t == "fp16":
        return 2 * count
    return None


def elias_bits(x: int) -> int:
    """Bits of the Elias-delta code of x >= 1."""
    n = x.bit_length()
    return n + 2 * (n.bit_length() - 1)


def dithering_max_bytes(kwargs: dict, dtype: str, count: int) -> int:
    """The core's bound on a dithering encoding (MaxEncodedBytes)."""
    scale_bytes = 8 if dtype == "float64" else 4
    bits = count * (2 + elias_bits(_levels(kwargs)))
    return 8 + scale_bytes + (bits + 7) // 8


# ---- base compressors: encode(x) -> (decoded, sent indices or None) ----------------------


class _Onebit:
    def __init__(self, dtype, kwargs):
        self.dtype = dtype
        self.scaling = kwargs.get("compressor_onebit_scaling", "false").lower() in ("true", "1")

    def encode(self, x):
        ct = _compute_type(self.dtype)
        xc = x.astype(ct)
        scale = 1.0
        if self.scaling:
            a = np.abs(xc).astype(np.float64)
            n = len(a)
            main = n // LANES * LANES
            lanes = np.zeros(LANES)
            if main:
                lanes = np.cumsum(a[:main].reshape(-1, LANES), axis=0)[-1].copy()
            for t in range(n - main):
                lanes[t] += a[main + t]
            total = 0.0
            for v in lanes:
                total += float(v)
            scale = total / n
        pos = np.array([ct(scale)], dtype=ct).astype(self.dtype)[0]
        return np.where(xc < 0, -pos, pos).astype(self.dtype), None


def _libstdcxx_topk(keys: np.ndarray, k: int) -> list:
    """Upstream's heap selection, step by step (libstdc++'s push_heap / pop_heap, comparator
    a > b on |x|): the indices in heap order. Slow (a Python loop); used where the threshold
    value is tied or NaN, where only the heap's order decides."""
    keys = [float(v) for v in keys]
    heap: list = []  # (key, index)

    def comp(a, b):
        return a[0] > b[0]

    def push_up(hole, top, value):
        parent = (hole - 1) // 2
        while hole > top and comp(heap[parent], value):
            heap[hole] = heap[parent]
            hole = parent
            parent = (hole - 1) // 2
        heap[hole] = value

    def adjust(hole, length, value):
        top = hole
        second = hole
        while second < (length - 1) // 2:
            second = 2 * (second + 1)
            if comp(heap[second], heap[second - 1]):
                second -= 1
            heap[hole] = heap[second]
            hole = second
        if length % 2 == 0 and second == (length - 2) // 2:
            second = 2 * (second + 1)
            heap[hole] = heap[second - 1]
            hole = second - 1
        push_up(hole, top, value)

    for i in range(k):
        heap.append((keys[i], i))
        push_up(len(heap) - 1, 0, heap[-1])
    for i in range(k, len(keys)):
        if keys[i] > heap[0][0]:
            if k > 1:  # pop_heap: the top moves to the back
                last = heap[k - 1]
                heap[k - 1] = heap[0]
                adjust(0, k - 1, last)
            heap[k - 1] = (keys[i], i)
            push_up(k - 1, 0, heap[k - 1])
    return [i for _, i in heap]


def topk_indices(keys: np.ndarray, k: int) -> np.ndarray:
    """The indices upstream's topk keeps (as a set; heap order only on the slow path)."""
    n = len(keys)
    if k >= n:
        return np.arange(n)
    if not np.isnan(keys).any():
        threshold = np.partition(keys, n - k)[n - k]
        above = keys > threshold
        if above.sum() + (keys == threshold).sum() == k:
            return np.flatnonzero(keys >= threshold)
    return np.array(_libstdcxx_topk(keys, k), dtype=np.int64)


class _Sparse:
    def __init__(self, dtype, kwargs, count, random):
        self.dtype = dtype
        self.k = sparse_k(kwargs, dtype.name, count)
        self.rng = XorShift128Plus(_seed(kwargs)) if random else None

    def encode(self, x):
        n = len(x)
        if self.rng is not None:
            idx = (self.rng.draws(self.k) % np.uint64(n)).astype(np.int64)
        else:
            idx = topk_indices(np.abs(x.astype(_compute_type(self.dtype))), self.k)
        out = np.zeros(n, dtype=self.dtype)
        out[idx] = x[idx]
        return out, idx


def _round_next_pow2(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.uint32) - np.uint32(1)  # wraps at 0, as upstream's uint32
    for s in (1, 2, 4, 8, 16):
        v |= v >> np.uint32(s)
    return v + np.uint32(1)


class _Dithering:
    def __init__(self, dtype, kwargs):
        self.dtype = dtype
        self.natural = kwargs.get("dithering_partition", "0") == "1"
        self.l2 = kwargs.get("dithering_normalize", "0") == "1"
        self.levels = _levels(kwargs)
        self.rng = XorShift128Plus(_seed(kwargs))

    def _scale(self, xc):
        if self.l2:
            with np.errstate(over="ignore"):
                sq = (xc * xc).astype(np.float64)
            return float(np.sqrt(np.cumsum(sq)[-1]))  # float64 sum in element order
        a = np.abs(xc).astype(np.float64)
        # Upstream's running max: `s > a ? s : a` forgets everything before a NaN.
        nan = np.flatnonzero(np.isnan(a))
        if len(nan):
            if nan[-1] == len(a) - 1:
                return float("nan")
            a = a[nan[-1] + 1:]
        return max(0.0, float(a.max()))

    def encode(self, x):
        ct = _compute_type(self.dtype)
        xc = x.astype(ct)
        scale = self._scale(xc)
        s = float(self.levels)
        a = np.abs(xc).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.natural:
                norm = a / scale * s
                norm = np.where(norm >= 0, norm, 0.0)
                norm = np.minimum(norm, s)
                low = _round_next_pow2(np.ceil(norm).astype(np.uint32)) >> np.uint32(1)
                length = np.where(low == 0, np.uint32(1), low)
                p = (norm - low) / length
                q = low.astype(np.uint64) + length.astype(np.uint64) * self.rng.bernoulli(p)
            else:
                norm = (a / scale * s).astype(ct)  # one rounding to the compute type
                norm = np.where(norm >= 0, norm, ct(0))
                norm = np.minimum(norm, ct(s)).astype(ct)
                low = np.floor(norm)
                p = (norm - low).astype(np.float64)
                q = low.astype(np.uint64) + self.rng.bernoulli(p)
            num = (q.astype(ct) * ct(scale)) / ct(s)
        value = np.where(np.signbit(xc), -num, num)
        value = np.where(q > 0, value, ct(0))
        with np.errstate(over="ignore"):
            return value.astype(self.dtype), None


class _Fp16:
    def __init__(self, dtype):
        self.dtype = dtype

    def encode(self, x):
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(self.dtype), None


def _seed(kwargs) -> int:
    seed = int(kwargs.get("seed", "0"))
    if seed == 0:
        raise ValueError("the reference needs a non-zero seed for randomk and dithering")
    return seed


def _base(kwargs, dtype, count):
    t = kwargs["compressor_type"]
    if t == "onebit":
        return _Onebit(dtype, kwargs)
    if t == "topk":
        return _Sparse(dtype, kwargs, count, random=False)
    if t == "randomk":
        return _Sparse(dtype, kwargs, count, random=True)
    if t == "dithering":
        return _Dithering(dtype, kwargs)
    if t == "fp16":
        return _Fp16(dtype)
    raise ValueError(f"unknown compressor_type {t!r}")


class Reference:
    """One partition's chain; roundtrip() is Compress followed by Decompress of its output."""

    def __init__(self, kwargs: dict, side: str, dtype: str, count: int):
        self.dtype = np.dtype(dtype)
        self.count = count
        self.ct = _compute_type(self.dtype)
        self.base = _base(kwargs, self.dtype, count)
        self.ef = kwargs.get("ef_type") == "vanilla"
        self.momentum = side == "worker" and kwargs.get("momentum_type") == "nesterov"
        self.mu = float(kwargs.get("momentum_mu", "0"))
        self.error = np.zeros(count, self.dtype)
        self.mom = np.zeros(count, self.dtype)
        self.prev_lr = 0.0

    def roundtrip(self, x: np.ndarray, scale: float = 1.0, lr: float = 0.0) -> np.ndarray:
        x = np.asarray(x, dtype=self.dtype).reshape(-1)
        assert len(x) == self.count
        ct = self.ct
        if self.momentum:
            mu = ct(self.mu)
            g = (x.astype(ct) * ct(scale)).astype(self.dtype).astype(ct)
            self.mom = (g + mu * self.mom.astype(ct)).astype(self.dtype)
            x = (g + mu * self.mom.astype(ct)).astype(self.dtype)
            scale = 1.0
        if not self.ef:
            if scale != 1.0:
                x = (x.astype(ct) * ct(scale)).astype(self.dtype)
            return self.base.encode(x)[0]
        f = self.prev_lr / lr if (lr > 0 and self.prev_lr > 0) else 1.0
        corrected = (x.astype(ct) * ct(scale) + ct(f) * self.error.astype(ct)).astype(self.dtype)
        decoded, sent = self.base.encode(corrected)
        if sent is not None:  # sparse: the error is what was not sent
            self.error = corrected.copy()
            self.error[sent] = 0
        else:
            self.error = (corrected.astype(ct) - decoded.astype(ct)).astype(self.dtype)
        self.prev_lr = lr
        return decoded

    def decode_add(self, decoded: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """dst + decoded, in the tensor's type (float16 through float32)."""
        return (dst.astype(self.ct) + decoded.astype(self.ct)).astype(self.dtype)


def reference_compressor(kwargs: dict, side: str, dtype: str, count: int) -> Reference:
    """The reference of the chain Create(kwargs, side, dtype, count) makes."""
    if side not in ("worker", "server"):
        raise ValueError(f"side must be 'worker' or 'server', got {side!r}")
    return Reference(kwargs, side, dtype, count)
