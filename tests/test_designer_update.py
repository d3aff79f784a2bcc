"""The delayed designer update end to end on the `tiny` model: fixed plays in, the exact designer
advantages out (worked out by hand below from the formulas in SPADE.md, step 9), the stale designer
rows reaching the train step with their truncated importance weights, and the update moving the
policy toward the positively scored design and away from the negative ones."""

import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.config import load_config
from spade_jax.models.registry import load_model
from spade_jax.policy import Learner, Policy
from spade_jax.rl.batch import DESIGNER
from spade_jax.rollout import Trajectory
from spade_jax.run import EnvArchive, PhaseTimer
from spade_jax.selfplay import PoolEnv, SelfPlay

pytestmark = pytest.mark.timeout(300)

# Four designs in two skills (regen_interval 2, two plays per arm). Episode rewards, no-hint arm at the
# regeneration step, hinted arm at the regeneration step, no-hint arm one iteration later:
PLAYS = {
    "d1": ("logical deduction", [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]),
    "d2": ("logical deduction", [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]),
    "d3": ("optimization", [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]),
    "d4": ("optimization", [-1.0, 1.0], [1.0, 0.0], [1.0, 0.0]),  # -1: an environment error in play
}
# By hand, SPADE's blend = 0.4 * clip(regret / 0.15, 0, 1) + 0.6 * plateau(w), regret = r_hint - r_nohint
# at the regeneration step, w = mean raw episode reward over the window, plateau 1 on [0.4, 0.6] falling
# to 0 over 0.25 on each side:
#   d1: regret 1.0 - 0.5 = 0.5 -> 1;  w = (0.5 + 0.5) / 2 = 0.5  -> plateau 1    -> blend 1.0
#   d2: regret 0             -> 0;  w = 0                  -> plateau 0    -> blend 0.0
#   d3: regret 0             -> 0;  w = 1                  -> plateau 0    -> blend 0.0
#   d4: regret 0.5 - 0.0 = 0.5 -> 1; w = (0.0 + 0.5) / 2 = 0.25 -> 1 - 0.15 / 0.25 = 0.4 -> blend 0.4 + 0.24 = 0.64
# Per-skill centring (no std): deduction mean 0.5 -> +0.5, -0.5; optimization mean 0.32 -> -0.32, +0.32.
# Scale = min(agent samples / designer samples * regen_interval, 50) = min(12 / 4 * 2, 50) = 6.
EXPECTED = {"d1": 3.0, "d2": -3.0, "d3": -1.92, "d4": 1.92}
AGENT_SAMPLES = 12


def _trajectories(env_id, arm, rewards, timeout=False):
    out = []
    for r in rewards:
        meta = {"env_error": "timeout"} if timeout and r < 0 else {}
        out.append(Trajectory([1], [0], [0.0], [r], [], [], terminated=True, group=(env_id, arm), meta=meta))
    return out


@pytest.fixture(scope="module")
def tiny():
    config = load_config("tiny", ["regen_interval=2", "group_size=2", "rl.lr=1e-2", "rl.grad_clip=null",
                                  "rl.weight_decay=0", "rl.micro_batches=1"])
    loaded = load_model("tiny", seed=0)
    return config, loaded


