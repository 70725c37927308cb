"""Running a list of cells: (stream, configuration, seed) triples, grouped so that nothing is copied.

:func:`simulate_cells` groups the cells by the state shape they need (approximate-index rows only
for configurations whose router uses the approximate view; as-of-sync fields only for the stale
view; priority fields only for lfu / length_aware; per-block queues only for s3fifo), and within a group by stream: one compiled program per group, a nested vmap over
``[streams, configurations per stream]`` in which each stream is passed once (never gathered per
configuration). Streams of a group are padded to one shape; configurations per stream are padded
by repeating the stream's last cell (results dropped).

Memory: before running, each group's program is compiled ahead of time and its memory analysis
(arguments + outputs + temporaries) is compared with the memory the machine has available. A
group that would not fit is split into chunks of fewer configurations per stream that do; if even
one configuration per stream does not fit, the run is refused with a message that names the
estimate and the settings to change. :class:`Plan` says what will run before it runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from ..cache.policies import PRIORITY_IDS, S3FIFO_ID
from ..routers import CACHE_ROUTERS, ROUTERS, VIEWS
from .simulate import Metrics, Static, nested_fn, check_bounds, check_stream, static_options
from .stream import Stream, pad_stream, stream_shape

__all__ = ["simulate_cells", "Plan", "GroupPlan", "available_memory_bytes", "MemoryError_"]


class MemoryError_(RuntimeError):  # noqa: N801 - not the builtin: raised before anything is allocated
    """A run that would not fit the machine's memory (raised before it starts)."""


