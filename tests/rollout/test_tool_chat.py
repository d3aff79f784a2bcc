"""Tool use in the model's chat format: on a Qwen3 tokenizer our rendering equals transformers'
`apply_chat_template(..., tools=...)`; templates without tools get the documented fallback; a reply holding
a malformed call is masked from the loss under `rollout.mask_malformed_tool_calls`."""

import pytest

from spade_jax.models.tokenizer import byte_tokenizer, load_hf_tokenizer
from spade_jax.rollout import ChatStream, Generation, RolloutConfig, play_episodes
from spade_jax.rollout.tool_calls import ToolCall, parse_tool_calls, render_tool_call, render_tool_calls
from spade_jax.rollout.tool_chat import (
    TOOLS_INTRO,
    assistant_message,
    fallback_messages,
    render_tool_chat,
    template_supports_tools,
    tool_messages,
    tool_schema,
)
from tests.rollout.qwen3_tokenizer import build_qwen3_tokenizer_dir

TOOLS = [
    {"name": "get_weather", "description": "Weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"]}},
    {"name": "ls", "description": "List files.", "parameters": {"type": "object", "properties": {}}},
]
CALLS = (ToolCall("get_weather", {"city": "Zürich", "days": 2}), ToolCall("ls", {}))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return load_hf_tokenizer(str(build_qwen3_tokenizer_dir(tmp_path_factory.mktemp("qwen3"))))


def _reference(tokenizer, messages, add_generation_prompt=True):
    """transformers' own rendering, with OpenAI-shaped tool calls and tools."""
    return tokenizer.hf.apply_chat_template(messages, tools=[tool_schema(t) for t in TOOLS], tokenize=False,
                                            add_generation_prompt=add_generation_prompt)


def _conversation():
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich, and list my files."},
        {"role": "assistant", "content": "", "tool_calls": [c.as_message() for c in CALLS]},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": "a.txt b.txt"},
        {"role": "assistant", "content": "21 degrees; two files."},
        {"role": "user", "content": "Thanks"},
    ]


def test_the_qwen3_template_supports_tools_and_chatml_does_not(qwen3):
    assert template_supports_tools(qwen3)
    assert not template_supports_tools(byte_tokenizer())


def test_native_rendering_equals_transformers_for_a_whole_tool_conversation(qwen3):
    messages = _conversation()
    assert render_tool_chat(qwen3, messages, TOOLS) == _reference(qwen3, messages)
    # ToolCall objects in tool_calls render as their OpenAI shape does
    with_objects = [{**m, "tool_calls": list(CALLS)} if m.get("tool_calls") else m for m in messages]
    assert render_tool_chat(qwen3, with_objects, TOOLS) == _reference(qwen3, messages)


