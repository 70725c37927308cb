"""The ``cacheresearch`` command (``cacheresearch.shell.cli``) and the one-line errors of the command line: a
user's mistake (an unknown experiment, key, option, policy or file) is one line on stderr naming the key and
what is allowed, exit status 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cacheresearch.shell import cli, guide
from cacheresearch.shell.overrides import check_overrides

ROOT = Path(__file__).resolve().parents[1]


def test_list_names_every_experiment_once(capsys):
    assert cli.main(["list"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.strip()][:-1]
    names = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml"))
    assert [x.split()[0] for x in lines] == names
    assert all(len(x.split(None, 1)) == 2 for x in lines)  # every line has its question


def test_show_routing_gives_question_knobs_and_variables(capsys):
    assert cli.main(["show", "routing"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("routing: ")
    assert "grid.router" in out and "grid.rate_per_s" in out and "cache.capacity_blocks" in out
    assert "python -m cacheresearch.sweep experiment=routing" in out
    assert "ttft_p99_s" in out and "token_hit_rate" in out


def test_show_a_study_lists_its_typed_defaults(capsys):
    assert cli.main(["show", "economics"]) == 0
    out = capsys.readouterr().out
    assert "study.sim.target_requests" in out and "study.pricings" in out


@pytest.mark.parametrize("argv, needle", [
    (["show", "nope"], "unknown experiment 'nope'"),
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["sweep", "experiment=nope"], "experiment=nope: unknown experiment; choose one of"),
    (["sweep", "nokey=1"], "nokey: unknown key; known top-level keys"),
    (["sweep", "cache.nokey=3"], "cache.nokey: unknown key; known keys of cache: ['block_tokens'"),
    (["sweep", "experiment=economics", "study.bogus=1"], "study.bogus: unknown key; known keys of study"),
    (["sweep", "replica=nope"], "replica=nope: unknown replica option; choose one of ['fcfs', 'vllm'"),
    (["sweep", "seeds=abc"], "seeds: Value 'abc'"),
    (["docs", "--record", "nope"], "docs --record: unknown experiment 'nope'"),
    (["docs", "--frobnicate"], "docs: unknown option '--frobnicate'"),
    (["sweep", "+cache.nokey=3"], "cache.nokey: unknown key; known keys of cache: ['block_tokens'"),
    (["sweep", "+engine.nokey=3"], "engine.nokey: unknown key; known keys of engine"),
])
def test_mistakes_are_one_line(capsys, argv, needle):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_docs_help_writes_nothing(capsys):
    before = {p: p.stat().st_mtime_ns for p in (Path(__file__).parents[1] / "docs" / "experiments").glob("*.md")}
    assert cli.main(["docs", "--help"]) == 0
    assert "cacheresearch docs" in capsys.readouterr().out
    assert before == {p: p.stat().st_mtime_ns for p in before}


def test_plain_overrides_pass_the_check():
    assert check_overrides(["experiment=routing", "hydra.run.dir=OUT", "seeds=2"]) is None
    assert check_overrides(["-m", "experiment=routing,seed_fleet"]) is None
    assert check_overrides(["experiment=llmd_blog,nope"]).startswith("experiment=nope: unknown experiment")


#: bad input, one line naming the key: three through the module's entry point (a process each: exit status 2,
#: the line last on stderr, no traceback), the rest through the same shell in this process
ENTRY_ERRORS = [
    (["experiment=nope"], "experiment=nope: unknown experiment"),
    (["experiment=seed_fleet", "cache.policy=nopol"], "cache.policy: unknown policy 'nopol'; choose one of"),
    (["experiment=replay", "trace.path=missing.jsonl"], "trace.path: file not found: missing.jsonl"),
]
SHELL_ERRORS = [
    (["experiment=seed_fleet", "grid.nokey=[1,2]"], "grid.nokey"),
    (["grid.policy=[lru,nopol]"], "grid.policy: unknown policy 'nopol'; choose one of"),
    (["cache.ttl_s=300"], "cache.ttl_s: a TTL is set but no policy of the grid ['lru'] has one"),
    (["grid.policy=[lru,sieve]", "grid.ttl_s=[60,300]"], "grid.ttl_s: a TTL is set but no policy of the grid"),
    (["fleet.knobs.s3fifo_small_pm=200"], "fleet.knobs.s3fifo_small_pm: a knob of the policies ['s3fifo'], none"),
    (["grid.policy=[sieve]", "grid.s3fifo_ghost_pm=[100,200]"], "grid.s3fifo_ghost_pm: a knob of the policies"),
]


@pytest.mark.parametrize("args, needle", SHELL_ERRORS)
def test_shell_errors_are_one_line(tmp_path, args, needle):
    from cacheresearch.shell.overrides import check_overrides  # noqa: PLC0415
    from cacheresearch.shell.sweep import run_experiment  # noqa: PLC0415

    msg = check_overrides(args)  # what the entry point prints before Hydra composes (None: the shell decides)
    if msg is None:
        with pytest.raises(ValueError) as e:  # noqa: PT011 - SweepError, a ValueError naming the key
            run_experiment(args + ["launch.progress=false"], tmp_path)
        msg = str(e.value)
    assert "\n" not in msg.strip() and needle in msg, msg[-2000:]


@pytest.mark.parametrize("args, needle", ENTRY_ERRORS)
def test_module_entry_point_errors_are_one_line(tmp_path, args, needle):
    p = subprocess.run([sys.executable, "-m", "cacheresearch.sweep", *args, f"hydra.run.dir={tmp_path}",
                        "launch.progress=false"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines and needle in lines[-1] and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_show_text_matches_the_guide():
    e = guide.experiment("seed_fleet")
    assert e.kind == "grid" and e.grid["policy"] == ["lru_plain", "lru"]
    assert "seed's fleet" in e.question and e.report["published"][0]["token_hit_rate"] == 0.837
