"""The agent's chat turns: its system prompt and hint format, and the token stream the chat template
makes of them, appended turn by turn on the host (`ChatStream`) or precomputed for the device loop (`ChatGlue`)."""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

# The agent's system turn in self-play and evaluation (rollout.system_prompt None selects it there).
AGENT_SYSTEM = (
    "You are playing a text game. Each turn, think briefly about the state, then end your reply "
    "with exactly one action inside \\boxed{}."
)


def with_hint(observation: str, hint: str | None) -> str:
    """The first observation of the hinted arm: the hint appended after the observation."""
    return observation if not hint else f"{observation}\n\nHint: {hint}"


class Tokenizer(Protocol):
    """What rollouts need of `spade_jax.models.tokenizer.Tokenizer`."""

    eos_token_ids: tuple[int, ...]

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = ...) -> str: ...


def _system_turn(system_prompt: str | None) -> list[dict]:
    return [{"role": "system", "content": system_prompt}] if system_prompt else []


def _render(tokenizer: Tokenizer, messages, add_generation_prompt: bool, tools=None) -> str:
    if tools:  # tool use: the template's tools= or the documented fallback (rollout/tool_chat.py)
        from spade_jax.rollout.tool_chat import render_tool_chat

        return render_tool_chat(tokenizer, messages, tools, add_generation_prompt=add_generation_prompt)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


def _after_reply(tokenizer: Tokenizer, history: list[dict], reply: str, user_text: str | Sequence[str], *,
                 role: str = "user", tools=None) -> tuple[str, str, bool]:
    """The template text after an assistant turn holding `reply`: (the text closing that turn, the text the
    next `role` turn(s) and reply header add, whether adding them left the earlier text as it was).
    `reply` is located by its last occurrence, so a unique placeholder finds the reply's end even for
    short or empty replies (which may also occur inside the template's own text)."""
    placed = [*history, {"role": "assistant", "content": reply}]
    through = _render(tokenizer, placed, False, tools)
    following = _render(tokenizer, [*placed, *_turns(role, user_text)], True, tools)
    tail = through[through.rfind(reply) + len(reply):]
    appended = following.startswith(through)
    if appended:
        return tail, following[len(through):], True
    # A template that re-renders the last assistant turn once another turn follows (Qwen3's thinking block):
    # the new text is what follows that turn's closing text in the longer rendering.
    after = following[following.rfind(reply) + len(reply):]
    return tail, after[len(tail):] if after.startswith(tail) else following[len(through):], False


def _turns(role: str, text: str | Sequence[str]) -> list[dict]:
    """One turn per text: several tool results are several `tool` turns (the template may merge them)."""
    return [{"role": role, "content": t} for t in ([text] if isinstance(text, str) else text)]


def _without_eos(tail: str, eos_text: str) -> str:
    """A reply that ended with an EOS token already closed its turn: the template's copy is dropped."""
    return tail[len(eos_text):] if tail.startswith(eos_text) else tail


class ChatStream:
    """Appends chat turns to a token stream exactly as the tokenizer's chat template renders them.

    Agent replies are kept as the sampled token ids (the update must score exactly what was
    sampled); only the template text between turns is tokenized.
    """

    def __init__(self, tokenizer: Tokenizer, system_prompt: str | None = None, reply_prefix: str = "",
                 tools=None):
        self.tokenizer = tokenizer
        self.messages: list[dict] = _system_turn(system_prompt)
        self.reply_prefix = reply_prefix
        self.tools = list(tools) if tools else None  # function descriptions the agent may call (tool use)
        # Tokenized on its own, so every reply starts with the same ids whatever precedes them.
        self._prefix_ids = tokenizer.encode(reply_prefix, add_special_tokens=False) if reply_prefix else []

    def first_turn(self, user_text: str) -> list[int]:
        self.messages.append({"role": "user", "content": user_text})
        rendered = _render(self.tokenizer, self.messages, True, self.tools)
        return self.tokenizer.encode(rendered, add_special_tokens=False) + self._prefix_ids

    def next_turn(self, reply_tokens: list[int], user_text: str | Sequence[str], *, role: str = "user") -> list[int]:
        """Tokens that follow the agent's reply: the end of its turn, the next turn (a user turn, or with
        role "tool" one `tool` turn per result given), the reply header (and the forced reply prefix)."""
        ended_with_eos = bool(reply_tokens) and reply_tokens[-1] in self.tokenizer.eos_token_ids
        content = self.reply_prefix + self.tokenizer.decode(reply_tokens, skip_special_tokens=True)
        history = self.messages
        tail, rest, _ = _after_reply(self.tokenizer, history, _PLACEHOLDER, user_text, role=role, tools=self.tools)
        if ended_with_eos:
            tail = _without_eos(tail, self.tokenizer.decode(reply_tokens[-1:], skip_special_tokens=False))
        self.messages = [*history, {"role": "assistant", "content": content}, *_turns(role, user_text)]
        return self.tokenizer.encode(tail + rest, add_special_tokens=False) + self._prefix_ids


_PLACEHOLDER = "\ue000spade-reply\ue001"


@dataclasses.dataclass(frozen=True)
class ChatGlue:
    """Token ids the chat template puts around observations, as `ChatStream` would emit them.

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
        base = _system_turn(system_prompt)

        def glue_after(history, reply, obs):
            """ChatStream.next_turn's text around `obs`: (tail, user header, user end + reply header)."""
            tail, rest, appended = _after_reply(tokenizer, history, reply, obs)
            if not appended:
                raise ValueError("the chat template re-renders earlier turns when a turn is added; use the host loop")
            at = rest.find(obs)
            return tail, rest[:at], rest[at + len(obs):]

        first = _render(tokenizer, base + [{"role": "user", "content": marks[0]}], True)
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
            variants.append(enc(_without_eos(tail, tokenizer.decode([eos], skip_special_tokens=False)) + header))
        return cls(enc(prefix), enc(suffix), tuple(variants), enc(after), tuple(int(e) for e in eos_ids))
