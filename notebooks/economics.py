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
# # Provider prompt-caching economics: closed forms beside the simulation
#
# The seed priced one scenario: 200 prefixes of 10,000 tokens, 50,000 requests a day, $3 per
# million input tokens. Uncached that is **$1500/day**; with a 5-minute cache (writes 1.25x, reads
# 0.1x, TTL refreshed on every hit) **$874**; with the 1-hour cache (writes 2x) **$150**; with no
# write premium **$717**. Break-even hit rates: **21.7%**, **52.6%**, **0.0%**.
#
# Each number comes from two formulas (`cacheresearch.analysis.analytic`): the hit rate of a prefix requested
# as a Poisson process of rate lambda under a refreshed TTL, `1 - exp(-lambda TTL)`, and the cost
# multiplier `h r + (1 - h) w`. The `economics` study recomputes them and runs the same setting
# through the TTL cache engine (Poisson arrivals per prefix), with 95% intervals.
#
# Data: the dataset named by `CACHERESEARCH_RESULTS` (a `results.nc` or the run directory of
# `python -m cacheresearch.sweep experiment=economics`); when unset, a reduced run (fewer requests
# per cell, two seeds) goes to a temporary directory. The figure is saved next to the dataset.

# %%

import numpy as np

from cacheresearch import studies
from cacheresearch.studies.base import fig as figure
from cacheresearch.shell import report
from cacheresearch.analysis.analytic import break_even_hit_rate, cost_multiplier, ttl_refresh_hit
from cacheresearch.shell.sweep import notebook_dataset

REDUCED = ["experiment=economics", "seeds=2", "study.sim.target_requests=5000", "study.sim.prefixes=40",
           "study.sim.arrivals=[poisson,diurnal,bursty]"]

ds, out_dir = notebook_dataset(REDUCED)

assert ds.attrs["study_kind"] == "economics", ds.attrs.get("study_kind")
assert {"pricing", "requests_per_hour"} <= set(ds.dims), dict(ds.sizes)

# %% [markdown]
# ## The seed's numbers, from the formulas alone

# %%
lam = 50_000 / 200 / 86_400  # requests per second per prefix (10.42 per hour)
uncached = 50_000 * 10_000 * 3e-6
print(f"uncached ${uncached:.0f}/day")
for name, w, ttl in [("5-minute", 1.25, 300), ("1-hour", 2.0, 3600), ("no write premium", 1.0, 300)]:
    h = float(ttl_refresh_hit(lam, ttl))
    print(f"{name:17s} break-even {100 * float(break_even_hit_rate(w, 0.1)):.1f}%, hit rate {100 * h:.2f}%, "
          f"${uncached * float(cost_multiplier(h, w, 0.1)):.0f}/day")

# %% [markdown]
# ## The study's summary: analytic values with the simulated ones and their 95% intervals

# %%
print(studies.summarize(ds))

# %% [markdown]
# ## Analytic vs simulated, cell by cell
#
# `hit_rate_sim` uses an unbiased estimator (requests early enough that the next request of their
# prefix is observed; see `cacheresearch.studies`); `hit_rate_sim_all_requests` counts every request,
# including each prefix's cold first miss.

# %%
cols = ["hit_rate_analytic", "hit_rate_sim", "hit_rate_sim_ci_low", "hit_rate_sim_ci_high", "cost_multiplier_analytic",
        "cost_multiplier_sim", "daily_cost_usd"]
if "hit_rate_sim" in ds:
    cols.append("hit_rate_sim_all_requests")
    table = ds[[c for c in cols if c in ds]].to_dataframe().round(4)
    print(table.to_string())
else:
    print(ds[["hit_rate_analytic", "cost_multiplier_analytic", "daily_cost_usd"]].to_dataframe().round(4))

# %% [markdown]
# ## Figure: daily cost of the worked example's 200 prefixes at each request rate
#
# Lines: analytic daily cost; points: the cost at the simulated hit rate, with its 95% interval; the
# dotted line is the uncached cost.

# %%
fig = figure(7.5, 4.5)
ax = fig.subplots()
x = ds.requests_per_hour.values
ax.plot(x, ds.daily_cost_uncached_usd, "k:", label="uncached")
for i, n in enumerate(ds.pricing.values):
    s = ds.sel(pricing=n)
    ax.plot(x, s.daily_cost_usd, "-", color=f"C{i}", label=str(n))
    if "daily_cost_sim_usd" in ds:
        y = np.asarray(s.daily_cost_sim_usd)
        ax.errorbar(x, y, yerr=[y - np.asarray(s.daily_cost_sim_usd_ci_low), np.asarray(s.daily_cost_sim_usd_ci_high) - y],
                    fmt="o", ms=4, capsize=3, color=f"C{i}")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("requests per hour per prefix (200 prefixes x 10,000 tokens)")
ax.set_ylabel("USD per day")
ax.grid(True, alpha=0.3)
ax.legend(fontsize="small")
fig_path = report.save_figure(fig, out_dir / "economics_daily_cost.png")
print(f"figure: {fig_path}")
fig  # noqa: B018 - displays the figure in Jupyter
