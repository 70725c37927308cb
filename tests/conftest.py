"""Shared test settings.

Each test module's compiled JAX programs are released when the module ends: a whole-suite process
otherwise keeps every executable it ever compiled (memory grew past 4.5 GB, and XLA's compiler
crashed late in the session once it held that many)."""

from __future__ import annotations

import gc

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    yield
    jax.clear_caches()
    gc.collect()
