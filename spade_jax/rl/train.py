"""TrainState and the jitted, sharded, buffer-donating GRPO train step with micro-batch accumulation.

`make_train_step(model, cfg, mesh)` returns the `TrainStep`: `init(model)`, `step(state, batch[, ref_params])`,
write-back. A step whose loss, gradients or updates are not finite is skipped inside the step (`train/skipped`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from spade_jax import mesh as mesh_lib
from spade_jax.rl.batch import ROLE_NAMES, TrainBatch
from spade_jax.rl.config import RLConfig
from spade_jax.rl.losses import grpo_loss, loss_normalisers, score_index, token_logprobs, token_logprobs_at


class TrainingDiverged(FloatingPointError):
    """Several updates in a row were not finite; none of them was applied (the Learner raises it)."""


@flax.struct.dataclass
class TrainState:
    """Everything the update changes; the model structure (graphdef) lives in the `TrainStep`."""

    params: Any  # nested dict of arrays (nnx.to_pure_dict layout); float32 master copy when RLConfig.master_fp32
    opt_state: Any  # optax state (clip + AdamW)
    step: jax.Array  # int32 scalar: optimizer steps taken (a skipped, non-finite step does not count)
    rng: jax.Array  # uint32 [2] raw PRNG key data, split once per step (checkpointable as-is)


def make_optimizer(cfg: RLConfig) -> optax.GradientTransformation:
    """Global-norm clip then AdamW with a constant learning rate (SPADE: 1e-6, wd 0.1, betas 0.9/0.98)."""

    def decay_mask(params):
        return jax.tree.map(lambda p: cfg.decay_norms or p.ndim >= 2, params)

    adamw = optax.adamw(
        learning_rate=cfg.lr,
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
        mask=decay_mask,
    )
    if cfg.grad_clip is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)


def param_shardings(model: nnx.Module, mesh: Mesh, rules=None):
    """NamedSharding per param from its logical axes (spade_jax.mesh rules), as a pure dict."""
    return nnx.to_pure_dict(mesh_lib.param_shardings(nnx.state(model, nnx.Param), mesh, rules))


def batch_axes(mesh: Mesh | None, rules=None) -> tuple[str, ...]:
    """Mesh axes the batch rows are split over (the `batch` rule, axes of size > 1)."""
    if mesh is None:
        return ()
    rule = (mesh_lib.LOGICAL_RULES if rules is None else rules).get("batch") or ()
    rule = (rule,) if isinstance(rule, str) else tuple(rule)
    return tuple(a for a in rule if mesh.shape.get(a, 1) > 1)


def batch_shards(mesh: Mesh | None, rules=None) -> int:
    """How many pieces the batch rows are split into (the product of `batch_axes`' sizes)."""
    return int(np.prod([mesh.shape[a] for a in batch_axes(mesh, rules)])) if mesh is not None else 1


def prepare_batch(batch: TrainBatch) -> TrainBatch:
    """Host-side: checks shapes and fixes dtypes so one compiled step serves every batch of a shape."""
    batch.check()
    casts = {
        "tokens_bt": jnp.int32, "positions_bt": jnp.int32, "valid_bt": bool, "loss_mask_bt": bool,
        "behaviour_logprobs_bt": jnp.float32, "advantages_b": jnp.float32, "advantages_bt": jnp.float32,
        "old_logprobs_bt": jnp.float32, "ref_logprobs_bt": jnp.float32, "role_b": jnp.int32,
        "is_stale_b": bool, "score_index_bk": jnp.int32, "role_bt": jnp.int32, "is_stale_bt": bool,
        "segment_ids_bt": jnp.int32, "prefix_ids_bt": jnp.int32,
    }
    changes = {}
    for name, dtype in casts.items():
        value = getattr(batch, name)
        if value is not None and np.dtype(getattr(value, "dtype", np.float64)) != np.dtype(dtype):
            changes[name] = np.asarray(value).astype(dtype)
    if batch.role_b is None and batch.role_bt is None:
        changes["role_b"] = np.zeros((batch.batch_size,), np.int32)
    if batch.is_stale_b is None and batch.is_stale_bt is None:
        changes["is_stale_b"] = np.zeros((batch.batch_size,), bool)
    return batch.replace(**changes) if changes else batch


def _all_finite(tree) -> jax.Array:
    """True when every float leaf of `tree` is free of NaN and inf (per leaf, so no norm can overflow)."""
    flags = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)


