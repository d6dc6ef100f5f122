"""``python -m benchmarks``: run the benchmarks and write the report (see :mod:`.cli`)."""

import sys

from .cli import main

sys.exit(main())
