"""Device-loop rollouts for JAX-backend environments: a whole batch of multi-turn episodes inside one
compiled loop (decode, reply -> action id, env step, observation tokens, cache append).

Produces the same `Trajectory` objects as the host loop in `spade_jax.rollout`.

Cache layout (why it looks the way it does): the decoder's KV cache has one write index shared by the
batch, while replies end at different lengths. Every turn therefore owns a run of slots: one slot per
decode step (a row that already stopped writes an invalid slot there), then the observation chunk,
in which each row's tokens are right-aligned behind invalid padding (so the chunk's last slot holds
every continuing row's last token, whose logits start the next reply). The chunk is appended in
blocks of `chunk_block` slots, only as many as the longest observation of the turn needs (the first
prompt likewise; the last turn's chunk is recorded but not fed, since nothing follows it). Invalid
slots are masked out of attention and positions count real tokens only, so each row sees exactly
the dense token sequence the host loop builds. The cache is sized for the worst case; each decode
and append runs against the smallest of four compiled windows of slots that holds what is written,
since attention costs in proportion to the slots it sees.

Tokenization: the first prompt and the text between turns come from the chat template exactly as
`rollout.ChatStream` builds them; observations are tokenized fragment by fragment (template literals,
table strings, one token per digit). With a byte-level tokenizer that equals tokenizing the whole
text, so both loops give the same ids; with BPE (SmolLM2, Qwen) a merge across a fragment boundary
can make the ids differ from the host loop's while decoding to the same text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax.models.decoder import packed_weights, rope_tables
from spade_jax.models.tokenizer import BYTE_OF_CHAR
from spade_jax.rollout import RolloutConfig, Trajectory, agent_action, clip_to_context, with_hint
from spade_jax.sampling import PACKED_WEIGHTS, SamplingConfig, SamplingMode, choose, cpu_kernel_applies, sampling_knobs

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")  # the library's action idiom: the last \boxed{...}
_OPEN = b"\\boxed{"
# Bytes that Python's str.isspace() accepts among ASCII, i.e. what str.strip() removes there.
_ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())
_NO_ANSWER_PROBES = ("", "I am not sure.", "boxed{1}", "\\boxed{", "\\boxed{1{2}", "{}", "the answer is 3")


# ---------------------------------------------------------------------------------------------------
# Chat template glue, computed once on the host.


@dataclasses.dataclass(frozen=True)
class ChatGlue:
    """Token ids the chat template puts around observations, as `rollout.ChatStream` would emit them.

    first_prefix + obs + hint + first_suffix is the first prompt; after a reply, after_reply[v] + obs +
    before_reply follows it, where v = 0 when the reply did not end with an EOS token and v = k when it
    ended with `eos_ids[k - 1]` (that EOS already closed the turn, so its text is not repeated).
    """

    first_prefix: tuple[int, ...]
    first_suffix: tuple[int, ...]
    after_reply: tuple[tuple[int, ...], ...]
    before_reply: tuple[int, ...]
    eos_ids: tuple[int, ...]

    @classmethod
    def build(cls, tokenizer, system_prompt: str | None, eos_ids: Sequence[int]) -> "ChatGlue":
        marks = ["\u2063OBS%d\u2063" % i for i in range(3)]
        replies = ["\u2063REPLY%d\u2063" % i for i in range(2)]
        base = [{"role": "system", "content": system_prompt}] if system_prompt else []

        def render(messages, generation_prompt):
            return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt)

        def glue_after(history, reply, obs):
            """ChatStream.next_turn's text around `obs`: (tail + user header, user end + reply header)."""
            through = render(history + [{"role": "assistant", "content": reply}], False)
            following = render(
                history + [{"role": "assistant", "content": reply}, {"role": "user", "content": obs}], True
            )
            if not following.startswith(through):
                raise ValueError("the chat template re-renders earlier turns when a turn is added; use the host loop")
            tail = through[through.rfind(reply) + len(reply):]
            rest = following[len(through):]
            at = rest.find(obs)
            return tail, rest[:at], rest[at + len(obs):]

        first = render(base + [{"role": "user", "content": marks[0]}], True)
        at = first.find(marks[0])
        prefix, suffix = first[:at], first[at + len(marks[0]):]
        history = base + [{"role": "user", "content": marks[0]}]
        tail, header, after = glue_after(history, replies[0], marks[1])
        # A template is turn-regular when the glue of a later turn is the glue of the first.
        history2 = history + [{"role": "assistant", "content": replies[0]}, {"role": "user", "content": marks[1]}]
        if glue_after(history2, replies[1], marks[2]) != (tail, header, after):
            raise ValueError("the chat template's text between turns changes from turn to turn; use the host loop")

        def enc(text):
            return tuple(int(i) for i in tokenizer.encode(text, add_special_tokens=False))

        variants = [enc(tail + header)]
        for eos in eos_ids:
            eos_text = tokenizer.decode([eos], skip_special_tokens=False)
            variants.append(enc((tail[len(eos_text):] if tail.startswith(eos_text) else tail) + header))
        return cls(enc(prefix), enc(suffix), tuple(variants), enc(after), tuple(int(e) for e in eos_ids))


