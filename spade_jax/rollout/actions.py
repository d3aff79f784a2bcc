"""What an environment receives of a reply: the text (`agent_action`, host loop) or, in the device
loop, the action id read from the reply's tokens on device (`ActionMap`, the host's mapping mirrored)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax.envs.api import boxed_command, extract_boxed
from spade_jax.models.tokenizer import BYTE_OF_CHAR

_OPEN = b"\\boxed{"
# Bytes that Python's str.isspace() accepts among ASCII, i.e. what str.strip() removes there.
_ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())
_NO_ANSWER_PROBES = ("", "I am not sure.", "boxed{1}", "\\boxed{", "\\boxed{1{2}", "{}", "the answer is 3")


def agent_action(reply: str, mode: str) -> str:
    """The text an environment receives for a reply: under "first_boxed" the reply's first complete
    \\boxed{...} (as `\\boxed{content}`, so environments that read the last one see the same), else
    the whole reply."""
    if mode == "first_boxed":
        content = extract_boxed(reply, first=True)
        if content is not None:
            return f"\\boxed{{{content}}}"
    return reply


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


class ActionMap:
    """Maps a reply's token ids to the environment's action id on device, exactly as the host does
    with `env.action_id(tokenizer.decode(reply, skip_special_tokens=True))`.

    On device: rebuild the reply's bytes, take the last `\\boxed{...}` content, strip ASCII space,
    lower-case ASCII, and look it up among the vocabulary's contents. That is exact for programs that
    read their command as `boxed_command` (the library idiom), which `build` checks on probe texts;
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
            content = boxed_command(text)
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
        """True when the program's parse behaves like `boxed_command` on probe texts."""
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