def available_memory_bytes() -> int:
    """Memory available to this process now (Linux ``MemAvailable``; else physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


@dataclass
class GroupPlan:
    index: bool
    stale: bool
    routers: tuple
    streams: list  # stream indices in this group
    cells: list  # per stream: the cell indices (global) it serves
    per_stream: int  # configurations per stream per call (after chunking)
    calls: int
    memory_bytes: int = 0  # the compiled program's memory analysis (one call)
    priority: bool = False  # lfu / length_aware fields
    s3: bool = False  # s3fifo's per-block queues

    @property
    def n_cells(self) -> int:
        return sum(len(c) for c in self.cells)


@dataclass
class Plan:
    groups: list = field(default_factory=list)
    n_cells: int = 0
    n_streams: int = 0
    available_bytes: int = 0

    @property
    def memory_bytes(self) -> int:
        return max((g.memory_bytes for g in self.groups), default=0)

    @property
    def calls(self) -> int:
        return sum(g.calls for g in self.groups)

    def line(self) -> str:
        return (f"plan: {self.n_cells} configurations over {self.n_streams} streams, {len(self.groups)} programs, "
                f"{self.calls} calls, memory estimate {self.memory_bytes / 2**20:.0f} MiB per call "
                f"(available {self.available_bytes / 2**20:.0f} MiB), devices {jax.device_count()}")


_COMPILED: dict = {}  # (static options, argument shapes) -> compiled program (studies call repeatedly)


def _compiled(st: Static, *args):
    sig = (st, tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(args)))
    exe = _COMPILED.get(sig)
    if exe is None:
        exe = jax.jit(nested_fn(st)).lower(*args).compile()
        if len(_COMPILED) > 32:
            _COMPILED.clear()
        _COMPILED[sig] = exe
    return exe


def _needs(p) -> tuple[bool, bool, bool, bool]:
    """(approximate-index rows, stale fields, priority fields, s3fifo queues) a configuration needs."""
    cache = int(p.router) in {ROUTERS[n] for n in CACHE_ROUTERS}
    return (bool(cache and int(p.view) == VIEWS["approximate"]), bool(cache and int(p.view) == VIEWS["stale"]),
            int(p.policy) in PRIORITY_IDS, int(p.policy) == S3FIFO_ID)


def _stack(xs):
    return jax.tree.map(lambda *a: jnp.asarray(np.stack([np.asarray(v) for v in a])), *xs)


def _memory(compiled) -> int:
    try:
        m = compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                   - getattr(m, "alias_size_in_bytes", 0))
    except Exception:  # noqa: BLE001 - a backend without the analysis: no estimate
        return 0


def simulate_cells(
    streams: list[Stream],
    stream_of: np.ndarray,
    params: list,
    seeds: np.ndarray,
    *,
    max_replicas: int,
    max_batch: int | None = None,
    memory_fraction: float = 0.8,
    log=None,
    **options,
) -> tuple[Metrics, Plan]:
    """Run cell ``g`` = (``streams[stream_of[g]]``, ``params[g]``, PRNG key of ``seeds[g]``) for every
    ``g``; returns the metrics stacked in cell order (NumPy) and the :class:`Plan` that ran.

    ``max_batch``: at most this many configurations per compiled call (default: as many as fit);
    ``memory_fraction``: the share of available memory one call may use; ``options``: static options
    of :func:`~cacheresearch.core.simulate.static_options` (``index``, ``stale`` and the compiled
    routers are chosen per group); ``log``: a callable for the plan line and progress (or None).
    """
    G = len(params)
    stream_of = np.asarray(stream_of, np.int64)
    if G == 0:
        raise ValueError("no cells to run")
    for k in ("index", "stale", "routers_compiled", "priority", "max_depth", "s3"):
        options.pop(k, None)
    avail = available_memory_bytes()
    budget = int(avail * memory_fraction)
    plan = Plan(n_cells=G, n_streams=len(set(stream_of.tolist())), available_bytes=avail)
    groups: dict[tuple, dict[int, list[int]]] = {}
    for g, p in enumerate(params):
        groups.setdefault(_needs(p), {}).setdefault(int(stream_of[g]), []).append(g)
    out: list = [None] * G
    ready = []
    for (index, stale, priority, s3), by_stream in groups.items():
        sids = sorted(by_stream)
        cells = [by_stream[s] for s in sids]
        gp_params = [params[g] for cs in cells for g in cs]
        grid = _stack(gp_params)
        depth = max(int(np.max(np.asarray(streams[s].n_blocks), initial=0)) for s in sids)
        st = static_options(grid, max_replicas=max_replicas, index=index, stale=stale, priority=priority,
                            max_depth=depth, s3=s3, **options)
        check_bounds(grid, max_replicas, st)
        for s_ in sids:
            check_stream(streams[s_], st)
        shape = stream_shape(streams[sids[0]])
        for s in sids[1:]:
            shape = shape.union(stream_shape(streams[s]))
        stacked = _stack([pad_stream(streams[s], shape) for s in sids])
        C = max(len(c) for c in cells)
        S = len(sids)
        per = C if max_batch is None else max(1, min(C, int(max_batch) // S))

        def args(c0, per, cells=cells, S=S):
            sel = [[cs[min(c0 + j, len(cs) - 1)] for j in range(per)] for cs in cells]
            P = jax.tree.map(lambda *a: jnp.asarray(np.stack([np.asarray(v) for v in a]).reshape((S, per))),
                             *[params[g] for row in sel for g in row])
            keys = jax.vmap(jax.vmap(jax.random.key))(jnp.asarray(np.asarray(seeds, np.uint32)[np.asarray(sel)]))
            return sel, P, keys

        while True:
            _, P, keys = args(0, per)
            compiled = _compiled(st, stacked, P, keys)
            mem = _memory(compiled)
            if mem <= budget or per == 1:
                break
            per = max(1, per // 2)
        if mem > budget:
            raise MemoryError_(
                f"one call of {S} streams x 1 configuration needs an estimated {mem / 2**20:.0f} MiB, more than "
                f"{memory_fraction:.0%} of the {avail / 2**20:.0f} MiB available: reduce the workload (requests), "
                f"max_replicas, engine.queue_slots or the router instances, or run fewer streams at once")
        calls = -(-C // per)
        gp = GroupPlan(index, stale, st.routers, sids, cells, per, calls, mem, priority, s3)
        plan.groups.append(gp)
        ready.append((gp, compiled, stacked, args))
    if log is not None:  # the whole plan, before anything runs
        log(plan.line())
        for i, (gp, *_rest) in enumerate(ready):
            log(f"  program {i + 1}: {gp.n_cells} configurations, {len(gp.streams)} streams x {gp.per_stream} per "
                f"call, {gp.calls} calls, index rows {'yes' if gp.index else 'no'}, stale fields "
                f"{'yes' if gp.stale else 'no'}, priority fields {'yes' if gp.priority else 'no'}, s3fifo queues "
                f"{'yes' if gp.s3 else 'no'}, memory {gp.memory_bytes / 2**20:.0f} MiB")
    for gp, compiled, stacked, args in ready:
        per, cells = gp.per_stream, gp.cells
        for c0 in range(0, max(len(c) for c in cells), per):
            sel, P, keys = args(c0, per)
            m = jax.tree.map(np.asarray, jax.block_until_ready(compiled(stacked, P, keys)))
            for i, cs in enumerate(cells):
                for j in range(per):
                    if c0 + j < len(cs):
                        out[cs[c0 + j]] = jax.tree.map(lambda x, i=i, j=j: x[i, j], m)
    return jax.tree.map(lambda *xs: np.stack(xs), *out), plan