# ---------------------------------------------------------------------------------------------------
# Reply text -> action id on device.


def token_byte_table(tokenizer, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes [V, width] int32 padded with -1, lengths [V]): what each id adds to
    `decode(ids, skip_special_tokens=True)` before UTF-8 decoding (special and unknown ids add nothing)."""
    hf = tokenizer.hf
    byte_of = BYTE_OF_CHAR
    added = {int(i): tok for i, tok in hf.added_tokens_decoder.items()}
    special = set(int(i) for i in hf.all_special_ids) | {i for i, tok in added.items() if tok.special}
    known = len(hf)
    pieces: list[bytes] = []
    names = hf.convert_ids_to_tokens(list(range(min(known, vocab_size))))
    for i in range(vocab_size):
        if i >= known or i in special or names[i] is None:
            pieces.append(b"")
        elif i in added:
            pieces.append(added[i].content.encode("utf-8"))
        elif all(c in byte_of for c in names[i]):
            pieces.append(bytes(byte_of[c] for c in names[i]))
        else:  # not byte-level BPE: the single-token decode (checked against the real decode by callers)
            pieces.append(hf.decode([i], skip_special_tokens=True).encode("utf-8"))
    width = max([len(p) for p in pieces] + [1])
    table = np.full((vocab_size, width), -1, np.int32)
    for i, p in enumerate(pieces):
        table[i, : len(p)] = list(p)
    return table, np.array([len(p) for p in pieces], np.int32)


def last_boxed_content(text: str) -> str | None:
    """The library idiom: the last \\boxed{...} content, stripped and lower-cased (None without one)."""
    found = _BOXED.findall(text)
    return found[-1].strip().lower() if found else None


class ActionMap:
    """Maps a reply's token ids to the environment's action id on device, exactly as the host does
    with `env.action_id(tokenizer.decode(reply, skip_special_tokens=True))`.

    On device: rebuild the reply's bytes, take the last `\\boxed{...}` content, strip ASCII space,
    lower-case ASCII, and look it up among the vocabulary's contents. That is exact for programs that
    read their command as `last_boxed_content` (the library idiom), which `build` checks on probe texts;
    a reply the table cannot settle (a content outside the table, non-ASCII text) is sent to the host
    by a callback, and so is every reply when the probes fail (`on_device` False).
    """

    def __init__(self, env, tokenizer, vocab_size: int, *, probe_limit: int = 96, first: bool = False):
        self.env, self.tokenizer = env, tokenizer
        self.first = first  # rollout.action == "first_boxed": the env receives the reply's first \\boxed{...}
        self.token_bytes, self.token_lengths = token_byte_table(tokenizer, vocab_size)
        self.no_answer_id = int(env.action_id("I am not sure."))
        contents: dict[str, int] = {}
        for text in env.action_vocab:
            content = last_boxed_content(text)
            if content is None or not content.isascii() or content in contents:
                continue
            contents[content] = int(env.action_id("\\boxed{" + content + "}"))
        self.contents = contents
        width = max([len(c) for c in contents] + [1])
        self.content_width = width
        table = np.full((max(len(contents), 1), width), -1, np.int32)
        lengths = np.full((max(len(contents), 1),), -1, np.int32)  # -1: an empty table matches nothing
        for row, content in enumerate(contents):
            table[row, : len(content)] = list(content.encode("ascii"))
            lengths[row] = len(content)
        self.content_table, self.content_lengths = table, lengths
        self.content_ids = np.array(list(contents.values()) or [0], np.int32)
        self.on_device = self._probe(probe_limit)

    def _probe(self, limit: int) -> bool:
        """True when the program's parse behaves like `last_boxed_content` on probe texts."""
        action_id = self.env.action_id
        if any(action_id(text) != self.no_answer_id for text in _NO_ANSWER_PROBES):
            return False
        items = list(self.contents.items())
        step = max(1, len(items) // max(limit, 1))
        for content, want in items[::step]:
            probes = [f"\\boxed{{{content}}}", f"So \\boxed{{zz}}, no: \\boxed{{ {content.upper()} }} it is.",
                      f"\\boxed{{{content}}}\n\t", f"\\boxed{{ {content} }} \\boxed{{{content}"]
            if any(action_id(p) != want for p in probes):
                return False
        return True

    def device_tables(self) -> dict:
        return {
            "token_bytes": jnp.asarray(self.token_bytes), "token_lengths": jnp.asarray(self.token_lengths),
            "content_table": jnp.asarray(self.content_table),
            "content_lengths": jnp.asarray(self.content_lengths),
            "content_ids": jnp.asarray(self.content_ids),
        }

    def reply_bytes(self, tables, tokens_r, count):
        """One row's reply as bytes [R * width] (padding -1) and its byte length."""
        r = tokens_r.shape[0]
        width = tables["token_bytes"].shape[1]
        pieces = tables["token_bytes"][tokens_r]  # [R, width]
        lengths = jnp.where(jnp.arange(r) < count, tables["token_lengths"][tokens_r], 0)
        offsets = jnp.cumsum(lengths) - lengths
        inside = jnp.arange(width)[None, :] < lengths[:, None]
        size = r * width
        dest = jnp.where(inside, offsets[:, None] + jnp.arange(width)[None, :], size)
        buf = jnp.full((size,), -1, jnp.int32).at[dest.reshape(-1)].set(pieces.reshape(-1), mode="drop")
        return buf, jnp.sum(lengths)

    def device_ids(self, tables, tokens_r, count):
        """(action id, settled) for one row; unsettled rows need the host (`host_ids`)."""
        buf, _ = self.reply_bytes(tables, tokens_r, count)
        n = buf.shape[0]
        idx = jnp.arange(n)
        padded = jnp.concatenate([buf, jnp.full((len(_OPEN) + 1,), -1, jnp.int32)])
        opens = jnp.ones((n,), bool)
        for k, byte in enumerate(_OPEN):
            opens = opens & (padded[k : k + n] == byte)
        brace = (buf == ord("{")) | (buf == ord("}"))
        # next_brace[p]: first brace at or after p (n if none), by a reversed running minimum.
        next_brace = jnp.flip(jax.lax.cummin(jnp.flip(jnp.where(brace, idx, n))))
        next_brace = jnp.concatenate([next_brace, jnp.full((len(_OPEN) + 1,), n, next_brace.dtype)])
        closing = next_brace[idx + len(_OPEN)]
        closes = (closing < n) & (jnp.concatenate([buf, jnp.array([-1])])[jnp.minimum(closing, n)] == ord("}"))
        match = opens & closes
        if self.first:
            chosen = jnp.min(jnp.where(match, idx, n))
            found = chosen < n
        else:
            chosen = jnp.max(jnp.where(match, idx, -1))
            found = chosen >= 0
        start = chosen + len(_OPEN)
        end = next_brace[jnp.clip(start, 0, n)]
        inside = (idx >= start) & (idx < end)
        space = jnp.zeros((n,), bool)
        for byte in _ASCII_SPACE:
            space = space | (buf == byte)
        body = inside & ~space
        lo = jnp.min(jnp.where(body, idx, n))
        hi = jnp.max(jnp.where(body, idx, -1)) + 1
        length = jnp.maximum(hi - lo, 0)
        kept = (idx >= lo) & (idx < hi)
        ascii_only = ~jnp.any(kept & (buf >= 128))
        width = tables["content_table"].shape[1]
        window = jnp.concatenate([buf, jnp.full((width,), -1, jnp.int32)])[jnp.clip(lo, 0, n) + jnp.arange(width)]
        window = jnp.where(jnp.arange(width) < length, window, -1)
        window = jnp.where((window >= ord("A")) & (window <= ord("Z")), window + 32, window)
        same = jnp.all(tables["content_table"] == window[None, :], axis=1) & (tables["content_lengths"] == length)
        hit = jnp.any(same)
        action = jnp.where(found, tables["content_ids"][jnp.argmax(same)], self.no_answer_id)
        settled = ~found | (hit & ascii_only & (length <= width))
        if not self.on_device:
            settled = jnp.zeros_like(settled)
        return action.astype(jnp.int32), settled

    def host_ids(self, tokens_br, counts_b, need_b, ids_b):
        """Host fallback: the exact host mapping for rows with `need_b` set."""
        out = np.array(ids_b, np.int32)
        for row in np.flatnonzero(np.asarray(need_b)):
            reply = [int(t) for t in np.asarray(tokens_br)[row, : int(counts_b[row])]]
            text = self.tokenizer.decode(reply, skip_special_tokens=True)
            out[row] = self.env.action_id(agent_action(text, "first_boxed" if self.first else "reply"))
        return out

    def __call__(self, tables, tokens_br, counts_b, need_b):
        """Action ids for a batch of replies, asking the host only about the rows it must."""
        ids, settled = jax.vmap(lambda t, c: self.device_ids(tables, t, c))(tokens_br, counts_b)
        ask = need_b & ~settled
        shape = jax.ShapeDtypeStruct(ids.shape, jnp.int32)
        return jax.lax.cond(
            jnp.any(ask),
            lambda: jax.pure_callback(self.host_ids, shape, tokens_br, counts_b, ask, ids),
            lambda: ids,
        ), ask


# ---------------------------------------------------------------------------------------------------
# The compiled episode loop.


_INT_SPEC = re.compile(r"^>?([1-9]\d*)?d?$")  # int formats rendered here: '', 'd', widths (space fill)
_INT_CHARS = 11  # sign and 10 digits cover int32


class ObservationTokens:
    """Observation record -> (tokens [max_tokens], length), for one template kind (0 reset, 1 step).

    Same contract as the JAX backend's TokenRenderer (each fragment tokenized on its own, numbers one
    token per character), built for compile time: every fragment is one row of a few vectorised
    tables (literal tokens and every table string in one static pool, all integers rendered at once),
    so the program size does not grow with the number of fragments; that renderer compiles per
    fragment, which took most of a minute for one library environment on XLA:CPU. Floats use it.
    """

    def __init__(self, env, tokenizer, kind: int, max_tokens: int | None = None):
        from spade_jax.envs.backends.jax.ir import FCat, FFloat, FInt, FLit, FSel, FStr

        def encode(text):
            return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]

        def single(ch):
            ids = encode(ch)
            if len(ids) != 1:
                raise ValueError(
                    f"the tokenizer splits {ch!r} into {len(ids)} tokens; device rendering of numbers needs one"
                )
            return ids[0]

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
            elif isinstance(leaf, FInt) and _INT_SPEC.match(leaf.spec):
                kinds.append(2)
                row = (0, 0, 0, len(int_slots))
                int_slots.append(leaf.slot)
                width = _INT_SPEC.match(leaf.spec).group(1)
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
            if isinstance(t, FInt) and _INT_SPEC.match(t.spec):
                width = _INT_SPEC.match(t.spec).group(1)
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


