"""The ``cacheresearch`` command (pyproject ``[project.scripts]``): find your way, then run.

::

    cacheresearch list                 # every experiment, one line each
    cacheresearch show NAME            # its question, command, knobs with defaults, output variables
    cacheresearch sweep [KEY=VALUE..]  # = python -m cacheresearch.sweep (Hydra overrides)
    cacheresearch bench [ARGS..]       # = python -m cacheresearch.bench
    cacheresearch diff A B [ARGS..]    # = python -m cacheresearch.diff
    cacheresearch docs [--check]       # write (or check) docs/experiments/*.md from the configs
    cacheresearch docs --record [NAME ...]  # rerun the small record runs: docs/experiments/variables.json
    cacheresearch docs --compat [--check]   # write (or check) docs/compatibility.md from the engine's checks

``python -m cacheresearch.sweep ...`` and the other module entry points keep working; the subcommands call
the same functions. A user's mistake is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

USAGE = ("usage: cacheresearch {list,show NAME,sweep [KEY=VALUE ...],bench [ARGS],diff A B [ARGS],"
         "docs [--check|--record|--compat]}")


def _err(msg: str) -> int:
    print(f"cacheresearch: error: {msg}", file=sys.stderr)
    return 2


def _list() -> int:
    from cacheresearch.shell import guide  # noqa: PLC0415

    exps = guide.experiments(defaults=False)
    w = max(len(e.name) for e in exps)
    for e in exps:
        print(f"{e.name.ljust(w)}  {e.description}")
    print(f"\n{len(exps)} experiments; `cacheresearch show NAME` for one, "
          "`cacheresearch sweep experiment=NAME` to run it.")
    return 0


def _show(args: list[str]) -> int:
    from cacheresearch.shell import guide  # noqa: PLC0415

    if len(args) != 1:
        return _err(f"show takes one experiment name; choose one of {guide.names()}")
    try:
        print(guide.show_text(guide.experiment(args[0])))
    except guide.UnknownExperiment as e:
        return _err(str(e))
    return 0


def _sweep(args: list[str]) -> int:
    from cacheresearch.shell.overrides import check_overrides  # noqa: PLC0415

    msg = check_overrides(args)
    if msg:
        return _err(msg)
    from cacheresearch.shell.sweep import main as sweep_main  # noqa: PLC0415

    sys.argv = ["cacheresearch sweep", *args]
    try:
        sweep_main()
    except SystemExit as e:  # Hydra's main exits; keep its status
        return int(e.code or 0) if not isinstance(e.code, str) else _err(e.code)
    return 0


def _compat(check: bool) -> int:
    from cacheresearch.shell import compat  # noqa: PLC0415

    text = compat.page()
    if check:
        if not compat.DOC.is_file() or compat.DOC.read_text(encoding="utf-8") != text:
            return _err("docs/compatibility.md is out of date; run `cacheresearch docs --compat`")
        print("docs/compatibility.md is up to date")
        return 0
    compat.DOC.write_text(text, encoding="utf-8")
    print("wrote docs/compatibility.md")
    return 0


def _docs(args: list[str]) -> int:
    from cacheresearch.shell import guide  # noqa: PLC0415

    if "-h" in args or "--help" in args:
        print(__doc__.strip())
        return 0
    flags = [a for a in args if a.startswith("-")]
    bad = [a for a in flags if a not in ("--check", "--record", "--compat")]
    if bad:
        return _err(f"docs: unknown option {bad[0]!r}; choose from --check, --record [NAME ...], --compat")
    if [a for a in args if not a.startswith("-")] and "--record" not in args:
        return _err("docs: experiment names go with --record (cacheresearch docs --record NAME ...)")
    if "--compat" in args:
        return _compat("--check" in args)
    if "--record" in args:
        from cacheresearch.shell.record import RECORD_RUNS, record  # noqa: PLC0415

        names = [a for a in args if not a.startswith("--")]
        unknown = [n for n in names if n not in RECORD_RUNS]
        if unknown:
            return _err(f"docs --record: unknown experiment {unknown[0]!r}; choose from {sorted(RECORD_RUNS)}")
        record(names or None, log=lambda m: print(m, file=sys.stderr))
    if "--check" in args:
        stale = [f for f, t in guide.pages().items()
                 if not (guide.DOCS_DIR / f).is_file() or (guide.DOCS_DIR / f).read_text(encoding="utf-8") != t]
        if stale:
            return _err(f"docs/experiments is out of date: {stale}; run `cacheresearch docs`")
        print("docs/experiments is up to date")
        return 0
    for p in guide.write_pages():
        print(f"wrote {p.relative_to(guide.REPO)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        print(__doc__.split("::", 1)[1].split("``python -m")[0].rstrip())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "list":
        return _list()
    if cmd == "show":
        return _show(rest)
    if cmd == "sweep":
        return _sweep(rest)
    if cmd == "bench":
        from cacheresearch.bench import main as bench_main  # noqa: PLC0415

        return int(bench_main(rest) or 0)
    if cmd == "diff":
        from cacheresearch.diff import main as diff_main  # noqa: PLC0415

        return int(diff_main(rest) or 0)
    if cmd == "docs":
        return _docs(rest)
    return _err(f"unknown command {cmd!r}; choose one of ['list', 'show', 'sweep', 'bench', 'diff', 'docs']")


if __name__ == "__main__":
    sys.exit(main())
