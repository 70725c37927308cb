"""Sweeps beyond one call: chunk files, resume, parts of a grid for launchers, the plan line, progress.

A grid runs as the calls of :func:`cacheresearch.core.run.plan_cells` (chunks that fit memory, or
``engine.max_batch`` configurations each). Each finished chunk is written to ``DIR/chunks/`` at once,
atomically (a temporary name, then :func:`os.replace`), as a small netCDF file of its cells' metrics
(the cells named by their index in the full grid). Rerunning the same command in the same directory
takes the chunks already there and runs only the rest; a changed configuration is refused with the
keys that differ (``launch.resume=fresh`` discards the old chunks instead). ``results.nc`` is combined
from the chunk files with xarray and is itself written atomically, so a ``kill -9`` at any moment
leaves either no ``results.nc`` or a complete one.

``launch.part=i launch.parts=n`` runs the i-th of n slices of the grid (slices of
:func:`~cacheresearch.core.run.cell_order`, so a slice shares programs and streams): a Hydra multirun
over ``launch.part`` spreads a grid over joblib processes, Slurm array jobs or a Ray cluster, all
writing chunk files into one directory; the part that finds every cell done writes ``results.nc``.

Only the shell (this module, :mod:`cacheresearch.shell.sweep`) touches files; the core runs cells.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import xarray as xr

from cacheresearch.core.run import available_memory_bytes, cell_order, plan_cells
from cacheresearch.metrics.core import Metrics

__all__ = ["CHUNK_DIR", "ChunkError", "ChunkStore", "ProgressLines", "RunInfo", "assemble", "done_cells", "fingerprint",
           "part_cells", "plan_line", "progress_bar", "run_grid", "write_atomic"]

CHUNK_DIR = "chunks"
MANIFEST = "manifest.json"
#: configuration keys that do not change any cell's result (chunking, launching, reporting)
NEUTRAL_KEYS = ("engine.max_batch", "launch", "output", "report", "description")


class ChunkError(ValueError):
    """Chunk files that cannot be used (another configuration, a broken file): the message says why."""


def _flat(d, prefix=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def fingerprint(config: dict, version: str) -> tuple[dict, str]:
    """(the configuration that fixes the results, its hash): ``config`` (resolved, plain containers)
    without :data:`NEUTRAL_KEYS`, plus the package version and the layout of the metrics a chunk holds
    (chunks written by an engine with other fields are not combined with new ones)."""
    flat = {k: v for k, v in _flat(config).items()
            if not any(k == n or k.startswith(n + ".") for n in NEUTRAL_KEYS)}
    flat["cacheresearch_version"] = version
    flat["metrics_layout"] = hashlib.sha256(",".join(Metrics._fields).encode()).hexdigest()[:12]
    text = json.dumps(flat, sort_keys=True, default=str)
    return flat, hashlib.sha256(text.encode()).hexdigest()[:16]


def write_atomic(path: Path, write) -> Path:
    """``write(tmp)`` to a temporary name beside ``path``, then rename it to ``path`` (atomic on POSIX):
    a reader, or a process killed at any moment, sees the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")  # the suffix names the format
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def part_cells(order: np.ndarray, part: int, parts: int) -> np.ndarray:
    """The cells of part ``part`` of ``parts``: a contiguous slice of the runner's ``order``."""
    if parts < 1 or not 0 <= part < parts:
        raise ChunkError(f"launch.part must be in [0, launch.parts) = [0, {parts}), got {part}")
    return np.sort(np.array_split(np.asarray(order, np.int64), parts)[part])