def _place(pieces, width: int, right: bool):
    """Concatenate per-row pieces [(tokens [B, k], lengths [B])] into [B, width], left- or right-
    aligned, padding 0; returns (tokens, valid, total lengths)."""
    batch = pieces[0][0].shape[0]
    lengths = jnp.stack([n for _, n in pieces], axis=1)  # [B, P]
    total = jnp.sum(lengths, axis=1)
    offsets = jnp.cumsum(lengths, axis=1) - lengths
    shift = (width - total) if right else jnp.zeros_like(total)
    out = jnp.zeros((batch, width + 1), jnp.int32)
    rows = jnp.arange(batch)[:, None]
    for p, (tokens, n) in enumerate(pieces):
        k = tokens.shape[1]
        pos = jnp.arange(k)[None, :]
        dest = jnp.where(pos < n[:, None], shift[:, None] + offsets[:, p : p + 1] + pos, width)
        out = out.at[rows, dest].set(tokens.astype(jnp.int32))
    out = out[:, :width]
    slot = jnp.arange(width)[None, :]
    valid = (slot >= shift[:, None]) & (slot < shift[:, None] + total[:, None])
    return out, valid, total


def _const_piece(ids: Sequence[int], batch: int, on):
    tokens = jnp.broadcast_to(jnp.asarray(list(ids) or [0], jnp.int32), (batch, max(len(ids), 1)))
    return tokens, jnp.where(on, len(ids), 0).astype(jnp.int32)


