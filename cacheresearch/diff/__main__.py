"""``python -m cacheresearch.diff``."""

import sys

from cacheresearch.diff import main

sys.exit(main())
