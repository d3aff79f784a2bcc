"""Asynchronous play (`async_staleness`): the next iteration's rollouts run during the update with the
weights from before it. With the weights frozen (lr 0) the rollouts cannot tell the loops apart, so every
rollout metric and the checkpointed trainer state must equal the synchronous loop's; with learning, the
agent rows are at most k updates old, marked stale, and reweighted (tis_weight moves off 1)."""

import math

import pytest

from experiments.run import main as run_main
from spade_jax.config import ConfigError, load_config
from spade_jax.envs.backends.sandbox import SandboxPool
from spade_jax.models.registry import load_model
from spade_jax.policy import Learner, Policy
from spade_jax.rl.batch import AGENT
from spade_jax.run import EnvArchive, PhaseTimer
from spade_jax.selfplay import SelfPlay

pytestmark = pytest.mark.timeout(600)

# Agent-only GRPO on two short library games; truncated plays trained on and a fixed batch, so every
# iteration runs an update; the format bonus gives some groups of the random model's plays non-zero advantages.
BASE = ["mode=fixed_pool", "env_pool=library:target_number,modular_lock", "group_size=2", "iterations=3",
        "rollout.loss_on_truncated=true", "global_batch=4", "rl.format_bonus=0.5"]
FROZEN = ["rl.lr=0", "rl.weight_decay=0"]
# Differ between the loops by construction (wall time, the async bookkeeping, the staleness correction).
LOOP_KEYS = ("time/", "async/")
LOSS_KEYS = ("loss", "pg_loss", "tis_weight", "ratio", "approx_kl", "clip_frac", "entropy", "kl", "grad_norm",
             "agent/advantage_mean", "designer/advantage_mean")


def _run(tmp_path, name, overrides):
    config = load_config("tiny", [*BASE, *overrides])
    loaded = load_model("tiny", seed=0)
    with SandboxPool(config.sandbox) as sandbox:
        learner = Learner(loaded.model, config.rl, sandbox=sandbox, verbose=False)
        used = []  # the samples of every update, as the learner got them
        update = learner.update

        def recording_update(samples, **kwargs):
            used.append(samples)
            return update(samples, **kwargs)

        learner.update = recording_update
        selfplay = SelfPlay(config, Policy(loaded.model, loaded.tokenizer), learner,
                            EnvArchive(tmp_path / name), PhaseTimer())
        metrics, states = [], []
        for _ in range(config.iterations):
            metrics.append(selfplay.step())
            states.append(selfplay.state_dict())
    return metrics, states, used


def _rollout_metrics(m):
    return {k: v for k, v in m.items() if not k.startswith(LOOP_KEYS) and k not in LOSS_KEYS}


@pytest.mark.slow
def test_frozen_weights_async_rollouts_and_checkpoints_equal_the_synchronous_loop(tmp_path):
    sync, sync_states, sync_used = _run(tmp_path, "sync", FROZEN)
    ours, our_states, our_used = _run(tmp_path, "async", [*FROZEN, "async_staleness=1"])
    assert not any(k.startswith("async/") for m in sync for k in m)
    for a, b in zip(sync, ours):
        assert _rollout_metrics(a) == _rollout_metrics(b)
        for key in LOSS_KEYS:  # the stale rows' TIS weights are exp(logp - behaviour logp): 1 up to float error
            if key in a:
                assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-5), key
    # What a checkpoint after each iteration holds: the state at the start of the next iteration, from
    # before the rollouts already collected for it (a resume collects them again).
    assert our_states == sync_states
    assert [m["async/staleness"] for m in ours] == [0, 1, 1]
    assert [m["async/stale_share"] for m in ours] == [0.0, 1.0, 1.0]
    assert all(m["async/overlap_s"] > 0 for m in ours[:-1]) and "async/overlap_s" not in ours[-1]
    # The same rows reach the update, the agent's marked stale once they were sampled an update ago.
    for it, (a, b) in enumerate(zip(sync_used, our_used)):
        assert [s.tokens for s in a] == [s.tokens for s in b]
        assert not any(s.stale for s in a)
        assert all(s.stale == (it > 0) for s in b if s.role == AGENT)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_async_rows_are_at_most_k_updates_stale_and_importance_weighted(tmp_path, k):
    ours, _, used = _run(tmp_path, f"k{k}", [f"async_staleness={k}", "iterations=4"])
    staleness = [m["async/staleness"] for m in ours]
    # k=1 refreshes the sampler after every update; k=2 every other one (staleness 1, 2, 1, ...).
    assert staleness == ([0, 1, 1, 1] if k == 1 else [0, 1, 2, 1])
    assert max(staleness) <= k
    reweighted = 0
    for i, (m, samples) in enumerate(zip(ours, used)):
        assert all(s.stale == (m["async/staleness"] > 0) for s in samples if s.role == AGENT)
        stale = m["async/staleness"]
        if stale == 0:
            assert m["tis_weight"] == pytest.approx(1.0, abs=1e-6)
        # An update with a gradient since the rows were sampled moved the weights: min(pi / pi_behaviour,
        # cap) != 1. (A group without spread has zero advantages and no gradient: the random model's
        # plays do not always earn the format bonus unevenly, and weight decay alone moves logprobs ~1e-7.)
        elif any(ours[j]["grad_norm"] > 0 for j in range(i - stale, i)):
            assert abs(m["tis_weight"] - 1.0) > 1e-6
            reweighted += 1
    assert reweighted, "no update had a gradient: nothing was checked"


@pytest.mark.parametrize("overrides, key", [
    (["async_staleness=-1"], "async_staleness=-1 must be >= 0"),
    (["async_staleness=1", "mesh.distributed=true"], "async_staleness > 0 is single-process only"),
    (["async_staleness=one"], "async_staleness must be an integer"),
])
def test_bad_async_staleness_is_a_one_line_config_error(overrides, key, capsys):
    with pytest.raises(ConfigError, match=key):
        load_config("tiny", overrides)
    assert run_main(["--config", "tiny", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and key in err


@pytest.mark.slow
def test_a_run_stopped_with_rollouts_in_flight_resumes_from_the_state_before_them(tmp_path):
    import json

    out = tmp_path / "run"
    common = ["--config", "tiny", "--out", str(out)]
    # The budget stops the run after iteration 0, while iteration 1's rollouts were collected alongside it.
    assert run_main([*common, *BASE, "async_staleness=1", "max_minutes=0.001"]) == 0
    first = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in first] == [0] and first[0]["async/overlap_s"] > 0
    assert (out / "checkpoints" / "1").is_dir()
    assert run_main([*common, "--resume", "max_minutes=null"]) == 0
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert resumed[:1] == first and [m["iteration"] for m in resumed] == [0, 1, 2]
    # The prefetched rollouts were dropped: iteration 1 is collected again, fresh, with the checkpoint's weights.
    assert [m["async/staleness"] for m in resumed] == [0, 0, 1]
    assert (out / "checkpoints" / "3").is_dir()
