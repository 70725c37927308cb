"""Fitting workload models to traces (no I/O here; ``experiment=fit`` is the shell).

:mod:`.laws` (candidate laws, MLE and AIC choice), :mod:`.structure` (sessions, parents, the radix
tree), :mod:`.model` (the session model: fit, sample whole sessions, the naive baseline),
:mod:`.validate` (hit-rate curves of a trace and of samples: LRU over capacities, TTL with refresh).
"""

from cacheresearch.fit.model import MODEL_VERSION, fit_workload, naive_workload, sample_workload
from cacheresearch.fit.structure import request_structure, tree_stats

__all__ = ["fit_workload", "sample_workload", "naive_workload", "request_structure", "tree_stats", "MODEL_VERSION"]
