"""Studies: every experiment is one (:class:`~cacheresearch.studies.base.Study`), registered here by name.

``python -m cacheresearch.sweep experiment=NAME`` runs the study named by the experiment config's
``kind`` (``grid`` when absent: the sweeps over ``grid.*`` axes)
through one pipeline (:mod:`cacheresearch.shell.pipeline`): chunks, resume, atomic writes, the plan line
and the progress bar. The modules:

* :mod:`~cacheresearch.studies.base`: the protocol (``Study``, ``Cells``), errors, configuration,
  attributes, formatting and figures shared by all;
* ``grid`` (routing, replay, seed fleet, ...: any ``grid.*`` sweep) is registered by the shell
  (:mod:`cacheresearch.shell.sweep`), which owns its schema;
* :mod:`~cacheresearch.studies.economics`: ``economics``, ``ttl``, ``che``, ``ttl_advisor``;
* :mod:`~cacheresearch.studies.audit`: ``isolation``, ``audit``;
* :mod:`~cacheresearch.studies.diagnostics`: ``volatile``, ``events``, ``granularity``, ``capacity``;
* :mod:`~cacheresearch.studies.traces`: ``fit``, ``mooncake_fig9``, ``mooncake_fig10``,
  ``mooncake_table1``, ``ttl_trace``;
* :mod:`~cacheresearch.studies.hosted`: ``hosted``; :mod:`~cacheresearch.studies.layouts`: ``layouts``;
  :mod:`~cacheresearch.studies.policy_curves`: ``policy_curves``;
* :mod:`~cacheresearch.studies.autoscale`: ``autoscale``; :mod:`~cacheresearch.studies.disagg`: ``disagg``.

Adding a study: ``docs/adding_a_study.md``.
"""

from __future__ import annotations

import xarray as xr

from cacheresearch.studies import (
    audit,
    autoscale,
    diagnostics,
    disagg,
    economics,
    hosted,
    layouts,
    llmd_benchmark,
    llmd_tiered,
    policy_curves,
    tiers,
    traces,
    tune,
)
from cacheresearch.studies.base import Study, StudyError, run_in_memory
from cacheresearch.studies.economics import fixed_units, ratio_interval, refresh_units

__all__ = ["REGISTRY", "Study", "StudyError", "get", "register", "run_study", "summarize", "plot",
           "refresh_units", "fixed_units", "ratio_interval"]

REGISTRY: dict[str, Study] = {}


def register(study: Study) -> Study:
    """Add ``study`` to the registry (a name may be registered once)."""
    if study.name in REGISTRY:
        raise ValueError(f"study {study.name!r} is registered twice")
    REGISTRY[study.name] = study
    return study


for _module in (economics, audit, autoscale, disagg, diagnostics, traces, llmd_benchmark, llmd_tiered, hosted,
                layouts,
                policy_curves, tune, tiers):
    for _s in _module.STUDIES:
        register(_s)


def get(kind: str) -> Study:
    """The study named ``kind`` (a clear error naming the registered ones)."""
    try:
        return REGISTRY[kind]
    except KeyError:
        raise StudyError(f"kind: unknown study {kind!r}; choose one of {sorted(REGISTRY)}") from None


def run_study(cfg) -> xr.Dataset:
    """Run the study named by ``cfg.kind`` in memory (no files) and return its dataset."""
    return run_in_memory(get(str(cfg.get("kind", "grid"))), cfg)


def summarize(ds: xr.Dataset) -> str:
    """The text summary of a study dataset (dispatch on ``attrs["study_kind"]``)."""
    return get(str(ds.attrs.get("study_kind", "grid"))).summarize(ds)


def plot(ds: xr.Dataset):
    """The figure of a study dataset (a :class:`matplotlib.figure.Figure`, Agg canvas)."""
    return get(str(ds.attrs.get("study_kind", "grid"))).plot(ds)
