"""Bench case of the command line's refusals: how long a bad input takes to be reported, and with what memory.

``python -m cacheresearch.bench.refusals [--repeats N] [--json FILE]``. Each case is a real process,
``python -m cacheresearch.sweep ARGS``, started in an empty temporary directory (so no ``../shared`` is beside
it: ``experiment=tiers`` meets its missing default trace), timed from start to exit, its peak resident memory
read by GNU time (``/usr/bin/time -f %M``; NaN without it). Each row: the case, the median and the largest wall
seconds over ``--repeats`` runs, the peak RSS (MB), whether it exited with status 2 and one line on stderr naming
the cause, and that line. The target (issue 47): every case within 2 s, one line, the right cause; this runs in
no test (no test asserts a time), its figures go to ``docs/performance.md`` with the date and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["CASES", "refusal", "run_cases", "main"]

GNU_TIME = "/usr/bin/time"  # peak RSS of the child (``%M``); without it, NaN
_TRACE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "mini_agent.jsonl"  # 64-token blocks

#: (case, overrides, what the line must contain)
CASES = (
    ("bad_experiment", ["experiment=nope"], "experiment=nope: unknown experiment"),
    ("bad_key", ["cache.nokey=1"], "cache.nokey: unknown key"),
    ("bad_policy", ["cache.policy=nopol"], "cache.policy: unknown policy 'nopol'"),
    ("bad_router", ["grid.router=[random,sticky]"], "grid.router: unknown router 'sticky'"),
    ("missing_trace", ["experiment=replay", "trace.path=missing.jsonl"], "trace.path: file not found"),
    ("tiers_default_trace", ["experiment=tiers"], "study.trace.path: file not found"),
    ("wrong_block_size", ["experiment=replay", f"trace.path={_TRACE}", "trace.block_tokens=512"],
     "set trace.block_tokens=N"),
)


def refusal(args: list[str], needle: str, cwd: str) -> dict:
    """One run of ``python -m cacheresearch.sweep ARGS`` in ``cwd``: wall seconds, peak RSS (MB, GNU time's
    ``%M`` of the child: a child forked from this process would count this process's pages), exit status, its
    stderr's last line and whether it is the one expected."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [sys.executable, "-m", "cacheresearch.sweep", *args, f"hydra.run.dir={cwd}/out"]
    rss_file = Path(cwd) / "rss.txt"
    if Path(GNU_TIME).is_file():
        cmd = [GNU_TIME, "-f", "%M", "-o", str(rss_file), *cmd]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    rss = float(rss_file.read_text().split()[-1]) / 1024 if rss_file.is_file() else float("nan")
    return dict(wall_s=wall, status=p.returncode, line=lines[-1] if lines else "", rss_mb=rss,
                ok=p.returncode == 2 and len(lines) == 1 and needle in lines[0] and not p.stdout.strip())


def run_cases(repeats: int = 3, cases=CASES) -> list[dict]:
    """Every case ``repeats`` times: the median and the largest wall time, the largest peak RSS."""
    rows = []
    for name, args, needle in cases:
        with tempfile.TemporaryDirectory(prefix="refusal_") as d:
            runs = [refusal(args, needle, d) for _ in range(repeats)]
        short = str(_TRACE.relative_to(_TRACE.parents[2]))
        rows.append(dict(case=name, args=" ".join(args).replace(str(_TRACE), short),
                         wall_s=round(statistics.median(r["wall_s"] for r in runs), 2),
                         wall_max_s=round(max(r["wall_s"] for r in runs), 2),
                         rss_mb=round(max(r["rss_mb"] for r in runs), 1), ok=all(r["ok"] for r in runs),
                         within_2s=max(r["wall_s"] for r in runs) <= 2.0,
                         line=re.sub(r"\(looked at [^)]*\)", "(looked at ...)",  # no machine path kept
                                     runs[-1]["line"].replace(str(_TRACE), short))))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cacheresearch.bench.refusals", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (the median is reported)")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    a = ap.parse_args(argv)
    rows = run_cases(a.repeats)
    w = max(len(r["case"]) for r in rows)
    print(f"{'case'.ljust(w)}  wall s (max)   RSS MB  ok   line")
    for r in rows:
        print(f"{r['case'].ljust(w)}  {r['wall_s']:5.2f} ({r['wall_max_s']:4.2f})  {r['rss_mb']:7.1f}  "
              f"{'yes' if r['ok'] and r['within_2s'] else 'NO '}  {r['line'][:100]}", flush=True)
    if a.json:
        root = Path(__file__).resolve().parents[2]
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        Path(a.json).write_text(json.dumps(dict(date=time.strftime("%Y-%m-%d"), commit=git.stdout.strip(),
                                                python=sys.version.split()[0], cores=os.cpu_count(),
                                                repeats=a.repeats, rows=rows), indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
