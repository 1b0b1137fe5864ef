"""``python -m warpdata``: same as the ``warp`` command."""

import sys

from warpdata.cli import main

sys.exit(main())
