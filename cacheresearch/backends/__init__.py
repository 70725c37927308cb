"""CPU backends of the engine: the same algorithms compiled with numba, tested equal to the JAX engine.

Importing this package registers the backends (:mod:`cacheresearch.backends.capabilities`: module names and what
each models, no numba) with :mod:`cacheresearch.core.registry`, which imports it by name on first use."""

from cacheresearch.backends import capabilities  # noqa: F401 - registers the numba backends
