"""The anchor (rl.anchor_coef): the starting policy's replies to reasoning-gym questions outside every eval
suite, made once, added in turn to each update, and kept by a checkpoint so a resumed run trains on the same."""

import dataclasses

import pytest

from spade_jax.anchor import ANCHOR_SEED_BASE, AnchorConfig, anchor_batch, anchor_plan
from spade_jax.config import ConfigError, load_config
from spade_jax.evaluation.environments import make_eval_env
from spade_jax.models.registry import load_model
from spade_jax.policy import Learner, Policy
from spade_jax.rl.batch import AGENT, ANCHOR
from spade_jax.rl.collate import Sample
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
    with pytest.raises(ConfigError, match="anchor.tasks is empty"):
        load_config("tiny", ["anchor.tasks=[]"])
    with pytest.raises(ConfigError, match="anchor.per_update"):
        load_config("tiny", ["anchor.per_update=0"])
    with pytest.raises(ValueError, match="anchor_coef"):
        load_config("tiny", ["rl.anchor_coef=-1"])


def test_plan_deals_the_tasks_in_turn_at_fresh_seeds():
    cfg = AnchorConfig(tasks=("rg:gcd", "rg:lcm"), prompts=5)
    assert anchor_plan(cfg) == [("rg:gcd", ANCHOR_SEED_BASE), ("rg:lcm", ANCHOR_SEED_BASE),
                                ("rg:gcd", ANCHOR_SEED_BASE + 1), ("rg:lcm", ANCHOR_SEED_BASE + 1),
                                ("rg:gcd", ANCHOR_SEED_BASE + 2)]


def test_anchor_batch_takes_the_samples_in_turn():
    samples = [Sample([i], [1], [0.0], role=ANCHOR) for i in range(5)]
    tokens = [[s.tokens[0] for s in anchor_batch(samples, 3, update)] for update in range(3)]
    assert tokens == [[0, 1, 2], [3, 4, 0], [1, 2, 3]]
    assert [s.tokens[0] for s in anchor_batch(samples, 8, 0)] == [0, 1, 2, 3, 4]  # never one sample twice
    assert anchor_batch([], 4, 0) == []


def test_run_adds_the_starting_policys_replies_to_each_update_and_a_checkpoint_keeps_them(tmp_path):
    config = load_config("tiny", [
        "mode=fixed_pool", "env_pool=library:target_number", "group_size=2", "iterations=2",
        "rollout.loss_on_truncated=true", "global_batch=2", "rl.lr=1e-2", "rl.anchor_coef=0.5",
        "anchor.tasks=rg:gcd,rg:spell_backward", "anchor.prompts=4", "anchor.per_update=3",
        "rollout.reply_prefix=ANSWER",
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
