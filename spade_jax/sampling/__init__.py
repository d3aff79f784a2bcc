"""Text generation from a decoder: prefill + decode over a donated KV cache (`Sampler`), the
sampling maths, the shared packed CPU weights, and multi-turn prefix reuse.

config.py   SamplingConfig and the shape buckets      choice.py   token choice inside compiled loops
sampler.py  Sampler: prefill, decode, stops, results  prefix.py   reuse of the last call's KV cache
packed.py   packed CPU decode weights (PACKED_WEIGHTS) versions.py  which parameters a cache came from
"""

from spade_jax.sampling.choice import SamplingMode, choose, sampling_knobs
from spade_jax.sampling.config import SamplingConfig, fit_bucket
from spade_jax.sampling.packed import PACKED_WEIGHTS, PackedWeights, cpu_kernel_applies
from spade_jax.sampling.sampler import FINISH_REASONS, GenerationResult, Sampler, sequence_logprobs

__all__ = [
    "FINISH_REASONS",
    "GenerationResult",
    "PACKED_WEIGHTS",
    "PackedWeights",
    "Sampler",
    "SamplingConfig",
    "SamplingMode",
    "choose",
    "cpu_kernel_applies",
    "fit_bucket",
    "sampling_knobs",
    "sequence_logprobs",
]
