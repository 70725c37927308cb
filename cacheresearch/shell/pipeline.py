"""The one experiment pipeline: a study's cells run as chunks, its dataset and outputs written atomically.

Every experiment is a :class:`~cacheresearch.studies.base.Study`. :func:`run_study` starts it
(``plan``: the cells it needs), runs each batch of cells it yields through
:func:`cacheresearch.shell.chunks.run_grid` (chunks that fit memory or ``engine.max_batch`` configurations,
sharded over the local devices; with an output directory, chunk files in ``DIR/chunks/`` written as they
finish, resumed on a rerun, a changed configuration refused, the plan line and the progress bar), hands
their metrics back (``assemble``) and returns the dataset. A study that asks for several batches gets a
chunk directory per batch (``chunks/call-K/``; the grid's single batch keeps ``chunks/``). The run's
attributes (devices, chunks, chunks resumed, simulate and compile time) are set here for every study.
:func:`write_outputs` writes ``results.nc``, ``summary.txt`` and ``figure.png``, each atomically.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import xarray as xr

from cacheresearch.core.run import BackendError, MemoryError_
from cacheresearch.shell import cf
from cacheresearch.shell.chunks import ChunkError, ChunkStore, run_grid, write_atomic
from cacheresearch.studies.base import Study, StudyError

__all__ = ["PipelineError", "run_study", "write_outputs", "RESULT_FILE", "SUMMARY_FILE", "FIGURE_FILE",
           "CompileTimer"]

RESULT_FILE, SUMMARY_FILE, FIGURE_FILE = "results.nc", "summary.txt", "figure.png"


class PipelineError(ValueError):
    """A run that cannot go on (bad launch settings, chunk files of another configuration, memory)."""


class CompileTimer:
    """Sums JAX's compile-time events (tracing, lowering, backend compile) while active."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __init__(self):
        self.seconds = 0.0

    def _listener(self, event, duration, **kwargs):
        if event in self.EVENTS:
            self.seconds += float(duration)

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc):
        try:
            jax.monitoring.unregister_event_duration_listener(self._listener)
        except Exception:  # noqa: BLE001 - older JAX: leave the (inactive) listener registered
            pass
        return False


def _log(msg: str) -> None:
    """Progress and plan lines go to stderr (stdout carries the summary)."""
    print(msg, file=sys.stderr, flush=True)


def run_study(study: Study, cfg, *, store_of=None, max_batch=None, launch: dict | None = None,
              log=_log) -> xr.Dataset | None:
    """Drive ``study`` on ``cfg``: every batch of cells through the chunked runner.

    ``store_of(k)``: the :class:`~cacheresearch.shell.chunks.ChunkStore` of batch ``k`` (None: in memory);
    ``launch``: :func:`run_grid`'s launch arguments (``part``, ``parts``, ``devices``, ``progress``).
    Returns the dataset, or None while other parts of a multi-part run have cells left."""
    launch = dict(launch or {})
    t0 = time.perf_counter()
    info = dict(calls=0, chunks=0, chunks_resumed=0, devices=0, simulate_s=0.0, memory_bytes=0, programs=0)
    try:
        r = study.plan(cfg)
        with CompileTimer() as ct:
            while r.cells is not None:
                c = r.cells
                if r.calls and launch.get("parts", 1) > 1:
                    raise PipelineError(f"study {study.name!r} runs several batches of cells; launch.parts > 1 "
                                        "splits one batch: run it without launch.parts")
                store = store_of(r.calls) if store_of is not None else None
                ts = time.perf_counter()
                m, ri = run_grid(c.streams, c.stream_of, c.params, c.seeds, max_replicas=c.max_replicas,
                                 max_batch=max_batch, store=store, log=log, **launch, **c.options)
                info["simulate_s"] += time.perf_counter() - ts
                for k in ("calls", "chunks", "chunks_resumed", "memory_bytes"):
                    info[k] = max(info[k], getattr(ri, k)) if k == "memory_bytes" else info[k] + getattr(ri, k)
                info["devices"], info["programs"] = ri.devices, info["programs"] + len(ri.groups)
                if m is None:  # a part of a multi-part run; the last part to finish combines
                    return None
                r.assemble(m)
    except MemoryError_ as e:
        raise PipelineError(f"{e} (or set engine.max_batch)") from None
    except (ChunkError, StudyError, BackendError) as e:
        raise PipelineError(str(e)) from None
    ds = r.dataset
    ds.attrs.update(devices=int(info["devices"] or len(jax.local_devices())), chunks=int(info["chunks"]),
                    chunks_resumed=int(info["chunks_resumed"]), engine_batches=int(r.calls),
                    n_compiled_calls=int(info["calls"]), compile_time_s=float(ct.seconds),
                    memory_estimate_bytes=int(info["memory_bytes"]))
    if r.calls:
        ds.attrs["simulate_time_s"] = float(info["simulate_s"])
    ds.attrs.setdefault("wall_time_s", float(time.perf_counter() - t0))
    return cf.complete(ds)  # long_name / units a study left out (CF)


def chunk_stores(root, config: dict, version: str, *, resume: str, log=_log):
    """``store_of(k)`` for :func:`run_study`: batch 0 in ``root/chunks``, batch ``k`` in
    ``root/chunks/call-K`` (each checked against ``config``: a changed configuration is refused)."""
    def store_of(k: int) -> ChunkStore:
        try:
            s = ChunkStore(root, dict(config, engine_batch=k), version, resume=resume, log=log,
                           subdir=None if k == 0 else f"call-{k}")
            s.open()
        except ChunkError as e:
            raise PipelineError(str(e)) from None
        return s
    return store_of


def write_outputs(ds: xr.Dataset, output_dir, study: Study, *, figure: bool = True) -> str:
    """``results.nc``, ``summary.txt`` and (optionally) ``figure.png`` in ``output_dir``, each written
    atomically (a temporary name, then a rename: never a partial file); returns the summary."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / RESULT_FILE, lambda p: ds.to_netcdf(p, engine="h5netcdf"))
    text = study.summarize(ds)
    write_atomic(out / SUMMARY_FILE, lambda p: p.write_text(text + "\n", encoding="utf-8"))
    if figure:
        f = study.plot(ds)
        write_atomic(out / FIGURE_FILE, lambda p: f.savefig(p, dpi=120, format="png"))
    return text
