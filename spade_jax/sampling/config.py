"""What a generation call is asked for: `SamplingConfig` (budget, temperature / top-k / top-p, stops,
cache dtype, CPU kernel choice, prefix reuse) and the padded-shape buckets that bound compiles."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp


def _powers_of_two(start: int, stop: int) -> tuple[int, ...]:
    out, size = [], start
    while size < stop:
        out.append(size)
        size *= 2
    return tuple(out) + (stop,)


def _half_octaves(start: int, stop: int) -> tuple[int, ...]:
    """start, 1.5 start, 2 start, 3 start, 4 start, ...: padding wastes at most a third, on average
    about a sixth, for two compiled shapes per doubling."""
    out = []
    for size in _powers_of_two(start, stop):
        out += [size, size * 3 // 2]
    return tuple(s for s in out if s < stop) + (stop,)


def _quarter_octaves(start: int, stop: int) -> tuple[int, ...]:
    """start * 2**(i/4) rounded up to a multiple of 8: padding wastes at most a fifth, four compiled
    shapes per doubling."""
    out, i = [], 0
    while (size := -(-int(math.ceil(start * 2 ** (i / 4))) // 8) * 8) < stop:
        if not out or size > out[-1]:
            out.append(size)
        i += 1
    return tuple(out) + (stop,)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 256  # tokens to generate at most per row (EOS included)
    temperature: float = 1.0  # softmax temperature; 0 means greedy (argmax)
    top_p: float = 1.0  # nucleus: keep the smallest top set with this much probability (1 = off)
    top_k: int = 0  # keep only the k most likely tokens (0 = off)
    # Cut the completion right after the first match (host side); a sampled token whose own text
    # holds a stop string also ends its row on device, so such rows do not run on to the budget.
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # device-side: these ids end a row like EOS (reason "stop")
    ignore_eos: bool = False  # keep going after EOS (benchmarks that need fixed lengths)
    prompt_buckets: tuple[int, ...] = _half_octaves(32, 1 << 17)  # padded prompt lengths
    # Prefill the prompts packed into one sequence (padding skipped by everything but attention),
    # its length padded to one of `packed_buckets`; off, or under a batch-sharded mesh, the prefill
    # runs on the padded [batch, prompt bucket] block. Results are the same either way.
    pack_prompts: bool = True
    # Prefill each distinct prompt once and copy its cache row to the prompts that repeat it (a GRPO group's
    # plays of one instance open alike); the draws stay per row. Off only to measure what it saves: a
    # `laptop` iteration's first call 3.62x faster (benchmarks/multiturn.py --group 8), its plays 1.12x
    # (benchmarks/iteration.py; docs/benchmarks.md).
    prefill_distinct: bool = True
    # The same for the new tails fed on top of a kept cache (`reuse_prefix`): a multi-turn turn's tails
    # differ in length and finished conversations keep their rows, so the padded block is mostly padding.
    # Off by default: with it (and compact_cache, half-octave batch_buckets) a 48-game, 8-turn play ran
    # 1.52x faster once compiled, but a cold-cache `laptop` iteration's plays 1.27x slower, paying the
    # compiles of the extra shapes (docs/benchmarks.md, "Packed tails, compacted caches")
    pack_tails: bool = False
    packed_buckets: tuple[int, ...] = _quarter_octaves(32, 1 << 20)
    # padded batch sizes; attention and the decode steps run on every padded row, so half octaves
    # ([1, 2, 3, 4, 6, 8, 12, ...]: 48 plays in 48 rows, not 64) run less, at more compiled shapes (pack_tails)
    batch_buckets: tuple[int, ...] = _powers_of_two(1, 1 << 16)
    new_token_bucket: int = 64  # cache room for new tokens is max_new_tokens rounded up to this
    # KV cache dtype. "auto": float32 on a CPU (XLA:CPU attends faster over f32), the model's compute
    # dtype on an accelerator (a GPU trace of a bf16 model over an f32 cache spent ~10% of each
    # decode step converting every layer's cache window to bf16).
    cache_dtype: str = "auto"
    # Decode matmuls on a CPU: "auto" uses the packed float32 kernel (`spade_jax.kernels`) for a
    # float32 model on one x86 CPU device with AVX2 or AVX-512 where it builds, "xla" always XLA's dot. The kernel
    # reads a packed copy of the weights (the model's size again; see `PACKED_WEIGHTS`).
    cpu_kernel: str = "auto"
    # Host-only: feed only the new tail of prompts that extend the previous call's rows (same results).
    # compare=False keeps it out of ==/hash, so caches keyed by a config never split over it.
    reuse_prefix: bool = dataclasses.field(default=True, compare=False)
    # Host-only too: with prefix reuse, move each row's kept tokens to its first slots (`prefix.COMPACT`)
    # whenever that needs a smaller cache than writing after the longest row's padding would; the kept
    # cache otherwise grows by a tail bucket and the reply room per turn, mostly empty slots that the
    # extension and every decode step attend over. Same results; off by default (see pack_tails).
    compact_cache: bool = dataclasses.field(default=False, compare=False)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids >= 0, got {self.stop_token_ids}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings must be non-empty strings")
        for name in ("prompt_buckets", "batch_buckets", "packed_buckets"):
            buckets = getattr(self, name)
            if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
                raise ValueError(f"{name} must be increasing positive sizes, got {buckets}")
        if self.new_token_bucket < 1:
            raise ValueError(f"new_token_bucket must be >= 1, got {self.new_token_bucket}")
        if self.cache_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"cache_dtype must be auto, float32, bfloat16 or float16, got {self.cache_dtype}")
        if self.cpu_kernel not in ("auto", "xla"):
            raise ValueError(f"cpu_kernel must be auto or xla, got {self.cpu_kernel}")

    def kv_cache_dtype(self, compute_dtype) -> str:
        """The KV cache dtype's name for a model computing in `compute_dtype` (resolves "auto")."""
        if self.cache_dtype != "auto":
            return self.cache_dtype
        return "float32" if jax.default_backend() == "cpu" else jnp.dtype(compute_dtype).name

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes) -> "SamplingConfig":
        return dataclasses.replace(self, **changes)


def fit_bucket(size: int, buckets: Sequence[int], what: str) -> int:
    """The smallest bucket that holds `size` (`what` names the size in the error past the largest)."""
    for b in buckets:
        if b >= size:
            return b
    raise ValueError(f"{what} {size} exceeds the largest bucket {buckets[-1]}; add a larger bucket")