def _played_selfplay(config, loaded, tmp_path, timeout=False, with_invalid=False):
    policy = Policy(loaded.model, loaded.tokenizer)
    learner = Learner(loaded.model, config.rl, verbose=False)
    selfplay = SelfPlay(config, policy, learner, EnvArchive(tmp_path), PhaseTimer())
    rng = np.random.default_rng(0)
    pool = []
    for env_id, (skill, *_rest) in PLAYS.items():
        prompt = rng.integers(3, 200, 6).tolist()
        tokens = rng.integers(3, 200, 5).tolist()
        env = PoolEnv(env_id, skill, "designer", f"class {env_id.upper()}Env: pass", True)
        env.designer_sample = {"prompt": prompt, "tokens": tokens, "logprobs": [-3.0] * len(tokens)}
        pool.append(env)
    if with_invalid:
        invalid = PoolEnv("d5", "logical deduction", "designer", "broken", False, errors=["no class"])
        invalid.designer_sample = {"prompt": [5, 6, 7], "tokens": [8, 9], "logprobs": [-3.0, -3.0]}
        pool.append(invalid)
    for env in pool:
        selfplay.archive.add(env.source, {"env_id": env.env_id, "valid": env.valid})
    selfplay.pool = pool
    regen, hinted, later = [], [], []
    for env_id, (_skill, nohint, hint, next_nohint) in PLAYS.items():
        regen += _trajectories(env_id, "nohint", nohint, timeout=timeout)
        hinted += _trajectories(env_id, "hint", hint)
        later += _trajectories(env_id, "nohint", next_nohint)
    selfplay.measure(regen + hinted, hinted=True)
    selfplay.measure(later, hinted=False)
    return selfplay


def test_designer_advantages_are_the_hand_computed_ones(tiny, tmp_path):
    config, loaded = tiny
    selfplay = _played_selfplay(config, loaded, tmp_path)
    samples, metrics = selfplay.score_pool(selfplay.pool, AGENT_SAMPLES)
    assert metrics["designer/scored"] == 4
    got = {env.env_id: s.advantage for env, s in zip(selfplay.pool, samples)}
    assert got == pytest.approx(EXPECTED, abs=1e-5)
    assert all(s.role == DESIGNER and s.stale for s in samples)
    index = {e["env_id"]: e for e in selfplay.archive.read_index()}
    assert index["d4"]["designer_advantage"] == pytest.approx(1.92, abs=1e-5)
    assert index["d4"]["mean_reward"] == pytest.approx(0.25) and index["d4"]["regret"] == pytest.approx(0.5)


def test_invalid_designs_are_not_trained_unless_asked(tiny, tmp_path):
    config, loaded = tiny
    selfplay = _played_selfplay(config, loaded, tmp_path / "a", with_invalid=True)
    samples, metrics = selfplay.score_pool(selfplay.pool, AGENT_SAMPLES)
    assert metrics["designer/scored"] == 4 and len(samples) == 4  # d5 neither trained nor in the baseline
    assert {e.env_id: s.advantage for e, s in zip(selfplay.pool, samples)} == pytest.approx(EXPECTED, abs=1e-5)

    import dataclasses

    from spade_jax.curriculum import CurriculumConfig

    trained = dataclasses.replace(config, curriculum=CurriculumConfig(train_invalid_designs=True))
    selfplay = _played_selfplay(trained, loaded, tmp_path / "b", with_invalid=True)
    samples, _ = selfplay.score_pool(selfplay.pool, AGENT_SAMPLES)
    # d5 scores 0 and joins the deduction mean: (1 + 0 + 0) / 3; scale min(12 / 5 * 2, 50) = 4.8.
    got = {e.env_id: s.advantage for e, s in zip(selfplay.pool, samples)}
    assert got["d1"] == pytest.approx((1 - 1 / 3) * 4.8, abs=1e-5)
    assert got["d2"] == pytest.approx(-1 / 3 * 4.8, abs=1e-5) and got["d5"] == pytest.approx(-1 / 3 * 4.8, abs=1e-5)


def test_a_step_timeout_in_play_costs_the_pure_regret_variant(tiny, tmp_path):
    import dataclasses

    from spade_jax.curriculum import CurriculumConfig

    config, loaded = tiny
    regret = dataclasses.replace(config, curriculum=CurriculumConfig(score="hint_regret"))
    selfplay = _played_selfplay(regret, loaded, tmp_path, timeout=True)  # d4's -1 play was a step timeout
    samples, _ = selfplay.score_pool(selfplay.pool, AGENT_SAMPLES)
    # Raw scores: d1 max(0.5, 0) = 0.5, d2 0, d3 0, d4 -0.5 (hung); centred per skill, scale 6.
    got = {e.env_id: s.advantage for e, s in zip(selfplay.pool, samples)}
    assert got == pytest.approx({"d1": 1.5, "d2": -1.5, "d3": 1.5, "d4": -1.5}, abs=1e-5)
    # The blend ignores the timeout (its failed play already counts -1 in the window's mean reward).
    selfplay = _played_selfplay(config, loaded, tmp_path / "blend", timeout=True)
    samples, _ = selfplay.score_pool(selfplay.pool, AGENT_SAMPLES)
    assert {e.env_id: s.advantage for e, s in zip(selfplay.pool, samples)} == pytest.approx(EXPECTED, abs=1e-5)


