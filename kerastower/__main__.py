"""``python -m kerastower``: the same as the ``kerastower`` command."""

import sys

from kerastower.cli import main

sys.exit(main())
