"""Tensors between pipeline stages over the job's p2p channel (:mod:`byteps.p2p`).

A tensor travels as two messages of one (sender, tag) pair each: a small header (dtype, shape
and the weight version it was computed with, for vertical sync) and the tensor's bytes, sent
from the tensor's memory and received into a tensor allocated from the header. The header is
decoded with bounds checked (dtype known, at most 16 dimensions, the size matching)."""

from __future__ import annotations

import struct
from typing import List, Tuple

import torch

from byteps.errors import InvalidArgumentError
from byteps.p2p import Channel, Op

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.uint8, torch.int8, torch.bool]
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_HEAD = struct.Struct("<BBq")  # dtype code, ndim, version
MAX_DIMS = 16


def encode_header(t: torch.Tensor, version: int) -> bytes:
    """The header of ``t`` (CPU tensor of a dtype in the table) with ``version``."""
    if t.dtype not in _CODE:
        raise InvalidArgumentError(f"pipeline: cannot send a {t.dtype} tensor")
    if t.dim() > MAX_DIMS:
        raise InvalidArgumentError(f"pipeline: a tensor of {t.dim()} dimensions (at most "
                                   f"{MAX_DIMS})")
    return _HEAD.pack(_CODE[t.dtype], t.dim(), int(version)) + struct.pack(
        f"<{t.dim()}q", *t.shape)


def decode_header(raw: bytes, max_bytes: int = 1 << 30) -> Tuple[torch.dtype, List[int], int]:
    """(dtype, shape, version) of a header; ``InvalidArgumentError`` for a malformed one or one
    announcing more than ``max_bytes`` (the channel's largest message, default 1 GiB)."""
    if len(raw) < _HEAD.size:
        raise InvalidArgumentError(f"pipeline: a tensor header of {len(raw)} bytes")
    code, ndim, version = _HEAD.unpack_from(raw)
    if code >= len(_DTYPES) or ndim > MAX_DIMS or len(raw) != _HEAD.size + 8 * ndim:
        raise InvalidArgumentError("pipeline: a malformed tensor header")
    shape = list(struct.unpack_from(f"<{ndim}q", raw, _HEAD.size))
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"pipeline: a tensor header with shape {shape}")
    nbytes = torch.empty((), dtype=_DTYPES[code]).element_size()
    for d in shape:
        nbytes *= d
        if nbytes > max_bytes:
            raise InvalidArgumentError(f"pipeline: a tensor header announcing shape {shape} "
                                       f"(more than {max_bytes} bytes)")
    return _DTYPES[code], shape, version


def send_tensor(ch: Channel, peer: int, tag_head: int, tag_data: int, t: torch.Tensor,
                version: int = 0) -> List[Op]:
    """Starts sending ``t`` (made contiguous) to ``peer``; returns the two pending ops (their
    ``wait`` keeps ``t`` alive until sent)."""
    t = t.detach().contiguous()
    return [ch.isend(peer, tag_head, encode_header(t, version)), ch.isend(peer, tag_data, t)]


def recv_tensor(ch: Channel, peer: int, tag_head: int, tag_data: int,
                timeout=None) -> Tuple[torch.Tensor, int]:
    """Receives a tensor sent by :func:`send_tensor`: (tensor, version)."""
    dtype, shape, version = decode_header(bytes(ch.recv(peer, tag_head, timeout=timeout)))
    out = torch.empty(shape, dtype=dtype)
    if out.numel() == 0:
        ch.recv(peer, tag_data, timeout=timeout)
        return out, version
    op = ch.irecv(peer, tag_data, out=out)
    op.wait(timeout)
    if op.nbytes != out.numel() * out.element_size():
        raise InvalidArgumentError(f"pipeline: {op.nbytes} bytes from rank {peer} for a "
                                   f"tensor of shape {shape} ({dtype})")
    return out, version
