"""``python -m byteps.server``: run a server or the scheduler (by ``DMLC_ROLE``)."""

import sys

from byteps.server import main

sys.exit(main())