class DeviceRollout:
    """Plays batches of episodes of one transpiled environment with one model inside one compiled loop.

    Built once per (environment, model structure, tokenizer, configs); `play` can be called many times
    (parameters are read from the model on every call, so training updates are seen). A new batch
    size or hint width compiles a new program.

    Options: observation_tokens (default: the environment's longest possible observation; a longer
    one raises), hint_prefix (hint -> text appended to the first observation; default rollout.with_hint),
    max_slots (cap on cache slots; episodes still playing when it runs out end truncated and
    cut_by_context), chunk_block (observation append block), cache_windows (compiled attention
    windows; 1 for the fastest compile), compiler_options (passed to jax.jit).
    """

    def __init__(self, env, model, tokenizer, sampling: SamplingConfig, rollout: RolloutConfig, *,
                 observation_tokens: int | None = None, hint_prefix: Callable[[str | None], str] | None = None,
                 max_slots: int | None = None, chunk_block: int = 64, cache_windows: int = 4,
                 compiler_options: dict | None = None):
        if sampling.stop_strings:
            raise ValueError("the device loop cannot apply stop_strings (host-side); use stop_token_ids")
        if rollout.reply_prefix:
            raise ValueError("the device loop reads whole replies; rollout.reply_prefix needs the host loop")
        if rollout.observation_suffix or rollout.end_on_cut_reply:
            raise ValueError("rollout.observation_suffix and rollout.end_on_cut_reply need the host loop")
        self.env, self.model, self.tokenizer = env, model, tokenizer
        self.sampling, self.rollout = sampling, rollout
        self.compiler_options = compiler_options
        if chunk_block < 1 or cache_windows < 1:
            raise ValueError(f"chunk_block and cache_windows must be >= 1, got {chunk_block}, {cache_windows}")
        # Each window compiles the model twice more (decode, append): fewer windows, faster compiles.
        self.cache_windows = cache_windows
        spec = model.spec
        eos = tuple(int(i) for i in tokenizer.eos_token_ids)
        stops = () if sampling.ignore_eos else eos
        self.stop_ids = stops + tuple(int(i) for i in sampling.stop_token_ids if i not in stops)
        self.glue = ChatGlue.build(tokenizer, rollout.system_prompt, eos)
        if observation_tokens is None:
            observation_tokens = max(ObservationTokens(env, tokenizer, kind).bound for kind in (0, 1))
        self.obs_width = int(observation_tokens)
        # One token more than kept, so that an observation past the width is detected, never cut silently.
        self.renderers = [ObservationTokens(env, tokenizer, kind, self.obs_width + 1) for kind in (0, 1)]
        if hint_prefix is None:
            hint_prefix = lambda hint: with_hint("", hint)  # noqa: E731 (with_hint appends the hint)
        self.hint_text = hint_prefix
        self.actions = ActionMap(env, tokenizer, spec.vocab_size, first=rollout.action == "first_boxed")
        g = self.glue
        self.reply_width = sampling.max_new_tokens
        self.chunk_width = max(len(v) for v in g.after_reply) + self.obs_width + len(g.before_reply)
        self.chunk_block = min(chunk_block, self.chunk_width)
        self.chunk_slots = -(-self.chunk_width // self.chunk_block) * self.chunk_block
        self.first_base = len(g.first_prefix) + self.obs_width + len(g.first_suffix)
        turns = rollout.max_turns
        # The first prompt is fed in whole blocks too; no observation is fed after the last reply.
        self.first_slots = lambda hint_width: -(-(self.first_base + hint_width) // self.chunk_block) * self.chunk_block
        self.full_slots = lambda hint_width: (self.first_slots(hint_width) + turns * self.reply_width
                                              + (turns - 1) * self.chunk_slots)
        self.max_slots = max_slots
        self._programs: dict = {}
        self.use_rollout(rollout)

    def use_rollout(self, rollout: RolloutConfig) -> None:
        """Switch the context budget or loss_on_truncated without recompiling (turns and system prompt
        are compiled in)."""
        if (rollout.max_turns, rollout.system_prompt) != (self.rollout.max_turns, self.rollout.system_prompt):
            raise ValueError("max_turns and system_prompt are compiled in; build a new DeviceRollout")
        # A row keeps playing while it holds fewer than max_context_tokens; one more turn adds at most this.
        reach = min(self.full_slots(0), rollout.max_context_tokens + self.reply_width + self.chunk_slots)
        if reach > self.model.spec.max_position:
            raise ValueError(
                f"an episode can reach {reach} tokens, past the model's context of {self.model.spec.max_position}; "
                "lower max_context_tokens, max_turns or max_new_tokens")
        self.rollout = rollout

    # -- the compiled loop ----------------------------------------------------------------------------

    def _program(self, batch: int, hint_width: int):
        key = (batch, hint_width)
        if key not in self._programs:
            slots = self.full_slots(hint_width)
            if self.max_slots is not None:
                slots = min(slots, self.max_slots)
            if slots < self.first_slots(hint_width) + self.reply_width:
                raise ValueError(f"max_slots={self.max_slots} leaves no room for one turn; raise it")
            run = jax.jit(self._run, static_argnums=0, static_argnames=("slots", "packed"),
                          compiler_options=self.compiler_options)
            self._programs[key] = (run, slots)
        return self._programs[key]

    def _run(self, graphdef, params, packed_head, *args, slots: int, packed: bool):
        """`packed`: `params` and `packed_head` come from `PackedWeights`; every matmul of the
        episode (appends and decode steps) runs `kernels.packed_matmul`."""
        with packed_weights(packed_head) if packed else contextlib.nullcontext():
            return self._episodes(graphdef, params, *args, slots=slots)

    def _episodes(self, graphdef, params, tables, reset_keys, hint_tokens, hint_lengths, live0, key, knobs,
                  max_context, *, slots: int):
        model = nnx.merge(graphdef, params)
        env, glue, actions = self.env, self.glue, self.actions
        batch = reset_keys.shape[0]
        turns, reply_w, chunk_w = self.rollout.max_turns, self.reply_width, self.chunk_width
        block = self.chunk_block
        blocks = -(-chunk_w // block)
        mode = SamplingMode.of(self.sampling)
        env_params = env.default_params
        def render(records, kind):
            tokens, length = jax.vmap(self.renderers[kind])(records)
            return tokens[:, : self.obs_width], jnp.minimum(length, self.obs_width), length > self.obs_width
        row_ids = jnp.arange(batch, dtype=jnp.int32)
        stop_ids = jnp.asarray(list(self.stop_ids) or [-1], jnp.int32)
        eos_ids = jnp.asarray(list(glue.eos_ids) or [-1], jnp.int32)

        # Reset and the first prompt.
        records, states = jax.vmap(env.reset_env, in_axes=(0, None))(reset_keys, env_params)
        obs_tokens, obs_len, overflow = render(records, 0)
        on = live0
        first_pieces = [_const_piece(glue.first_prefix, batch, on), (obs_tokens, jnp.where(on, obs_len, 0)),
                        (hint_tokens, jnp.where(on, hint_lengths, 0)), _const_piece(glue.first_suffix, batch, on)]
        first_w = self.first_slots(hint_tokens.shape[1])
        first_tokens, _, first_len = _place(first_pieces, first_w, right=False)
        tokens0, valid0, _ = _place(first_pieces, first_w, right=True)
        cache = model.new_cache(batch, slots, jnp.dtype(self.sampling.kv_cache_dtype(model.dtype)))
        n = self.cache_windows
        windows = sorted({min(slots, -(-slots * k // (n * block)) * block) for k in range(1, n + 1)})

        def in_window(width, cache, tokens, positions, valid):
            """Append `tokens` through a view of the first `width` cache slots; logits of the last one."""
            hidden, view = model.hidden_states(tokens, positions, valid, cache.window(width))
            return cache.merge(view), model.logits(hidden[:, -1:])[:, 0]

        def feed(cache, logits, tokens, positions, valid, needed):
            """Append the last `needed` blocks of right-aligned `tokens` (the blocks before them hold only
            padding, so they are neither run nor given cache slots); logits of the last token."""
            total = tokens.shape[1] // block

            def append(j, carry):
                cache, _ = carry
                cut = lambda x: jax.lax.dynamic_slice_in_dim(x, j * block, block, axis=1)  # noqa: E731 (local one-liner)
                # Attention costs queries x cache slots; run each block against the smallest window of
                # slots (a few compiled sizes) that holds everything written so far.
                rung = jnp.sum(jnp.asarray(windows) < cache.index + block)
                branches = [functools.partial(in_window, w) for w in windows]
                return jax.lax.switch(rung, branches, cache, cut(tokens), cut(positions), cut(valid))

            return jax.lax.fori_loop(total - needed, total, append, (cache, logits))

        def blocks_for(lengths):
            return (jnp.max(lengths) + block - 1) // block

        positions = jnp.maximum(jnp.cumsum(valid0, axis=1) - 1, 0)
        cache, logits = feed(cache, jnp.zeros((batch, model.spec.vocab_size), jnp.float32), tokens0, positions,
                             valid0, jnp.maximum(blocks_for(first_len), 1))

        out = {
            "reply": jnp.zeros((turns, batch, reply_w), jnp.int32),
            "logp": jnp.zeros((turns, batch, reply_w), jnp.float32),
            "reply_len": jnp.zeros((turns, batch), jnp.int32),
            "chunk": jnp.zeros((turns, batch, chunk_w), jnp.int32),
            "chunk_len": jnp.zeros((turns, batch), jnp.int32),
            "active": jnp.zeros((turns, batch), bool),
            "action": jnp.zeros((turns, batch), jnp.int32),
            "asked_host": jnp.zeros((turns, batch), bool),
            "reward": jnp.zeros((turns, batch), jnp.float32),
            "terminated": jnp.zeros((turns, batch), bool),
            "truncated": jnp.zeros((turns, batch), bool),
            "records": jax.tree.map(lambda x: jnp.zeros((turns,) + x.shape, x.dtype), records),
        }
        n_real = first_len
        done = ~live0

        def decode(cache, logits, n_real, active, turn_key):
            def cond(c):
                return (c[0] < reply_w) & ~jnp.all(c[-1])

            # The RoPE tables of each step's position ride in the carry (see Sampler's decode loop).
            def body(c):
                step, logits, cache, n_real, rope, toks, lps, count, stopped = c
                token, logp, _ = choose(logits, turn_key, step, row_ids, mode, knobs)
                emit = ~stopped
                toks = toks.at[:, step].set(jnp.where(emit, token, 0))
                lps = lps.at[:, step].set(jnp.where(emit, logp, 0.0))
                count = count + emit
                ended = emit & jnp.any(stop_ids[None, :] == token[:, None], axis=1)
                # Feed the token now so the cache holds the whole reply (its end included) before the chunk.
                hidden, cache = model.hidden_states(token[:, None], n_real[:, None], emit[:, None], cache, rope)
                logits = model.logits(hidden)[:, 0]
                n_real = n_real + emit
                return (step + 1, logits, cache, n_real, rope_tables(model.spec, n_real[:, None]), toks, lps,
                        count, stopped | ended)

            carry = (jnp.int32(0), logits, cache, n_real, rope_tables(model.spec, n_real[:, None]),
                     jnp.zeros((batch, reply_w), jnp.int32), jnp.zeros((batch, reply_w), jnp.float32),
                     jnp.zeros((batch,), jnp.int32), ~active)
            _, logits, cache, n_real, _, toks, lps, count, _ = jax.lax.while_loop(cond, body, carry)
            # As ChatStream: the glue after a reply depends on whether its last token is an EOS (which one).
            last = jnp.take_along_axis(toks, jnp.maximum(count - 1, 0)[:, None], 1)[:, 0]
            is_eos = (eos_ids[None, :] == last[:, None]) & (count > 0)[:, None]
            variant = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, 0)
            return cache, logits, n_real, toks, lps, count, variant

        def turn_cond(c):
            turn, _, _, n_real, done, *_ = c
            chunk_room = jnp.where(turn + 1 < turns, blocks * block, 0)
            return (turn < turns) & jnp.any(~done & (n_real < max_context)) & (
                c[1].index + reply_w + chunk_room <= slots)

        def turn_body(c):
            turn, cache, logits, n_real, done, states, overflow, out = c
            active = ~done & (n_real < max_context)
            turn_key = jax.random.fold_in(key, turn)
            def decode_in(width, cache, *args):
                view, *rest = decode(cache.window(width), *args)
                return (cache.merge(view), *rest)

            rung = jnp.sum(jnp.asarray(windows) < cache.index + reply_w)
            cache, dec_logits, n_real, toks, lps, count, variant = jax.lax.switch(
                rung, [functools.partial(decode_in, w) for w in windows], cache, logits, n_real, active, turn_key)
            action, asked = actions(tables, toks, count, active)
            step_keys = jax.random.split(turn_key, batch)
            records, new_states, reward, terminated, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(
                step_keys, states, action, env_params)
            truncated = new_states.truncated
            states = jax.tree.map(lambda new, old: jnp.where(
                active.reshape(active.shape + (1,) * (new.ndim - 1)), new, old), new_states, states)
            reward = jnp.where(jnp.isfinite(reward), reward, 0.0)
            finished = terminated | truncated
            going = active & ~finished
            obs_tokens, obs_len, over = render(records, 1)
            overflow = overflow | (going & over)
            after = jnp.asarray(_pad_rows(glue.after_reply))
            after_len = jnp.asarray([len(v) for v in glue.after_reply], jnp.int32)
            pieces = [(after[variant], jnp.where(going, after_len[variant], 0)),
                      (obs_tokens, jnp.where(going, obs_len, 0)), _const_piece(glue.before_reply, batch, going)]
            chunk_left, _, chunk_len = _place(pieces, chunk_w, right=False)
            padded_w = blocks * block
            chunk_right, chunk_valid, _ = _place(pieces, padded_w, right=True)
            positions = n_real[:, None] + jnp.maximum(jnp.cumsum(chunk_valid, axis=1) - 1, 0)
            # Only the blocks some row needs are run (the chunk width is a worst case over all observations);
            # after the last reply nothing is generated, so its chunk goes to the trajectory only.
            needed = jnp.where(turn + 1 < turns, blocks_for(chunk_len), 0)
            cache, chunk_logits = feed(cache, dec_logits, chunk_right, positions, chunk_valid, needed)
            logits = jnp.where(going[:, None], chunk_logits, dec_logits)
            n_real = n_real + chunk_len
            done = done | (active & finished)

            def put(buf, value):
                return jax.lax.dynamic_update_index_in_dim(buf, value, turn, 0)

            out = dict(out)
            for name, value in (("reply", toks), ("logp", lps), ("reply_len", count), ("chunk", chunk_left),
                                ("chunk_len", chunk_len), ("active", active), ("action", action),
                                ("asked_host", asked), ("reward", reward), ("terminated", terminated & active),
                                ("truncated", truncated & active)):
                out[name] = put(out[name], value)
            out["records"] = jax.tree.map(put, out["records"], records)
            return turn + 1, cache, logits, n_real, done, states, overflow, out

        carry = (jnp.int32(0), cache, logits, n_real, done, states, overflow, out)
        turn, _, _, n_real, done, _, overflow, out = jax.lax.while_loop(turn_cond, turn_body, carry)
        out["overflow"] = overflow
        out["first"], out["first_len"], out["first_record"] = first_tokens, first_len, records
        out["n_real"], out["done"], out["turns"] = n_real, done, turn
        return out

    # -- host side ------------------------------------------------------------------------------------

    def play(self, seeds: Sequence[int], key: jax.Array | int = 0, *, hints: Sequence[str | None] | None = None,
             groups: Sequence[Any] | None = None) -> list[Trajectory]:
        """One episode per seed, all in one compiled call; trajectories as `rollout.play_episodes` makes."""
        n = len(seeds)
        if n == 0:
            raise ValueError("play needs at least one seed")
        hints = list(hints) if hints is not None else [None] * n
        groups = list(groups) if groups is not None else list(range(n))
        if len(hints) != n or len(groups) != n:
            raise ValueError(f"hints and groups need one entry per seed ({n})")
        if isinstance(key, int):
            key = jax.random.key(key)
        hint_ids = [self.tokenizer.encode(self.hint_text(h), add_special_tokens=False) if h else [] for h in hints]
        hint_width = _bucket(max(len(h) for h in hint_ids))
        hint_tokens = np.zeros((n, max(hint_width, 1)), np.int32)
        for row, ids in enumerate(hint_ids):
            hint_tokens[row, : len(ids)] = ids
        reset_keys = np.stack([np.asarray(jax.random.PRNGKey(int(s) % (2**32))) for s in seeds])
        run, slots = self._program(n, hint_tokens.shape[1])
        graphdef, params = nnx.split(self.model)
        head, packed = None, cpu_kernel_applies(self.sampling, self.model)
        if packed:
            params, head = PACKED_WEIGHTS.get(graphdef, params)
        out = run(graphdef, params, head, self.actions.device_tables(), jnp.asarray(reset_keys),
                  jnp.asarray(hint_tokens), jnp.asarray([len(h) for h in hint_ids], jnp.int32), jnp.ones((n,), bool),
                  key, sampling_knobs(self.sampling), jnp.int32(self.rollout.max_context_tokens),
                  slots=slots, packed=packed)
        out = jax.device_get(out)
        if out["overflow"].any():
            raise ValueError(f"an observation rendered to more than observation_tokens={self.obs_width} tokens; "
                             "raise observation_tokens (or leave it unset for the environment's bound)")
        return self._trajectories(out, hints, groups)

    def _record(self, records, *index):
        return {name: np.asarray(value[index]) for name, value in records.items()}

    def _trajectories(self, out, hints, groups) -> list[Trajectory]:
        config, env, decode = self.rollout, self.env, self.tokenizer.decode
        trajectories = []
        for row in range(len(groups)):
            first = [int(t) for t in out["first"][row, : int(out["first_len"][row])]]
            first_text = env.render_text(self._record(out["first_record"], row))
            traj = Trajectory(first, [0] * len(first), [0.0] * len(first), [], [first_text], [],
                              group=groups[row], meta={"hinted": hints[row] is not None})
            finished = False
            for turn in range(config.max_turns):
                if not out["active"][turn, row]:
                    break
                count = int(out["reply_len"][turn, row])
                reply = [int(t) for t in out["reply"][turn, row, :count]]
                traj.tokens.extend(reply)
                traj.loss_mask.extend([1] * count)
                traj.behaviour_logprobs.extend(float(x) for x in out["logp"][turn, row, :count])
                traj.actions.append(decode(reply, skip_special_tokens=True))
                reward = float(out["reward"][turn, row])
                traj.rewards.append(reward if math.isfinite(reward) else 0.0)
                traj.observations.append(env.render_text(self._record(out["records"], turn, row)))
                terminated, truncated = bool(out["terminated"][turn, row]), bool(out["truncated"][turn, row])
                if terminated or truncated:
                    traj.terminated, traj.truncated = terminated, truncated and not terminated
                    finished = True
                    break
                chunk = [int(t) for t in out["chunk"][turn, row, : int(out["chunk_len"][turn, row])]]
                traj.tokens.extend(chunk)
                traj.loss_mask.extend([0] * len(chunk))
                traj.behaviour_logprobs.extend([0.0] * len(chunk))
            if not finished:  # out of turns, out of context, or out of cache slots
                traj.truncated = True
                traj.cut_by_context = len(traj.tokens) >= config.max_context_tokens or (
                    int(out["turns"]) < config.max_turns and len(traj.tokens) < config.max_context_tokens)
            clip_to_context(traj, config)
            trajectories.append(traj)
        return trajectories


def _pad_rows(rows: Sequence[Sequence[int]]) -> np.ndarray:
    width = max([len(r) for r in rows] + [1])
    out = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _bucket(size: int, smallest: int = 16) -> int:
    """Hint widths round up to powers of two, so new hints rarely compile a new program."""
    if size == 0:
        return 0
    width = smallest
    while width < size:
        width *= 2
    return width


_ROLLOUTS: dict = {}
_MAX_RUNNERS = 16  # compiled device loops kept by play_episodes_device (oldest dropped first)


def play_episodes_device(
    env, seeds: Sequence[int], model, tokenizer, sampling: SamplingConfig, rollout: RolloutConfig,
    key: jax.Array | int = 0, *, hints: Sequence[str | None] | None = None,
    groups: Sequence[Any] | None = None, **options,
) -> list[Trajectory]:
    """Plays one episode per seed of a device environment (`Runnable.device_env`) inside one compiled
    loop; same trajectories as `rollout.play_episodes` over `env.text_env()` instances. `options` go to
    `DeviceRollout` (observation_tokens, hint_prefix, max_slots, chunk_block, cache_windows,
    compiler_options)."""
    graphdef, _ = nnx.split(model)
    cache_key = (id(env), id(tokenizer), graphdef, sampling, rollout.max_turns, rollout.system_prompt,
                 repr(sorted(options.items())))
    if cache_key not in _ROLLOUTS:
        # Runners hold their env and tokenizer, so the ids in the key stay theirs; keep only a few.
        while len(_ROLLOUTS) >= _MAX_RUNNERS:
            _ROLLOUTS.pop(next(iter(_ROLLOUTS)))
        _ROLLOUTS[cache_key] = DeviceRollout(env, model, tokenizer, sampling, rollout, **options)
    runner = _ROLLOUTS[cache_key]
    runner.model = model
    runner.use_rollout(rollout)
    return runner.play(seeds, key, hints=hints, groups=groups)
