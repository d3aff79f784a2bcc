"""The anchor (rl.anchor_coef): the starting policy's replies to reasoning-gym questions outside every eval
suite, made once, added in turn to each update, and kept by a checkpoint so a resumed run trains on the same."""

import dataclasses
import logging

import pytest

from spade_jax.anchor import (
    ANCHOR_SEED_BASE,
    DEFAULT_TASKS,
    AnchorConfig,
    anchor_batch,
    anchor_plan,
    is_answer,
    make_anchor_samples,
)
from spade_jax.config import ConfigError, load_config
from spade_jax.evaluation.environments import make_eval_env
from spade_jax.models.registry import load_model
from spade_jax.policy import Learner, Policy
from spade_jax.rl.batch import AGENT, ANCHOR
from spade_jax.rl.collate import Sample
from spade_jax.rollout import Trajectory
from spade_jax.run import EnvArchive, PhaseTimer
from spade_jax.selfplay import SelfPlay

pytestmark = pytest.mark.timeout(300)


def test_config_refuses_eval_tasks_other_kinds_and_bad_counts():
    with pytest.raises(ConfigError, match="rg:syllogism is scored by the eval suite"):
        load_config("laptop", ["anchor.tasks=rg:gcd,rg:syllogism"])
    with pytest.raises(ConfigError, match="rg:countdown is scored by the eval suite.*heldout"):
        AnchorConfig(tasks=("rg:countdown",))
    with pytest.raises(ConfigError, match="not a one-turn reasoning-gym task"):
        AnchorConfig(tasks=("game:GuessTheNumber-v0",))
    with pytest.raises(ConfigError, match="anchor.tasks: unknown reasoning-gym task 'no_such_task'"):
        load_config("tiny", ["anchor.tasks=rg:gcd,rg:no_such_task"])
    with pytest.raises(ConfigError, match="rg:syllogism\\(allow_some=False\\) is scored by the eval suite"):
        AnchorConfig(tasks=("rg:syllogism(allow_some=False)",))  # another difficulty of an evaluated generator
    with pytest.raises(ConfigError, match="anchor.tasks: .*gcd has no config field 'no_field'"):
        AnchorConfig(tasks=("rg:gcd(no_field=1)",))
    AnchorConfig(tasks=("rg:gcd(max_value=20)",))  # a generator at a chosen difficulty
    AnchorConfig(tasks=tuple(reversed(DEFAULT_TASKS)))  # the defaults are reasoning-gym datasets (checked as one's own)
    with pytest.raises(ConfigError, match="anchor.tasks is empty"):
        load_config("tiny", ["anchor.tasks=[]"])
    with pytest.raises(ConfigError, match="anchor.per_update"):
        load_config("tiny", ["anchor.per_update=0"])
    with pytest.raises(ConfigError, match="anchor.temperature"):
        load_config("tiny", ["anchor.temperature=-0.5"])
    assert load_config("tiny", ["anchor.temperature=null"]).anchor.temperature is None  # the agent's own
    with pytest.raises(ConfigError, match="anchor.keep"):
        load_config("tiny", ["anchor.keep=some"])
    with pytest.raises(ValueError, match="anchor_coef"):
        load_config("tiny", ["rl.anchor_coef=-1"])


def test_plan_deals_the_tasks_in_turn_at_fresh_seeds():
    cfg = AnchorConfig(tasks=("rg:gcd", "rg:lcm"), prompts=5)
    assert anchor_plan(cfg) == [("rg:gcd", ANCHOR_SEED_BASE), ("rg:lcm", ANCHOR_SEED_BASE),
                                ("rg:gcd", ANCHOR_SEED_BASE + 1), ("rg:lcm", ANCHOR_SEED_BASE + 1),
                                ("rg:gcd", ANCHOR_SEED_BASE + 2)]


def test_keep_answers_drops_the_placeholder_and_unclosed_replies():
    assert is_answer("\\boxed{12}") and is_answer("\\boxed{Jack}\\") and is_answer("so \\boxed{3.5} then")
    for reply in ("\\boxed{...}", "\\boxed{ \u2026 }", "\\boxed{}", "\\boxed{5095 - 2", "12"):
        assert not is_answer(reply), reply
    replies = ["\\boxed{...}", "\\boxed{7}", "\\boxed{seven", "\\boxed{Jack}"]

    def play(envs, seeds, key):
        assert seeds == [ANCHOR_SEED_BASE, ANCHOR_SEED_BASE, ANCHOR_SEED_BASE + 1, ANCHOR_SEED_BASE + 1]
        return [Trajectory([5, 6, i], [0, 0, 1], [0.0] * 3, [0.0], ["q"], [r], terminated=True)
                for i, r in enumerate(replies)]

    cfg = AnchorConfig(tasks=("rg:gcd", "rg:lcm"), prompts=4)
    kept, written = make_anchor_samples(cfg, play, None)
    assert written == 4 and [s.tokens[-1] for s in kept] == [1, 3]
    kept, _ = make_anchor_samples(dataclasses.replace(cfg, keep="all"), play, None)
    assert [s.tokens[-1] for s in kept] == [0, 1, 2, 3] and all(s.role == ANCHOR for s in kept)