def test_our_call_rendering_is_the_templates_and_parses_back(qwen3):
    messages = _conversation()[:3]
    text = _reference(qwen3, messages, add_generation_prompt=False)
    assert render_tool_calls(CALLS) in text
    assert all(render_tool_call(c) in text for c in CALLS)
    reply = text[text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"): text.rindex("<|im_end|>")]
    assert parse_tool_calls(reply).calls == CALLS
    # a reply parsed into an assistant message renders back to the same turn
    again = [*messages[:2], assistant_message(reply)]
    assert render_tool_chat(qwen3, again, TOOLS, add_generation_prompt=False) == text


def test_chat_stream_with_tools_and_tool_turns_matches_transformers(qwen3):
    stream = ChatStream(qwen3, system_prompt="Be brief.", tools=TOOLS)
    first = stream.first_turn("Weather in Zürich, and list my files.")
    messages = _conversation()[:2]
    assert qwen3.decode(first, skip_special_tokens=False) == _reference(qwen3, messages)
    reply_text = render_tool_calls(CALLS)
    reply = qwen3.encode(reply_text, add_special_tokens=False) + [qwen3.eos_token_ids[0]]
    follow = stream.next_turn(reply, ['{"temp": 21}', "a.txt b.txt"], role="tool")
    full = _reference(qwen3, _conversation()[:5])
    # after the reply, the stream holds exactly what the template writes after the calls: the tool turns
    # (merged into one user turn of <tool_response> blocks) and the next reply header
    after_calls = full[full.rindex("</tool_call>") + len("</tool_call>"):]
    assert qwen3.decode(reply[-1:] + follow, skip_special_tokens=False) == after_calls
    assert stream.messages[-2:] == tool_messages(['{"temp": 21}', "a.txt b.txt"])


def test_fallback_writes_tools_calls_and_results_as_plain_turns():
    tokenizer = byte_tokenizer()  # ChatML without tools, as SmolLM2's template
    messages = _conversation()
    plain = fallback_messages(messages, TOOLS)
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert plain[0]["content"].startswith("Be brief.\n\n" + TOOLS_INTRO)
    assert '"name": "get_weather"' in plain[0]["content"] and "<tool_call>" in plain[0]["content"]
    assert plain[2]["content"] == render_tool_calls(CALLS)
    assert plain[3]["content"] == (
        '<tool_response>\n{"temp": 21}\n</tool_response>\n<tool_response>\na.txt b.txt\n</tool_response>')
    rendered = render_tool_chat(tokenizer, messages, TOOLS)
    assert rendered == tokenizer.apply_chat_template(plain, add_generation_prompt=True)
    # the calls the fallback shows parse back to the calls made
    assert parse_tool_calls(plain[2]["content"]).calls == CALLS
    # without a system turn the tools block is the system turn
    assert fallback_messages(messages[1:2], TOOLS)[0]["content"].startswith(TOOLS_INTRO)


def test_chat_stream_fallback_appends_tool_turns_exactly():
    tokenizer = byte_tokenizer()
    stream = ChatStream(tokenizer, system_prompt="Be brief.", tools=TOOLS)
    tokens = stream.first_turn("hi")
    reply = tokenizer.encode(render_tool_call(CALLS[1]), add_special_tokens=False) + [tokenizer.eos_token_ids[0]]
    tokens += reply + stream.next_turn(reply, ["a.txt"], role="tool")
    expected = render_tool_chat(tokenizer, [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": render_tool_call(CALLS[1])}, {"role": "tool", "content": "a.txt"},
    ], TOOLS)
    assert tokenizer.decode(tokens, skip_special_tokens=False) == expected


class _ToolEnv:
    """Answers each reply with the names it called; ends after two steps."""

    def reset(self, seed=None):
        self.steps = 0
        return "Call a tool.", {}

    def step(self, action):
        self.steps += 1
        names = [c.name for c in parse_tool_calls(action).calls]
        return f"called {names}", 0.0, self.steps >= 2, False, {}


@pytest.mark.parametrize("mask", [False, True])
def test_malformed_tool_calls_are_masked_from_the_loss_when_asked(mask):
    tokenizer = byte_tokenizer()
    replies = ['<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>', '<tool_call>\n{"name": "ls", "argu']
    turn = iter(replies)

    def generate(prompts):
        ids = tokenizer.encode(next(turn), add_special_tokens=False) + [tokenizer.eos_token_ids[0]]
        return [Generation(ids, [-0.1] * len(ids), "eos") for _ in prompts]

    config = RolloutConfig(max_turns=2, action="reply", mask_malformed_tool_calls=mask, system_prompt="")
    (traj,) = play_episodes([_ToolEnv()], [0], generate, tokenizer, config)
    sizes = [len(tokenizer.encode(r, add_special_tokens=False)) + 1 for r in replies]
    assert sum(traj.loss_mask) == (sizes[0] if mask else sum(sizes))
    assert traj.meta.get("malformed_tool_calls", 0) == (1 if mask else 0)
    assert len(traj.loss_mask) == len(traj.tokens)


def test_the_device_loop_refuses_the_mask_option():
    from spade_jax.rollout import DeviceRollout

    with pytest.raises(ValueError, match="mask_malformed_tool_calls"):
        DeviceRollout(None, None, None, _NoStops(), RolloutConfig(mask_malformed_tool_calls=True))


class _NoStops:
    stop_strings = ()


class _ListedToolsEnv(_ToolEnv):
    def reset(self, seed=None):
        obs, _ = super().reset(seed)
        return obs, {"tools": TOOLS}


@pytest.mark.parametrize("tool_turns", [False, True])
def test_tool_turns_put_tools_in_the_template_and_results_in_tool_turns(qwen3, tool_turns):
    replies = [render_tool_calls(CALLS), "<answer>done</answer>"]
    turn = iter(replies)

    def generate(prompts):
        ids = qwen3.encode(next(turn), add_special_tokens=False) + [qwen3.eos_token_ids[0]]
        return [Generation(ids, [-0.1] * len(ids), "eos") for _ in prompts]

    config = RolloutConfig(max_turns=2, action="reply", tool_turns=tool_turns, system_prompt="Be brief.")
    (traj,) = play_episodes([_ListedToolsEnv()], [0], generate, qwen3, config, format_observation=lambda o, h: o)
    text = qwen3.decode(traj.tokens, skip_special_tokens=False)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Call a tool."},
                {"role": "assistant", "content": replies[0]},
                {"role": "tool" if tool_turns else "user", "content": "called ['get_weather', 'ls']"}]
    if tool_turns:  # the stream is what transformers renders with tools=, up to the re-rendered thinking block
        reference = _reference(qwen3, messages)
        assert text.startswith(_reference(qwen3, messages[:2]))
        assert text.endswith(reference[reference.rindex("</tool_call>") + len("</tool_call>"):] + replies[1]
                             + "<|im_end|>")
    else:
        assert "# Tools" not in text and "<tool_response>" not in text


def test_a_tiny_qwen3_checkpoint_ships_the_tokenizer_and_renders_tools_as_transformers(tmp_path):
    from transformers import AutoTokenizer

    from spade_jax.models.registry import load_model
    from tests.models.hf_tiny import hf_model, save_hf

    directory = save_hf(hf_model("qwen3", vocab_size=512), tmp_path / "tiny-qwen3")
    build_qwen3_tokenizer_dir(directory)
    loaded = load_model(str(directory))
    reference = AutoTokenizer.from_pretrained(str(directory))
    messages = _conversation()
    assert render_tool_chat(loaded.tokenizer, messages, TOOLS) == reference.apply_chat_template(
        messages, tools=[tool_schema(t) for t in TOOLS], tokenize=False, add_generation_prompt=True)
    assert loaded.tokenizer.eos_token_ids[0] == reference.convert_tokens_to_ids("<|im_end|>")
