"""The Learner's watch over non-finite updates: skipped steps are counted, a run of them in a row
raises TrainingDiverged, and a finite step in between starts the count again. With rl.kl_coef > 0
it anchors the KL on the weights it was built from, through updates and a resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_testing import tiny_decoder

from spade_jax.policy import Learner
from spade_jax.rl import RLConfig, make_train_step
from spade_jax.rl.batch import DESIGNER
from spade_jax.rl.collate import Sample, collate
from spade_jax.rl.train import TrainingDiverged


def _samples(advantage: float) -> list[Sample]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(4):
        tokens = rng.integers(0, 48, 10).tolist()
        out.append(Sample(tokens, [0] * 4 + [1] * 6, [0.0] * 4 + [-1.0] * 6, advantage if i % 2 else -advantage))
    return out


def _model_params(model):
    return [np.array(x, copy=True) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_non_finite_updates_are_skipped_counted_and_a_run_of_them_stops_training():
    model = tiny_decoder(0)
    learner = Learner(model, RLConfig(lr=1e-2, max_nonfinite_steps=2), verbose=False)
    assert learner.ref_params is None  # no KL, no reference copy
    good = learner.update(_samples(1.0))
    assert good["train/skipped"] == 0 and good["update/skipped"] == 0 and good["train/skipped_steps"] == 0
    kept = _model_params(model)

    nan = float("nan")
    first = learner.update(_samples(nan))
    assert first["train/skipped"] == 1 and first["update/skipped"] == 1 and first["train/skipped_steps"] == 1
    for a, b in zip(kept, _model_params(model)):
        np.testing.assert_array_equal(np.asarray(b), a)  # the model the sampler uses is untouched

    # A finite step resets the run: one more NaN step is again only a skip.
    assert learner.update(_samples(1.0))["train/skipped"] == 0
    assert learner.update(_samples(nan))["train/skipped_steps"] == 2
    with pytest.raises(TrainingDiverged) as raised:
        learner.update(_samples(nan))
    message = str(raised.value)
    assert "\n" not in message and "2 non-finite updates in a row" in message and "checkpoint is kept" in message
    assert learner.skipped_steps == 3
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(learner.state.params))


def test_max_nonfinite_steps_must_be_positive():
    with pytest.raises(ValueError, match="max_nonfinite_steps"):
        RLConfig(max_nonfinite_steps=0)


def test_kl_k3_to_the_starting_weights_runs_end_to_end():
    model = tiny_decoder(0)
    start = _model_params(model)
    learner = Learner(model, RLConfig(lr=1e-2, kl_coef=0.005, kl_estimator="k3"), verbose=False)
    first = learner.update(_samples(1.0))
    assert first["train/skipped"] == 0 and first["kl"] == 0.0  # the policy is still the reference
    second = learner.update(_samples(1.0))
    assert second["train/skipped"] == 0 and second["kl"] > 0.0
    assert any(not np.array_equal(a, b) for a, b in zip(start, _model_params(model)))  # the model moved...
    for a, b in zip(start, jax.tree.leaves(learner.ref_params)):
        np.testing.assert_array_equal(np.asarray(b), a)  # ...the reference did not


def test_kl_reference_survives_a_resume():
    """As experiments/run.py resumes: a fresh Learner on the reloaded starting weights, then the
    checkpointed state restored into it; it continues exactly like the Learner that never stopped."""
    cfg = RLConfig(lr=1e-2, kl_coef=0.005)
    running = Learner(tiny_decoder(0), cfg, verbose=False)
    running.update(_samples(1.0))
    running.update(_samples(-1.0))
    resumed = Learner(tiny_decoder(0), cfg, verbose=False)
    resumed.state = jax.tree.map(jnp.copy, running.state)  # what Checkpointer.restore hands back
    resumed.train_step.write_params(resumed.model, resumed.state)
    for a, b in zip(jax.tree.leaves(running.ref_params), jax.tree.leaves(resumed.ref_params)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    want, got = running.update(_samples(1.0)), resumed.update(_samples(1.0))
    assert want["kl"] > 0 and got["kl"] == want["kl"] and got["loss"] == want["loss"]


def test_min_update_length_fixes_the_width_of_every_update():
    learner = Learner(tiny_decoder(0), RLConfig(lr=1e-2, min_update_length=200, pack_sequences=True), verbose=False)
    out = learner.update(_samples(1.0))
    assert (out["update/rows"], out["update/length"]) == (1, 256)  # four 10-token samples in one row
    with pytest.raises(ValueError, match="min_update_length"):
        RLConfig(min_update_length=0)


def _long_sample(length: int = 300, advantage: float = 1.0) -> Sample:
    return Sample([i % 48 for i in range(length)], [0] * (length - 10) + [1] * 10,
                  [0.0] * (length - 10) + [-1.0] * 10, advantage, role=DESIGNER)


def test_a_sample_longer_than_min_update_length_widens_the_update_to_the_length_multiple():
    for multiple, short, width in ((128, 256, 384), (200, 200, 400)):
        cfg = RLConfig(lr=1e-2, min_update_length=200, update_length_multiple=multiple, pack_sequences=True,
                       long_samples_apart=False)
        out = Learner(tiny_decoder(0), cfg, verbose=False).update([_long_sample()] + _samples(1.0))
        assert out["update/length"] == width and out["update/long_rows"] == 0
        apart = Learner(tiny_decoder(0), cfg.replace(long_samples_apart=True), verbose=False)
        out = apart.update([_long_sample()] + _samples(1.0))
        assert (out["update/length"], out["update/long_rows"], out["update/long_length"]) == (short, 1, width)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="update_length_multiple"):
            RLConfig(update_length_multiple=bad)


@pytest.mark.parametrize("pack", [False, True])
def test_long_samples_apart_give_the_update_of_one_batch_at_the_longest_width(pack):
    """rl.long_samples_apart: the rows longer than min_update_length in a batch of their own width, the
    others at min_update_length, one step: the same loss, metrics and weights as every row at the widest."""
    samples = _samples(1.0) + _samples(-0.5)[:3] + [_long_sample(300, 1.0), _long_sample(260, -2.0)]
    cfg = RLConfig(lr=1e-2, adam_eps=1.0, micro_batches=2, update_rows=8, min_update_length=64,
                   pack_sequences=pack, score_loss_only=True)
    together = Learner(tiny_decoder(0), cfg.replace(long_samples_apart=False), verbose=False)
    apart = Learner(tiny_decoder(0), cfg, verbose=False)
    for _ in range(2):
        one, two = together.update(samples), apart.update(samples)
        assert one["update/length"] == 384 and one["update/long_rows"] == 0
        assert (two["update/length"], two["update/long_length"]) == (128, 384)
        assert two["update/long_rows"] == 2 and two["update/filled_rows"] == (3 if pack else 9)
        for key in ("loss", "pg_loss", "entropy", "grad_norm", "tokens", "sequences", "designer/tokens"):
            np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for a, b in zip(_model_params(together.model), _model_params(apart.model)):
        np.testing.assert_allclose(b, a, atol=1e-6)


def test_fixed_update_rows_give_updates_of_any_sample_count_one_compiled_step():
    model = tiny_decoder(0)
    learner = Learner(model, RLConfig(lr=1e-2, micro_batches=2, update_rows=8, score_loss_only=True), verbose=False)
    first = learner.update(_samples(1.0)[:3])
    second = learner.update(_samples(1.0) + _samples(0.5)[:2])
    assert first["update/rows"] == second["update/rows"] == 8
    assert (first["update/filled_rows"], second["update/filled_rows"]) == (3, 6)
    assert first["train/skipped"] == second["train/skipped"] == 0 and second["tokens"] == 6 * 6
    assert len(learner.train_step._compiled) == 1


def test_shared_prompts_give_the_update_of_one_copy_per_sample_in_fewer_rows():
    """rl.share_prefixes: a GRPO group's plays of one instance open with the same prompt; stored once per
    row, the update (loss, metrics, weights) is the one of a copy per sample, through fewer tokens."""
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 48, 40).tolist()
    samples = []
    for i in range(6):
        own = int(rng.integers(8, 20))
        samples.append(Sample(prompt + rng.integers(0, 48, own).tolist(), [0] * 40 + [1] * own,
                              [0.0] * 40 + [-1.0] * own, float(i % 3) - 1.0))
    cfg = RLConfig(lr=1e-2, adam_eps=1.0, micro_batches=2, update_rows=8, min_update_length=128,
                   pack_sequences=True, score_loss_only=True)
    copied = Learner(tiny_decoder(0), cfg.replace(share_prefixes=False), verbose=False)
    shared = Learner(tiny_decoder(0), cfg, verbose=False)
    for _ in range(2):
        one, two = copied.update(samples), shared.update(samples)
        tokens = sum(len(s.tokens) for s in samples)
        assert one["update/model_tokens"] == tokens and two["update/model_tokens"] < tokens - 3 * 39
        assert two["update/filled_rows"] < one["update/filled_rows"]
        for key in ("loss", "pg_loss", "entropy", "grad_norm", "tokens", "sequences"):
            np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for a, b in zip(_model_params(copied.model), _model_params(shared.model)):
        np.testing.assert_allclose(b, a, atol=1e-6)


def test_tokens_after_the_last_reply_are_left_out_of_the_update_and_change_nothing():
    """A play that ran out of turns ends with an observation no loss token sees: the Learner drops it,
    and its update equals the train step's on the whole samples."""
    rng = np.random.default_rng(5)
    samples = []
    for i in range(4):
        tokens = rng.integers(0, 48, 30).tolist()
        loss = [0] * 6 + [1] * 5 + [0] * 7 + [1] * 4 + [0] * 8  # 8 tokens after the last reply
        samples.append(Sample(tokens, loss, [-1.0 if m else 0.0 for m in loss], float(i % 2) - 0.5))
    cfg = RLConfig(lr=1e-2, adam_eps=1.0, micro_batches=2, min_update_length=32, update_length_multiple=32)
    learner = Learner(tiny_decoder(0), cfg, verbose=False)
    got = learner.update(samples)
    assert got["update/model_tokens"] == 4 * 22
    model = tiny_decoder(0)
    step = make_train_step(model, cfg, verbose=False)
    state, want = step(step.init(model), collate(samples, row_multiple=2, min_length=32, length_multiple=32))
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "tokens", "sequences"):
        np.testing.assert_allclose(got[key], float(want[key]), rtol=1e-5, atol=1e-7, err_msg=key)
    step.write_params(model, state)
    for a, b in zip(_model_params(model), _model_params(learner.model)):
        np.testing.assert_allclose(b, a, atol=1e-6)
