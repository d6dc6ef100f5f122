"""Worker script of tests/test_cost_model.py: ``python cost_model_worker.py measure`` under
``python -m byteps.launch``; start-up, log and fail are bps_worker's.

``measure``: ``byteps.cost_model()`` (the measurement, collective), prints ``COSTMODEL <json>``
(``CostModel.as_dict()``) and ``PLACEMENT [servers, CPU-only servers]`` (the address book's,
``byteps._core.server_placement()``); a second call must return the same object without measuring; then
``BYTEPS_COST_BETA`` is set in this process and ``byteps.cost_model(refresh=True)`` measures
again with β taken from it: prints ``COSTMODEL_BETA <json>``. Finally one push_pull checks that
the job still sums exactly after the measurement.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bps_worker as w
from bps_worker import bps, fail, log, push_pull

#: the β the second measurement takes from BYTEPS_COST_BETA (s/B)
BETA = "2.5e-10"


def mode_measure(args) -> int:
    import byteps
    from byteps import _core
    from byteps.sync import cost_measure

    model = byteps.cost_model()
    names = list(_core.declared_names())
    want = [cost_measure.NAME_TINY, cost_measure.NAME_LARGE,
            cost_measure.NAME_LATENCY + ".ps", cost_measure.NAME_COMBINE]
    if names[:4] != want:
        fail(f"the measurement declared {names}, expected {want} first")
    log("COSTMODEL " + json.dumps(model.as_dict(), sort_keys=True))
    log("PLACEMENT " + json.dumps(list(_core.server_placement())))
    if byteps.cost_model() is not model:
        fail("a second byteps.cost_model() measured again")
    os.environ["BYTEPS_COST_BETA"] = BETA
    again = byteps.cost_model(refresh=True)
    log("COSTMODEL_BETA " + json.dumps(again.as_dict(), sort_keys=True))
    x = np.full(1000, w.RANK + 1, dtype=np.float32)
    out = np.empty_like(x)
    bps.wait(push_pull("after.cost_model", x, out, "float32", False))
    size = bps.size()
    if not (out == size * (size + 1) // 2).all():
        fail("push_pull after the measurement: wrong sum")
    return 3


if __name__ == "__main__":
    w.main({"measure": mode_measure})
