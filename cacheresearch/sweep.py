"""The entry point: ``python -m cacheresearch.sweep experiment=NAME`` (the shell: :mod:`cacheresearch.shell`).

Run as a program, it checks the overrides and the composed configuration first (names, files, traces:
:func:`cacheresearch.shell.overrides.check_overrides`, no engine imported), so that a mistake is one line in
well under 2 s; only then does it import the shell and run. The shell's names (``main``, ``run``,
``run_experiment``, ``compose_config``, ``SweepError``) are loaded from :mod:`cacheresearch.shell.sweep` on
first use."""

from __future__ import annotations

import importlib

_SHELL = ("SweepError", "compose_config", "main", "run", "run_experiment")


def __getattr__(name: str):
    if name in _SHELL:
        return getattr(importlib.import_module("cacheresearch.shell.sweep"), name)
    raise AttributeError(f"module 'cacheresearch.sweep' has no attribute {name!r}")


if __name__ == "__main__":
    import sys

    from cacheresearch.shell.overrides import check_overrides

    _msg = check_overrides(sys.argv[1:])  # a user's mistake: one line naming the key, not Hydra's ten
    if _msg:
        print(f"cacheresearch.sweep: error: {_msg}", file=sys.stderr)
        sys.exit(2)
    importlib.import_module("cacheresearch.shell.sweep").main()
