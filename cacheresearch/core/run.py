"""Running a list of cells: (stream, configuration, seed) triples, grouped so that nothing is copied.

:func:`simulate_cells` groups the cells by the state shape they need (approximate-index rows only
for configurations whose router uses the approximate view; as-of-sync fields only for the stale
view; priority fields only for lfu / length_aware; each per-block policy, fifo, sieve, s3fifo, lfu or
arc, its own program), and within a group by stream: one compiled program per group, a nested vmap
over ``[streams, configurations per stream]`` in which each stream is passed once (never gathered per
configuration). Streams of a group are padded to one shape; configurations per stream are padded by
repeating the stream's last cell (results dropped).

Backends (``backend=``, :data:`BACKENDS`): a program runs on the JAX engine (the compiled XLA program above, on
any device) or on a numba CPU backend (:mod:`cacheresearch.backends.numba_cache` and its siblings, which
register themselves in :mod:`~cacheresearch.core.registry`: the same algorithm as compiled loops, configurations
in threads, one stream per call), which has no per-step XLA overhead. ``auto`` (the default) takes numba for the
configurations it covers when the devices are the host's CPU, the JAX engine for the rest, and numba on any host
for what only numba runs (a closed-loop client, the vllm pool's orders beyond LRU): the cells are grouped by
backend too, and the plan names each program's backend. Both give the same metrics, field by field.
:func:`check_cells` makes every check of a run (coverage, bounds, streams) and compiles nothing: the backend of
each cell, or the refusal a run would raise (``docs/compatibility.md`` is made of it).

Memory: before running, each group's program is compiled ahead of time and its memory analysis
(arguments + outputs + temporaries) is compared with the memory the machine has available. A
group that would not fit is split into chunks of fewer configurations per stream that do; if even
one configuration per stream does not fit, the run is refused with a message that names the
estimate and the settings to change. :class:`Plan` says what will run before it runs.

Calls are the chunks of a run: :func:`plan_cells` returns a :class:`CellRunner` whose calls run one at
a time (the sweep writes each to a file as it finishes). ``max_batch`` bounds the configurations per
call; below a group's stream count it splits the streams too. Over several local devices the
configuration axis of each call is sharded (a 1-D mesh, ``shard_map``; streams replicated), padded to
at least two configurations per device. A cell's PRNG key is its own seed, and the programs return
integers and exact integer sums (ratios are divided on the host: :func:`~.simulate.finalize`), so its
result does not depend on chunking, padding or the device count, bit for bit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from cacheresearch.cache.blocks import JAX_RULES
from cacheresearch.cache.policies import POLICIES, PRIORITY_IDS, S3FIFO_ID, block_policies
from cacheresearch.core.registry import numba_available, numba_backend, numba_module
from cacheresearch.core.simulate import (
    VLLM_POLICIES,
    Metrics,
    Static,
    check_bounds,
    check_stream,
    finalize,
    nested_fn,
    serve_needs,
    serve_stream,
    static_options,
    with_block_bound,
)
from cacheresearch.core.simulate import simulate as simulate_jax
from cacheresearch.core.simulate import simulate_grid as simulate_grid_jax
from cacheresearch.core.stream import Stream, pad_stream, stream_shape
from cacheresearch.routers import CACHE_ROUTERS, REGISTRY, ROUTERS, VIEWS

__all__ = ["simulate_cells", "plan_cells", "check_cells", "CellRunner", "Call", "cell_order", "Plan", "GroupPlan",
           "available_memory_bytes", "MemoryError_", "BACKENDS", "BackendError", "simulate", "simulate_grid"]

#: ``backend=``: ``auto`` (per program the fastest exact backend that covers its configurations: the
#: numba backend on a CPU host where it covers them, the JAX engine elsewhere), ``jax``, ``numba``.
BACKENDS = ("auto", "jax", "numba")


class BackendError(ValueError):
    """``backend="numba"`` asked for configurations the numba backend does not model; ``missing``: what it does
    not model of them (the backends' ``coverage()`` phrases)."""

    def __init__(self, message: str, missing: tuple = ()):
        super().__init__(message)
        self.missing = tuple(missing)


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
    memory_bytes: int = 0  # the compiled program's memory analysis (one call, all its devices)
    priority: bool = False  # lfu / length_aware fields
    s3: bool = False  # s3fifo's per-block queues
    streams_per_call: int = 0  # streams of the group in one call (all of them unless chunked)
    backend: str = "jax"  # jax (the compiled XLA program) or numba (backends/numba_cache.py)
    block: str = ""  # the per-block policy of the program (cache/blocks.py), or ""

    @property
    def n_cells(self) -> int:
        return sum(len(c) for c in self.cells)


@dataclass
class Call:
    """One compiled call: ``sel[i, j]`` is the cell run for stream slot ``i``, configuration ``j``
    (padding repeats a real cell; its result is dropped). ``real`` lists the (i, j, cell) kept."""

    group: int
    slots: np.ndarray  # [streams per call] positions in the group's stream list (padding repeats)
    sel: np.ndarray  # [streams per call, configurations per stream] global cell indices
    real: list

    @property
    def cells(self) -> np.ndarray:
        return np.asarray([g for _, _, g in self.real], dtype=np.int64)


@dataclass
class Plan:
    groups: list = field(default_factory=list)
    n_cells: int = 0
    n_streams: int = 0
    available_bytes: int = 0
    devices: int = 1

    @property
    def memory_bytes(self) -> int:
        return max((g.memory_bytes for g in self.groups), default=0)

    @property
    def calls(self) -> int:
        return sum(g.calls for g in self.groups)

    def line(self) -> str:
        kinds = {b: sum(g.backend == b for g in self.groups) for b in ("jax", "numba")}
        progs = ", ".join(f"{k} {b}" for b, k in kinds.items() if k)
        return (f"plan: {self.n_cells} configurations over {self.n_streams} streams, {len(self.groups)} programs "
                f"({progs or 'none'}), "
                f"{self.calls} calls, memory estimate {self.memory_bytes / 2**20:.0f} MiB per call "
                f"(available {self.available_bytes / 2**20:.0f} MiB), devices {self.devices}")

    def program_lines(self) -> list[str]:
        yn = {True: "yes", False: "no"}
        return [f"  program {i + 1} ({gp.backend}): {gp.n_cells} configurations, {gp.streams_per_call} of "
                f"{len(gp.streams)} streams x {gp.per_stream} per call, {gp.calls} calls, index rows {yn[gp.index]}, "
                f"stale fields {yn[gp.stale]}, priority fields {yn[gp.priority]}, s3fifo queues {yn[gp.s3]}, per-block "
                f"policy {gp.block or 'no'}, memory "
                f"{gp.memory_bytes / 2**20:.0f} MiB" for i, gp in enumerate(self.groups)]


_COMPILED: dict = {}  # (static options, devices, argument shapes) -> compiled program (studies call repeatedly)
_AXIS = "cells"  # the mesh axis: configurations per stream


def _mesh(devices: list):
    return jax.sharding.Mesh(np.asarray(devices, dtype=object), (_AXIS,))


def _program(st: Static, devices: list):
    """The nested vmap; over several devices, ``shard_map`` over the configuration axis (each device
    runs the same program on its slice; streams are replicated), so a configuration's result does not
    depend on the device count."""
    fn = nested_fn(st)
    if len(devices) == 1:
        return jax.jit(fn)
    PS = jax.sharding.PartitionSpec
    return jax.jit(jax.shard_map(fn, mesh=_mesh(devices), in_specs=(PS(), PS(None, _AXIS), PS(None, _AXIS)),
                                 out_specs=PS(None, _AXIS), check_vma=False))


def _place(devices: list, stacked, P, keys):
    """Commit the arguments to the devices: streams replicated, configurations split."""
    if len(devices) == 1:
        return stacked, P, keys
    PS, NS = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
    mesh = _mesh(devices)
    return (jax.device_put(stacked, NS(mesh, PS())), jax.device_put(P, NS(mesh, PS(None, _AXIS))),
            jax.device_put(keys, NS(mesh, PS(None, _AXIS))))


def _compiled(st: Static, devices: list, *args):
    sig = (st, tuple(d.id for d in devices), tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(args)))
    exe = _COMPILED.get(sig)
    if exe is None:
        exe = _program(st, devices).lower(*_place(devices, *args)).compile()
        if len(_COMPILED) > 32:
            _COMPILED.clear()
        _COMPILED[sig] = exe
    return exe


