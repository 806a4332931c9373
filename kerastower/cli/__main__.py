"""``python -m kerastower.cli``: the ``kerastower`` command line."""

import sys

from kerastower.cli.command import main

sys.exit(main())
