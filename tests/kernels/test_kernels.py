"""The packed float32 matmul kernel (spade_jax.kernels) against numpy; its builds and its failure to
build (the sampler's decode with it: tests/sampling/test_packed.py)."""

import os
import platform
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import kernels

needs_kernel = pytest.mark.skipif(not kernels.available(), reason=f"kernel unavailable: {kernels.unavailable_reason()}")


def test_the_kernel_builds_wherever_a_compiler_exists():
    if kernels._compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    assert kernels.available(), kernels.unavailable_reason()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("k,n", [(64, 48), (37, 160), (576, 192)])
def test_packed_matmul_equals_numpy(rows, k, n):
    rng = np.random.default_rng(rows * 1000 + k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64)
    got = jax.jit(lambda x, w: kernels.packed_matmul(x, kernels.pack(w)))(x, w)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4 * np.sqrt(k))
    # A weight contracted on its last axis (a tied embedding) packs by rows to the same product.
    got_rows = jax.jit(lambda x, w_nk: kernels.packed_matmul(x, kernels.pack_rows(w_nk)))(x, w.T.copy())
    np.testing.assert_allclose(np.asarray(got_rows), want, rtol=1e-5, atol=1e-4 * np.sqrt(k))


@needs_kernel
def test_packed_matmul_keeps_leading_axes_and_runs_in_a_loop():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 32), dtype=np.float32)
    w = rng.standard_normal((32, 32), dtype=np.float32) / 6

    def steps(x, w_packed):
        return jax.lax.fori_loop(0, 4, lambda _, h: jnp.tanh(kernels.packed_matmul(h, w_packed)), x)

    got = jax.jit(steps)(x, kernels.pack(jnp.asarray(w)))
    want = x.astype(np.float64)
    for _ in range(4):
        want = np.tanh(want @ w)
    assert got.shape == (2, 3, 32)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


@needs_kernel
def test_packed_matmul_rejects_what_it_cannot_multiply():
    w = kernels.pack(jnp.ones((8, 16)))
    with pytest.raises(ValueError, match="packed_matmul"):
        kernels.packed_matmul(jnp.ones((2, 9)), w)  # K mismatch
    with pytest.raises(ValueError, match="packed_matmul"):
        kernels.packed_matmul(jnp.ones((2, 8), jnp.bfloat16), w)
    assert not kernels.packable(8, 24) and kernels.packable(8, 32)


def test_a_failed_build_leaves_the_kernel_unavailable_with_its_reason(tmp_path):
    code = (
        "from spade_jax import kernels; "
        "print(kernels.available(), '|', kernels.unavailable_reason())"
    )
    env = dict(os.environ, CXX="false", SPADE_JAX_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    available, reason = out.stdout.strip().split(" | ")
    assert available == "False" and "false failed" in reason
    assert not list(tmp_path.rglob("*.so"))  # nothing half-built left in the cache


@pytest.mark.skipif(not kernels.available() or platform.machine() not in ("x86_64", "AMD64"),
                    reason="needs a working x86 kernel build")
@pytest.mark.parametrize("arch,bits", [("x86-64-v3", 256), ("x86-64-v2", 128)])
def test_the_avx2_and_sse_builds_equal_numpy(tmp_path, arch, bits):
    """The narrower register tiles (6 rows with AVX2, 3 with SSE) cover every row remainder."""
    code = f"""
import numpy as np, jax
from spade_jax import kernels
assert kernels.vector_bits() == {bits}, kernels.vector_bits()
rng = np.random.default_rng(0)
for rows in (1, 2, 3, 5, 6, 7, 13, 16, 19):
    x = rng.standard_normal((rows, 70), dtype=np.float32)
    w = rng.standard_normal((70, 80), dtype=np.float32)
    got = np.asarray(jax.jit(lambda x, w: kernels.packed_matmul(x, kernels.pack(w)))(x, w))
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-3)
print("ok")
"""
    env = dict(os.environ, SPADE_JAX_KERNEL_ARCH=arch, SPADE_JAX_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
