"""Makes the repository root importable in every test session: the benchmark lab lives in the
top-level ``benchmarks`` package, which is not installed with byteps. Explicit, so it does not
depend on pytest's import mode or on the directory pytest is started from."""

import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
