"""The decoder-only transformer (Flax NNX) for every supported family, with its KV cache.

Parameters carry logical axis names (`logical_axes` metadata); `spade_jax.mesh` maps them to mesh axes.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from spade_jax import kernels
from spade_jax.models.attention import AttnMask, attend, check_attention
from spade_jax.models.layers import param
from spade_jax.models.moe import MoE
from spade_jax.models.sharding import BTE, constrain
from spade_jax.models.spec import ModelSpec

# Set while tracing code that reads weights rewritten by `pack_decode_weights`: holds the packed
# output projection (or None when the vocabulary is not packable).
_PACKED = contextvars.ContextVar("packed_decode_weights", default=None)


@contextlib.contextmanager
def packed_weights(head: jax.Array | None):
    """Trace the model inside this to read the weights `pack_decode_weights` rewrote: `matmul` and
    `Decoder.logits` then call `kernels.packed_matmul` instead of XLA's dot."""
    token = _PACKED.set((head,))
    try:
        yield
    finally:
        _PACKED.reset(token)


def matmul(x, w):
    """x @ w accumulated in float32 and returned in x's dtype. Asking for a float32 result is what
    lets XLA:CPU use its bf16 dot-product kernels (a bf16-out matmul falls back to a path ~7x slower);
    accelerators accumulate in float32 anyway. Under `packed_weights`, w holds packed data."""
    if _PACKED.get() is not None:
        k = x.shape[-1]
        n = w.size // k
        if kernels.packable(k, n):
            return kernels.packed_matmul(x, w.reshape(n // kernels.LANES, k, kernels.LANES))
    return jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _packed_in_place(var: nnx.Variable, contracted: int) -> None:
    """Reorder a weight whose first `contracted` axes are matmul's K into `kernels.pack` order,
    keeping its shape (the modules' free reshapes then hand `matmul` the packed [K, N] view)."""
    w = var[...]
    k = math.prod(w.shape[:contracted])
    n = w.size // k
    if kernels.packable(k, n):
        var[...] = kernels.pack(w.reshape(k, n)).reshape(w.shape)


def pack_decode_weights(model: "Decoder") -> jax.Array | None:
    """Rewrite every weight `matmul` reads (attention q/k/v/o, dense MLP gate/up/down) into the
    packed order, in place, and return the packed output projection (None if the vocabulary is not
    a multiple of 16). The model is then only fit to run under `packed_weights(head)`."""
    if model.scan_layers or jnp.dtype(model.dtype) != jnp.float32:
        raise ValueError("packed decode weights need a float32 model with scan_layers=False")
    for _, module in nnx.iter_graph(model):
        if isinstance(module, Attention):
            for var, contracted in ((module.q, 1), (module.k, 1), (module.v, 1), (module.o, 2)):
                _packed_in_place(var, contracted)
        elif isinstance(module, MLP):
            for var in (module.gate, module.up, module.down):
                _packed_in_place(var, 1)
    vocab, hidden = model.spec.vocab_size, model.spec.hidden_size
    if not kernels.packable(hidden, vocab):
        return None
    if model.spec.tie_embeddings:
        return kernels.pack_rows(model.embed[...].astype(jnp.float32))
    return kernels.pack(model.lm_head[...].astype(jnp.float32))


def _grow_axis(a: jax.Array, axis: int, by: int) -> jax.Array:
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, by)
    return jnp.pad(a, pad)


@flax.struct.dataclass
class KVCache:
    """Preallocated keys and values for all layers; slots are shared by the batch (prompts are left-padded).

    Both are laid out as the attention matmuls read them (keys with slots last, values with slots
    before head_dim). `k` and `v` hold one array per layer (a tuple: what the layer loop reads and
    writes in place) or, for `scan_layers` models, one array stacked on a leading layers axis (what
    `lax.scan` slices); `Decoder.new_cache` makes the model's own layout. A per-layer slice of a
    stacked cache would be copied out in every layer of every decode step on XLA:CPU.
    """

    k: tuple[jax.Array, ...] | jax.Array  # per layer [batch, kv_heads, head_dim, slots]
    v: tuple[jax.Array, ...] | jax.Array  # per layer [batch, kv_heads, slots, head_dim]
    valid: jax.Array  # [batch, slots] bool: the slot holds a real token
    index: jax.Array  # int32 scalar: next slot to write

    @classmethod
    def create(cls, spec: ModelSpec, batch: int, slots: int, dtype=jnp.float32, *,
               stacked: bool = False) -> "KVCache":
        heads = (batch, spec.num_kv_heads)
        k_shape, v_shape = (*heads, spec.head_dim, slots), (*heads, slots, spec.head_dim)
        if stacked:
            k = jnp.zeros((spec.num_layers, *k_shape), dtype)
            v = jnp.zeros((spec.num_layers, *v_shape), dtype)
        else:
            k = tuple(jnp.zeros(k_shape, dtype) for _ in range(spec.num_layers))
            v = tuple(jnp.zeros(v_shape, dtype) for _ in range(spec.num_layers))
        return cls(k=k, v=v, valid=jnp.zeros((batch, slots), bool), index=jnp.zeros((), jnp.int32))

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    @property
    def stacked(self) -> bool:
        return not isinstance(self.k, tuple)

    def per_layer(self) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        """(keys, values) as one array per layer, whatever the layout."""
        if not self.stacked:
            return self.k, self.v
        return tuple(self.k), tuple(self.v)

    def with_layers(self, k, v) -> "KVCache":
        """This cache holding keys `k` and values `v` (per-layer sequences or stacked arrays) in its
        own layout."""

        def own(layers):
            if not self.stacked:
                return tuple(layers)  # iterating a stacked array unstacks it
            return layers if isinstance(layers, jax.Array) else jnp.stack(layers)

        return self.replace(k=own(k), v=own(v))

    def window(self, width: int) -> "KVCache":
        """The first `width` slots: a smaller cache to attend over while fewer are filled."""
        return KVCache(k=jax.tree.map(lambda a: a[..., :width], self.k),
                       v=jax.tree.map(lambda a: a[..., :width, :], self.v),
                       valid=self.valid[:, :width], index=self.index)

    def padded(self, slots: int) -> "KVCache":
        """This cache with empty, invalid slots appended up to `slots`."""
        grow = slots - self.slots
        return KVCache(k=jax.tree.map(lambda a: _grow_axis(a, -1, grow), self.k),
                       v=jax.tree.map(lambda a: _grow_axis(a, -2, grow), self.v),
                       valid=_grow_axis(self.valid, 1, grow), index=self.index)

    def merge(self, view: "KVCache") -> "KVCache":
        """This cache with an (updated) `window` view written back over its first slots."""
        put = lambda full, part: jax.lax.dynamic_update_slice(full, part, (0,) * full.ndim)  # noqa: E731 (local one-liner)
        return KVCache(k=jax.tree.map(put, self.k, view.k), v=jax.tree.map(put, self.v, view.v),
                       valid=put(self.valid, view.valid), index=view.index)


@flax.struct.dataclass
class Packing:
    """Where the tokens of a packed prompt batch sit in the padded [B, W] layout.

    A packed call feeds the N real tokens of B left-padded rows as one [1, N] sequence: norms,
    projections and MLPs (nearly all of a prefill's FLOPs) skip the padding; only attention, which
    needs each row's tokens together, and the cache write run in the padded layout. N may include
    trailing pad tokens (a length bucket); their results are never read.
    """

    gather_bw: jax.Array  # [B, W] int32: packed index of each padded position (padding: any index)
    scatter_n: jax.Array  # [N] int32: b * W + w of each packed token (pad tokens: any position)

    def unpack(self, x_1n):
        """[1, N, ...] -> [B, W, ...]."""
        return x_1n[0][self.gather_bw]

    def pack(self, x_bw):
        """[B, W, ...] -> [1, N, ...]."""
        b, w = self.gather_bw.shape
        return x_bw.reshape(b * w, *x_bw.shape[2:])[self.scatter_n][None]


def _rope_kind(spec: ModelSpec) -> str:
    scaling = spec.rope_scaling_dict or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def rope_inv_freq(spec: ModelSpec) -> jax.Array:
    """Inverse RoPE frequencies, with the HF `rope_scaling` variants the supported families use."""
    dim = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    scaling = spec.rope_scaling_dict
    kind = _rope_kind(spec)
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low_ff = float(scaling.get("low_freq_factor", 1.0))
        high_ff = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", spec.max_position))
        wavelen = 2 * math.pi / inv_freq
        low_wavelen, high_wavelen = old_ctx / low_ff, old_ctx / high_ff
        smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return jnp.where(is_mid, smoothed, scaled)
    if kind == "yarn":
        # Qwen3's long-context recipe (YaRN): interpolate low frequencies, keep high ones, ramp between.
        old_ctx = float(scaling.get("original_max_position_embeddings", spec.max_position))
        factor = scaling.get("factor")
        factor = float(factor) if factor is not None else spec.max_position / old_ctx
        beta_fast = float(scaling.get("beta_fast") or 32)
        beta_slow = float(scaling.get("beta_slow") or 1)

        def correction_dim(rotations):
            return dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(spec.rope_theta))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # the ramp needs a non-empty interval
        ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
        keep = 1 - ramp  # 1 where the original (extrapolated) frequency is kept
        return (inv_freq / factor) * (1 - keep) + inv_freq * keep
    raise ValueError(
        f"rope_scaling type {kind!r} is not supported; use default, linear, llama3 or yarn"
    )


