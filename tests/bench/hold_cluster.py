"""Helper of test_cluster.py: hold an emulated cluster until a signal arrives.

``python hold_cluster.py PREFIX MODE``: builds a 2-worker/1-server cluster named PREFIX, starts
``sleep`` inside w0, prints ``READY <sleep pid>`` and waits (at most 60 s). MODE ``with``
relies on KeyboardInterrupt unwinding the ``with`` block (SIGINT); MODE ``handler`` installs
``install_signal_cleanup`` (SIGINT and SIGTERM).
"""

import faulthandler
import os
import signal
import sys
import time

# Run as a script (sys.path[0] is tests/bench): the benchmarks package is at the repository root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.cluster import EmulatedCluster, install_signal_cleanup

prefix, mode = sys.argv[1], sys.argv[2]
# A process started from a background job of a non-interactive shell inherits SIGINT ignored,
# and Python then installs no KeyboardInterrupt handler: the "with" mode would sleep through the
# signal (seen in CI runs started in the background). Restore Python's default handler.
signal.signal(signal.SIGINT, signal.default_int_handler)
if mode == "handler":
    install_signal_cleanup()
with EmulatedCluster(2, 1, 100e6, prefix=prefix) as cluster:
    child = cluster.spawn("w0", ["sleep", "60"])
    print("READY", child.pid, flush=True)
    # Should the signal not end this process, every thread's stack goes to stderr before the
    # test gives up, for the test's failure message.
    faulthandler.dump_traceback_later(20, repeat=True)
    time.sleep(60)
sys.exit(3)  # not reached when the signal arrives
