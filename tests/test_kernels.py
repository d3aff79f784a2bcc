"""The packed float32 matmul kernel (spade_jax.kernels) against numpy, and the sampler's decode with
it against the XLA path (itself checked against transformers in test_sampling)."""

import os
import platform
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spade_jax import kernels
from spade_jax.models.registry import load_model
from spade_jax.sampling import PACKED_WEIGHTS, Sampler, SamplingConfig

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


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=3)  # vocab 512 and every projection packable; tied head


@needs_kernel
def test_decode_with_the_kernel_matches_xla_and_follows_parameter_updates(tiny):
    model = tiny.model
    sampler = Sampler(model, tiny.tokenizer)
    prompts = [[5, 9, 200, 17], [3] * 11, [100, 101, 102], list(range(20, 45))]
    fast = SamplingConfig(max_new_tokens=24, temperature=0.0, ignore_eos=True, reuse_prefix=False)
    plain = fast.replace(cpu_kernel="xla")
    assert sampler.uses_cpu_kernel(fast) == kernels.preferred() and not sampler.uses_cpu_kernel(plain)
    if not kernels.preferred():
        pytest.skip("no AVX2/AVX-512 build here: auto keeps XLA's dot")

    def compare(a, b):
        assert a.tokens == b.tokens
        for la, lb in zip(a.logprobs, b.logprobs):
            np.testing.assert_allclose(la, lb, atol=2e-4)

    compare(sampler.generate(prompts, fast), sampler.generate(prompts, plain))
    sampled = fast.replace(temperature=0.8, top_p=0.9)
    compare(sampler.generate(prompts, sampled, key=7), sampler.generate(prompts, sampled.replace(cpu_kernel="xla"), key=7))

    # A training step makes new parameter arrays: the packed copy must follow them.
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p: p * 1.5 if p.ndim >= 2 else p, state))
    after = sampler.generate(prompts, fast)
    compare(after, sampler.generate(prompts, plain))
    graphdef, params = nnx.split(model)
    assert PACKED_WEIGHTS.holds(graphdef, params)
    sampler.forget()
    assert not PACKED_WEIGHTS.holds(graphdef, params)


@needs_kernel
def test_one_packed_copy_per_parameter_version_process_wide():
    import gc

    from spade_jax.sampling import cpu_kernel_applies

    config = SamplingConfig(max_new_tokens=3, temperature=0.0, reuse_prefix=False)
    models = [load_model("tiny", seed=s).model for s in (1, 2, 3)]
    if not cpu_kernel_applies(config, models[0]):
        pytest.skip("the packed CPU kernel does not apply here")
    PACKED_WEIGHTS._held.clear()
    for model in models[:2]:
        Sampler(model).generate([[5, 6, 7]], config)
        Sampler(model).generate([[5, 6, 7]], config)  # a second sampler of the same model: no new copy
    assert len(PACKED_WEIGHTS._held) == 2
    Sampler(models[2]).generate([[5, 6, 7]], config)
    assert len(PACKED_WEIGHTS._held) == PACKED_WEIGHTS.keep  # the least recently used went
    assert not PACKED_WEIGHTS.holds(*nnx.split(models[0]))
    del models[2]
    gc.collect()
    assert len(PACKED_WEIGHTS._held) == 1  # freed parameters take their packed copy with them


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
