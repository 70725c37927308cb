"""The numba backends' registry: ``core/`` imports no backend module; the backends register themselves here.

A numba backend runs one replica model (:data:`KINDS`: ``fcfs``, ``blocks`` (the fcfs replica with a per-block
policy), ``vllm``) and is a module with ``coverage(params, st)`` (what it does not model, in phrases),
``state_bytes(stream, st)`` and ``run_stream(stream, params, keys, st, n_out=)``. Its registration
(:class:`NumbaBackend`) names that module, says in words what it models (the refusal's second sentence) and
carries the replica model's policy table where the model has one (the vllm pool's orders, and why it refuses
each other policy). The registrations are made when the package :data:`PROVIDER` is imported (it imports no
numba); this module imports it by name on the first question, and a backend's module (numba, its kernels)
only when a run needs it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["KINDS", "PROVIDER", "NumbaBackend", "register_numba", "numba_backend", "numba_module", "numba_kind",
           "numba_available"]

#: The replica models a numba backend runs: fcfs, fcfs with a per-block policy, vllm.
KINDS = ("fcfs", "blocks", "vllm")
#: The package whose import registers the numba backends (by name: core imports no backend).
PROVIDER = "cacheresearch.backends"


@dataclass(frozen=True)
class NumbaBackend:
    """``module``: the backend module's dotted name (imported on first use); ``covers``: what it models of its
    replica model, in words (``"with the policies [...] and ..."``: a refusal puts ``"the fcfs replica "`` before
    it); ``policies``: the policies the replica model takes on this backend, in order; ``refused``: policy -> why
    the replica model cannot take it (one line; empty where the model refuses nothing by table). Each may be given
    as a function of no arguments, asked at every question (tables that follow the policy registry)."""

    module: str
    covers: str
    policies: tuple = ()
    refused: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))


_REGISTRY: dict[str, NumbaBackend] = {}


def register_numba(kind: str, backend: NumbaBackend) -> None:
    """Register the numba backend of replica model ``kind`` (one of :data:`KINDS`); a second registration
    replaces the first."""
    if kind not in KINDS:
        raise ValueError(f"numba backend kind {kind!r}: one of {list(KINDS)}")
    _REGISTRY[kind] = backend


def numba_backend(kind: str) -> NumbaBackend:
    """The registration of replica model ``kind``'s numba backend (imports :data:`PROVIDER` on first use)."""
    if kind not in _REGISTRY:
        importlib.import_module(PROVIDER)
    if kind not in _REGISTRY:
        raise ValueError(f"no numba backend is registered for {kind!r} (registered: {sorted(_REGISTRY)})")
    b = _REGISTRY[kind]
    now = [f() if callable(f) else f for f in (b.covers, b.policies, b.refused)]
    return NumbaBackend(b.module, now[0], tuple(now[1]), MappingProxyType(dict(now[2])))


def numba_kind(scheduler: str, blocks: bool = False) -> str:
    """The backend kind of a program: ``vllm`` for the vllm replica, ``blocks`` for the fcfs replica with a
    per-block policy, else ``fcfs``."""
    if scheduler == "vllm":
        return "vllm"
    return "blocks" if blocks else "fcfs"


def numba_module(scheduler: str, blocks: bool = False):
    """The numba backend module of a program (imported now: it imports numba)."""
    return importlib.import_module(numba_backend(numba_kind(scheduler, blocks)).module)


def numba_available() -> bool:
    """numba importable (the backends' only requirement)."""
    try:
        import numba  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True
