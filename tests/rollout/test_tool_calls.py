"""Qwen-format tool calls: well-formed replies parse to their calls and text, malformed blocks are reported
with a reason, rendering round-trips, and adversarial inputs neither crash nor take quadratic time."""

import json
import time

import pytest

from spade_jax.rollout.tool_calls import (
    MalformedCall,
    ToolCall,
    parse_tool_calls,
    render_tool_call,
    render_tool_calls,
)


def _block(payload: str) -> str:
    return f"<tool_call>\n{payload}\n</tool_call>"


def test_one_call_with_text_around_it():
    reply = 'Let me look.\n<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp"}}\n</tool_call>\nDone.'
    parsed = parse_tool_calls(reply)
    assert parsed.calls == (ToolCall("ls", {"path": "/tmp"}),)
    assert parsed.malformed == ()
    assert parsed.well_formed
    assert parsed.text == "Let me look.\n\nDone."


def test_several_calls_in_one_turn_keep_their_order():
    reply = "\n".join(_block(json.dumps({"name": f"f{i}", "arguments": {"i": i}})) for i in range(3))
    parsed = parse_tool_calls(reply)
    assert [c.name for c in parsed.calls] == ["f0", "f1", "f2"]
    assert [c.arguments["i"] for c in parsed.calls] == [0, 1, 2]
    assert parsed.text == ""


def test_a_reply_without_calls_is_well_formed_text():
    parsed = parse_tool_calls("  just an answer \\boxed{4}  ")
    assert parsed.calls == () and parsed.well_formed and parsed.text == "just an answer \\boxed{4}"


def test_arguments_as_a_json_string_are_accepted_as_qwen_does():
    payload = json.dumps({"name": "cd", "arguments": json.dumps({"folder": "docs"})})
    assert parse_tool_calls(_block(payload)).calls == (ToolCall("cd", {"folder": "docs"}),)


def test_close_tags_and_unbalanced_braces_inside_strings_stay_in_the_argument():
    arguments = {"code": "print('</tool_call>'); x = '{{{'; y = \"}\"", "nested": {"a": [1, {"b": "}"}]}}
    reply = "pre " + _block(json.dumps({"name": "run", "arguments": arguments})) + " post"
    parsed = parse_tool_calls(reply)
    assert parsed.calls == (ToolCall("run", arguments),)
    assert parsed.text == "pre  post"


def test_compact_block_without_newlines_parses():
    parsed = parse_tool_calls('<tool_call>{"name":"a","arguments":{}}</tool_call>')
    assert parsed.calls == (ToolCall("a", {}),)


@pytest.mark.parametrize(
    "payload, reason",
    [
        ('{"name": "f", "arguments": {"x": 1}', "invalid JSON"),
        ("not json at all", "invalid JSON"),
        ('["f", {"x": 1}]', "expected a JSON object, got list"),
        ('{"arguments": {}}', 'missing "name"'),
        ('{"name": "", "arguments": {}}', '"name" is not a non-empty string'),
        ('{"name": 3, "arguments": {}}', '"name" is not a non-empty string'),
        ('{"name": "f"}', 'missing "arguments"'),
        ('{"name": "f", "arguments": [1, 2]}', '"arguments" must be an object, got list'),
        ('{"name": "f", "arguments": 7}', '"arguments" must be an object, got int'),
        ('{"name": "f", "arguments": "[1]"}', '"arguments" must be an object, got list'),
        ('{"name": "f", "arguments": "{bad"}', '"arguments" is a string that is not JSON'),
        ('{"name": "f", "arguments": {}} trailing', "text after the JSON object"),
    ],
)
def test_malformed_blocks_are_reported_with_a_reason(payload, reason):
    parsed = parse_tool_calls("before " + _block(payload) + " after")
    assert parsed.calls == ()
    assert len(parsed.malformed) == 1 and not parsed.well_formed
    assert parsed.malformed[0].reason.startswith(reason), parsed.malformed[0].reason
    assert parsed.malformed[0].text.startswith("<tool_call>")
    assert parsed.text == "before  after"


def test_a_malformed_block_does_not_hide_the_good_ones_beside_it():
    good = _block('{"name": "a", "arguments": {}}')
    reply = good + _block('{"name": "b", "arguments": ') + good
    parsed = parse_tool_calls(reply)
    assert parsed.calls == (ToolCall("a", {}), ToolCall("a", {}))
    assert [m.reason.split(" (")[0] for m in parsed.malformed] == ["invalid JSON"]


def test_unclosed_tags_are_malformed():
    cut = parse_tool_calls('text <tool_call>\n{"name": "f", "arguments": {"x": 1}}')
    assert cut.calls == () and cut.malformed == (MalformedCall(cut.malformed[0].text, "unclosed <tool_call>"),)
    assert cut.text == "text"
    truncated = parse_tool_calls('<tool_call>\n{"name": "f", "argu')
    assert truncated.malformed[0].reason == "unclosed <tool_call>"
    bare = parse_tool_calls("<tool_call>")
    assert bare.malformed[0].reason == "unclosed <tool_call>"


def test_an_open_tag_inside_a_broken_block_starts_a_new_block():
    reply = '<tool_call>\n{"name": "f", <tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    parsed = parse_tool_calls(reply)
    assert parsed.calls == (ToolCall("g", {}),)
    assert parsed.malformed[0].reason == "unclosed <tool_call>"


def test_a_stray_close_tag_is_text():
    assert parse_tool_calls("a </tool_call> b").text == "a </tool_call> b"


def test_deep_nesting_is_reported_not_raised():
    parsed = parse_tool_calls(_block('{"name": "f", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}"))
    assert parsed.calls == () and parsed.malformed[0].reason == "JSON nested too deeply"


def test_huge_inputs_parse_in_linear_time():
    many_open = "<tool_call>{" * 50_000  # each block unclosed and invalid
    long_string = _block(json.dumps({"name": "w", "arguments": {"data": "x" * 2_000_000}}))
    many_calls = "\n".join([_block('{"name": "n", "arguments": {"k": 1}}')] * 20_000)
    started = time.perf_counter()
    assert len(parse_tool_calls(many_open).malformed) == 50_000
    assert parse_tool_calls(long_string).calls[0].arguments["data"] == "x" * 2_000_000
    assert len(parse_tool_calls(many_calls).calls) == 20_000
    # a quadratic parser takes minutes here; a generous bound keeps the test meaningful on a busy machine
    assert time.perf_counter() - started < 20


def test_malformed_reports_cut_long_blocks():
    parsed = parse_tool_calls(_block("y" * 10_000))
    assert len(parsed.malformed[0].text) <= 200


def test_render_matches_qwens_template_text_and_round_trips():
    call = ToolCall("get_weather", {"city": "Zürich", "days": 2, "units": None})
    text = render_tool_call(call)
    # the Qwen2.5/Qwen3 template: '<tool_call>\n{"name": "' + name + '", "arguments": ' + tojson + '}\n</tool_call>'
    assert text == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2, "units": null}}\n</tool_call>'
    )
    calls = (call, ToolCall("ls", {}), ToolCall("echo", {"s": "</tool_call> {"}))
    assert parse_tool_calls(render_tool_calls(calls)).calls == calls


def test_tool_call_validates_and_hashes_by_value():
    with pytest.raises(ValueError, match="non-empty string"):
        ToolCall("", {})
    with pytest.raises(ValueError, match="must be a dict"):
        ToolCall("f", [1])
    assert hash(ToolCall("f", {"a": 1, "b": 2})) == hash(ToolCall("f", {"b": 2, "a": 1}))
    message = {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    assert ToolCall("f", {"a": 1}).as_message() == message
