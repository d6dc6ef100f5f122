"""One name, different shape (then dtype) across ranks: every rank must raise
byteps.errors.MismatchError. Prints ``MISMATCH_SHAPE_RAISED rank=..`` and
``MISMATCH_DTYPE_RAISED rank=..``, then ``MISMATCH_AFTER_OK rank=..`` once a correct
push_pull still works afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import byteps.torch as bps
from byteps.errors import MismatchError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: oracle.py
from oracle import expected_sum

torch.set_num_threads(1)


def expect_mismatch(tensor: torch.Tensor, name: str, marker: str) -> bool:
    r = bps.rank()
    try:
        bps.push_pull(tensor, average=False, name=name)
    except MismatchError as e:
        print(f"{marker} rank={r}: {e}", flush=True)
        return True
    except Exception as e:  # wrong exception type
        print(f"rank {r}: {name}: expected MismatchError, got {type(e).__name__}: {e}",
              flush=True)
        return False
    print(f"rank {r}: {name}: no error raised for mismatched tensors", flush=True)
    return False


def main() -> None:
    bps.init()
    r, n = bps.rank(), bps.size()
    ok = expect_mismatch(torch.ones(4 + r), "mm.shape", "MISMATCH_SHAPE_RAISED")
    # same byte count, different dtype: 8 x float32 on rank 0, 4 x float64 elsewhere
    t = torch.ones(8, dtype=torch.float32) if r == 0 else torch.ones(4, dtype=torch.float64)
    ok = expect_mismatch(t, "mm.dtype", "MISMATCH_DTYPE_RAISED") and ok
    out = bps.push_pull(torch.full((10,), float(r)), average=False, name="mm.after")
    if bool((out == float(expected_sum(lambda q: q, n))).all()):
        print(f"MISMATCH_AFTER_OK rank={r}", flush=True)
    else:
        print(f"rank {r}: push_pull after a mismatch gave {out.tolist()}", flush=True)
        ok = False
    bps.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
