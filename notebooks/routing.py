# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Routing with load and latency: the seed's design questions
#
# 200 tenants with 10,000-token prefixes, one of them hot (half of all traffic), 8 replicas; every
# router against load level, KV capacity and prompt layout. The questions: which router, what load
# cap on prefix affinity, which prompt layout. TTFT = queueing wait + prefill of the uncached suffix
# (`docs/fleet_semantics.md`); the replica speed is an assumption (the `h100_8b` preset).
#
# Data: the dataset named by `CACHERESEARCH_RESULTS` (a `results.nc` or the run directory of
# `python -m cacheresearch.sweep experiment=routing`); when unset, a reduced run goes to a temporary
# directory. The figures are saved next to the dataset.

# %%
import numpy as np

from cacheresearch.shell import report
from cacheresearch.shell.sweep import notebook_dataset

REDUCED = ["experiment=routing", "workload.tenant.n_tenants=20", "workload.tenant.prefix_tokens=1600",
           "workload.tenant.n_requests=300", "fleet.prefix_blocks=100", "grid.capacity_blocks=[800,3200]",
           "grid.rate_per_s=[4,16,32]"]

ds, out_dir = notebook_dataset(REDUCED)
assert ds.attrs["experiment"] == "routing", ds.attrs["experiment"]
assert {"router", "rate_per_s"} <= set(ds.dims), dict(ds.sizes)

# %% [markdown]
# ## The answers (summary of the run)

# %%
print(report.summarize(ds, "ttft_p99_s"))

# %% [markdown]
# ## Hit rate against tail latency at the top load
#
# Pure affinity (`prefix_hash`) has the best hit rate and the worst tail: the hot tenant's replica
# melts. Load-only routers balance but lose the cache. The cache-aware routers sit in the corner.

# %%
from matplotlib.figure import Figure  # noqa: E402

top = ds.sel(rate_per_s=ds.rate_per_s.values[-1])
if "layout" in top.dims:
    top = top.sel(layout="stable")
if "capacity_blocks" in top.dims:
    top = top.sel(capacity_blocks=top.capacity_blocks.values[-1])
fig = Figure(figsize=(6.5, 4.5), layout="constrained")
ax = fig.add_subplot()
for r in top.router.values:
    c = top.sel(router=r)
    ax.scatter(100 * float(c.token_hit_rate), float(c.ttft_p99_s), s=30)
    ax.annotate(str(r), (100 * float(c.token_hit_rate), float(c.ttft_p99_s)), fontsize=8)
ax.set_yscale("log")
ax.set_xlabel("token hit rate (%)")
ax.set_ylabel("TTFT p99 (s)")
ax.set_title(f"routers at {float(ds.rate_per_s.values[-1]):g} requests/s")
ax.grid(True, alpha=0.3)
path = out_dir / "routing_hit_vs_p99.png"
fig.savefig(path, dpi=110)
print("saved", path)
assert np.all(np.isfinite(top.ttft_p99_s.values))
