"""Chat turns: the host stream equals the template's rendering of the whole conversation; the device
loop's precomputed glue equals the host stream."""

import pytest

from spade_jax.models.tokenizer import byte_tokenizer
from spade_jax.rollout import ChatGlue, ChatStream


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _reply(tokenizer, text, eos=True):
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids + ([tokenizer.eos_token_ids[0]] if eos else [])


def test_chat_stream_matches_the_template_rendering_of_the_whole_conversation(tokenizer):
    stream = ChatStream(tokenizer, system_prompt="Play well.")
    tokens = stream.first_turn("board 1")
    replies = ["I move \\boxed{up}", "then \\boxed{left}"]
    observations = ["board 2", "board 3"]
    for reply, obs in zip(replies, observations):
        tokens += _reply(tokenizer, reply)
        tokens += stream.next_turn(_reply(tokenizer, reply), obs)
    messages = [{"role": "system", "content": "Play well."}, {"role": "user", "content": "board 1"}]
    for reply, obs in zip(replies, observations):
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": obs}]
    # The reference: the template renders the whole conversation in one go.
    assert tokens == tokenizer.encode_chat(messages, add_generation_prompt=True)


def test_a_reply_cut_by_length_gets_the_end_of_turn_from_the_template(tokenizer):
    stream = ChatStream(tokenizer)
    tokens = stream.first_turn("obs")
    cut = _reply(tokenizer, "\\boxed{1", eos=False)
    tokens += cut + stream.next_turn(cut, "next")
    messages = [{"role": "user", "content": "obs"}, {"role": "assistant", "content": "\\boxed{1"},
                {"role": "user", "content": "next"}]
    assert tokens == tokenizer.encode_chat(messages, add_generation_prompt=True)


@pytest.mark.parametrize("reply", ["", "d", ">", "\n", "assistant"])
def test_short_replies_that_also_occur_in_the_template_get_the_right_glue(tokenizer, reply):
    stream = ChatStream(tokenizer)
    tokens = stream.first_turn("obs")
    ids = _reply(tokenizer, reply)
    tokens += ids + stream.next_turn(ids, "next")
    messages = [{"role": "user", "content": "obs"}, {"role": "assistant", "content": reply},
                {"role": "user", "content": "next"}]
    assert tokens == tokenizer.encode_chat(messages, add_generation_prompt=True)


def test_chat_glue_rebuilds_the_chat_stream():
    tokenizer = byte_tokenizer()
    eos = tokenizer.eos_token_ids[0]
    glue = ChatGlue.build(tokenizer, "Be brief.", tokenizer.eos_token_ids)
    stream = ChatStream(tokenizer, "Be brief.")
    first = stream.first_turn("obs one")
    assert first == list(glue.first_prefix) + tokenizer.encode("obs one") + list(glue.first_suffix)
    for reply_text, ends in (("I pick \\boxed{2}", True), ("cut off \\box", False)):
        reply = tokenizer.encode(reply_text) + ([eos] if ends else [])
        variant = glue.after_reply[1 if ends else 0]
        turn = stream.next_turn(reply, "obs two")
        assert turn == list(variant) + tokenizer.encode("obs two") + list(glue.before_reply)
