"""The Learner's watch over non-finite updates: skipped steps are counted, a run of them in a row
raises TrainingDiverged, and a finite step in between starts the count again."""

import jax
import numpy as np
import pytest
from flax import nnx

from rl_testing import tiny_decoder
from spade_jax.policy import Learner
from spade_jax.rl import RLConfig
from spade_jax.rl.collate import Sample
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
