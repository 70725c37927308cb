"""``python -m cacheresearch.routers [FILE]``: write the routers table (``docs/routers.md``) from the registry.

Without ``FILE`` the table is printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cacheresearch.core.params import LATENCY_KNOBS
from cacheresearch.routers.registry import markdown_table

if __name__ == "__main__":
    text = markdown_table(extra_knobs=LATENCY_KNOBS)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        sys.stdout.write(text)
