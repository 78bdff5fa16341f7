"""``python -m zoo_core`` is the ``zoo`` command."""

import sys

from zoo_core.cli import main

sys.exit(main())
