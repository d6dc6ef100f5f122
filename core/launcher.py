"""Moved: ``bpslaunch`` is :mod:`byteps.launch.cli` (run it as ``bpslaunch`` or ``python -m
byteps.launch``); the plans are :mod:`byteps.launch.local` and :mod:`byteps.launch.upstream`,
the shared pieces :mod:`byteps.launch.common`.

This module re-exports their names, and ``python -m byteps.launcher`` still runs
``bpslaunch``, for one release: it goes after the next one.
"""

import sys

from .launch.cli import main
from .launch.common import (  # noqa: F401
    DEFAULT_GRACE,
    LOCAL_MODE_VARS,
    ChildSpec,
    LaunchError,
    check_job_shape,
    cleanup_shm,
    default_server_argv,
    find_free_port,
    parse_env_pairs,
)
from .launch.contract import ROLES  # noqa: F401
from .launch.local import build_local_plan  # noqa: F401
from .launch.upstream import (  # noqa: F401
    build_upstream_plan,
    upstream_is_distributed,
    validate_upstream_env,
)

if __name__ == "__main__":
    sys.exit(main())
