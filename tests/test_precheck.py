"""Inputs checked before any work and before the engines are imported (issue 47): the name lists the shell checks
against equal the registries; every bad name, missing file, wrong block size or corrupt trace line is one line
naming the key and the cause, exit status 2; the check imports no JAX, numba or xarray (the time it takes is
the bench's: ``python -m cacheresearch.bench.refusals``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cacheresearch.shell import names
from cacheresearch.shell.overrides import check_overrides

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
AGENT = FIX / "mini_agent.jsonl"  # 64-token blocks
MOONCAKE = FIX / "mini_mooncake.jsonl"  # 512-token blocks


def test_name_lists_equal_the_registries():
    """Each list of shell/names.py is a copy of a registry (importing one imports JAX): update the list."""
    from cacheresearch import studies  # noqa: PLC0415
    from cacheresearch.cache.policies import POLICIES  # noqa: PLC0415
    from cacheresearch.core.params import STEP_PRESETS  # noqa: PLC0415
    from cacheresearch.core.run import BACKENDS  # noqa: PLC0415
    from cacheresearch.core.simulate import SCHEDULERS  # noqa: PLC0415
    from cacheresearch.engine import KNOBS, LATENCY_PRESETS  # noqa: PLC0415
    from cacheresearch.routers import PRESETS, ROUTERS  # noqa: PLC0415
    from cacheresearch.workload.keys import SALT_MODES  # noqa: PLC0415

    for name, copy, registry in (
            ("policy_names()", names.policy_names(), POLICIES), ("ROUTER_NAMES", names.ROUTER_NAMES, ROUTERS),
            ("PRESET_NAMES", names.PRESET_NAMES, PRESETS), ("KNOB_NAMES", names.KNOB_NAMES, KNOBS),
            ("STUDY_NAMES", names.STUDY_NAMES, ["grid", *(k for k in studies.REGISTRY if k != "grid")]),  # the
            # shell registers grid when it is imported
            ("SCHEDULER_NAMES", names.SCHEDULER_NAMES, SCHEDULERS), ("STEP_PRESET_NAMES", names.STEP_PRESET_NAMES,
                                                                     STEP_PRESETS),
            ("BACKEND_NAMES", names.BACKEND_NAMES, BACKENDS),
            ("LATENCY_PRESET_NAMES", names.LATENCY_PRESET_NAMES, LATENCY_PRESETS),
            ("SALT_NAMES", names.SALT_NAMES, SALT_MODES)):
        assert list(copy) == list(registry), f"cacheresearch/shell/names.py {name}: update it to {list(registry)}"


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def bad_traces(tmp_path):
    """The 64-token agent fixture with line 31 short of three ids, and with line 41 cut in the middle."""
    lines = AGENT.read_text().splitlines()
    o = json.loads(lines[30])
    o["hash_ids"] = o["hash_ids"][:-3]
    short = _write_lines(tmp_path / "short.jsonl", lines[:30] + [json.dumps(o)] + lines[31:])
    cut = _write_lines(tmp_path / "cut.jsonl", lines[:40] + [lines[40][:50]] + lines[41:])
    return short, cut


# (overrides, the cause in the line); run from a directory with no ../shared beside it
CASES = [
    (["kind=nope"], "kind: unknown study 'nope'; choose one of"),
    (["cache.policy=nopol"], "cache.policy: unknown policy 'nopol'; choose one of"),
    (["grid.policy=[lru,nopol]"], "grid.policy: unknown policy 'nopol'"),
    (["fleet.router=bogus"], "fleet.router: unknown router 'bogus': choose a rule"),
    (["grid.router=[random,sticky]"], "grid.router: unknown router 'sticky'"),
    (["engine.backend=gpu"], "engine.backend='gpu': choose one of ['auto', 'jax', 'numba']"),
    (["grid.layout=[sideways]"], "grid.layout: unknown layout 'sideways'"),
    (["workload.source=csv"], "workload.source: unknown source 'csv'"),
    (["experiment=tiers"], "study.trace.path: file not found: ../shared/traces/agentic_coding_sessions.jsonl"),
    (["experiment=ttl_trace"], "experiment=ttl_trace needs trace.path=FILE"),
    (["experiment=fit", "trace.path=../shared/traces/mooncake_synthetic_trace.jsonl"],
     "trace.path: file not found: ../shared/traces/mooncake_synthetic_trace.jsonl"),
    (["experiment=replay"], "workload.source=trace needs trace.path=FILE"),
    (["experiment=replay", "trace.path=missing.jsonl"], "trace.path: file not found: missing.jsonl"),
    (["experiment=policy_curves"], "study.traces is required: 'study.traces=[PATH[:BLOCK_TOKENS],...]'"),
    (["experiment=policy_curves", f"study.traces=[{MOONCAKE}:512,nope.jsonl]"], "study.traces (nope.jsonl): file"),
    (["experiment=granularity", "study.trace_path=nope.jsonl"], "study.trace_path: file not found: nope.jsonl"),
    (["experiment=replay", "workload.source=fitted"], "workload.source=fitted needs workload.fitted.path=FILE"),
    (["experiment=replay", "workload.source=fitted", "workload.fitted.path=OUT/results.nc"],
     "workload.fitted.path: file not found: OUT/results.nc"),
    (["experiment=llmd_benchmark", "llmd.inference_perf=ip.yaml"], "llmd.inference_perf: file not found: ip.yaml"),
    (["experiment=llmd_benchmark", "+llmd.epp.precise=epp.yaml"], "llmd.epp.precise: file not found: epp.yaml"),
    (["replica.model=cfg/config.json", "replica.gpu=h100_80gb"], "replica.model: file not found: cfg/config.json"),
    (["experiment=replay", f"trace.path={AGENT}", "trace.block_tokens=512"],
     "mini_agent.jsonl:1: field 'hash_ids': has 23 ids but input_length 1436 with block_tokens 512"),
    (["experiment=ttl_trace", f"trace.path={AGENT}", "trace.block_tokens=512"], "that fit this line: [64]"),
]


@pytest.mark.parametrize("args, needle", CASES)
def test_bad_input_is_one_line_before_any_work(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)  # no ../shared here
    msg = check_overrides(args)
    assert msg is not None and "\n" not in msg and needle in msg, msg


def test_missing_shared_traces_say_where_to_get_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    msg = check_overrides(["experiment=tiers"])
    assert "kv-cache-tester" in msg and "64-token blocks" in msg and "'study.workloads=[design]'" in msg, msg
    assert check_overrides(["experiment=tiers", "study.workloads=[design]"]) is None
    msg = check_overrides(["experiment=fit", "trace.path=../shared/traces/mooncake_synthetic_trace.jsonl"])
    assert "FAST25-release/traces" in msg and "512-token blocks" in msg, msg


def test_block_size_errors_name_the_line_and_the_key(bad_traces):
    short, cut = bad_traces
    for exp in ("replay", "ttl_trace", "fit"):  # the block size inferred: the line that fits none is itself
        msg = check_overrides([f"experiment={exp}", f"trace.path={short}"])
        assert "short.jsonl:31: field 'hash_ids': has 44 ids for input_length 2999" in msg, msg
        assert "lines 1-30 ([64])" in msg and "set trace.block_tokens=N" in msg, msg
        msg = check_overrides([f"experiment={exp}", f"trace.path={cut}"])
        assert "cut.jsonl:41: invalid JSON" in msg and "block_tokens 512" not in msg, msg
    msg = check_overrides(["experiment=tiers", f"study.trace.path={AGENT}", "study.agent.block_tokens=16",
                           "study.workloads=[agent]"])
    assert msg.startswith("study.trace.path: ") and "set study.agent.block_tokens=N (or null: inferred)" in msg, msg
    msg = check_overrides(["experiment=policy_curves", f"study.traces=[{AGENT}:512]"])
    assert f"give it in study.traces as {AGENT}:BLOCK_TOKENS" in msg, msg


def test_good_inputs_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["experiment=replay", f"trace.path={AGENT}"], ["experiment=ttl_trace", f"trace.path={MOONCAKE}"],
                 ["experiment=policy_curves", f"study.traces=[{MOONCAKE}:512,{AGENT}]"],
                 ["experiment=tiers", f"study.trace.path={AGENT}"], ["experiment=routing"],
                 ["experiment=llmd_benchmark"],
                 ["experiment=routing", "grid.router=[random,chwbl_c2]"]):  # a fleet.variants name
        assert check_overrides(args) is None, args


def test_hydra_launchers_of_installed_plugins_are_known():
    """``hydra/launcher=joblib`` and ``submitit_local`` (README's launchers, from Hydra's plugins, not ``configs/``)
    pass the group check; a launcher nobody provides is one line naming them all."""
    from cacheresearch.shell.overrides import group_options

    opts = group_options("hydra/launcher")
    assert {"ray_local", "ray_cluster", "slurm", "basic"} <= set(opts), opts
    for name in ("joblib", "submitit_local"):
        if name in opts:  # the plugin is installed (the test extras install it)
            assert check_overrides(["-m", f"hydra/launcher={name}", "launch.part=0,1", "launch.parts=2"]) is None
    msg = check_overrides(["-m", "hydra/launcher=nosuch"])
    assert msg.startswith("hydra/launcher=nosuch: unknown hydra/launcher option") and "basic" in msg, msg


def test_the_check_imports_no_engine(tmp_path):
    """What the command line loads before it refuses: the schema, the name lists, Hydra, and numpy for a trace's
    first lines; not JAX, numba or xarray (importing them is what made a refusal take 5-15 s)."""
    code = ("import sys; from cacheresearch.shell.overrides import check_overrides; "
            f"print(check_overrides(['experiment=replay', 'trace.path={AGENT}', 'trace.block_tokens=512'])); "
            "print(check_overrides(['experiment=tiers'])); print(check_overrides(['cache.policy=nopol'])); "
            "print(sorted(m for m in ('jax', 'numba', 'xarray', 'scipy', 'matplotlib') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    out = p.stdout.splitlines()
    assert p.returncode == 0 and len(out) == 4, p.stderr[-2000:]
    assert "block_tokens 512" in out[0] and "study.trace.path" in out[1] and "nopol" in out[2]
    assert out[3] == "[]", out


@pytest.mark.parametrize("args, needle", [
    (["experiment=tiers"], "study.trace.path: file not found"),
    (["experiment=nope"], "experiment=nope: unknown experiment"),
    (["grid.router=[random,sticky]"], "grid.router: unknown router 'sticky'"),
])
def test_entry_point_refuses_with_one_line_and_status_2(tmp_path, args, needle):
    p = subprocess.run([sys.executable, "-m", "cacheresearch.sweep", *args, f"hydra.run.dir={tmp_path / 'out'}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and needle in lines[0], p.stderr[-2000:]
    assert lines[0].startswith("cacheresearch.sweep: error: ") and not (tmp_path / "out").exists()


def test_run_prechecks_too(tmp_path, monkeypatch):
    """In process (run_experiment, a multirun's jobs): the same line, as a SweepError, before the study starts."""
    from cacheresearch.shell.sweep import SweepError, run_experiment  # noqa: PLC0415

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SweepError, match=r"^study\.trace\.path: file not found: \.\./shared/traces/agentic"):
        run_experiment(["experiment=tiers"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tiers_reads_the_agent_trace_before_the_design_half_runs(tmp_path, monkeypatch):
    """The study itself (past the precheck: a multirun job, a caller of run_study) reads every workload before
    the first one runs: a bad trace fails before the design half's engine is called."""
    from cacheresearch.shell.sweep import compose_config  # noqa: PLC0415
    from cacheresearch.studies import run_study  # noqa: PLC0415
    from cacheresearch.studies import tiers as T  # noqa: PLC0415
    from cacheresearch.studies.base import StudyError  # noqa: PLC0415

    def no_run(*a, **k):
        raise AssertionError("the design half ran before the agent trace was read")

    monkeypatch.setattr(T, "run_tiers", no_run)
    lines = AGENT.read_text().splitlines()
    bad = _write_lines(tmp_path / "agent.jsonl", lines[:20] + ["{not json"] + lines[21:])
    cfg = compose_config(["experiment=tiers", f"study.trace.path={bad}", "study.design.n_requests=50"])
    with pytest.raises(StudyError, match=r"^study\.trace\.path: .*agent\.jsonl:21: invalid JSON"):
        run_study(cfg)


def test_progress_lines_when_stderr_is_not_a_terminal(capsys):
    """A sweep's stderr redirected (a log file, a batch job): the chunks' progress as plain lines, not a bar that
    tqdm would hide; none when launch.progress=false."""
    import io  # noqa: PLC0415

    from cacheresearch.shell.chunks import ProgressLines, progress_bar  # noqa: PLC0415

    bar = progress_bar(10, None)  # pytest's stderr is not a terminal
    assert isinstance(bar, ProgressLines)
    out = io.StringIO()
    lines = ProgressLines(10, every_s=0.0, stream=out)
    for k in range(2):
        lines.set_postfix_str(f"chunk {k + 1}/2")
        lines.update(5)
    got = out.getvalue().splitlines()
    assert got[0].startswith("sweep: 5/10 configurations (chunk 1/2), ") and "s left" in got[0]
    assert got[1].startswith("sweep: 10/10 configurations (chunk 2/2), ") and "left" not in got[1]
    quiet = ProgressLines(10, every_s=3600.0, stream=out)  # at most one line per every_s, and the last one
    quiet.update(5)
    quiet.update(5)
    extra = out.getvalue().splitlines()[2:]
    assert len(extra) == 1 and extra[0].startswith("sweep: 10/10 configurations"), extra
    assert progress_bar(10, False).disable and not capsys.readouterr().err.strip()


def test_the_check_reads_a_trace_as_the_run_will(tmp_path):
    """trace.sort and trace.max_requests apply to the check too: it refuses nothing the run would read."""
    rows = [json.loads(x) for x in MOONCAKE.read_text().splitlines()[:10]]
    rows[3]["timestamp"] = rows[6]["timestamp"] + 5  # out of order
    p = _write_lines(tmp_path / "log.jsonl", [json.dumps(r) for r in rows] + ["{cut"])
    msg = check_overrides(["experiment=replay", f"trace.path={p}"])
    assert "log.jsonl:5: field 'timestamp': timestamps must be non-decreasing" in msg, msg
    msg = check_overrides(["experiment=replay", f"trace.path={p}", "trace.sort=true"])
    assert "log.jsonl:11: invalid JSON" in msg, msg  # sorted: the next problem is the cut last line
    for exp in ("replay", "ttl_trace"):
        assert check_overrides([f"experiment={exp}", f"trace.path={p}", "trace.sort=true",
                                "trace.max_requests=10"]) is None


def test_replay_infers_the_block_size(tmp_path):
    """experiment=replay on a 64-token trace with no trace.block_tokens: the sizes fit, the run uses 64 (it used to
    refuse at 512 with no hint), and hardware capacity counts blocks of 64 tokens."""
    from cacheresearch.replica.hardware import kv_blocks  # noqa: PLC0415
    from cacheresearch.shell.sweep import compose_config, make_plan, run_experiment  # noqa: PLC0415

    ds = run_experiment(["experiment=replay", f"trace.path={AGENT}", "launch.progress=false"], tmp_path)
    assert json.loads(ds.attrs["workload"])[0]["block_tokens"] == 64
    plan = make_plan(compose_config(["experiment=replay", f"trace.path={AGENT}", "replica.gpu=h100_80gb",
                                     "replica.model=llama3_8b", "cache.capacity_blocks=null"]))
    assert plan.base["capacity_blocks"] == kv_blocks("llama3_8b", "h100_80gb", block_tokens=64)
