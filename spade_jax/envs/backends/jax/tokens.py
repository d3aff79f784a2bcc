"""Device-side rendering of observations into a fixed-size token buffer, per fragment (`TokenRenderer`)
or, for the compiled episode loop, from a few vectorised tables per template (`ObservationTokens`)."""

from __future__ import annotations

import re

import jax
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


def _single_token(encode, ch: str) -> int:
    ids = encode(ch)
    if len(ids) != 1:
        raise ValueError(f"the tokenizer splits {ch!r} into {len(ids)} tokens; device rendering of numbers needs one")
    return int(ids[0])


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
        return _single_token(self.encode, ch)

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


_TABLE_INT_SPEC = re.compile(r"^>?([1-9]\d*)?d?$")  # int formats ObservationTokens tables: '', 'd', widths (space fill)


class ObservationTokens:
    """Observation record -> (tokens [max_tokens], length), for one template kind (0 reset, 1 step).

    Same contract as TokenRenderer above (each fragment tokenized on its own, numbers one
    token per character), built for compile time: every fragment is one row of a few vectorised
    tables (literal tokens and every table string in one static pool, all integers rendered at once),
    so the program size does not grow with the number of fragments; that renderer compiles per
    fragment, which took most of a minute for one library environment on XLA:CPU. Floats use it.
    """

    def __init__(self, env, tokenizer, kind: int, max_tokens: int | None = None):
        base_encode = _encoder(tokenizer)

        def encode(text):
            return [int(i) for i in base_encode(text)]

        def single(ch):
            return _single_token(encode, ch)

        self.env, self.kind = env, kind
        template = env.templates[kind]
        if template is None:
            raise ValueError(f"the environment has no observation template of kind {kind}")
        segments = []  # (conditions, leaf); a condition is (slot, wanted truth)

        def flatten(t, conds):
            if isinstance(t, FCat):
                for part in t.parts:
                    flatten(part, conds)
            elif isinstance(t, FSel):
                flatten(t.a, conds + ((t.slot, True),))
                flatten(t.b, conds + ((t.slot, False),))
            elif not (isinstance(t, FLit) and not t.s):
                segments.append((conds, t))

        flatten(template, ())
        pool: list[int] = []  # static tokens: literals, then every table string per format spec
        string_rows: dict[str, int] = {}  # spec -> first row of its strings in str_start/str_len
        str_start, str_len = [], []
        self.digits = np.array([single(c) for c in "0123456789"], np.int32)
        self.minus, self.space = single("-"), single(" ")
        int_slots, int_widths, other_leaves = [], [], []
        kinds, lit_start, lit_len, str_slot, dyn_row = [], [], [], [], []
        for _, leaf in segments:
            row = (0, 0, 0, 0)
            if isinstance(leaf, FLit):
                ids = encode(leaf.s)
                kinds.append(0)
                row = (len(pool), len(ids), 0, 0)
                pool.extend(ids)
            elif isinstance(leaf, FStr):
                if leaf.spec not in string_rows:
                    string_rows[leaf.spec] = len(str_start)
                    for text in env.table.strings:
                        ids = encode(format(text, leaf.spec))
                        str_start.append(len(pool))
                        str_len.append(len(ids))
                        pool.extend(ids)
                kinds.append(1)
                row = (string_rows[leaf.spec], 0, leaf.slot, 0)
            elif isinstance(leaf, FInt) and _TABLE_INT_SPEC.match(leaf.spec):
                kinds.append(2)
                row = (0, 0, 0, len(int_slots))
                int_slots.append(leaf.slot)
                width = _TABLE_INT_SPEC.match(leaf.spec).group(1)
                int_widths.append(int(width) if width else 0)
            elif isinstance(leaf, (FInt, FFloat)):
                kinds.append(3)
                row = (0, 0, 0, len(other_leaves))
                other_leaves.append(leaf)
            else:
                raise ValueError(f"cannot render template piece {leaf!r} on device")
            lit_start.append(row[0])
            lit_len.append(row[1])
            str_slot.append(row[2])
            dyn_row.append(row[3])
        self.int_slots = np.array(int_slots or [0], np.int32)
        self.int_widths = np.array(int_widths or [0], np.int32)
        self.int_width = max([_INT_CHARS] + int_widths)
        self.other = other_leaves
        self._legacy = env.token_renderer(tokenizer, 1) if other_leaves else None
        ni, nf = env.obs_sizes
        self._shapes = (jax.ShapeDtypeStruct((ni,), jnp.int32), jax.ShapeDtypeStruct((nf,), jnp.float32))
        other_widths = [self._other_width(leaf) for leaf in other_leaves]
        self.other_width = max(other_widths + [1])
        depth = max([len(c) for c, _ in segments] + [1])
        cond_slot = np.zeros((max(len(segments), 1), depth), np.int32)
        cond_want = np.full((max(len(segments), 1), depth), -1, np.int32)  # -1: no condition
        for i, (conds, _) in enumerate(segments):
            for j, (slot, want) in enumerate(conds):
                cond_slot[i, j], cond_want[i, j] = slot, int(want)
        self.tables = {name: np.array(values or [0], np.int32) for name, values in (
            ("kind", kinds), ("lit_start", lit_start), ("lit_len", lit_len), ("str_slot", str_slot),
            ("dyn_row", dyn_row), ("pool", pool), ("str_start", str_start), ("str_len", str_len))}
        self.tables["cond_slot"], self.tables["cond_want"] = cond_slot, cond_want
        self.empty = not segments

        # The longest rendering: concatenations add, a choice takes its longer side.
        str_width = {spec: max(str_len[row : row + len(env.table.strings)] + [0]) for spec, row in string_rows.items()}
        def bound(t) -> int:
            if isinstance(t, FCat):
                return sum(bound(p) for p in t.parts)
            if isinstance(t, FSel):
                return max(bound(t.a), bound(t.b))
            if isinstance(t, FLit):
                return len(encode(t.s)) if t.s else 0
            if isinstance(t, FStr):
                return str_width[t.spec]
            if isinstance(t, FInt) and _TABLE_INT_SPEC.match(t.spec):
                width = _TABLE_INT_SPEC.match(t.spec).group(1)
                return max(_INT_CHARS, int(width) if width else 0)
            return self._other_width(t)

        self.bound = max(bound(template), 1)
        self.max_tokens = self.bound if max_tokens is None else int(max_tokens)

    def _other_width(self, leaf) -> int:
        return int(jax.eval_shape(lambda i, f: self._legacy._leaf(leaf, i, f)[0], *self._shapes).shape[0])

    def _integers(self, values):
        """Each value as left-aligned character tokens [n, width] and its length (Python's format)."""
        neg = values < 0
        mag = jnp.abs(values).astype(jnp.uint32)  # |INT_MIN| wraps to 2**31 in uint32, as wanted
        powers = jnp.asarray([10**k for k in range(10)], jnp.uint32)
        ndigits = 1 + jnp.sum(mag[:, None] >= powers[None, 1:], axis=1)
        digits = (mag[:, None] // powers[None, :]) % 10  # [n, 10], least significant first
        body = ndigits + neg
        length = jnp.maximum(body, jnp.asarray(self.int_widths))
        pad = length - body
        p = jnp.arange(self.int_width)[None, :]
        which = jnp.clip(ndigits[:, None] - 1 - (p - pad[:, None] - neg[:, None]), 0, 9)
        digit = jnp.asarray(self.digits)[jnp.take_along_axis(digits, which, 1).astype(jnp.int32)]
        tokens = jnp.where(p < pad[:, None], self.space,
                           jnp.where(neg[:, None] & (p == pad[:, None]), self.minus, digit))
        return tokens.astype(jnp.int32), length.astype(jnp.int32)

    def __call__(self, record):
        """One record (no batch axis) -> (tokens int32[max_tokens], length); vmap for a batch."""
        size = self.max_tokens
        if self.empty:
            return jnp.zeros((size,), jnp.int32), jnp.int32(0)
        t = {k: jnp.asarray(v) for k, v in self.tables.items()}
        ints, floats = record["ints"], record["floats"]
        int_tokens, int_len = self._integers(ints[jnp.asarray(self.int_slots)] if ints.shape[0] else
                                             jnp.zeros_like(jnp.asarray(self.int_slots)))
        width = max(self.int_width, self.other_width)
        dyn = jnp.pad(int_tokens, ((0, 0), (0, width - self.int_width)))
        dyn_len = int_len
        if self.other:
            rows = [self._legacy._leaf(leaf, ints, floats) for leaf in self.other]
            other = jnp.stack([jnp.pad(r[0], (0, width - r[0].shape[0])) for r in rows])
            other_len = jnp.stack([jnp.asarray(r[1], jnp.int32) for r in rows])
            kind3 = t["kind"] == 3
        sid = t["str_start"].shape[0]
        str_row = jnp.clip(t["lit_start"] + (ints[t["str_slot"]] if ints.shape[0] else 0), 0, sid - 1)
        kind = t["kind"]
        start = jnp.where(
            kind == 0, t["lit_start"], jnp.where(kind == 1, t["str_start"][str_row], t["dyn_row"] * width)
        )
        length = jnp.where(kind == 0, t["lit_len"], jnp.where(kind == 1, t["str_len"][str_row], dyn_len[t["dyn_row"]] if
                                                             self.int_slots.size else 0))
        if self.other:
            start = jnp.where(kind3, (self.int_slots.shape[0] + t["dyn_row"]) * width, start)
            length = jnp.where(kind3, other_len[t["dyn_row"]], length)
            dyn = jnp.concatenate([dyn, other])
        truth = (ints[t["cond_slot"]] != 0).astype(jnp.int32) if ints.shape[0] else jnp.zeros_like(t["cond_slot"])
        on = jnp.all((t["cond_want"] < 0) | (truth == t["cond_want"]), axis=1)
        lengths = jnp.where(on, length, 0)
        ends = jnp.cumsum(lengths)
        begins = ends - lengths
        p = jnp.arange(size)
        seg = jnp.minimum(jnp.searchsorted(ends, p, side="right"), ends.shape[0] - 1)
        src = start[seg] + p - begins[seg]
        flat = dyn.reshape(-1)
        from_dyn = kind[seg] >= 2
        token = jnp.where(from_dyn, flat[jnp.clip(src, 0, flat.shape[0] - 1)],
                          t["pool"][jnp.clip(src, 0, t["pool"].shape[0] - 1)])
        total = ends[-1]
        return jnp.where(p < total, token, 0).astype(jnp.int32), jnp.minimum(total, size).astype(jnp.int32)
