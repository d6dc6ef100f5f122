"""``python -m byteps.launch``: ``bpslaunch`` (:func:`byteps.launch.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