def _split_micro_batches(x, m: int):
    """[B, ...] -> [m, B/m, ...] taking every m-th row, so each device's rows feed every micro-batch."""
    b = x.shape[0]
    return x.reshape((b // m, m) + x.shape[1:]).swapaxes(0, 1)


def _compute_graphdef(model: nnx.Module, compute_dtype, attn_chunk: int | None = None):
    """The model's graphdef with every module's activation `dtype` set to `compute_dtype` and, if given,
    attention's query block to `attn_chunk` (the model, which the sampler runs, keeps its own).

    Layers cast their params to `self.dtype` before each matmul, so the float32 master params in
    the state meet bfloat16 activations without a separate cast (and get float32 gradients).
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (params, rest))
    clone = nnx.merge(graphdef, *abstract)
    for _, node in nnx.iter_graph(clone):
        if isinstance(node, nnx.Module) and hasattr(node, "dtype"):
            node.dtype = compute_dtype
    if attn_chunk is not None:
        clone.set_attn_chunk(attn_chunk)
    return nnx.split(clone, nnx.Param, ...)[0]


def format_memory(compiled) -> str:
    """One line with the compiled step's memory (argument, output, temporaries, code)."""
    try:
        stats = compiled.memory_analysis()
    except Exception as err:  # some backends do not implement it
        return f"train_step compiled memory: unavailable ({err})"
    if stats is None:
        return "train_step compiled memory: unavailable on this backend"

    def size(name):
        value = float(getattr(stats, name, 0) or 0)
        for unit in ("B", "KiB", "MiB", "GiB"):
            if value < 1024 or unit == "GiB":
                return f"{value:.1f} {unit}"
            value /= 1024
        return f"{value:.1f} GiB"

    peak = sum(float(getattr(stats, n, 0) or 0) for n in
               ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"))
    peak -= float(getattr(stats, "alias_size_in_bytes", 0) or 0)
    return (
        f"train_step compiled memory per device: arguments {size('argument_size_in_bytes')}, "
        f"outputs {size('output_size_in_bytes')}, donated {size('alias_size_in_bytes')}, "
        f"temporaries {size('temp_size_in_bytes')}, code {size('generated_code_size_in_bytes')}; "
        f"peak about {peak / 2**30:.3f} GiB"
    )


@dataclasses.dataclass
class TrainStep:
    """The compiled GRPO update for one model structure, config and mesh.

    `state, metrics = train_step(state, batch)` donates `state`: do not reuse the old one. Unpacks as
    `init, step = make_train_step(...)`.
    """

    cfg: RLConfig
    graphdef: Any  # compute-dtype graphdef the loss merges params into
    optimizer: optax.GradientTransformation
    mesh: Mesh | None
    param_shardings: Any  # pure dict of NamedSharding, or None without a mesh
    state_shardings: Any  # TrainState of NamedSharding, or None without a mesh
    batch_sharding: NamedSharding | None  # rows split over the batch axes
    jitted: Any  # jax.jit(step_fn, shardings, donate_argnums=0)
    rules: Any = None  # logical-axis rules (None: spade_jax.mesh.LOGICAL_RULES)
    verbose: bool = True  # print the compiled memory before the first step of each shape
    jitted_ref: Any = None  # the same step taking the frozen reference params as a third argument (kl_coef > 0)
    _compiled: dict = dataclasses.field(default_factory=dict)

    def __iter__(self):
        return iter((self.init, self))

    def init(self, model: nnx.Module, seed: int | None = None) -> TrainState:
        """A fresh state from the model's current params (copied; the model keeps its own)."""
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        if self.cfg.master_fp32:
            params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
        params = jax.tree.map(jnp.copy, params)
        rng = jax.random.key_data(jax.random.key(self.cfg.seed if seed is None else seed))
        rng = jnp.asarray(rng, jnp.uint32)

        def build(p, key):
            return TrainState(params=p, opt_state=self.optimizer.init(p), step=jnp.zeros((), jnp.int32), rng=key)

        if self.mesh is None:
            return jax.jit(build)(params, rng)
        params = jax.device_put(params, self.param_shardings)
        return jax.jit(build, out_shardings=self.state_shardings)(params, rng)

    def reference_params(self, model: nnx.Module):
        """A frozen copy of the model's current params for the KL term; None when `kl_coef` is 0.

        Call it on the STARTING weights (the Learner does, before any checkpoint is restored into the
        model). Kept in the model's own param dtype and sharded like the policy params: one more copy
        of the weights. Not part of `TrainState`, so checkpoints do not grow: a resumed run reloads the
        same starting weights and makes the reference again.
        """
        if self.cfg.kl_coef == 0:
            return None
        params = jax.tree.map(jnp.copy, nnx.to_pure_dict(nnx.state(model, nnx.Param)))  # own buffers
        if self.mesh is not None:
            params = jax.device_put(params, self.param_shardings)
        return params

    def _reference_for(self, batch: TrainBatch | tuple[TrainBatch, ...], ref_params):
        """The reference params the step needs for `batch`: None without KL or when the batch brings its own."""
        parts = batch if isinstance(batch, tuple) else (batch,)
        if self.cfg.kl_coef == 0 or all(part.ref_logprobs_bt is not None for part in parts):
            return None
        if ref_params is None:
            raise ValueError(
                "rl.kl_coef > 0 needs the frozen reference: pass ref_params=train_step.reference_params(model) "
                "made from the starting weights (the Learner does), or TrainBatch.ref_logprobs_bt"
            )
        if self.mesh is not None:
            ref_params = jax.device_put(ref_params, self.param_shardings)  # no-op when already placed
        return ref_params

    def abstract_state(self, model: nnx.Module) -> TrainState:
        """Shapes, dtypes and shardings of `init(model)`'s result (a restore target for checkpoints)."""
        state = jax.eval_shape(lambda: self.init(model))
        if self.state_shardings is None:
            return state
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, self.state_shardings
        )

    def place_batch(self, batch: TrainBatch, micro_batches: int | None = None) -> TrainBatch:
        """`batch` on the devices, with its score index when `score_loss_only`; its rows must split into
        `micro_batches` (default `cfg.micro_batches`) x the batch shards."""
        micro_batches = self.cfg.micro_batches if micro_batches is None else micro_batches
        if self.cfg.score_loss_only and batch.score_index_bk is None:
            # With update_rows, a fixed count of columns too (one shape): a quarter of the width.
            least = 8 if self.cfg.update_rows is None else max(8, batch.tokens_bt.shape[1] // 4)
            batch = batch.replace(score_index_bk=score_index(batch.loss_mask_bt, batch.valid_bt, least))
        elif not self.cfg.score_loss_only and batch.score_index_bk is not None:
            batch = batch.replace(score_index_bk=None)
        batch = prepare_batch(batch)
        b = batch.batch_size
        shards = batch_shards(self.mesh, self.rules)
        if b % (micro_batches * shards):
            raise ValueError(
                f"batch size {b} must be a multiple of micro_batches ({micro_batches}) x batch "
                f"shards ({shards}); pad the batch with rows whose loss_mask_bt is all False"
            )
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, batch)
        return jax.device_put(batch, self.batch_sharding)

    def compile(self, state: TrainState, batch: TrainBatch, ref_params=None):
        """Lowers and compiles for these shapes (cached); prints the compiled memory the first time.

        `ref_params` None compiles the step without the reference forward (`jitted`), else `jitted_ref`.
        """
        leaves, tree = jax.tree.flatten((state, batch, ref_params))
        key = (tree, tuple((np.shape(x), np.dtype(x.dtype)) for x in leaves))
        compiled = self._compiled.get(key)
        if compiled is None:
            # Traced under the mesh, the model's activation sharding constraints apply (models/sharding.py).
            with contextlib.nullcontext() if self.mesh is None else jax.set_mesh(self.mesh):
                if ref_params is None:
                    compiled = self.jitted.lower(state, batch).compile()
                else:
                    compiled = self.jitted_ref.lower(state, batch, ref_params).compile()
            if self.verbose:
                print(format_memory(compiled), file=sys.stderr, flush=True)
            self._compiled[key] = compiled
        return compiled

    def _place(self, batch: TrainBatch | tuple[TrainBatch, ...]):
        """One batch, or an update's batches of different widths: the first splits into
        `cfg.micro_batches`, the others into micro-batches of one row per batch shard."""
        if not isinstance(batch, tuple):
            return self.place_batch(batch)
        return (self.place_batch(batch[0]),) + tuple(self.place_batch(part, 1) for part in batch[1:])

    def __call__(
        self, state: TrainState, batch: TrainBatch | tuple[TrainBatch, ...], ref_params=None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One update of `batch`, or of a tuple of batches as one (their rows' loss and gradients summed,
        normalised over all of them; `Learner` puts samples much longer than the rest in a batch of
        their own width). With `kl_coef > 0` the reference logprobs come from `batch.ref_logprobs_bt`
        if set, else from `ref_params` (`reference_params(model)`) inside the step."""
        batch = self._place(batch)
        ref_params = self._reference_for(batch, ref_params)
        if ref_params is None:
            return self.compile(state, batch)(state, batch)
        return self.compile(state, batch, ref_params)(state, batch, ref_params)

    def memory_report(self, state: TrainState, batch: TrainBatch | tuple[TrainBatch, ...], ref_params=None) -> str:
        batch = self._place(batch)
        return format_memory(self.compile(state, batch, self._reference_for(batch, ref_params)))

    def sampling_model(self, state: TrainState, model: nnx.Module) -> nnx.Module:
        """A model sharing `state`'s param buffers (no copy); valid only until the next train step donates them."""
        graphdef, _, rest = nnx.split(model, nnx.Param, ...)
        dtypes = jax.tree.map(lambda x: x.dtype, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
        params = jax.tree.map(lambda x, dt: x if x.dtype == dt else x.astype(dt), state.params, dtypes)
        return nnx.merge(graphdef, params, rest)

    def write_params(self, model: nnx.Module, state: TrainState) -> None:
        """Copies the state's params into `model` (cast to the model's dtypes), e.g. for the sampler."""
        current = nnx.state(model, nnx.Param)
        dtypes = jax.tree.map(lambda x: x.dtype, nnx.to_pure_dict(current))
        fresh = jax.tree.map(lambda x, dt: jnp.array(x, dtype=dt, copy=True), state.params, dtypes)
        nnx.replace_by_pure_dict(current, fresh)
        nnx.update(model, current)


def make_train_step(
    model: nnx.Module,
    cfg: RLConfig,
    mesh: Mesh | None = None,
    *,
    rules=None,
    verbose: bool = True,
) -> TrainStep:
    """Builds the pure step `(state, batch) -> (state, metrics)` and jits it over `mesh` with donation.

    Micro-batches: rows are dealt round-robin into `cfg.micro_batches` groups, gradients are summed
    over a `lax.scan`, and every loss term is normalised by counts of the FULL batch (e.g. token
    aggregation divides by all loss tokens of the batch), so the result equals the one-shot step.

    KL (`kl_coef > 0`): given the frozen reference params as a third argument, each micro-batch's
    reference logprobs come from a forward pass with them inside the same step (no gradient, no
    host round trip, and only one micro-batch of reference activations alive at a time).
    """
    compute_dtype = jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else jnp.float32
    graphdef = _compute_graphdef(model, compute_dtype, cfg.attn_chunk)
    optimizer = make_optimizer(cfg)
    m = cfg.micro_batches

    p_shardings = state_shardings = batch_sharding = mb_sharding = replicated = None
    if mesh is not None:
        p_shardings = param_shardings(model, mesh, rules)
        replicated = NamedSharding(mesh, P())
        abstract_params = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32 if cfg.master_fp32 else x.dtype),
            nnx.to_pure_dict(nnx.state(model, nnx.Param)),
        )
        abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
        opt_shardings = optax.tree_map_params(
            optimizer,
            lambda _, sharding: sharding,
            abstract_opt,
            p_shardings,
            transform_non_params=lambda _: replicated,
            is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
        )
        state_shardings = TrainState(params=p_shardings, opt_state=opt_shardings, step=replicated, rng=replicated)
        axes = batch_axes(mesh, rules)
        batch_sharding = NamedSharding(mesh, P(axes or None))
        mb_sharding = NamedSharding(mesh, P(None, axes or None))

    _, _, rest = nnx.split(model, nnx.Param, ...)  # non-param variables (none in Decoder): constants

    def logprobs(model, mb: TrainBatch):
        """[B, T] logprobs of the batch's tokens: at its loss columns when it carries their index."""
        if mb.score_index_bk is None:
            return token_logprobs(
                model, mb.tokens_bt, mb.positions_bt, mb.valid_bt, cfg.logprob_chunk, mb.segment_ids_bt,
                mb.prefix_ids_bt,
            )
        return token_logprobs_at(
            model, mb.tokens_bt, mb.positions_bt, mb.valid_bt, mb.score_index_bk, cfg.logprob_chunk,
            mb.segment_ids_bt, mb.prefix_ids_bt,
        )

    def with_reference(micro_batch, ref_params):
        """Fills `ref_logprobs_bt` from the frozen reference params (same compute graphdef as the policy)."""
        if ref_params is None:
            return micro_batch
        ref_logp = logprobs(nnx.merge(graphdef, ref_params, rest), micro_batch)
        return micro_batch.replace(ref_logprobs_bt=jax.lax.stop_gradient(ref_logp))

    def loss_fn(params, micro_batch, norm, ref_params=None):
        micro_batch = with_reference(micro_batch, ref_params)
        logp = logprobs(nnx.merge(graphdef, params, rest), micro_batch)
        return grpo_loss(logp, micro_batch, cfg, norm)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    shards = batch_shards(mesh, rules)

    def part_grads(params, part: TrainBatch, micro_count: int, skip_empty: bool, norm, ref_params):
        """float32 gradients and metrics of one batch, summed over `micro_count` micro-batches (a
        `lax.scan`); with `skip_empty`, a micro-batch of padding rows only costs no compute."""

        def micro_step(micro_batch):
            (_, mb_metrics), mb_grads = grad_fn(params, micro_batch, norm, ref_params)
            return jax.tree.map(lambda g: g.astype(jnp.float32), mb_grads), mb_metrics

        if micro_count == 1 and not skip_empty:
            return micro_step(part)
        micro = jax.tree.map(lambda x: _split_micro_batches(x, micro_count), part)
        if mb_sharding is not None:
            micro = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, mb_sharding), micro)
        first = jax.tree.map(lambda x: x[0], micro)
        metric_shapes = jax.eval_shape(lambda p, mb, rp: loss_fn(p, mb, norm, rp)[1], params, first, ref_params)
        zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
        zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        if p_shardings is not None:
            zero_grads = jax.lax.with_sharding_constraint(zero_grads, p_shardings)

        def accumulate(carry, micro_batch):
            grads_acc, metrics_acc = carry
            if skip_empty:  # a micro-batch of padding rows only (fill_micro_batches) is skipped: no compute
                mb_grads, mb_metrics = jax.lax.cond(
                    jnp.any(micro_batch.valid_bt), micro_step, lambda _: (zero_grads, zero_metrics), micro_batch
                )
            else:
                mb_grads, mb_metrics = micro_step(micro_batch)
            grads_acc = jax.tree.map(jnp.add, grads_acc, mb_grads)
            return (grads_acc, jax.tree.map(jnp.add, metrics_acc, mb_metrics)), None

        (grads, metrics), _ = jax.lax.scan(accumulate, (zero_grads, zero_metrics), micro)
        return grads, metrics

    def step_fn(state: TrainState, batch: TrainBatch | tuple[TrainBatch, ...], ref_params=None):
        # Several batches: one update's rows at different widths (Learner, rl.long_samples_apart). The
        # first is split into cfg.micro_batches; each later one into micro-batches of one row per batch
        # shard, padding-only ones skipped, so its few long rows cost about their own compute.
        parts = batch if isinstance(batch, tuple) else (batch,)
        norm = loss_normalisers(parts, cfg)
        params = state.params
        if len(parts) == 1 and m == 1:
            (_, metrics), grads = grad_fn(params, parts[0], norm, ref_params)
        else:
            grads = metrics = None
            for i, part in enumerate(parts):
                micro_count = m if i == 0 else part.batch_size // shards
                skip_empty = cfg.update_rows is not None if i == 0 else True
                g, mt = part_grads(params, part, micro_count, skip_empty, norm, ref_params)
                grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
                metrics = mt if metrics is None else jax.tree.map(jnp.add, metrics, mt)
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, params)
        # A non-finite loss, gradient or update (NaN advantages, rl.lr=nan, an overflow) would poison
        # every weight and moment: such a step keeps the old params and optimizer state, bit for bit.
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm) & _all_finite(updates)
        new_params = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old), optax.apply_updates(params, updates), params
        )
        opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), opt_state, state.opt_state)
        rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state.rng))[0])
        metrics = dict(metrics)
        metrics["train/skipped"] = jnp.logical_not(finite).astype(jnp.float32)
        metrics["grad_norm"] = grad_norm
        metrics["tokens"] = norm.tokens
        metrics["sequences"] = norm.sequences
        for r, name in enumerate(ROLE_NAMES):
            metrics[f"{name}/tokens"] = norm.role_tokens[r]
        steps = state.step + finite.astype(jnp.int32)
        new_state = TrainState(params=new_params, opt_state=opt_state, step=steps, rng=rng)
        return new_state, metrics

    def jit(with_reference_params: bool):
        if mesh is None:
            return jax.jit(step_fn, donate_argnums=0)
        in_shardings = (state_shardings, batch_sharding) + ((p_shardings,) if with_reference_params else ())
        # The reference params are an input, never donated: the same buffers serve every step.
        return jax.jit(
            step_fn, in_shardings=in_shardings, out_shardings=(state_shardings, replicated), donate_argnums=0
        )

    return TrainStep(
        cfg=cfg,
        graphdef=graphdef,
        optimizer=optimizer,
        mesh=mesh,
        param_shardings=p_shardings,
        state_shardings=state_shardings,
        batch_sharding=batch_sharding,
        jitted=jit(False),
        jitted_ref=jit(True) if cfg.kl_coef > 0 else None,
        rules=rules,
        verbose=verbose,
    )
