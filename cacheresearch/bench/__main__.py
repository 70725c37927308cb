"""``python -m cacheresearch.bench``."""

import sys

from cacheresearch.bench import main

sys.exit(main())
