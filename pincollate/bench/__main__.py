"""``python -m pincollate.bench``: the benchmark's command line."""

import sys

from . import main

sys.exit(main())
