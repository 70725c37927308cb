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
# # The seed's fleet table
#
# Eight tenants share a 1,200-token system prompt; each tenant has an 800-token document; every
# request adds 60 unique user tokens (2,000 requests, 16-token blocks). Four replicas hold 400
# blocks each. The seed's snippet (plain LRU, blocks touched in prompt order) printed a token hit
# rate of **83.7%** with random routing, **96.8%** with prefix-aware routing and **0.0%** with a
# timestamp at the top of the prompt. Here the same table is recomputed over 8 seeds, next to
# leaf-first LRU (vLLM / SGLang eviction order).
#
# Data: the dataset named by `CACHERESEARCH_RESULTS` (a `results.nc` or the run directory of
# `python -m cacheresearch.sweep experiment=seed_fleet`); when unset, a reduced run (fewer requests
# and seeds) goes to a temporary directory. The figure is saved next to the dataset.
#
# Run as a script (`python notebooks/seed_fleet.py`) or open with jupytext.

# %%

from cacheresearch.shell import report
from cacheresearch.shell.sweep import notebook_dataset

REDUCED = ["experiment=seed_fleet", "workload.fleet.n_requests=300", "seeds=3"]

ds, out_dir = notebook_dataset(REDUCED)

assert ds.attrs["experiment"] == "seed_fleet", ds.attrs["experiment"]
assert {"policy", "router", "layout"} <= set(ds.dims), dict(ds.sizes)

# %% [markdown]
# ## Summary: the table, the published numbers, and the effect of leaf-first eviction

# %%
print(report.summarize(ds))

# %% [markdown]
# ## Per-seed token hit rates (stable layout)
#
# Both policies see the same requests and the same random routing on each seed, so the per-seed
# difference isolates the eviction order.

# %%
stable = ds.token_hit_rate.sel(layout="stable")
per_seed = (100 * stable).round(2).to_dataframe().unstack("policy")["token_hit_rate"]
if "seed" in ds.dims:
    per_seed["lru - lru_plain"] = per_seed["lru"] - per_seed["lru_plain"]
print(per_seed.to_string())

# %% [markdown]
# ## Figure: grouped bars per router and layout, one bar per policy, error bars = std over seeds

# %%
fig = report.bar_chart(ds, "token_hit_rate", hue="policy")
fig_path = report.save_figure(fig, out_dir / "seed_fleet_bars.png")
print(f"figure: {fig_path}")
fig  # noqa: B018 - displays the figure in Jupyter
