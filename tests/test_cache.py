"""Where XLA's compiled programs are kept between runs (`spade_jax.cache.enable_compilation_cache`)."""

import jax
import pytest

from spade_jax.cache import enable_compilation_cache

KEYS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")


@pytest.fixture
def jax_cache_config():
    saved = {key: jax.config.values[key] for key in KEYS}
    yield
    for key, value in saved.items():
        jax.config.update(key, value)


def test_programs_go_under_the_cache_root(monkeypatch, tmp_path, jax_cache_config):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("SPADE_JAX_NO_CACHE", raising=False)
    monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path))
    assert enable_compilation_cache() == str(tmp_path / "xla")
    assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "xla")


def test_a_folder_named_by_jax_is_kept_and_no_cache_turns_it_off(monkeypatch, tmp_path, jax_cache_config):
    before = jax.config.values["jax_compilation_cache_dir"]
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert enable_compilation_cache() == str(tmp_path / "mine")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("SPADE_JAX_NO_CACHE", "1")
    assert enable_compilation_cache() is None
    assert jax.config.values["jax_compilation_cache_dir"] == before
