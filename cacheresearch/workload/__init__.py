"""Workloads: the request table (:mod:`.table`), chained block keys (:mod:`.keys`), synthetic
generators (:mod:`.synthetic`) and trace formats (:mod:`.trace`). The first stage of the pipeline
workload -> keys -> router -> cache -> replica -> metrics -> dataset."""

from cacheresearch.workload.table import MAX_ARRIVAL_MS, Workload, WorkloadError

__all__ = ["Workload", "WorkloadError", "MAX_ARRIVAL_MS"]