def _block_of(policy_id: int) -> str:
    """The per-block policy of id ``policy_id`` ("" for another family); plug-ins included."""
    return next((n for n in block_policies() if POLICIES[n].id == policy_id), "")


def _needs(p) -> tuple[bool, bool, bool, bool, str]:
    """(approximate-index rows, stale fields, priority fields, s3fifo_sosp queues, the per-block policy or "")
    a configuration needs: each per-block policy is its own program (its state and step, nothing of the others')."""
    cache = int(p.router) in {ROUTERS[n] for n in CACHE_ROUTERS}
    return (bool(cache and int(p.view) == VIEWS["approximate"]), bool(cache and int(p.view) == VIEWS["stale"]),
            int(p.policy) in PRIORITY_IDS, int(p.policy) == S3FIFO_ID, _block_of(int(p.policy)))


def cell_order(params: list, stream_of) -> np.ndarray:
    """Cell indices ordered as the runner groups them (state shape, then stream, then cell): contiguous
    slices of this order share programs and streams, so they split a grid into parts that run well."""
    stream_of = np.asarray(stream_of, np.int64)
    keys = [(_needs(p), int(stream_of[g]), g) for g, p in enumerate(params)]
    return np.asarray([g for *_, g in sorted(keys)], dtype=np.int64)


