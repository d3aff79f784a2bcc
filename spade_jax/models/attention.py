"""Softmax attention by implementation name (`model.attention`): the einsum path, `jax.nn.dot_product_attention`
(XLA, or cuDNN's fused kernel on a GPU in 16-bit) and the TPU splash kernel (Pallas; interpreted elsewhere).

Every implementation takes queries [B, T, KVH, G, D] (GQA: G query heads per KV head), keys and values in
the cache layouts ([B, KVH, D, S] and [B, KVH, S, D]) and an `AttnMask`; returns [B, T, KVH, G, D].
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp

ATTENTION = ("einsum", "dot_product", "splash")

_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite, so fully padded rows stay NaN-free
_SPLASH_BLOCK = 128  # splash's smallest block (TPU lanes): sequences are padded to a multiple of it


def check_attention(name: str) -> str:
    if name not in ATTENTION:
        raise ValueError(f"attention={name!r} is not supported; choose one of {', '.join(ATTENTION)}")
    return name


@flax.struct.dataclass
class AttnMask:
    """Which keys each query sees: the dense mask the einsum and dot_product paths read, plus the
    structure the splash kernel needs instead (it cannot take a dense per-row mask)."""

    dense_bts: jax.Array  # bool [B, T, S]
    valid_bs: jax.Array  # bool [B, S]: the key slot holds a real token
    # int32 [B, S]: which packed sequence each slot holds (>= 1 on real tokens); None: one per row.
    # The dense mask already keeps queries inside their sequence; splash reads these instead.
    segments_bs: jax.Array | None = None
    sliding: jax.Array | None = None  # bool scalar under scan_layers: this layer uses `window`
    window: int | None = flax.struct.field(pytree_node=False, default=None)  # sliding window (None: none)
    self_attention: bool = flax.struct.field(pytree_node=False, default=False)  # no cache: keys are the queries
    # the dense mask lets sequences see a shared prompt segment (TrainBatch.prefix_ids_bt): segment ids alone
    # cannot say so, so splash cannot run it
    shared_prefixes: bool = flax.struct.field(pytree_node=False, default=False)

    def choose(self, sliding: jax.Array, windowed: "AttnMask") -> "AttnMask":
        """`windowed` where the traced flag `sliding` is set, else this mask (scan over mixed layers)."""
        return self.replace(dense_bts=jnp.where(sliding, windowed.dense_bts, self.dense_bts), sliding=sliding,
                            window=windowed.window)


def attend(impl: str, q_btkgd, k_bkds, v_bksd, mask: AttnMask, chunk: int | None = None):
    """Attention with implementation `impl` (one of ATTENTION). Splash runs cache-free calls (training,
    scoring); calls over a KV cache (prefill, decode) take the dot_product path, which equals it."""
    if impl == "splash" and mask.self_attention:
        if mask.shared_prefixes:
            raise ValueError("attention=splash cannot run shared prompt segments (rl.share_prefixes): use "
                             "attention=einsum or dot_product, or rl.share_prefixes=false")
        return _splash(q_btkgd, k_bkds, v_bksd, mask)
    block = _einsum_block if impl == "einsum" else _dot_product_block
    out = _chunked(block, q_btkgd, k_bkds, v_bksd, mask.dense_bts, chunk, causal=mask.self_attention)
    # a query that sees no key (padding) reads 0, not a mean over however many keys its block held
    return jnp.where(mask.dense_bts.any(axis=-1)[:, :, None, None, None], out, 0)


def _chunked(block, q_btkgd, k_bkds, v_bksd, mask_bts, chunk, causal: bool = False):
    """Longer than `chunk`, the queries go in blocks whose scores are rematerialised in the backward pass,
    so neither pass holds more than one block's [B, heads, chunk, S] scores. `causal` (cache-free calls,
    where query and key columns are the same and no query sees a later column): a block reads only the
    keys up to its last query, a quarter less attention arithmetic at two blocks."""
    t = q_btkgd.shape[1]
    if chunk is None or t <= chunk:
        return block(q_btkgd, k_bkds, v_bksd, mask_bts)
    block = jax.checkpoint(block)
    outs = []
    for s in range(0, t, chunk):
        keys = min(s + chunk, t) if causal else k_bkds.shape[-1]
        outs.append(block(q_btkgd[:, s: s + chunk], k_bkds[..., :keys], v_bksd[:, :, :keys],
                          mask_bts[:, s: s + chunk, :keys]))
    return jnp.concatenate(outs, axis=1)


def _einsum_block(q_btkgd, k_bkds, v_bksd, mask_bts):
    d = q_btkgd.shape[-1]
    q_bkgtd = q_btkgd.transpose(0, 2, 3, 1, 4)
    scores = jnp.einsum("bkgtd,bkds->bkgts", q_bkgtd, k_bkds, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(d)
    scores = jnp.where(mask_bts[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(q_btkgd.dtype)
    out = jnp.einsum("bkgts,bksd->bkgtd", probs, v_bksd, preferred_element_type=jnp.float32)
    return out.astype(q_btkgd.dtype).transpose(0, 3, 1, 2, 4)


def dot_product_implementation(dtype) -> str:
    """cuDNN's fused attention on a GPU for 16-bit inputs (all it takes), XLA's otherwise."""
    gpu = jax.default_backend() == "gpu"
    return "cudnn" if gpu and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)) else "xla"


def _dot_product_block(q_btkgd, k_bkds, v_bksd, mask_bts):
    b, t, kvh, g, d = q_btkgd.shape
    q = q_btkgd.reshape(b, t, kvh * g, d)  # head kvh_i * g + g_i: the grouping dot_product_attention uses
    k = k_bkds.transpose(0, 3, 1, 2)  # [B, S, KVH, D]
    v = v_bksd.transpose(0, 2, 1, 3)
    impl = dot_product_implementation(q.dtype)
    out = jax.nn.dot_product_attention(q, k, v, mask=mask_bts[:, None], implementation=impl)
    return out.reshape(b, t, kvh, g, d)


@functools.cache
def _splash_kernel(heads: int, length: int, window: int | None, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    shape = (length, length)
    one = sa.CausalMask(shape) if window is None else sa.LocalMask(shape, (window - 1, 0), offset=0)
    block = min(512, length)
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    with jax.ensure_compile_time_eval():  # the mask tables are constants, not values of the trace that asks first
        return sa.make_splash_mha(sa.MultiHeadMask([one] * heads), head_shards=1, q_seq_shards=1, block_sizes=sizes,
                                  interpret=interpret)


def _splash(q_btkgd, k_bkds, v_bksd, mask: AttnMask):
    """The TPU splash kernel over [B] rows: causal (or local) mask from the block structure, padding as
    segment ids (real tokens 1, or their packed sequence's id; padding 0). Real queries see exactly the
    einsum path's keys; padding queries see earlier padding instead of nothing (never read)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, t, kvh, g, d = q_btkgd.shape
    length = -(-t // _SPLASH_BLOCK) * _SPLASH_BLOCK
    grow = length - t
    scale = 1.0 / math.sqrt(d)  # splash does not scale the scores
    q = (q_btkgd.astype(jnp.float32) * scale).astype(q_btkgd.dtype).reshape(b, t, kvh * g, d).transpose(0, 2, 1, 3)
    k = k_bkds.transpose(0, 1, 3, 2)  # [B, KVH, S, D]
    q = jnp.pad(q, ((0, 0), (0, 0), (0, grow), (0, 0)))
    k = jnp.pad(k, ((0, 0), (0, 0), (0, grow), (0, 0)))
    v = jnp.pad(v_bksd, ((0, 0), (0, 0), (0, grow), (0, 0)))
    segments = mask.valid_bs.astype(jnp.int32)
    if mask.segments_bs is not None:
        segments = jnp.where(mask.valid_bs, mask.segments_bs.astype(jnp.int32), 0)
    segments = jnp.pad(segments, ((0, 0), (0, grow)))
    interpret = jax.default_backend() != "tpu"

    def local(q, k, v, segments, sliding):
        """The kernel over this device's rows and heads (all of them without a mesh)."""

        def run(window):
            kernel = _splash_kernel(q.shape[1], length, window, interpret)
            per_row = lambda q1, k1, v1, s1: kernel(q1, k1, v1, segment_ids=sa.SegmentIds(q=s1, kv=s1))  # noqa: E731 (vmapped one-liner)
            return jax.vmap(per_row)(q, k, v, segments)

        if mask.window is None:
            return run(None)
        if sliding is None:
            return run(mask.window)
        return jax.lax.cond(sliding, lambda: run(mask.window), lambda: run(None))

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        out = local(q, k, v, segments, mask.sliding)
    else:
        # A Pallas call does not partition itself: run it per shard, rows over the batch axes and heads
        # over tensor where they divide (as models.sharding lays the activations out).
        from jax.sharding import PartitionSpec as P

        batch = tuple(a for a in ("data", "fsdp") if mesh.shape.get(a, 1) > 1)
        batch = batch if batch and b % math.prod(mesh.shape[a] for a in batch) == 0 else None
        tensor = mesh.shape.get("tensor", 1)
        heads = "tensor" if tensor > 1 and kvh % tensor == 0 else None
        rows, cols = P(batch, heads), P(batch)
        sliding = jnp.asarray(False) if mask.sliding is None else mask.sliding
        out = jax.shard_map(lambda q, k, v, s, w: local(q, k, v, s, None if mask.sliding is None else w),
                            mesh=mesh, in_specs=(rows, rows, rows, cols, P()), out_specs=rows,
                            check_vma=False)(q, k, v, segments, sliding)
    out = out[:, :, :t].astype(q_btkgd.dtype)  # [B, H, T, D]
    return out.transpose(0, 2, 1, 3).reshape(b, t, kvh, g, d)
