"""``python -m warpdata``: same as the ``warp`` command."""

import sys

from warpdata.cli.app import main

sys.exit(main())
