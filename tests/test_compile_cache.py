"""engine.compile_cache: the command line's persistent JAX compilation cache (off, a directory, auto, or a
directory the environment already set)."""

from __future__ import annotations

import jax
import pytest
from omegaconf import OmegaConf

from cacheresearch.shell.sweep import compile_cache


@pytest.fixture
def restore():
    before = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", before)


def test_off_a_directory_and_auto(tmp_path, monkeypatch, restore):
    jax.config.update("jax_compilation_cache_dir", None)
    assert compile_cache(OmegaConf.create({"engine": {"compile_cache": "none"}})) is None
    assert jax.config.jax_compilation_cache_dir is None
    assert compile_cache(OmegaConf.create({"engine": {"compile_cache": str(tmp_path / "c")}})) == str(tmp_path / "c")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache(OmegaConf.create({})) == str(tmp_path / "xdg" / "cacheresearch" / "jax")


def test_a_directory_already_set_is_kept(tmp_path, restore):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    assert compile_cache(OmegaConf.create({"engine": {"compile_cache": str(tmp_path / "other")}})) == str(
        tmp_path / "mine")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
