"""Device-loop rollouts: the same trajectories as the host loop, token for token, on a transpiled
library environment; the on-device pieces (chat glue, observation tokens, reply -> action id) each
checked against their host reference."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import kernels, roles
from spade_jax.envs.backends.jax import transpile
from spade_jax.envs.library import library_program
from spade_jax.models.presets import get_preset, init_decoder
from spade_jax.models.tokenizer import byte_tokenizer
from spade_jax.rollout import (
    ActionMap,
    ChatStream,
    DeviceRollout,
    Generation,
    RolloutConfig,
    play_episodes,
    play_episodes_device,
)
from spade_jax.sampling import Sampler, SamplingConfig, cpu_kernel_applies


def _byte_id(ch: str) -> int:
    return ord(ch) + 3  # byte tokenizer: three specials, then the bytes


# The scripted agent spells "\boxed{k}" with k in 1..5 chosen among equals, then ends its turn or
# (equally likely) starts another box, which the token budget cuts; "" stands for EOS.
_CHAIN = {"\n": ["\\"], "\\": ["b"], "b": ["o"], "o": ["x"], "x": ["e"], "e": ["d"], "d": ["{"],
          "{": list("12345"), **{d: ["}"] for d in "12345"}, "}": ["", " "], " ": ["\\"]}


def _scripted_model(seed: int = 0, strength: float = 24.0):
    """The tiny preset with an untied output layer set up as a bigram table over `_CHAIN`: a real
    Decoder whose samples are readable actions, so episodes win, lose and end at different turns."""
    spec = dataclasses.replace(get_preset("tiny"), tie_embeddings=False)
    model = init_decoder(spec, seed=seed)
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((spec.vocab_size, spec.hidden_size)).astype(np.float32)
    embed /= np.sqrt((embed**2).mean(1, keepdims=True))
    head = np.zeros((spec.hidden_size, spec.vocab_size), np.float32)
    for ch, nexts in _CHAIN.items():
        for nxt in nexts:
            head[:, 2 if nxt == "" else _byte_id(nxt)] += strength / spec.hidden_size * embed[_byte_id(ch)]
    model.embed[...] = jnp.asarray(embed)
    model.lm_head[...] = jnp.asarray(head)
    return model, byte_tokenizer(eos_token_ids=spec.eos_token_ids)


@pytest.fixture(scope="module")
def odd_env():
    program = library_program("odd_one_out")
    return transpile(program.source, program.class_name, fast_compile=True)


@pytest.fixture(scope="module")
def scripted():
    return _scripted_model()


class _RowAligned:
    """A host-loop generate function that samples each episode in its own batch row with the device
    loop's key schedule (turn t uses fold_in(key, t)), so both loops draw the same random numbers."""

    def __init__(self, sampler, config, key, first_prompts):
        self.sampler, self.config, self.key, self.first = sampler, config, key, first_prompts
        self.turn = 0

    def __call__(self, prompts):
        rows = [next(i for i, f in enumerate(self.first) if p[: len(f)] == f) for p in prompts]
        batch = [list(f) for f in self.first]
        for row, prompt in zip(rows, prompts):
            batch[row] = prompt
        result = self.sampler.generate(batch, self.config, jax.random.fold_in(self.key, self.turn))
        self.turn += 1
        return [Generation(result.tokens[r], result.logprobs[r], result.finish_reasons[r]) for r in rows]


def _first_prompts(env, tokenizer, seeds, hints, system_prompt=None):
    out = []
    for seed, hint in zip(seeds, hints):
        obs, _ = env.text_env().reset(seed)
        out.append(ChatStream(tokenizer, system_prompt).first_turn(roles.with_hint(obs, hint)))
    return out


def _assert_same(host, device):
    assert len(host) == len(device)
    for h, d in zip(host, device):
        assert d.tokens == h.tokens
        assert d.loss_mask == h.loss_mask
        assert d.rewards == h.rewards
        assert (d.terminated, d.truncated, d.cut_by_context) == (h.terminated, h.truncated, h.cut_by_context)
        assert d.actions == h.actions and d.observations == h.observations
        assert d.group == h.group and d.meta == h.meta
        np.testing.assert_allclose(d.behaviour_logprobs, h.behaviour_logprobs, atol=1e-4)


