"""The engine's core: the run-compressed stream, the parameters, and the scan that composes the
components (cache, router view, queue, metrics). Public names are re-exported from
:mod:`cacheresearch.engine` and :mod:`cacheresearch`."""