class ChunkStore:
    """The chunk files of one run directory (``root/chunks``)."""

    def __init__(self, root, config: dict, version: str, *, resume: str = "auto", log=None, subdir: str | None = None):
        if resume not in ("auto", "fresh"):
            raise ChunkError(f"launch.resume must be 'auto' or 'fresh', got {resume!r}")
        self.dir = Path(root) / CHUNK_DIR / (subdir or "")  # a study's later batches: chunks/call-K
        self.config, self.key = fingerprint(config, version)
        self.resume = resume
        self._log = log or (lambda msg: None)

    # -- the manifest: which configuration these chunks belong to
    def open(self) -> None:
        """Check (or write) the manifest; with another configuration refuse, or start afresh."""
        self.dir.mkdir(parents=True, exist_ok=True)
        man = self.dir / MANIFEST
        if man.exists():
            try:
                old = json.loads(man.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ChunkError(f"{man}: unreadable manifest ({e}); remove {self.dir} to start afresh") from None
            if old.get("key") != self.key:
                diff = sorted(k for k in set(old.get("config", {})) | set(self.config)
                              if old.get("config", {}).get(k, "<absent>") != self.config.get(k, "<absent>"))
                shown = ", ".join(f"{k}: {old.get('config', {}).get(k, '<absent>')!r} -> "
                                  f"{self.config.get(k, '<absent>')!r}" for k in diff[:8])
                more = f" and {len(diff) - 8} more" if len(diff) > 8 else ""
                if self.resume != "fresh":
                    raise ChunkError(
                        f"{self.dir} holds chunks of another configuration ({shown}{more}); rerun with "
                        f"launch.resume=fresh to discard them, or use another run directory (hydra.run.dir=...)")
                self._log(f"resume: discarding {len(self.files())} chunks of another configuration "
                          f"({shown}{more}) in {self.dir}")
                self.clear()
            elif self.resume == "fresh" and self.files():
                self._log(f"resume: launch.resume=fresh, discarding {len(self.files())} chunks in {self.dir}")
                self.clear()
        if not man.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            body = json.dumps({"key": self.key, "config": self.config}, indent=1, sort_keys=True, default=str)
            write_atomic(man, lambda p: p.write_text(body, encoding="utf-8"))

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)

    def files(self) -> list[Path]:
        return sorted(p for p in self.dir.glob("chunk-*.nc"))

    # -- chunk files
    def write(self, cells: np.ndarray, metrics: Metrics) -> Path:
        """One finished chunk: the metrics of ``cells`` (global indices), written atomically. Fields of
        one dtype and shape share a variable (``packN[cell, packN_field, ...]``; a netCDF variable per
        field costs about 10 ms to write)."""
        cells = np.asarray(cells, np.int64)
        packs: dict = {}
        for f in Metrics._fields:
            a = np.asarray(getattr(metrics, f))
            if a.size:  # per-request fields are empty unless asked for
                packs.setdefault((a.dtype.str, a.shape[1:]), []).append((f, a))
        data, coords = {}, {"cell": cells}
        for k, items in enumerate(packs.values()):
            arr = np.stack([a for _, a in items], axis=1)
            name = f"pack{k}"
            data[name] = (("cell", f"{name}_field") + tuple(f"{name}_d{j}" for j in range(2, arr.ndim)), arr)
            coords[f"{name}_field"] = [f for f, _ in items]
        ds = xr.Dataset(data, coords=coords, attrs={"config_key": self.key})
        path = self.dir / f"chunk-{int(cells.min()):08d}-{len(cells)}.nc"
        return write_atomic(path, lambda p: ds.to_netcdf(p, engine="h5netcdf"))

    @staticmethod
    def fields(ds: xr.Dataset) -> dict:
        """The metric fields of a chunk dataset (or of several combined), unpacked: {field: [cell, ...]}."""
        out = {}
        for name in ds.data_vars:
            for i, f in enumerate(ds[f"{name}_field"].values):
                out[str(f)] = ds[name].values[:, i]
        return out

    def load(self) -> tuple[xr.Dataset | None, int]:
        """(the finished cells' metrics, one row per cell sorted by cell, or None; how many files)."""
        parts = []
        for p in self.files():
            try:
                with xr.open_dataset(p, engine="h5netcdf") as ds:
                    ds = ds.load()
            except Exception as e:  # noqa: BLE001 - written atomically, so only a foreign file gets here
                raise ChunkError(f"{p}: unreadable chunk file ({e}); remove it to run its cells again") from None
            if ds.attrs.get("config_key") != self.key:
                raise ChunkError(f"{p} belongs to another configuration; remove it or use launch.resume=fresh")
            parts.append(ds)
        if not parts:
            return None, 0
        ds = xr.concat(parts, dim="cell", data_vars="all", coords="minimal", join="outer", combine_attrs="drop")
        return ds.drop_duplicates("cell").sortby("cell"), len(parts)