def rope_attention_factor(spec: ModelSpec) -> float:
    """Scale HF multiplies into cos and sin (YaRN's attention temperature; 1 otherwise)."""
    if _rope_kind(spec) != "yarn":
        return 1.0
    scaling = spec.rope_scaling_dict
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    old_ctx = float(scaling.get("original_max_position_embeddings", spec.max_position))
    factor = scaling.get("factor")
    factor = float(factor) if factor is not None else spec.max_position / old_ctx

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if m and m_all:
        return float(mscale(factor, m) / mscale(factor, m_all))
    return mscale(factor)


def rope_tables(spec: ModelSpec, positions_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) [B, T, 1, D/2] of every position, as `apply_rope` and `Decoder.hidden_states` take them."""
    freqs = positions_bt.astype(jnp.float32)[..., None] * rope_inv_freq(spec)  # [B, T, D/2]
    scale = rope_attention_factor(spec)
    return (jnp.cos(freqs) * scale)[:, :, None, :], (jnp.sin(freqs) * scale)[:, :, None, :]


def apply_rope(x_bthd: jax.Array, rope):
    """HF's rotate-half RoPE (the halves of each head are the two coordinates); `rope` is
    `rope_tables(...)`."""
    cos, sin = rope
    x = x_bthd.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_bthd.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, param_dtype, rngs: nnx.Rngs):
        self.weight = param(rngs, (dim,), ("norm",), param_dtype, init="ones")
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * self.weight[...].astype(jnp.float32)).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, spec: ModelSpec, *, dtype, param_dtype, rngs: nnx.Rngs):
        e, h, kvh, d = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.spec, self.dtype = spec, dtype
        self.attn_chunk: int | None = 512  # query block of `attend`; the Decoder sets it
        self.attention = "einsum"  # implementation of `attend` (models.attention.ATTENTION); the Decoder sets it
        self.q = param(rngs, (e, h, d), ("embed", "heads", "head_dim"), param_dtype)
        self.k = param(rngs, (e, kvh, d), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.v = param(rngs, (e, kvh, d), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.o = param(rngs, (h, d, e), ("heads", "head_dim", "embed"), param_dtype)
        if spec.qkv_bias:
            self.q_bias = param(rngs, (h, d), ("heads", "head_dim"), param_dtype, init="zeros")
            self.k_bias = param(rngs, (kvh, d), ("kv_heads", "head_dim"), param_dtype, init="zeros")
            self.v_bias = param(rngs, (kvh, d), ("kv_heads", "head_dim"), param_dtype, init="zeros")
        if spec.o_bias:
            self.o_bias = param(rngs, (e,), ("norm",), param_dtype, init="zeros")
        if spec.qk_norm:
            self.q_norm = RMSNorm(d, spec.rms_eps, param_dtype=param_dtype, rngs=rngs)
            self.k_norm = RMSNorm(d, spec.rms_eps, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x_bte, rope, mask: AttnMask, layer_cache, packing: Packing | None = None):
        """Returns the attention output and the (possibly updated) cache arrays, or this call's k, v."""
        spec, dt = self.spec, self.dtype
        q = constrain(_project_heads(x_bte, self.q[...].astype(dt)), _BTHD)
        k = constrain(_project_heads(x_bte, self.k[...].astype(dt)), _BTKD)
        v = constrain(_project_heads(x_bte, self.v[...].astype(dt)), _BTKD)
        if spec.qkv_bias:
            q = q + self.q_bias[...].astype(dt)
            k = k + self.k_bias[...].astype(dt)
            v = v + self.v_bias[...].astype(dt)
        if spec.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        if packing is not None:
            q, k, v = packing.unpack(q), packing.unpack(k), packing.unpack(v)
        k = k.transpose(0, 2, 3, 1)  # [B, KVH, D, T]: the cache layouts
        v = v.transpose(0, 2, 1, 3)  # [B, KVH, T, D]
        if layer_cache is not None:
            # Write this layer's arrays in place (the sampler donates the cache) and attend over them.
            cache_k, cache_v, index = layer_cache
            k = cache_k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype), (0, 0, 0, index))
            v = cache_v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype), (0, 0, index, 0))
        else:
            cache_k, cache_v = k, v
        b, t, h, d = q.shape
        kvh = k.shape[1]
        q = q.reshape(b, t, kvh, h // kvh, d)
        out = attend(self.attention, q, k.astype(dt), v.astype(dt), mask, self.attn_chunk).reshape(b, t, h * d)
        if packing is not None:
            out = packing.pack(out)
        out = constrain(out, ("activation_batch", "activation_length", "activation_heads"))
        o = self.o[...].astype(dt)
        out = matmul(out, o.reshape(h * d, o.shape[-1]))  # the weight reshape is free
        if spec.o_bias:
            out = out + self.o_bias[...].astype(dt)
        return constrain(out, BTE), (cache_k, cache_v)


_BTHD = ("activation_batch", "activation_length", "activation_heads", "activation_head_dim")
_BTKD = ("activation_batch", "activation_length", "activation_kv_heads", "activation_head_dim")


def _project_heads(x_bte, w_ehd):
    """[B, T, E] x [E, H, D] -> [B, T, H, D] as one 2-D matmul (reshaping row-major weights is free)."""
    e, h, d = w_ehd.shape
    return matmul(x_bte, w_ehd.reshape(e, h * d)).reshape(*x_bte.shape[:-1], h, d)


class MLP(nnx.Module):
    def __init__(self, hidden: int, inner: int, *, dtype, param_dtype, rngs: nnx.Rngs, bias=False):
        self.dtype, self.bias = dtype, bias
        self.gate = param(rngs, (hidden, inner), ("embed", "mlp"), param_dtype)
        self.up = param(rngs, (hidden, inner), ("embed", "mlp"), param_dtype)
        self.down = param(rngs, (inner, hidden), ("mlp", "embed"), param_dtype)
        if bias:
            self.gate_bias = param(rngs, (inner,), ("mlp",), param_dtype, init="zeros")
            self.up_bias = param(rngs, (inner,), ("mlp",), param_dtype, init="zeros")
            self.down_bias = param(rngs, (hidden,), ("norm",), param_dtype, init="zeros")

    def __call__(self, x):
        dt = self.dtype
        gate, up = matmul(x, self.gate[...].astype(dt)), matmul(x, self.up[...].astype(dt))
        if self.bias:
            gate, up = gate + self.gate_bias[...].astype(dt), up + self.up_bias[...].astype(dt)
        inner = constrain(jax.nn.silu(gate) * up, ("activation_batch", "activation_length", "activation_mlp"))
        out = matmul(inner, self.down[...].astype(dt))
        if self.bias:
            out = out + self.down_bias[...].astype(dt)
        return constrain(out, BTE)


class Block(nnx.Module):
    def __init__(self, spec: ModelSpec, *, dtype, param_dtype, rngs: nnx.Rngs, layer: int = 0):
        self.attn_norm = RMSNorm(spec.hidden_size, spec.rms_eps, param_dtype=param_dtype, rngs=rngs)
        self.attn = Attention(spec, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mlp_norm = RMSNorm(spec.hidden_size, spec.rms_eps, param_dtype=param_dtype, rngs=rngs)
        if spec.layer_is_moe(layer):
            self.mlp = MoE(spec, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        else:
            self.mlp = MLP(
                spec.hidden_size,
                spec.intermediate_size,
                dtype=dtype,
                param_dtype=param_dtype,
                rngs=rngs,
                bias=spec.mlp_bias,
            )

    def __call__(self, x, rope, mask: AttnMask, layer_cache, packing=None):
        attn_out, kv = self.attn(self.attn_norm(x), rope, mask, layer_cache, packing)
        x = constrain(x + attn_out, BTE)
        return constrain(x + self.mlp(self.mlp_norm(x)).astype(x.dtype), BTE), kv


def _stacked_blocks(spec: ModelSpec, *, dtype, param_dtype, rngs: nnx.Rngs) -> Block:
    """One Block whose parameters carry a leading `layers` axis, for `lax.scan` over depth."""

    @nnx.split_rngs(splits=spec.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(layer_rngs):
        return Block(spec, dtype=dtype, param_dtype=param_dtype, rngs=layer_rngs)

    blocks = make(rngs)
    for _, var in nnx.iter_graph(blocks):
        if isinstance(var, nnx.Param):
            var.set_metadata(logical_axes=("layers", *var.logical_axes))
    return blocks


def _run_block(block, x, rope, mask, layer_cache, packing=None):
    return block(x, rope, mask, layer_cache, packing)


class Decoder(nnx.Module):
    """Token ids in, logits out; optionally reads and writes a `KVCache`.

    `scan_layers=True` stacks the blocks' parameters on a leading `layers` axis and runs them with
    `lax.scan` (one compiled block: faster compiles for deep models; on XLA:CPU decoding is slower).
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
        scan_layers: bool = False,
        attn_chunk: int | None = 512,
        remat: bool = False,
        attention: str = "einsum",
    ):
        if scan_layers and not spec.uniform_layers:
            raise ValueError(
                "scan_layers=True needs every layer to have the same structure; this MoE spec has dense "
                f"layers {spec.dense_layers}: use scan_layers=False"
            )
        self.spec, self.dtype, self.scan_layers = spec, dtype, scan_layers
        # Training memory: recompute each block's activations in the backward pass (cache-free calls).
        self.remat = remat
        self.embed = param(
            rngs, (spec.vocab_size, spec.hidden_size), ("vocab", "embed"), param_dtype
        )
        if scan_layers:
            self.layers = _stacked_blocks(spec, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        else:
            self.layers = nnx.List(
                [
                    Block(spec, dtype=dtype, param_dtype=param_dtype, rngs=rngs, layer=i)
                    for i in range(spec.num_layers)
                ]
            )
        self.final_norm = RMSNorm(spec.hidden_size, spec.rms_eps, param_dtype=param_dtype, rngs=rngs)
        if not spec.tie_embeddings:
            self.lm_head = param(
                rngs, (spec.hidden_size, spec.vocab_size), ("embed", "vocab"), param_dtype
            )
        self.set_attn_chunk(attn_chunk)
        self.set_attention(attention)

    def set_attention(self, name: str) -> None:
        """Attention implementation, one of `models.attention.ATTENTION` (`model.attention` in the config):
        einsum, dot_product (jax.nn.dot_product_attention; cuDNN on a GPU in 16-bit) or splash (the TPU
        Pallas kernel, interpreted off TPU; cache-free calls only). Results agree to rounding."""
        check_attention(name)
        self.attention_impl = name
        for _, module in nnx.iter_graph(self):
            if isinstance(module, Attention):
                module.attention = name

    def set_attn_chunk(self, chunk: int | None) -> None:
        """Query block size of attention (None: all queries at once); results do not depend on it."""
        if chunk is not None and chunk < 1:
            raise ValueError(f"attn_chunk must be >= 1 or None, got {chunk}")
        for _, module in nnx.iter_graph(self):
            if isinstance(module, Attention):
                module.attn_chunk = chunk

    def hidden_states(self, tokens_bt, positions_bt, valid_bt=None, cache: KVCache | None = None,
                      rope=None, packing: Packing | None = None, segment_ids_bt=None, prefix_ids_bt=None):
        """Final-normed hidden states [B, T, E] and the updated cache (None without one).

        Without a cache the keys are the tokens themselves (training and scoring). With one, the T new
        tokens are written at slots [cache.index, cache.index + T) and attend to every valid slot up
        to their own.

        `rope`, if given, is `rope_tables(spec, positions_bt)` made outside this function (another jitted
        call, or a loop carry): XLA:CPU otherwise fuses a fresh cos/sin of every position into each
        layer's q and k fusions, once per element.

        With `packing` (cache calls only), `tokens_bt` and `positions_bt` are one packed [1, N] sequence,
        `valid_bt` is the padded [B, W] mask `packing` maps it to, and the hidden states come back packed.

        With `segment_ids_bt` (cache-free calls: the packed train step), each row holds several sequences,
        told apart by these ids; a token attends only within its own (give `positions_bt` restarting at 0).
        With `prefix_ids_bt` too, a sequence that continues a shared prompt segment (its id there, 0: none)
        also attends to that segment, which stands earlier in the row (positions continue the prompt's).
        """
        spec = self.spec
        if packing is not None:
            if cache is None or valid_bt is None:
                raise ValueError("a packed call needs a cache and the padded valid mask")
            b, t = packing.gather_bw.shape
        else:
            b, t = tokens_bt.shape
        if valid_bt is None:
            valid_bt = jnp.ones((b, t), bool)
        if rope is None:
            rope = rope_tables(spec, positions_bt)
        # The lookup reads the table gathered over fsdp (as every fsdp weight is gathered for its use): its
        # gradient, rows over the batch axes, cannot reshard onto an fsdp-split width but reduce-scatters.
        x = jnp.take(self.embed[...], tokens_bt, axis=0)
        x = constrain(x, ("activation_lookup_batch", "activation_length", "embed"))
        x = constrain(x.astype(self.dtype), BTE)
        if cache is None:
            q_slot = jnp.arange(t)
            key_valid_bs, k_slot = valid_bt, q_slot
        else:
            q_slot = cache.index + jnp.arange(t)
            key_valid_bs = jax.lax.dynamic_update_slice(cache.valid, valid_bt, (0, cache.index))
            k_slot = jnp.arange(cache.slots)
        causal_ts = k_slot[None, :] <= q_slot[:, None]
        mask_bts = causal_ts[None] & key_valid_bs[:, None, :]
        if segment_ids_bt is not None:
            if cache is not None:
                raise ValueError("segment_ids_bt (packed rows) is for cache-free calls")
            same = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
            if prefix_ids_bt is not None:
                same = same | ((prefix_ids_bt[:, :, None] == segment_ids_bt[:, None, :])
                               & (prefix_ids_bt[:, :, None] > 0))
            mask_bts = mask_bts & same
        elif prefix_ids_bt is not None:
            raise ValueError("prefix_ids_bt (shared prompts) needs segment_ids_bt (packed rows)")
        mask = AttnMask(mask_bts, key_valid_bs, segments_bs=segment_ids_bt, self_attention=cache is None,
                        shared_prefixes=prefix_ids_bt is not None)
        window_mask = None
        if spec.sliding_layers:
            if prefix_ids_bt is None:
                # HF's sliding window counts cache positions (slots), padding included.
                in_window_bts = (k_slot[None, :] > q_slot[:, None] - spec.sliding_window)[None]
            else:  # a shared prompt's slots are not its continuations' neighbours: count positions
                in_window_bts = positions_bt[:, None, :] > positions_bt[:, :, None] - spec.sliding_window
            window_mask = mask.replace(dense_bts=mask_bts & in_window_bts, window=spec.sliding_window)
        blocks = self._scan_blocks if self.scan_layers else self._loop_blocks
        x, cache = blocks(x, rope, mask, window_mask, cache, packing)
        x = self.final_norm(x)
        if cache is None:
            return x, None
        return x, cache.replace(valid=key_valid_bs, index=cache.index + t)

    def new_cache(self, batch: int, slots: int, dtype=jnp.float32) -> KVCache:
        """An empty cache in the layout this model's blocks read in place (see `KVCache`)."""
        return KVCache.create(self.spec, batch, slots, dtype, stacked=self.scan_layers)

    def _loop_blocks(self, x, rope, mask, window_mask, cache, packing=None):
        if cache is not None:
            keys, values = map(list, cache.per_layer())
        run = nnx.remat(_run_block) if self.remat and cache is None else _run_block
        for i, block in enumerate(self.layers):
            layer_mask = window_mask if i in self.spec.sliding_layers else mask
            layer_cache = None if cache is None else (keys[i], values[i], cache.index)
            x, (k, v) = run(block, x, rope, layer_mask, layer_cache, packing)
            if cache is not None:
                keys[i], values[i] = k, v
        return x, (None if cache is None else cache.with_layers(keys, values))

    def _scan_blocks(self, x, rope, mask, window_mask, cache, packing=None):
        graphdef, stacked = nnx.split(self.layers)
        sliding_l = jnp.array([i in self.spec.sliding_layers for i in range(self.spec.num_layers)])
        layer_kv = None
        if cache is not None:
            layer_kv = (cache.k, cache.v) if cache.stacked else tuple(map(jnp.stack, cache.per_layer()))

        def step(x, xs):
            layer_state, kv, sliding = xs
            block = nnx.merge(graphdef, layer_state)
            layer_mask = mask if window_mask is None else mask.choose(sliding, window_mask)
            layer_cache = None if kv is None else (kv[0], kv[1], cache.index)
            x, new_kv = block(x, rope, layer_mask, layer_cache, packing)
            return x, (None if kv is None else new_kv)

        if self.remat and cache is None:
            step = jax.checkpoint(step)
        x, new_kv = jax.lax.scan(step, x, (stacked, layer_kv, sliding_l))
        return x, (None if cache is None else cache.with_layers(*new_kv))

    def logits(self, hidden_bte):
        """Output projection in float32."""
        packed = _PACKED.get()
        if packed is not None and packed[0] is not None:
            return kernels.packed_matmul(hidden_bte.astype(jnp.float32), packed[0])
        if self.spec.tie_embeddings:
            w = self.embed[...].astype(self.dtype)
            logits = jnp.einsum("bte,ve->btv", hidden_bte, w, preferred_element_type=jnp.float32)
        else:
            logits = jnp.matmul(hidden_bte, self.lm_head[...].astype(self.dtype), preferred_element_type=jnp.float32)
        return constrain(logits, ("activation_batch", "activation_length", "activation_vocab"))

    def __call__(self, tokens_bt, positions_bt, valid_bt=None, cache: KVCache | None = None, rope=None,
                 packing: Packing | None = None):
        hidden, cache = self.hidden_states(tokens_bt, positions_bt, valid_bt, cache, rope, packing)
        return self.logits(hidden), cache