def _design_logprob(model, sample):
    """Mean log-probability of a design's completion tokens under `model` (numpy log-softmax)."""
    tokens = np.asarray(sample.tokens)[None]
    positions = np.arange(tokens.shape[1])[None]
    logits = np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions))[0], np.float64)[0]
    top = logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits - top).sum(-1, keepdims=True)) - top
    picked = logp[np.arange(len(sample.tokens) - 1), tokens[0, 1:]]
    mask = np.asarray(sample.loss_mask[1:], bool)
    return picked[mask]


def test_stale_designer_rows_reach_the_update_with_their_tis_weights(tiny, tmp_path):
    config, loaded = tiny
    selfplay = _played_selfplay(config, loaded, tmp_path)
    samples, _ = selfplay.score_pool(selfplay.pool, AGENT_SAMPLES)
    before = {e.env_id: _design_logprob(loaded.model, s) for e, s in zip(selfplay.pool, samples)}
    # The behaviour policy that wrote the designs `regen_interval` updates ago is not today's: TIS
    # weights min(exp(logp_now - logp_then), 2) correct the stale rows (SPADE: clamped to [0, 2]).
    behaviour = {env_id: logp + np.array([0.0, 0.5, -0.5, 2.0, -2.0]) for env_id, logp in before.items()}
    for env, sample in zip(selfplay.pool, samples):
        n_prompt = len(env.designer_sample["prompt"])
        sample.behaviour_logprobs[n_prompt:] = behaviour[env.env_id].tolist()
    expected_tis = np.mean(np.concatenate([np.minimum(np.exp(before[k] - behaviour[k]), 2.0) for k in before]))

    metrics = selfplay.learner.update(samples)
    assert metrics["update/skipped"] == 0
    assert metrics["tis_weight"] == pytest.approx(float(expected_tis), rel=1e-4)
    assert metrics["designer/advantage_mean"] == pytest.approx(
        np.mean([EXPECTED[k] for k in before for _ in range(5)]), abs=1e-4)
    after = {e.env_id: _design_logprob(loaded.model, s) for e, s in zip(selfplay.pool, samples)}
    change = {k: float(after[k].mean() - before[k].mean()) for k in before}
    assert change["d1"] > 0 and change["d4"] > 0  # positively scored designs became more likely
    assert change["d2"] < 0 and change["d3"] < 0


def test_in_band_share_is_logged_with_a_frozen_designer_too(tiny, tmp_path):
    import dataclasses

    config, loaded = tiny
    # Window win rates (share of no-hint plays won, both iterations): d1 0.5, d2 0, d3 1, d4 0.5; the band
    # is [0.4, 0.6], so 2 of the 4 valid designs are in it; the invalid d5 is not counted.
    selfplay = _played_selfplay(config, loaded, tmp_path / "a", with_invalid=True)
    assert selfplay.in_band_share(selfplay.pool) == pytest.approx(0.5)

    frozen = dataclasses.replace(config, train_designer=False)
    selfplay = _played_selfplay(frozen, loaded, tmp_path / "b", with_invalid=True)
    selfplay.iteration = frozen.regen_interval  # the regeneration step that closes the pool's window
    selfplay.design_pool = lambda: ([], [])  # no new pool, hints or plays: only the closing pool's metrics
    selfplay.write_hints = lambda: None
    selfplay.play = lambda hinted: []
    _, metrics = selfplay.collect()
    assert metrics["curriculum/in_band_share"] == pytest.approx(0.5)
    assert "designer/scored" not in metrics  # a frozen designer is not scored