def assemble(n_cells: int, earlier: xr.Dataset | None, parts: list) -> Metrics:
    """Metrics of every cell ``0..n_cells-1`` (leading cell axis) from the chunks loaded from files
    (``earlier``) and those run now (``parts``: ``(cells, metrics)`` pairs); fields empty in a sweep
    (per request) stay empty."""
    rows: list = [None] * n_cells
    if earlier is not None:
        values = ChunkStore.fields(earlier)
        for n, g in enumerate(earlier["cell"].values):
            rows[int(g)] = {f: v[n] for f, v in values.items()}
    for cells, m in parts:
        values = {f: np.asarray(getattr(m, f)) for f in Metrics._fields}
        for n, g in enumerate(np.asarray(cells)):
            rows[int(g)] = {f: v[n] for f, v in values.items() if v.size}
    missing = [g for g, r in enumerate(rows) if r is None]
    if missing:
        raise ChunkError(f"{len(missing)} of {n_cells} configurations have no chunk (first: {missing[:10]})")
    out = {}
    for f in Metrics._fields:
        out[f] = (np.stack([r[f] for r in rows]) if all(f in r for r in rows)
                  else np.zeros((n_cells, 0), np.int32))
    return Metrics(**out)


def done_cells(earlier: xr.Dataset | None) -> np.ndarray:
    return np.zeros(0, np.int64) if earlier is None else earlier["cell"].values.astype(np.int64)


def plan_line(*, n_cells: int, todo: int, chunks: int, resumed: int, streams: int, memory_bytes: int,
              available_bytes: int, devices: int, where: str, part: str = "") -> str:
    """The one-line plan printed before launch."""
    mem = f"{memory_bytes / 2**20:.0f} MiB per chunk" if chunks else "-"
    done = f", {n_cells - todo} done in {resumed} earlier chunks" if resumed else ""
    return (f"plan: {n_cells} configurations{part}, {chunks} chunks to run{done}, {streams} streams, "
            f"memory estimate {mem} (available {available_bytes / 2**20:.0f} MiB), devices {devices}; "
            f"chunks in {where}")


