"""The record behind ``docs/experiments/variables.json``: every experiment run small, its variables' names,
dimensions, ``long_name`` and ``units`` written down (``cacheresearch docs --record``). ``tests/test_cf_attrs.py``
reruns a representative set of these runs and checks them against the record and the CF attributes."""

from __future__ import annotations

import json

from cacheresearch.shell.guide import REPO, VARIABLES_FILE

__all__ = ["RECORD_RUNS", "variables_of", "record"]

_FIX = REPO / "tests" / "fixtures"
_MM = f"trace.path={_FIX / 'mini_mooncake.jsonl'}"
_TENANT = ["workload.tenant.n_tenants=12", "workload.tenant.prefix_tokens=640", "workload.tenant.n_requests=120",
           "fleet.prefix_blocks=40", "fleet.replicas=4"]
_BLOG = ["workload.tenant.n_tenants=6", "workload.tenant.prefix_tokens=320", "workload.tenant.query_tokens=64",
         "workload.tenant.duration_s=4", "fleet.replicas=2", "fleet.prefix_blocks=20", "grid.rate_per_s=[20]"]

#: experiment -> overrides of a small run with the same variables as the full one (None: not recorded here)
RECORD_RUNS: dict[str, list[str] | None] = {
    "seed_fleet": ["workload.fleet.n_requests=64"],
    "routing": [*_TENANT, "grid.capacity_blocks=[800]", "grid.rate_per_s=[4]", "grid.router=[random,prefix_hash]",
                "grid.layout=[stable]"],
    "hot_tenant": [*_TENANT, "grid.rate_per_s=[4]"],
    "llmd_blog": [*_BLOG, "workload.tenant.output_tokens=8", "cache.capacity_blocks=120", "engine.queue_slots=64",
                  "fleet.knobs.max_num_seqs=8", "grid.router=[precise,random]"],
    "llmd_blog_fcfs": _BLOG,
    "replay": [_MM, "trace.block_tokens=512"],
    "economics": ["study.requests_per_hour=[6,60]", "study.sim.target_requests=1500", "study.sim.prefixes=20",
                  "study.sim.arrivals=[poisson]"],
    "ttl": ["study.rates_per_hour=[6,30]", "study.ttl_s=[300]", "study.arrivals=[poisson]",
            "study.target_requests=1500", "study.duration_s=21600"],
    "che": ["study.n_prefixes=100", "study.n_requests=2000", "study.capacity_blocks=[60,240]",
            "study.routers=[single,prefix_hash]", "study.replicas=2"],
    "ttl_advisor": ["study.design.n_tenants=20", "study.design.n_requests=1000",
                    "study.scenarios.zipf_low_traffic.n_requests=300"],
    "capacity": [],
    "fit": [_MM, "study.capacity_points=3", "study.max_kinds=2"],
    "mooncake_fig9": [_MM, "study.mark_tokens=51200"],
    "mooncake_fig10": [_MM, "study.nodes=4", "study.node_tokens=[10240]"],
    "mooncake_table1": [_MM, "study.capacities=[inf,40]", "study.policies=[lru,lfu]"],
    "ttl_trace": [f"trace.path={_FIX / 'ttl_trace.jsonl'}", "study.top_roots=3"],
    "policy_curves": [f"study.traces=[{_FIX / 'mini_mooncake.jsonl'}:512]", "study.points=3", "study.max_requests=60"],
    "volatile": [], "events": [], "granularity": [], "hosted": [], "isolation": [], "audit": [], "layouts": [],
    "llmd_benchmark": [], "llmd_benchmark_37": [],
    "tune": ["workload.tenant.n_tenants=12", "workload.tenant.prefix_tokens=640", "workload.tenant.query_tokens=64",
             "workload.tenant.output_tokens=16", "workload.tenant.n_requests=240", "workload.tenant.rate_per_s=40",
             "fleet.replicas=4", "fleet.prefix_blocks=40", "cache.capacity_blocks=200", "engine.queue_slots=64",
             "tune.population=4", "tune.generations=2", "tune.holdout_seeds=2", "tune.progress=false",
             "~tune.knobs.chwbl_c_pct", "tune.knobs.router.values=[random,least_loaded,prefix_hash]",
             "tune.knobs.capacity_blocks={low:40,high:400,grid:[40,120,400]}"],
    "disagg": ["study.workload.n_tenants=6", "study.workload.prefix_tokens=160", "study.workload.suffix_tokens=40",
               "study.workload.n_requests=60", "study.workload.output_tokens=8", "study.replicas=3",
               "study.vllm.capacity_blocks=200", "study.vllm.max_num_seqs=8", "study.vllm.queue_slots=64",
               "grid.pd=[agg,'1:2']", "grid.router=[llmd_precise]", "grid.link_gbps=[50.0]", "grid.rate_per_s=[20.0]"],
    "tune_llmd": ["llmd.max_requests_per_stage=12", "tune.population=2", "tune.generations=1", "tune.progress=false"],
    "tiers": [f"study.trace.path={_FIX / 'mini_agent.jsonl'}", "study.gpu_blocks=60", "study.design.n_tenants=12",
              "study.design.prefix_tokens=640", "study.design.n_requests=150", "study.design.rate_per_s=4.0",
              "study.design.replicas=3", "study.agent.replicas=2", "grid.cpu_capacity_blocks=[0,1.0,200]",
              "grid.cpu_gbps=[2.0,50.0]", "grid.router=[random,tier_scorer]"],
}


def variables_of(ds) -> dict:
    """{variable or coordinate: {dims, long_name, units}} of a dataset, data variables first."""
    out = {}
    for v in [*ds.data_vars, *ds.coords]:
        a = ds[v].attrs
        out[str(v)] = {"dims": [str(d) for d in ds[v].dims], "label": ds[v].dtype.kind in "OSU",
                       **{k: str(a[k]) for k in ("long_name", "units") if k in a}}
    return out


def record(names=None, log=print) -> dict:
    """Run the record runs (``names``: all) and write ``docs/experiments/variables.json``."""
    from cacheresearch.shell.sweep import compose_config, run  # noqa: PLC0415

    rec = json.loads(VARIABLES_FILE.read_text(encoding="utf-8")) if VARIABLES_FILE.is_file() else {}
    for name in names or list(RECORD_RUNS):
        over = RECORD_RUNS.get(name)
        if over is None:
            continue
        cfg = compose_config([f"experiment={name}", *over, "output.figure=false", "launch.progress=false"])
        ds = run(cfg, None, write=False)
        rec[name] = variables_of(ds)
        log(f"recorded {name}: {len(ds.data_vars)} variables")
    VARIABLES_FILE.parent.mkdir(parents=True, exist_ok=True)
    VARIABLES_FILE.write_text(json.dumps(dict(sorted(rec.items())), indent=1) + "\n", encoding="utf-8")
    return rec
