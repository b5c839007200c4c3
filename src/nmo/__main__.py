"""``python -m nmo`` is the ``nmo`` command."""

import sys

from nmo.cli import main

sys.exit(main())