class ProgressLines:
    """Progress as plain lines on stderr (a log file, a batch job's output): ``sweep: N/TOTAL configurations
    (chunk K/C), S s elapsed, about R s left``, at most one every ``every_s`` seconds, and the last one always.
    The methods :func:`run_grid` calls on a tqdm bar."""

    def __init__(self, total: int, every_s: float = 10.0, stream=None):
        self.total, self.every_s, self.n, self.note = total, every_s, 0, ""
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = self.last = time.perf_counter()

    def set_postfix_str(self, s: str, refresh: bool = False) -> None:
        self.note = s

    def update(self, n: int) -> None:
        self.n += n
        now = time.perf_counter()
        if self.n >= self.total or now - self.last >= self.every_s:
            self.last = now
            el = now - self.t0
            left = f", about {el / self.n * (self.total - self.n):.0f} s left" if 0 < self.n < self.total else ""
            print(f"sweep: {self.n}/{self.total} configurations ({self.note}), {el:.0f} s elapsed{left}",
                  file=self.stream, flush=True)

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool | None):
    """Progress over configurations, advanced per chunk, on stderr: a tqdm bar when ``enabled`` (None: when
    stderr is a terminal); with ``enabled`` None and stderr not a terminal (redirected to a file), plain lines
    (:class:`ProgressLines`); none when ``enabled`` is False."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    if enabled is None and not sys.stderr.isatty():
        return ProgressLines(total)
    return tqdm(total=total, unit="config", desc="sweep", file=sys.stderr, disable=enabled is False, dynamic_ncols=True,
                smoothing=0.0)


@dataclass
class RunInfo:
    """What a chunked run did (the sweep's timings and the dataset's attributes)."""

    calls: int = 0  # chunks run by this process
    memory_bytes: int = 0  # the largest chunk's compiled memory estimate
    groups: list = field(default_factory=list)  # the programs (core.run.GroupPlan) of the chunks run now
    devices: int = 1
    chunks: int = 0  # chunks the results are combined from
    chunks_resumed: int = 0  # of those, chunks taken from an earlier, interrupted run
    complete: bool = True  # False: another part of a multi-part run still has cells to run


def run_grid(streams, stream_of, params, seeds, *, max_replicas: int, max_batch=None, store: ChunkStore | None = None,
             part: int = 0, parts: int = 1, devices=None, progress=None, log=None, **options):
    """Run the cells of a grid as chunks (the calls of :func:`~cacheresearch.core.run.plan_cells`).

    With a ``store``, cells already in its chunk files are skipped and each chunk run now is written
    there as it finishes. ``part``/``parts`` restrict the run to one slice of the grid. Returns the
    metrics of every cell in cell order (None while other parts have cells left) and a
    :class:`RunInfo`. ``log`` gets the one-line plan; the progress bar goes to stderr."""
    G = len(params)
    stream_of = np.asarray(stream_of, np.int64)
    seeds = np.asarray(seeds, np.uint32)
    earlier, resumed = store.load() if store is not None else (None, 0)
    todo = np.setdiff1d(np.arange(G, dtype=np.int64), done_cells(earlier))
    where = str(store.dir) if store is not None else "memory (no chunk files)"
    label = ""
    if parts > 1:
        if store is None:
            raise ChunkError("launch.parts > 1 needs chunk files (launch.chunks=true): parts meet in one directory")
        mine = part_cells(cell_order(params, stream_of), part, parts)
        todo = np.intersect1d(todo, mine)
        label = f" (part {part + 1} of {parts}: {len(mine)} of them)"
    runner = None
    if len(todo):
        if log is not None:  # compiling comes first: the memory estimate is the compiled programs'
            log(f"compiling the programs of {len(todo)} configurations{label} ...")
        runner = plan_cells(streams, stream_of[todo], [params[g] for g in todo], seeds[todo],
                            max_replicas=max_replicas, max_batch=max_batch, devices=devices, **options)
    info = RunInfo(chunks_resumed=resumed)
    if runner is not None:
        rp = runner.plan
        info.calls, info.memory_bytes, info.groups, info.devices = rp.calls, rp.memory_bytes, rp.groups, rp.devices
        avail = rp.available_bytes
    else:
        info.devices = devices if isinstance(devices, int) else len(devices) if devices else len(jax.local_devices())
        avail = available_memory_bytes()
    if log is not None:
        log(plan_line(n_cells=G, todo=len(todo), chunks=info.calls, resumed=resumed,
                      streams=len(set(stream_of.tolist())), memory_bytes=info.memory_bytes,
                      available_bytes=avail, devices=info.devices, where=where, part=label))
        if runner is not None:
            for line in runner.plan.program_lines():
                log(line)
    new = []
    if runner is not None:
        bar = progress_bar(len(todo), progress)
        try:
            for k in range(len(runner.calls)):
                local, m = runner.run(k)
                cells = todo[local]
                if store is not None:
                    store.write(cells, m)
                new.append((cells, m))
                bar.set_postfix_str(f"chunk {k + 1}/{len(runner.calls)}", refresh=False)
                bar.update(len(cells))
        finally:
            bar.close()
    if store is not None and parts > 1:  # other parts may have finished meanwhile: the files decide
        earlier, n_files = store.load()
        new = []
        info.complete = earlier is not None and len(done_cells(earlier)) == G
        info.chunks = n_files
    else:
        info.chunks = resumed + info.calls
    if not info.complete:
        return None, info
    return assemble(G, earlier, new), info
