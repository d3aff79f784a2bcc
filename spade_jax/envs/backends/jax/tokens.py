"""Device-side rendering of observations into a fixed-size token buffer: static fragments and
every string of the table are tokenized once on the host; numbers go through digit tables."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np

from spade_jax.envs.backends.jax.ir import FCat, FFloat, FInt, FLit, FSel, FStr

_INT_SPEC = re.compile(r"^>?(\d*)d?$")
_FLOAT_SPEC = re.compile(r"^\.(\d)f$")
_INT_CHARS = 11  # sign and 10 digits cover int32


def _encoder(tokenizer):
    if callable(getattr(tokenizer, "encode", None)):
        def encode(text):
            try:
                return list(tokenizer.encode(text, add_special_tokens=False))
            except TypeError:
                return list(tokenizer.encode(text))
        return encode
    if callable(tokenizer):
        return lambda text: list(tokenizer(text))
    raise ValueError("tokenizer must have encode(text) or be a callable text -> list[int]")


class TokenRenderer:
    """obs record -> (tokens int32[max_tokens], length int32), jittable and vmappable.

    The buffer is the concatenation of each fragment's own tokenization (literal pieces, table
    strings, one token per digit), so it decodes to exactly render_text(obs) but may differ
    from tokenizing the whole text at once where a BPE merge would cross a fragment boundary.
    Limits: ints with '', 'd' or a right-aligned width spec; floats only with '.Nf'; text past
    max_tokens is cut (length saturates)."""

    def __init__(self, env, tokenizer, max_tokens: int = 1024):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        self.env = env
        self.max_tokens = max_tokens
        self.encode = _encoder(tokenizer)
        self._lit_cache: dict[str, np.ndarray] = {}
        chars = [self._single(c) for c in "0123456789-. "]
        self.digit_tokens = np.array(chars[:10], np.int32)
        self.minus, self.dot, self.space = chars[10], chars[11], chars[12]
        strings = env.table.strings
        self._strings = list(strings)
        self._str_tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.segments = [self._flatten(env.templates[k], ()) for k in (0, 1)]

    def _single(self, ch: str) -> int:
        ids = self.encode(ch)
        if len(ids) != 1:
            raise ValueError(
                f"the tokenizer splits {ch!r} into {len(ids)} tokens; device rendering of numbers needs one"
            )
        return int(ids[0])

    def _lit(self, s: str) -> np.ndarray:
        if s not in self._lit_cache:
            self._lit_cache[s] = np.array(self.encode(s), np.int32)
        return self._lit_cache[s]

    def _str_table(self, spec: str):
        if spec not in self._str_tables:
            rows = [self._lit(format(s, spec)) for s in self._strings]
            width = max([len(r) for r in rows] + [1])
            table = np.zeros((len(rows), width), np.int32)
            for i, r in enumerate(rows):
                table[i, : len(r)] = r
            self._str_tables[spec] = (table, np.array([len(r) for r in rows], np.int32))
        return self._str_tables[spec]

    def _flatten(self, t, conds):
        """Template -> list of (conditions, leaf); a condition is (slot, wanted truth)."""
        if isinstance(t, FCat):
            out = []
            for p in t.parts:
                out.extend(self._flatten(p, conds))
            return out
        if isinstance(t, FSel):
            return self._flatten(t.a, conds + ((t.slot, True),)) + self._flatten(t.b, conds + ((t.slot, False),))
        if isinstance(t, FLit):
            return [(conds, t)] if t.s else []
        if isinstance(t, FInt) and not _INT_SPEC.match(t.spec):
            raise ValueError(f"device rendering supports int format specs '', 'd' and widths, not {t.spec!r}")
        if isinstance(t, FFloat) and not _FLOAT_SPEC.match(t.spec):
            raise ValueError(f"device rendering needs floats formatted with '.Nf', not {t.spec!r}")
        return [(conds, t)]

    # ----- device side ------------------------------------------------------------------------

    def _number(self, value, decimals: int | None, width: int):
        """Right-aligned characters of a number as tokens, then left-aligned with a length."""
        if decimals is None:
            v = value.astype(jnp.int32)
            neg = v < 0
            mag = jnp.abs(v).astype(jnp.uint32)
            digits_needed = 1 + sum((mag >= 10**k).astype(jnp.int32) for k in range(1, 10))
            frac = 0
        else:
            scaled = jnp.round(jnp.abs(value) * (10.0**decimals)).astype(jnp.uint32)
            neg = (value < 0) & (scaled > 0)
            mag = scaled
            digits_needed = jnp.maximum(1 + decimals, 1 + sum((mag >= 10**k).astype(jnp.int32) for k in range(1, 10)))
            frac = decimals
        n_chars = _INT_CHARS + (1 if frac else 0)
        # position j from the right: digit index, with a '.' inserted after `frac` digits
        toks = []
        for j in range(n_chars):
            if frac and j == frac:
                toks.append(jnp.int32(self.dot))
                continue
            k = j - (1 if frac and j > frac else 0)
            d = (mag // np.uint32(10**k)) % 10 if k < 10 else jnp.uint32(0)
            toks.append(jnp.asarray(self.digit_tokens)[d.astype(jnp.int32)])
        right = jnp.stack(toks[::-1])  # most significant first, right-aligned
        n_body = digits_needed + (1 if frac else 0)
        length = n_body + neg.astype(jnp.int32)
        length_padded = jnp.maximum(length, width)
        size = n_chars + 1 + max(width - n_chars - 1, 0)
        idx = jnp.arange(size)
        pad = length_padded - length
        # output p: spaces for p < pad, then '-' if neg, then the last n_body chars of `right`
        body_pos = p_body = idx - pad - neg.astype(jnp.int32)
        src = jnp.clip(n_chars - n_body + p_body, 0, n_chars - 1)
        out = jnp.where(idx < pad, self.space, jnp.where(neg & (idx == pad), self.minus, right[src]))
        del body_pos
        return out.astype(jnp.int32), length_padded.astype(jnp.int32)

    def _leaf(self, leaf, ints, floats):
        if isinstance(leaf, FLit):
            toks = self._lit(leaf.s)
            return jnp.asarray(toks), jnp.int32(len(toks))
        if isinstance(leaf, FStr):
            table, lengths = self._str_table(leaf.spec)
            sid = ints[leaf.slot]
            return jnp.asarray(table)[sid], jnp.asarray(lengths)[sid]
        if isinstance(leaf, FInt):
            width = int(_INT_SPEC.match(leaf.spec).group(1) or 0)
            return self._number(ints[leaf.slot], None, width)
        decimals = int(_FLOAT_SPEC.match(leaf.spec).group(1))
        return self._number(floats[leaf.slot], decimals, 0)

    def _render(self, segments, ints, floats):
        bufs, lens = [], []
        for conds, leaf in segments:
            toks, n = self._leaf(leaf, ints, floats)
            on = jnp.bool_(True)
            for slot, want in conds:
                on = on & ((ints[slot] != 0) == want)
            bufs.append(toks)
            lens.append(jnp.where(on, n, 0))
        if not bufs:
            return jnp.zeros((self.max_tokens,), jnp.int32), jnp.int32(0)
        lens = jnp.stack(lens)
        offsets = jnp.cumsum(lens) - lens
        flat = jnp.concatenate(bufs)
        pos_in_seg = jnp.concatenate([jnp.arange(b.shape[0]) for b in bufs])
        seg_of = np.concatenate([np.full(b.shape[0], i) for i, b in enumerate(bufs)])
        valid = pos_in_seg < lens[seg_of]
        dest = jnp.where(valid, offsets[seg_of] + pos_in_seg, self.max_tokens)
        out = jnp.zeros((self.max_tokens,), jnp.int32).at[dest].set(flat, mode="drop")
        return out, jnp.minimum(jnp.sum(lens), self.max_tokens).astype(jnp.int32)

    def __call__(self, obs):
        ints, floats = obs["ints"], obs["floats"]
        t0, n0 = self._render(self.segments[0], ints, floats)
        t1, n1 = self._render(self.segments[1], ints, floats)
        first = obs["kind"] == 0
        return jnp.where(first, t0, t1), jnp.where(first, n0, n1)
