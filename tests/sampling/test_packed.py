"""The sampler's decode with the packed CPU kernel against the XLA path (itself checked against
transformers in test_sampler), and the process-wide packed-weights cache (spade_jax.sampling.packed)."""

import jax
import numpy as np
import pytest
from flax import nnx

from spade_jax import kernels
from spade_jax.models.registry import load_model
from spade_jax.sampling import PACKED_WEIGHTS, Sampler, SamplingConfig

needs_kernel = pytest.mark.skipif(not kernels.available(), reason=f"kernel unavailable: {kernels.unavailable_reason()}")


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
    compare(
        sampler.generate(prompts, sampled, key=7), sampler.generate(prompts, sampled.replace(cpu_kernel="xla"), key=7)
    )

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