def test_anchor_batch_takes_the_samples_in_turn():
    samples = [Sample([i], [1], [0.0], role=ANCHOR) for i in range(5)]
    tokens = [[s.tokens[0] for s in anchor_batch(samples, 3, update)] for update in range(3)]
    assert tokens == [[0, 1, 2], [3, 4, 0], [1, 2, 3]]
    assert [s.tokens[0] for s in anchor_batch(samples, 8, 0)] == [0, 1, 2, 3, 4]  # never one sample twice
    assert anchor_batch([], 4, 0) == []


def test_run_adds_the_starting_policys_replies_to_each_update_and_a_checkpoint_keeps_them(tmp_path, caplog):
    config = load_config("tiny", [
        "mode=fixed_pool", "env_pool=library:target_number", "group_size=2", "iterations=2",
        "rollout.loss_on_truncated=true", "global_batch=2", "rl.lr=1e-2", "rl.anchor_coef=0.5",
        "anchor.tasks=rg:gcd,rg:spell_backward", "anchor.prompts=4", "anchor.per_update=3",
        "rollout.reply_prefix=ANSWER", "anchor.keep=all",  # the random tiny model closes no box
    ])
    loaded = load_model("tiny", seed=0)
    policy = Policy(loaded.model, loaded.tokenizer)
    learner = Learner(loaded.model, config.rl, verbose=False)
    used = []
    update = learner.update
    learner.update = lambda samples, **kw: used.append(samples) or update(samples, **kw)
    selfplay = SelfPlay(config, policy, learner, EnvArchive(tmp_path), PhaseTimer())
    metrics = [selfplay.step() for _ in range(2)]

    kept = selfplay.anchor
    assert len(kept) == 4 and all(s.role == ANCHOR and s.advantage == 0.0 for s in kept)
    for sample, (task, seed) in zip(kept, anchor_plan(config.anchor)):
        cut = sample.loss_mask.index(1)  # the prompt, then the reply: only the reply carries loss
        assert all(sample.loss_mask[cut:]) and not any(sample.loss_mask[:cut])
        prompt = loaded.tokenizer.decode(sample.tokens[:cut])
        # the agent's conversation: its system line, the question, the forced reply prefix (no loss)
        assert make_eval_env(task).reset(seed) in prompt and prompt.rstrip().endswith("ANSWER")
    for i, samples in enumerate(used):  # the update's own samples, then three anchors in turn
        assert [s.role for s in samples[-3:]] == [ANCHOR] * 3 and {s.role for s in samples[:-3]} == {AGENT}
        assert [s.tokens for s in samples[-3:]] == [s.tokens for s in anchor_batch(kept, 3, i)]
        assert metrics[i]["anchor/samples"] == 3 and metrics[i]["anchor/tokens"] > 0
        assert metrics[i]["anchor/nll"] > 0

    state = selfplay.state_dict()
    restored = SelfPlay(config, policy, learner, EnvArchive(tmp_path / "r"), PhaseTimer())
    restored.load_state_dict(state)
    restored._play_one_turn = None  # a restored run must not answer the questions again (weights moved)
    assert [dataclasses.astuple(s) for s in restored.anchor_samples()] == [dataclasses.astuple(s) for s in kept]

    # Made late: silent while no update has landed (iterations with nothing to train on), a warning after one.
    with caplog.at_level(logging.WARNING, logger="spade_jax.selfplay"):
        late = SelfPlay(config, policy, Learner(loaded.model, config.rl, verbose=False), EnvArchive(tmp_path / "l"),
                        PhaseTimer())
        late.iteration = 1
        assert len(late.anchor_samples()) == 4
        assert "anchor: made from the weights" not in caplog.text
        state["anchor"] = None  # a checkpoint from before the anchor existed
        resumed = SelfPlay(config, policy, learner, EnvArchive(tmp_path / "a"), PhaseTimer())
        resumed.load_state_dict(state)
        assert len(resumed.anchor_samples()) == 4
    assert "anchor: made from the weights after 2 updates (iteration 2)" in caplog.text
