"""``byteps.server``: the process that runs a server of the summation service or the scheduler.

Start it with ``python -m byteps.server`` (``bpslaunch`` does this for you); ``DMLC_ROLE``
chooses ``server`` or ``scheduler`` and the other ``DMLC_*`` variables say where the scheduler
is and how many workers and servers the job has (see ``docs/env.md``).

Upstream BytePS started the server as a side effect of ``python3 -c 'import byteps.server'``;
that form keeps working, so existing launch scripts need no change.
"""

from __future__ import annotations

import sys

from byteps import _core
from byteps.errors import BytePSError


def main() -> int:
    """Run a server or the scheduler until the job ends.

    Returns:
        0 when every worker finished, 1 when the job failed (the reason is printed on stderr:
        a dead peer, a timeout, or a configuration error naming the variable).
    """
    try:
        _core.run_node()
    except BytePSError as err:
        print(f"byteps server/scheduler: {err}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _upstream_import_start() -> None:
    """``python -c 'import byteps.server'`` runs the node, as upstream did.

    An environment the core refuses (e.g. a bad value) does not pass in
    silence: :func:`main` prints the error and the process exits with status 1.
    """
    if sys.argv[:1] != ["-c"]:
        return
    try:
        role = _core.knob_values().get("DMLC_ROLE")
    except BytePSError:
        sys.exit(main())
    if role in ("server", "scheduler"):
        sys.exit(main())


_upstream_import_start()