def _play_both(env, model, tokenizer, sampling, rollout, seeds, hints, key, host_sampling=None):
    first = _first_prompts(env, tokenizer, seeds, hints, rollout.system_prompt)
    assert len({tuple(f) for f in first}) == len(first)  # the row-aligned host generate needs this
    generate = _RowAligned(Sampler(model, tokenizer), host_sampling or sampling, key, first)
    host = play_episodes([env.text_env() for _ in seeds], seeds, generate, tokenizer, rollout, hints=hints,
                         format_observation=roles.with_hint)
    device = play_episodes_device(env, seeds, model, tokenizer, sampling, rollout, key, hints=hints)
    return host, device


def test_greedy_device_loop_equals_host_loop(odd_env, scripted):
    model, tokenizer = scripted
    seeds = [3, 1, 4, 15, 9, 2]
    hints = [None, "Look at the last digits.", None, None, "Squares.", None]
    host, device = _play_both(odd_env, model, tokenizer, SamplingConfig(max_new_tokens=24, temperature=0.0),
                              RolloutConfig(max_turns=4, max_context_tokens=1400, system_prompt="Play."),
                              seeds, hints, jax.random.key(0))
    _assert_same(host, device)
    # The episodes did something: the actions were read, some games ended, loss sits on agent tokens.
    assert any(t.terminated for t in device) and all(t.actions for t in device)
    assert all(a.startswith("\\boxed{") for t in device for a in t.actions)
    assert any(t.trainable for t in device)


def test_device_loop_on_the_cpu_kernel_equals_the_host_loop_on_xla(odd_env, scripted):
    if not kernels.preferred():
        pytest.skip("the packed CPU kernel does not apply here (no AVX2/AVX-512 build)")
    model, tokenizer = scripted  # untied head of 512 entries: every matmul, the head too, is packed
    sampling = SamplingConfig(max_new_tokens=24, temperature=1.0)
    assert cpu_kernel_applies(sampling, model)
    host, device = _play_both(odd_env, model, tokenizer, sampling, RolloutConfig(max_turns=3, max_context_tokens=1400),
                              [3, 1, 4, 15, 9], [None, "Squares.", None, None, None], jax.random.key(5),
                              host_sampling=sampling.replace(cpu_kernel="xla"))
    _assert_same(host, device)
    assert any(t.terminated for t in device) and all(t.actions for t in device)


def test_max_slots_ends_every_episode_at_the_same_turn_as_a_shorter_host_game(odd_env, scripted):
    model, tokenizer = scripted
    seeds, hints = list(range(8)), [None] * 8
    sampling = SamplingConfig(max_new_tokens=20, temperature=1.0)  # greedy loses every game within 3 turns
    rollout = RolloutConfig(max_turns=4, max_context_tokens=1400)
    full = DeviceRollout(odd_env, model, tokenizer, sampling, rollout)
    # Room for one worst-case turn (a turn starts only with room for its reply and the chunk after it);
    # these games last two or three turns.
    cap = full.first_slots(0) + full.reply_width + full.chunk_slots
    device = DeviceRollout(odd_env, model, tokenizer, sampling, rollout, max_slots=cap).play(seeds, jax.random.key(7))
    turns = max(len(d.actions) for d in device)
    assert turns == 1
    host, _ = _play_both(odd_env, model, tokenizer, sampling, dataclasses.replace(rollout, max_turns=turns),
                         seeds, hints, jax.random.key(7))
    cut = [d for d in device if not d.terminated]
    assert cut
    for d in cut:  # out of cache slots: cut like out of context, and no loss on them
        assert d.truncated and d.cut_by_context and not any(d.loss_mask)
    for h, d in zip(host, device):
        if not d.terminated:  # the host game ran out of turns instead
            h = dataclasses.replace(h, cut_by_context=True, loss_mask=[0] * len(h.loss_mask))
        _assert_same([h], [d])