def _stack(xs):
    return jax.tree.map(lambda *a: jnp.asarray(np.stack([np.asarray(v) for v in a])), *xs)


def _memory(compiled) -> int:
    try:
        m = compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                   - getattr(m, "alias_size_in_bytes", 0))
    except Exception:  # noqa: BLE001 - a backend without the analysis: no estimate
        return 0


def _device_memory(devices: list) -> int | None:
    """Memory of one accelerator (``bytes_limit``), or None on the host (devices share host memory)."""
    if devices[0].platform == "cpu":
        return None
    try:
        return int(devices[0].memory_stats()["bytes_limit"])
    except Exception:  # noqa: BLE001 - no statistics: fall back to host memory
        return None


def _balanced(n: int, most: int) -> int:
    """The smallest block size that covers ``n`` in as many blocks as blocks of ``most`` would."""
    return -(-n // -(-n // max(1, most)))


def _padded(per: int, devices: int) -> int:
    """Configurations per stream in a call: a multiple of the device count, and at least two per
    device. XLA compiles a batch of one differently: float32 ratios once rounded 1 ulp apart from the
    same configuration in a larger batch. The ratios are now divided on the host from exact integer
    sums (:func:`~.simulate.finalize`); the padding stays for the vllm replica's float32 accumulators
    (a repeated cell, its result dropped)."""
    return max(2, -(-per // devices)) * devices


def _cell_keys(seeds: np.ndarray, keys, sel):
    """The PRNG keys of cells ``sel`` (an index array of any shape): ``keys[sel]`` where the caller gave keys, else
    each cell's ``jax.random.key(seeds[g])``."""
    sel = np.asarray(sel, np.int64)
    if keys is not None:
        return keys[jnp.asarray(sel)]
    make = jax.random.key
    for _ in range(sel.ndim):
        make = jax.vmap(make)
    return make(jnp.asarray(seeds[sel]))


class CellRunner:
    """A planned run of cells: :attr:`plan` (what runs, before it runs), :attr:`calls` (the compiled
    calls, each a chunk of cells) and :meth:`run` (one call's results). :func:`simulate_cells` runs
    them all; the sweep runs them one chunk at a time (files, resume, progress)."""

    def __init__(self, plan: Plan, calls: list, ready: list, devices: list, seeds: np.ndarray, params: list,
                 keys=None):
        self.plan, self.calls = plan, calls
        self._ready, self._devices, self._seeds, self._params = ready, devices, seeds, params
        self._keys = keys

    def run(self, k: int):
        """(global cell indices, their metrics as NumPy with a leading cell axis) of call ``k``."""
        call = self.calls[k]
        if self.plan.groups[call.group].backend == "numba":
            return self._run_numba(call)
        compiled, stacked, st = self._ready[call.group]
        if len(call.slots) != stacked.run_len.shape[0] or np.any(call.slots != np.arange(len(call.slots))):
            stacked = jax.tree.map(lambda x: x[call.slots], stacked)
        S, C = call.sel.shape
        P = jax.tree.map(lambda *a: jnp.asarray(np.stack([np.asarray(v) for v in a]).reshape((S, C))),
                         *[self._params[g] for g in call.sel.reshape(-1)])
        keys = _cell_keys(self._seeds, self._keys, call.sel)
        m = jax.tree.map(np.asarray, jax.block_until_ready(compiled(*_place(self._devices, stacked, P, keys))))
        i = np.asarray([i for i, _, _ in call.real], dtype=np.int64)
        j = np.asarray([j for _, j, _ in call.real], dtype=np.int64)
        return call.cells, finalize(jax.tree.map(lambda x: x[i, j], m), st)  # ratios from the sums, on the host

    def _run_numba(self, call: Call):
        """A numba call: one stream, its cells in threads (backends/numba_cache.py); the same metrics."""
        stream, st, n_out = self._ready[call.group]
        cells = call.cells
        keys = _cell_keys(self._seeds, self._keys, cells)  # one call, [G] keys
        mod = numba_module(st.scheduler, bool(st.blocks))
        m = mod.run_stream(stream[int(call.slots[0])], [self._params[g] for g in cells], keys, st, n_out=n_out)
        return cells, finalize(m, st)


def _devices_of(devices) -> list:
    local = jax.local_devices()
    if devices is None:
        return list(local)
    if isinstance(devices, int):
        if not 1 <= devices <= len(local):
            raise ValueError(f"devices={devices}: this process has {len(local)} local devices")
        return list(local[:devices])
    return list(devices)


_POLICY_NAME = {spec.id: n for n, spec in POLICIES.items()}


def _backend_of(p, needs: tuple, backend: str, cpu: bool, scheduler: str) -> tuple[str, list]:
    """(the backend of configuration ``p``, what numba does not cover of it) under ``backend=``; a closed-loop
    client (``client_permits > 0``; its timeouts, ``client_timeout_ms > 0``), a hybrid KV layout (``kv_groups``),
    the vllm pool's orders beyond leaf-first LRU (``ttl_refresh``, ``fifo``, ``sieve``, ``s3fifo``), a router with
    no JAX rule (one with state) and a per-block policy with no JAX rule are the numba backends' only, so ``auto``
    takes numba for them on any host."""
    closed = int(getattr(p, "client_permits", 0)) > 0 or int(getattr(p, "client_timeout_ms", 0)) > 0
    hybrid = int(getattr(p, "kv_groups", 1)) > 1 or int(getattr(p, "kv_window_groups", 0)) != 0
    norule = any(r.numba_only(p) for r in REGISTRY.routers() if r.id == int(p.router))  # numba only (its state)
    nojax = needs[4] and needs[4] not in JAX_RULES  # a per-block policy with a numba kernel only
    numba_only = closed or hybrid or norule or nojax or (scheduler == "vllm"
                                               and _POLICY_NAME.get(int(p.policy)) not in VLLM_POLICIES)
    if closed and (backend == "jax" or not numba_available()):
        raise BackendError("client_permits > 0 or client_timeout_ms > 0 (the client's permits, its timeouts) is "
                           "modelled by the numba vllm backend only: engine.backend=auto or numba, with numba "
                           "installed")
    if hybrid and (backend == "jax" or not numba_available()):
        raise BackendError("kv_groups > 1 or kv_window_groups (a hybrid KV layout) is modelled by the numba vllm "
                           "backend only: engine.backend=auto or numba, with numba installed")
    if backend == "jax":
        return "jax", []
    index, stale, priority, s3, block = needs
    st = SimpleNamespace(scheduler=scheduler, index=index, stale=stale, priority=priority, s3=s3,
                         blocks=(block,) if block else ())
    missing = numba_module(scheduler, bool(block)).coverage([p], st)
    if backend == "numba" or (numba_only and not missing and numba_available()):
        return "numba", missing
    return ("numba" if cpu and not missing and numba_available() else "jax"), []


def _group_cells(params, stream_of, backend: str, cpu: bool, scheduler: str) -> dict:
    """{(needs..., backend): {stream: [cells]}}; ``backend="numba"`` refuses what numba does not cover."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: one of {list(BACKENDS)}")
    if backend == "numba" and not numba_available():
        raise BackendError("backend=numba: numba is not installed (pip install numba)")
    groups: dict[tuple, dict[int, list[int]]] = {}
    refused: dict[str, int] = {}
    for g, p in enumerate(params):
        needs = _needs(p)
        b, missing = _backend_of(p, needs, backend, cpu, scheduler)
        for why in missing:
            refused[why] = refused.get(why, 0) + 1
        groups.setdefault(needs + (b,), {}).setdefault(int(stream_of[g]), []).append(g)
    if backend == "auto" and scheduler != "vllm":
        norule = {r.id: r for r in REGISTRY.routers()}  # a router numba only runs (with its state) stays on numba
        groups = _whole_programs(groups, {g for g, p in enumerate(params) if norule[int(p.router)].numba_only(p)})
    if refused:
        what = "; ".join(f"{why} ({n} configurations)" for why, n in refused.items())
        kinds = ("vllm",) if scheduler == "vllm" else ("fcfs", "blocks")  # the backends' own words
        covers = f"the {scheduler} replica " + ", and ".join(numba_backend(k).covers for k in kinds)
        raise BackendError(f"backend=numba does not cover: {what}. The numba backend models {covers}; use "
                           "backend=auto (the JAX engine for the rest) or backend=jax", tuple(refused))
    return groups


def _whole_programs(groups: dict, keep: set = frozenset()) -> dict:
    """``auto`` on the fcfs replica: a program (one static state shape) runs on one backend, numba when it
    covers all of the program's configurations, else JAX for all of them. The JAX program is compiled
    for the rest anyway and its vmapped batch takes the covered configurations at little extra cost,
    where a numba part would add its own compile and one call per stream (the main job: 24 of 108
    configurations on numba made it slower, not faster). On the vllm replica the JAX program's cost per
    configuration is high, so there the covered configurations still go to numba. The cells of ``keep`` (what only
    numba runs) stay on numba."""
    out: dict = {}
    for key, by_stream in groups.items():
        jax_key = key[:-1] + ("jax",)
        move = key[-1] == "numba" and jax_key in groups
        for s, cells in by_stream.items():
            for c in cells:
                out.setdefault(jax_key if move and c not in keep else key, {}).setdefault(s, []).append(c)
    for by_stream in out.values():
        for cells in by_stream.values():
            cells.sort()
    return out


def _numba_group(streams, sids, cells, st, max_batch, budget, D):
    """A numba program: calls of one stream each (at most ``max_batch`` configurations, fewer when the
    per-thread state would not fit), the state estimate as its memory."""
    C = max(len(c) for c in cells)
    per = C if max_batch is None else max(1, min(C, int(max_batch)))
    n_out = max(int(np.asarray(streams[s].arrival_ms).shape[0]) - 1 for s in sids)  # the JAX program's length
    R = st.max_replicas

    def mem(per):
        if st.scheduler == "vllm" or st.blocks:
            state = max(numba_module(st.scheduler, bool(st.blocks)).state_bytes(streams[s], st) for s in sids)
        else:
            state = max(int(streams[s].n_keys) * 2 + int(streams[s].log.shape[-2]) * 3 for s in sids) * R * 8
        out = per * n_out * 4 * (4 + (R if st.match else 0)) if st.per_request else 0
        if st.scheduler == "vllm":
            out += per * n_out * 8  # the sends under the client's permits (backends/numba_vllm.py, int64 [G, N])
        return min(per, os.cpu_count() or 1) * (state + st.queue_slots * R * 8) + out

    while per > 1 and mem(per) > budget:
        per = _balanced(C, per // 2)
    calls = []
    for i, cs in enumerate(cells):
        for c0 in range(0, len(cs), per):
            part = cs[c0:c0 + per]
            real = [(0, j, g) for j, g in enumerate(part)]
            calls.append((np.asarray([i], np.int64), np.asarray([part], np.int64), real))
    return calls, per, mem(per), n_out


def _checked_programs(streams, stream_of, params, max_replicas: int, backend: str, cpu: bool, options: dict):
    """Per program (one state shape, one backend): (its key, streams, cells per stream, static options, served
    streams), every check of a run done (coverage, bounds, streams) and nothing compiled."""
    groups = _group_cells(params, stream_of, backend, cpu, options.get("scheduler", "fcfs"))
    derived: dict = {}  # (stream, what serve_stream derives) -> the served stream, shared by the programs

    def served_stream(s_, st):
        k = (s_,) + serve_needs(st)
        if k not in derived:
            derived[k] = serve_stream(streams[s_], st)
        return derived[k]

    for key, by_stream in groups.items():
        index, stale, priority, s3, block, kind = key
        sids = sorted(by_stream)
        cells = [by_stream[s] for s in sids]
        grid = jax.tree.map(lambda *a: np.asarray(a), *[params[g] for cs in cells for g in cs])  # host arrays
        depth = max(int(np.max(np.asarray(streams[s].n_blocks), initial=0)) for s in sids)
        options["max_runs"] = max(int(np.max(np.asarray(streams[s].n_runs), initial=0)) for s in sids)
        st = static_options(grid, max_replicas=max_replicas, index=index, stale=stale, priority=priority,
                            max_depth=depth, s3=s3, blocks=(block,) if block else (), **options)
        check_bounds(grid, max_replicas, st, backend=kind)  # the one scope check, for the backend that runs it
        served = {s_: served_stream(s_, st) for s_ in sids}  # what this program needs, derived once a stream
        for s_ in sids:  # the per-block lists (lfu: the largest frequency) of every stream of the program
            st = with_block_bound(served[s_], st)
        for s_ in sids:
            check_stream(served[s_], st, grid)
        yield key, sids, cells, st, served


def check_cells(streams: list[Stream], stream_of: np.ndarray, params: list, *, max_replicas: int,
                backend: str = "auto", cpu: bool | None = None, **options) -> list[str]:
    """The backend (``"jax"`` or ``"numba"``) each cell would run on under ``backend=``, on a CPU host
    (``cpu``; default: whether the local devices are the host's CPU) or an accelerator host, after every check
    :func:`plan_cells` makes: it raises the same refusal (:class:`BackendError`, ``ValueError``), compiling and
    running nothing. ``auto`` on the fcfs replica gives a program to one backend (``_whole_programs``), so a
    cell's backend can depend on the cells beside it."""
    stream_of = np.asarray(stream_of, np.int64)
    if not params:
        raise ValueError("no cells to check")
    if cpu is None:
        cpu = jax.local_devices()[0].platform == "cpu"
    options = dict(options)
    for k in ("index", "stale", "routers_compiled", "priority", "max_depth", "s3", "blocks", "block_q"):
        options.pop(k, None)
    out = [""] * len(params)
    for key, _sids, cells, _st, _served in _checked_programs(streams, stream_of, params, max_replicas, backend, cpu,
                                                              options):
        for cs in cells:
            for g in cs:
                out[g] = key[-1]
    return out


def plan_cells(
    streams: list[Stream],
    stream_of: np.ndarray,
    params: list,
    seeds: np.ndarray,
    *,
    max_replicas: int,
    max_batch: int | None = None,
    memory_fraction: float = 0.8,
    devices: list | int | None = None,
    log=None,
    backend: str = "auto",
    keys=None,
    **options,
) -> CellRunner:
    """Plan cell ``g`` = (``streams[stream_of[g]]``, ``params[g]``, PRNG key of ``seeds[g]``, or ``keys[g]``
    where ``keys`` is given) for every ``g``: group, choose each program's backend, compile ahead of time, check
    memory and cut into calls (see :func:`simulate_cells`)."""
    G = len(params)
    stream_of = np.asarray(stream_of, np.int64)
    seeds = np.asarray(seeds, np.uint32)
    if G == 0:
        raise ValueError("no cells to run")
    if keys is not None and (np.ndim(keys) < 1 or np.shape(keys)[0] != G):
        raise ValueError(f"keys: one PRNG key per cell ({G}), got shape {np.shape(keys)}")
    if max_batch is not None and int(max_batch) < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    devices = _devices_of(devices)
    D = len(devices)
    for k in ("index", "stale", "routers_compiled", "priority", "max_depth", "s3", "blocks", "block_q"):
        options.pop(k, None)
    per_device = _device_memory(devices)
    avail = per_device if per_device is not None else available_memory_bytes()
    budget = int(avail * memory_fraction)
    plan = Plan(n_cells=G, n_streams=len(set(stream_of.tolist())), available_bytes=avail, devices=D)
    calls: list[Call] = []
    ready = []
    for (index, stale, priority, s3, block, kind), sids, cells, st, served in _checked_programs(
            streams, stream_of, params, max_replicas, backend, devices[0].platform == "cpu", options):
        gi = len(plan.groups)
        if kind == "numba":
            got, per, mem, n_out = _numba_group(served, sids, cells, st, max_batch, budget, D)
            calls += [Call(gi, slots, sel, real) for slots, sel, real in got]
            plan.groups.append(GroupPlan(index, stale, st.routers, sids, cells, per, len(got), mem, priority, s3, 1,
                                         backend="numba", block=block))
            ready.append(([served[s] for s in sids], st, n_out))
            continue
        compiled, stacked, got, per, s_per, mem = _jax_group(served, sids, cells, st, params, (seeds, keys),
                                                             max_batch, budget, devices, per_device, avail,
                                                             memory_fraction)
        calls += [Call(gi, slots, sel, real) for slots, sel, real in got]
        plan.groups.append(GroupPlan(index, stale, st.routers, sids, cells, per, len(got), mem, priority, s3, s_per,
                                     block=block))
        ready.append((compiled, stacked, st))
    if log is not None:  # the whole plan, before anything runs
        log(plan.line())
        for line in plan.program_lines():
            log(line)
    return CellRunner(plan, calls, ready, devices, seeds, params, keys)


def _jax_group(streams, sids, cells, st, params, seeds_keys, max_batch, budget, devices, per_device, avail,
               memory_fraction):
    """A JAX program: the streams padded to one shape and stacked, compiled ahead of time at the largest
    batch that fits the memory budget, cut into calls."""
    D = len(devices)
    shape = stream_shape(streams[sids[0]])
    for s in sids[1:]:
        shape = shape.union(stream_shape(streams[s]))
    stacked = _stack([pad_stream(streams[s], shape) for s in sids])
    C = max(len(c) for c in cells)
    S = len(sids)
    if max_batch is None:
        s_per, per = S, C
    elif int(max_batch) >= S:
        s_per, per = S, _balanced(C, min(C, int(max_batch) // S))
    else:
        s_per, per = _balanced(S, int(max_batch)), 1

    def probe(s_per, per):
        pad = _padded(per, D)
        sel = np.asarray([[cells[min(i, S - 1)][0]] * pad for i in range(s_per)], dtype=np.int64)
        P = jax.tree.map(lambda *a: jnp.asarray(np.stack([np.asarray(v) for v in a]).reshape((s_per, pad))),
                         *[params[g] for g in sel.reshape(-1)])
        keys = _cell_keys(*seeds_keys, sel)  # (seeds, the caller's keys or None)
        part = stacked if s_per == S else jax.tree.map(lambda x: x[:s_per], stacked)
        compiled = _compiled(st, devices, part, P, keys)
        m = _memory(compiled)
        return compiled, (m if per_device is not None else m * D)  # forced host devices share memory

    while True:
        compiled, mem = probe(s_per, per)
        if mem <= budget or (per == 1 and s_per == 1):
            break
        if per > 1:
            per = _balanced(C, per // 2)
        else:
            s_per = _balanced(S, s_per // 2)
    if mem > budget:
        raise MemoryError_(
            f"one call of 1 stream x 1 configuration needs an estimated {mem / 2**20:.0f} MiB, more than "
            f"{memory_fraction:.0%} of the {avail / 2**20:.0f} MiB available: reduce the workload (requests), "
            f"max_replicas, engine.queue_slots or the router instances")
    pad = _padded(per, D)
    got = []
    for s0 in range(0, S, s_per):
        slots = np.asarray([min(i, S - 1) for i in range(s0, s0 + s_per)], dtype=np.int64)
        block = [cells[i] for i in range(s0, min(S, s0 + s_per))]
        for c0 in range(0, max(len(c) for c in block), per):
            sel = np.empty((s_per, pad), dtype=np.int64)
            real = []
            for i, slot in enumerate(slots):
                cs = cells[slot]
                for j in range(pad):
                    sel[i, j] = cs[min(c0 + min(j, per - 1), len(cs) - 1)]
                    if i < len(block) and j < per and c0 + j < len(cs):
                        real.append((i, j, cs[c0 + j]))
            got.append((slots, sel, real))
    return compiled, stacked, got, per, s_per, mem


def simulate_cells(
    streams: list[Stream],
    stream_of: np.ndarray,
    params: list,
    seeds: np.ndarray,
    *,
    max_replicas: int,
    max_batch: int | None = None,
    memory_fraction: float = 0.8,
    devices: list | int | None = None,
    log=None,
    backend: str = "auto",
    keys=None,
    **options,
) -> tuple[Metrics, Plan]:
    """Run cell ``g`` = (``streams[stream_of[g]]``, ``params[g]``, PRNG key of ``seeds[g]``) for every
    ``g``; returns the metrics stacked in cell order (NumPy) and the :class:`Plan` that ran.

    ``max_batch``: at most this many configurations per compiled call (default: as many as fit;
    fewer than a group's streams splits the streams too); ``memory_fraction``: the share of available
    memory one call may use; ``devices``: the local devices (or how many) the configuration axis is
    sharded over (default: all; padded to a multiple of their count); ``options``: static options of
    :func:`~cacheresearch.core.simulate.static_options` (``index``, ``stale`` and the compiled
    routers are chosen per group); ``log``: a callable for the plan line and progress (or None);
    ``backend``: :data:`BACKENDS` (``auto``: per program the numba backend on a CPU host where it covers
    the program's configurations, :func:`cacheresearch.backends.numba_cache.coverage`, else the JAX
    engine; ``numba`` refuses what it does not cover with :class:`BackendError`). Every backend gives
    the same metrics (``tests/test_replay.py``).

    A cell's PRNG key is ``jax.random.key(seeds[g])``, its own seed, or ``keys[g]`` where ``keys`` (a [G] array of
    PRNG keys) is given: results do not depend on the grouping, the chunking, the padding or the device count.
    """
    runner = plan_cells(streams, stream_of, params, seeds, max_replicas=max_replicas, max_batch=max_batch,
                        memory_fraction=memory_fraction, devices=devices, log=log, backend=backend, keys=keys,
                        **options)
    parts = [runner.run(k) for k in range(len(runner.calls))]
    order = np.concatenate([np.asarray(cells, np.int64) for cells, _ in parts])
    where = np.empty(len(params), np.int64)
    where[order] = np.arange(order.size)  # cell g is row where[g] of the calls' rows, concatenated
    if len(parts) == 1 and np.array_equal(where, np.arange(where.size)):  # one call, cells in order: as it is
        return parts[0][1], runner.plan
    return jax.tree.map(lambda *xs: np.concatenate(xs)[where], *[m for _, m in parts]), runner.plan


def _jax_only(backend: str, *trees) -> bool:
    """Whether the JAX scan runs these arguments whatever the cells: ``backend="jax"``, or arguments traced by a JAX
    transformation under ``auto`` (``numba`` refuses them in one line); checks the backend's name."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: one of {list(BACKENDS)}")
    traced = any(isinstance(x, jax.core.Tracer) for t in trees for x in jax.tree.leaves(t))
    if traced and backend == "numba":
        raise BackendError("backend=numba under a JAX transformation (traced params, keys or stream): only the JAX "
                           "scan traces; use backend=jax or auto")
    return backend == "jax" or traced


def _numba_run(streams: list, stream_of, plist: list, keys, backend: str, max_replicas: int, options: dict):
    """The metrics of cells ``plist`` (keys ``keys`` [G]) run as the sweep runs them (:func:`simulate_cells`) when
    ``backend=`` sends any of them to a numba backend, else None (the caller runs the JAX scan)."""
    stream_of = np.asarray(stream_of, np.int64)
    cpu = jax.local_devices()[0].platform == "cpu"
    groups = _group_cells(plist, stream_of, backend, cpu, options.get("scheduler", "fcfs"))  # refusals: one line
    if all(k[-1] == "jax" for k in groups):
        return None
    m, _ = simulate_cells(streams, stream_of, plist, np.zeros(len(plist), np.uint32), max_replicas=max_replicas,
                          backend=backend, keys=keys, **options)
    return m


def simulate(stream: Stream, params, key: jax.Array, *, backend: str = "auto", max_replicas: int = 1,
             per_request: bool = True, window: int | None = None, **options) -> Metrics:
    """One configuration over the stream on the backend ``backend=`` chooses (:data:`BACKENDS`, the sweep's
    ``engine.backend``): ``auto`` runs it on a numba backend where the numba backends cover it and the devices are
    the host's CPU (and, on any host, what only numba runs), else the JAX scan
    (:func:`cacheresearch.core.simulate.simulate`, also under a JAX transformation); ``jax`` the JAX scan;
    ``numba`` a numba backend, refusing in one line (:class:`BackendError`) what none covers. The metrics are the
    same field by field on every backend (finalized; NumPy arrays from numba). Arguments as the JAX scan's."""
    if not _jax_only(backend, stream, params, key):
        m = _numba_run([stream], [0], [params], key[None], backend, max_replicas,
                       dict(options, per_request=per_request, window=window))
        if m is not None:
            return jax.tree.map(lambda x: np.asarray(x)[0, ...], m)  # as the JAX scan returns them
    return simulate_jax(stream, params, key, max_replicas=max_replicas, per_request=per_request, window=window,
                        **options)


def simulate_grid(stream: Stream, params, keys: jax.Array, *, backend: str = "auto", max_replicas: int = 1,
                  per_request: bool = False, window: int | None = None, stream_axis: bool = False,
                  **options) -> Metrics:
    """A grid of configurations (``params`` fields [G], ``keys`` [G]) on the backends ``backend=`` chooses, as
    :func:`simulate` does per configuration and the sweep per program (:func:`simulate_cells`; under ``auto`` on
    the fcfs replica a program runs whole on one backend); the JAX scan is
    :func:`cacheresearch.core.simulate.simulate_grid`. ``stream_axis=True``: the stream is stacked [G] too."""
    if not _jax_only(backend, stream, params, keys):
        G = int(np.shape(np.asarray(params.policy))[0])
        plist = [jax.tree.map(lambda x, g=g: np.asarray(x)[g], params) for g in range(G)]
        streams = [jax.tree.map(lambda x, g=g: np.asarray(x)[g], stream) for g in range(G)] if stream_axis else [stream]
        m = _numba_run(streams, np.arange(G) if stream_axis else np.zeros(G), plist, keys, backend, max_replicas,
                       dict(options, per_request=per_request, window=window))
        if m is not None:
            return m
    return simulate_grid_jax(stream, params, keys, max_replicas=max_replicas, per_request=per_request, window=window,
                             stream_axis=stream_axis, **options)
