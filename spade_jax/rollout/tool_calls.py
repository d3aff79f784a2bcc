"""Tool calls in Qwen's text format (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`):
parsing a reply into its calls, its malformed calls with a reason each, and its other text; rendering back.

A block's JSON is read with a JSON decoder from the open tag, not cut at the first close tag, so a
`</tool_call>` or unbalanced brace inside a string argument stays part of the argument. Each block is
read only up to the next open tag, which keeps parsing linear in the reply's length for any input.
"""

from __future__ import annotations

import dataclasses
import json

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"
_SNIPPET = 200  # characters of a malformed block kept in its report


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments by parameter name."""

    name: str
    arguments: dict

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ToolCall.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.arguments, dict):
            raise ValueError(f"ToolCall.arguments must be a dict, got {type(self.arguments).__name__}")

    def __hash__(self):  # the dict field makes the generated hash fail; equal calls hash equal
        return hash((self.name, _canonical(self.arguments)))

    def as_message(self) -> dict:
        """The call as an assistant message's `tool_calls` entry (the OpenAI / transformers shape)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True)
class MalformedCall:
    """A `<tool_call>` block that is not a call: its text (cut to a few hundred characters) and why."""

    text: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    """A reply read as tool calls: the calls in order, the malformed blocks, and the text outside blocks."""

    calls: tuple[ToolCall, ...]
    malformed: tuple[MalformedCall, ...]
    text: str

    @property
    def well_formed(self) -> bool:
        """No block failed to parse (a reply without blocks is well formed)."""
        return not self.malformed


def _call_from_json(value) -> ToolCall | str:
    """The call a block's decoded JSON describes, or why it describes none."""
    if not isinstance(value, dict):
        return f"expected a JSON object, got {type(value).__name__}"
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return "missing \"name\"" if "name" not in value else "\"name\" is not a non-empty string"
    if "arguments" not in value:
        return "missing \"arguments\""
    arguments = value["arguments"]
    if isinstance(arguments, str):  # Qwen's template passes string arguments through, and models write them
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return "\"arguments\" is a string that is not JSON"
    if not isinstance(arguments, dict):
        return f"\"arguments\" must be an object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments)


def _read_block(segment: str) -> tuple[ToolCall | str, int]:
    """Reads one block from `segment` (the text after an open tag, up to the next open tag):
    (the call or why it failed, the length of `segment` the block used, close tag included)."""
    start = len(segment) - len(segment.lstrip(_WHITESPACE))
    close = segment.find(CLOSE_TAG)
    try:
        value, end = _DECODER.raw_decode(segment, start)
    except RecursionError:
        value, end, error = None, -1, "JSON nested too deeply"
    except ValueError as exc:
        value, end, error = None, -1, f"invalid JSON ({exc.msg} at offset {exc.pos - start})"
    if end >= 0:
        after = end + len(segment[end:]) - len(segment[end:].lstrip(_WHITESPACE))
        if segment.startswith(CLOSE_TAG, after):
            return _call_from_json(value), after + len(CLOSE_TAG)
        if after == len(segment):
            return "unclosed <tool_call>", len(segment)
        close = segment.find(CLOSE_TAG, end)
        error = "text after the JSON object inside <tool_call>"
    if close < 0:
        return "unclosed <tool_call>", len(segment)
    return error, close + len(CLOSE_TAG)


def parse_tool_calls(reply: str) -> ParsedReply:
    """Reads every `<tool_call>` block of `reply`. A block holds one JSON object with a string "name" and
    "arguments" (an object, or a string holding a JSON object as Qwen accepts); anything else, and a block
    whose close tag is missing (a reply cut short), is reported in `malformed`. Text outside blocks is
    kept, joined and stripped, in `text`."""
    calls: list[ToolCall] = []
    malformed: list[MalformedCall] = []
    text_parts: list[str] = []
    cursor = 0
    while True:
        opened = reply.find(OPEN_TAG, cursor)
        if opened < 0:
            text_parts.append(reply[cursor:])
            break
        text_parts.append(reply[cursor:opened])
        body = opened + len(OPEN_TAG)
        following = reply.find(OPEN_TAG, body)
        segment = reply[body:] if following < 0 else reply[body:following]
        result, used = _read_block(segment)
        if isinstance(result, ToolCall):
            calls.append(result)
        else:
            malformed.append(MalformedCall(text=reply[opened : body + used][:_SNIPPET], reason=result))
        cursor = body + used
    return ParsedReply(calls=tuple(calls), malformed=tuple(malformed), text="".join(text_parts).strip())


def render_tool_call(call: ToolCall) -> str:
    """The block Qwen's chat template writes for a call (`tojson` is `json.dumps(ensure_ascii=False)`)."""
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    return f'{OPEN_TAG}\n{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": {arguments}}}\n{CLOSE_TAG}'


def render_tool_calls(calls) -> str:
    """Several calls as one reply's blocks, one per line as Qwen's template separates them."""
    return "\n".join(render_tool_call(call) for call in calls)
