"""`python -m mhsa.parity`: the same flags and report as `mhsa parity`."""

import sys

from mhsa.parity.command import main

sys.exit(main())
