"""Random draws: random.Random's methods in reset() mapped onto jax.random with split keys (on the
host, Python's own generator)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spade_jax.envs.backends.jax.interp.predication import _NeedsState
from spade_jax.envs.backends.jax.interp.values import _num
from spade_jax.envs.backends.jax.ir import Masked, StrId, unsupported


class RandomDraws:
    """Mixin of Interp: random draws from keys split off the reset key."""

    # ----- random draws -----------------------------------------------------------------------

    def next_key(self, node):
        if self.host:
            raise _NeedsState()
        if self.key is None:
            where = "step()" if self.in_step else "this method"
            raise unsupported(
                node,
                f"random draw in {where} (only reset() may draw; the sandbox's random stream cannot be reproduced)",
            )
        self.key, sub = jax.random.split(self.key)
        return sub

    def draw(self, name, args, kwargs, node):
        if self.host:
            if self.pyrng is None:
                raise _NeedsState()
            if name not in (
                "randint", "randrange", "random", "uniform", "choice", "choices", "shuffle", "sample", "gauss"
            ):
                raise unsupported(node, f"random.{name}()")
            if isinstance(args[0] if args else None, Masked):
                raise unsupported(node, f"random.{name} of a filtered list")
            return getattr(self.pyrng, name)(*args, **kwargs)
        args = [self._as_dyn(a) for a in args]
        if name == "randint":
            a, b = args
            return jax.random.randint(self.next_key(node), (), _num(a), _num(b) + 1, jnp.int32)
        if name == "randrange":
            if len(args) == 1:
                start, stop, step = 0, args[0], 1
            else:
                start, stop = args[0], args[1]
                step = args[2] if len(args) > 2 else 1
            if self._has_dyn(step):
                raise unsupported(node, "randrange with a data-dependent step")
            count = (_num(stop) - _num(start) + step - (1 if step > 0 else -1)) // step
            return _num(start) + step * jax.random.randint(self.next_key(node), (), 0, count, jnp.int32)
        if name == "random":
            return jax.random.uniform(self.next_key(node), (), jnp.float32)
        if name == "uniform":
            a, b = args
            u = jax.random.uniform(self.next_key(node), (), jnp.float32)
            return _num(a) + (_num(b) - _num(a)) * u
        if name in ("gauss", "normalvariate"):
            mu, sigma = args
            return _num(mu) + _num(sigma) * jax.random.normal(self.next_key(node), (), jnp.float32)
        if name == "choice":
            return self.random_choice(args[0], node)
        if name == "choices":
            k = kwargs.get("k", 1)
            if kwargs.get("weights") is not None or kwargs.get("cum_weights") is not None:
                raise unsupported(node, "random.choices with weights")
            return [self.random_choice(args[0], node) for _ in range(k)]
        if name == "shuffle":
            seq = args[0]
            if isinstance(seq, Masked):
                return self._shuffle_present(seq, node)
            if not isinstance(seq, list):
                raise unsupported(node, "shuffle of something that is not a fixed-length list")
            perm = jax.random.permutation(self.next_key(node), len(seq))
            new = [self.gather(seq, perm[i], node) for i in range(len(seq))]
            seq[:] = [self.merge(self._current_mask, n, o, node) for n, o in zip(new, seq)]
            return None
        if name == "sample":
            pop = args[0]
            k = args[1] if len(args) > 1 else kwargs.get("k")
            if self._has_dyn(k):
                raise unsupported(node, "random.sample with a data-dependent size")
            items = self.iterate_plain(pop, node) if not isinstance(pop, Masked) else None
            if items is None:
                raise unsupported(node, "random.sample from a filtered list")
            perm = jax.random.permutation(self.next_key(node), len(items))
            return [self.gather(items, perm[i], node) for i in range(k)]
        raise unsupported(node, f"random.{name}()")

    def _shuffle_present(self, seq: Masked, node):
        """Shuffles the present items of a filtered list (list(word) of a drawn word) in place: a
        uniform order of the present items, which then come first, absent slots after them."""
        conds = [jnp.asarray(c, jnp.bool_) for c, _ in seq.items]
        if not conds:
            return None
        keys = jax.random.uniform(self.next_key(node), (len(conds),))
        order = jnp.argsort(jnp.where(jnp.stack(conds), keys, 2.0))  # present items first, at random
        values = [v for _, v in seq.items]
        count = sum(c.astype(jnp.int32) for c in conds)
        shuffled = [(count > k, self.gather(values, order[k], node)) for k in range(len(values))]
        seq.items[:] = [(self.merge(self._current_mask, c, oc, node), self.merge(self._current_mask, v, ov, node))
                        for (c, v), (oc, ov) in zip(shuffled, seq.items)]
        return None

    def random_choice(self, seq, node):
        if isinstance(seq, range):
            if len(seq) == 0:
                raise unsupported(node, "choice from an empty range")
            return seq.start + seq.step * jax.random.randint(self.next_key(node), (), 0, len(seq), jnp.int32)
        if isinstance(seq, StrId):
            seq = self.chars(seq, node)  # random.choice(word): a position of the string, uniformly
        if isinstance(seq, Masked):
            conds = jnp.stack([jnp.asarray(c, bool) for c, _ in seq.items])
            logits = jnp.where(conds, 0.0, -jnp.inf)
            idx = jax.random.categorical(self.next_key(node), logits)
            return self.gather([v for _, v in seq.items], idx, node)
        items = self.iterate_plain(seq, node)
        if not items:
            raise unsupported(node, "choice from an empty list")
        idx = jax.random.randint(self.next_key(node), (), 0, len(items), jnp.int32)
        return self.gather(items, idx, node)
