"""Tool use in the model's own chat format: tools rendered by the tokenizer's chat template (`tools=`) or, for
templates without tool support (SmolLM2's), by a documented fallback in the system turn; replies become
assistant messages with `tool_calls`, tool results become `tool` turns.

The fallback (`fallback_messages`) writes what Qwen's template writes, as plain messages any template renders:
the system turn gets the "# Tools" block (each tool's JSON in <tools></tools> and the <tool_call> format), an
assistant turn's calls are appended to its content as `render_tool_calls` blocks, and consecutive `tool` turns
become one user turn of <tool_response> blocks.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from spade_jax.rollout.tool_calls import ToolCall, parse_tool_calls, render_tool_calls

TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FORMAT = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>"
)
_PROBE_NAME = "spade_probe_tool_e000"


def tool_schema(tool: dict) -> dict:
    """A tool as chat templates expect it: {"type": "function", "function": {name, description, parameters}}
    (a bare function description is wrapped; a wrapped one is returned as is)."""
    if "function" in tool and tool.get("type", "function") == "function":
        return tool
    if not isinstance(tool.get("name"), str):
        raise ValueError(f"a tool needs a \"name\": {json.dumps(tool)[:120]}")
    return {"type": "function", "function": tool}


def tools_system_text(tools: Sequence[dict]) -> str:
    """The fallback's tools block: each tool's JSON on its own line inside <tools></tools>, then the call format."""
    lines = "".join("\n" + json.dumps(tool_schema(t), ensure_ascii=False) for t in tools)
    return TOOLS_INTRO + lines + TOOLS_FORMAT


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders `tools=` (a probe tool's name appears in its output)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template or "tools" not in template:
        return False
    probe = [tool_schema({"name": _PROBE_NAME, "description": "", "parameters": {"type": "object", "properties": {}}})]
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                             tools=probe)
    except Exception:  # a template that breaks on tools= does not support them
        return False
    return _PROBE_NAME in text


def _call_message(call: ToolCall | dict) -> dict:
    return call.as_message() if isinstance(call, ToolCall) else call


def fallback_messages(messages: Sequence[dict], tools: Sequence[dict]) -> list[dict]:
    """`messages` with tools, tool calls and tool results written as plain system, assistant and user turns."""
    out: list[dict] = []
    block = tools_system_text(tools) if tools else ""
    rest = list(messages)
    if rest and rest[0].get("role") == "system":
        system = rest.pop(0)["content"] or ""
        out.append({"role": "system", "content": f"{system}\n\n{block}" if block and system else system or block})
    elif block:
        out.append({"role": "system", "content": block})
    for message in rest:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            calls = [_call_message(c) for c in message["tool_calls"]]
            text = render_tool_calls(ToolCall(c["function"]["name"], _arguments(c)) for c in calls)
            content = message.get("content") or ""
            out.append({"role": "assistant", "content": f"{content}\n{text}" if content else text})
        elif role == "tool":
            response = f"<tool_response>\n{message['content']}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool_turn": True})
        else:
            out.append({"role": role, "content": message["content"]})
    return [{k: v for k, v in m.items() if k != "_tool_turn"} for m in out]


def _arguments(call: dict) -> dict:
    arguments = call["function"].get("arguments", {})
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def render_tool_chat(tokenizer: Any, messages: Sequence[dict], tools: Sequence[dict] | None, *,
                     add_generation_prompt: bool = True, native: bool | None = None) -> str:
    """The prompt text of a conversation with tools: the template's own rendering (`tools=`) when it supports
    tools (`native` None asks `template_supports_tools`), else the fallback messages through the template."""
    tools = list(tools or [])
    if native is None:
        native = bool(tools) and template_supports_tools(tokenizer)
    if native:
        calls_as_messages = [
            {**m, "tool_calls": [_call_message(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in messages
        ]
        return tokenizer.apply_chat_template(calls_as_messages, add_generation_prompt=add_generation_prompt,
                                             tools=[tool_schema(t) for t in tools] or None)
    plain = fallback_messages(messages, tools)
    return tokenizer.apply_chat_template(plain, add_generation_prompt=add_generation_prompt)


def assistant_message(reply: str) -> dict:
    """A reply as the assistant turn a tool-use conversation keeps: its text outside call blocks as content
    and its well-formed calls as `tool_calls` (malformed blocks are dropped, as Qwen's own parsers drop them)."""
    parsed = parse_tool_calls(reply)
    if not parsed.calls:
        return {"role": "assistant", "content": reply}
    return {"role": "assistant", "content": parsed.text, "tool_calls": [c.as_message() for c in parsed.calls]}


def tool_messages(results: Sequence[str]) -> list[dict]:
    """Tool results, one `tool` turn each, in the order of the calls."""
    return [{"role": "tool", "content": str(r)} for r in results]