@pytest.mark.slow
def test_sampled_device_loop_equals_host_loop_with_the_same_random_stream(odd_env, scripted):
    model, tokenizer = scripted
    seeds = list(range(8))
    hints = [None, "Check the squares first.", None, None, None, "Primes.", None, None]
    sampling = SamplingConfig(max_new_tokens=20, temperature=1.0)
    rollout = RolloutConfig(max_turns=4, max_context_tokens=1300)
    host, device = _play_both(odd_env, model, tokenizer, sampling, rollout, seeds, hints, jax.random.key(7))
    _assert_same(host, device)
    replies = [a for t in device for a in t.actions]
    assert len(set(replies)) >= 3  # different picks
    assert any(" " in a for a in replies)  # a second box: the reply ran on (to the token budget)
    assert any(tokenizer.eos_token_ids[0] in t.tokens for t in device)  # and replies that ended
    assert any(t.terminated for t in device) and any(len(t.actions) >= 3 for t in device)

    # A context budget that cuts the longer episodes (same compiled program: the budget is traced).
    host, device = _play_both(odd_env, model, tokenizer, sampling, RolloutConfig(max_turns=4, max_context_tokens=600),
                              seeds, hints, jax.random.key(7))
    cut = [d for d in device if d.cut_by_context and not d.terminated]
    assert cut
    for d in cut:  # cut episodes are truncated and carry no loss (RolloutConfig.loss_on_truncated)
        assert d.truncated and len(d.tokens) == 600 and not any(d.loss_mask)
    # The host loop leaves episodes it drops for context neither terminated nor truncated, so they keep
    # their loss (rollout.py, reported); everything else must agree.
    for h, d in zip(host, device):
        if any(d is c for c in cut):
            h = dataclasses.replace(h, truncated=True, loss_mask=[0] * len(h.loss_mask))
        _assert_same([h], [d])


def _random_replies(rng, tokenizer, contents, n, width):
    """Replies built from pieces that stress the parse: boxes with vocabulary contents in other case and
    spacing, broken and nested boxes, non-ASCII text, special tokens, ids past the tokenizer."""
    pieces = ["\\boxed{", "}", "{", " ", "\n", "\\boxed{}", "answer: ", "\u00a0", "\u00e9", "K", "007", "-3",
              "\\boxed{\\boxed{1}", "\\boxed{ 2 }", "\\boxed{x{1}}"]
    out = []
    for _ in range(n):
        ids = []
        while len(ids) < width:
            r = rng.random()
            if r < 0.45:
                c = contents[rng.integers(len(contents))]
                c = c.upper() if rng.random() < 0.3 else c
                text = "\\boxed{" + " " * int(rng.integers(0, 2)) + c + "\t" * int(rng.integers(0, 2)) + "}"
                ids += tokenizer.encode(text, add_special_tokens=False)
            elif r < 0.85:
                ids += tokenizer.encode(pieces[rng.integers(len(pieces))], add_special_tokens=False)
            else:
                ids.append(int(rng.integers(0, 300)))  # bytes, specials, and ids the tokenizer lacks
        out.append(ids[: int(rng.integers(1, width + 1))])
    return out


@pytest.mark.parametrize("name", ["odd_one_out", "sequence_rule"])
def test_device_action_ids_equal_the_host_mapping(name, odd_env):
    if name == "odd_one_out":
        env = odd_env
    else:
        program = library_program(name)
        env = transpile(program.source, program.class_name, fast_compile=True)
    tokenizer = byte_tokenizer()
    actions = ActionMap(env, tokenizer, 512)
    assert actions.on_device  # library programs read the last \boxed{} content, stripped and lower-cased
    rng = np.random.default_rng(1)
    width = 40
    replies = _random_replies(rng, tokenizer, list(actions.contents) or ["1"], 400, width)
    tokens = np.zeros((len(replies), width), np.int32)
    for row, ids in enumerate(replies):
        tokens[row, : len(ids)] = ids
    counts = np.array([len(r) for r in replies], np.int32)
    tables = actions.device_tables()
    ids, asked = jax.jit(lambda t, c: actions(tables, t, c, jnp.ones(c.shape, bool)))(tokens, counts)
    want = [env.action_id(tokenizer.decode(r, skip_special_tokens=True)) for r in replies]
    assert np.asarray(ids).tolist() == want
    # Most replies are settled on device; the rest went to the host and came back right.
    assert 0 < int(np.sum(asked)) < len(replies) // 2
    assert len(set(want)) > 3
