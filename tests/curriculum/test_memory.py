"""Environment memory: FIFO eviction, SPADE's positive/negative sampling, checkpoint round trip."""

import json

import numpy as np
import pytest

from spade_jax.curriculum import CurriculumConfig
from spade_jax.curriculum.memory import EnvMemory, EnvRecord


def _record(i, regret=0.0, win_rate=0.5, skill="logical deduction", valid=True):
    return EnvRecord(
        f"env{i}", f"class E{i}Env: pass", skill, regret=regret, win_rate=win_rate, valid=valid, iteration=i
    )


def test_capacity_evicts_oldest_first():
    memory = EnvMemory(capacity=3)
    evicted = [memory.add(_record(i)) for i in range(5)]
    assert [e.env_id if e else None for e in evicted] == [None, None, None, "env0", "env1"]
    assert [r.env_id for r in memory.records] == ["env2", "env3", "env4"]
    assert len(memory) == 3 and "env0" not in memory


def test_update_keeps_age_and_rejects_unknown():
    memory = EnvMemory(capacity=2)
    memory.add(EnvRecord("a", "src", "optimization"))
    memory.add(EnvRecord("b", "src", "optimization"))
    assert not memory["a"].measured
    memory.update("a", regret=0.2, win_rate=0.5)
    assert memory["a"].measured
    memory.add(EnvRecord("c", "src", "optimization"))  # "a" is still the oldest
    assert "a" not in memory
    with pytest.raises(KeyError):
        memory.update("a", regret=0.1)
    with pytest.raises(ValueError, match="no field"):
        memory.update("b", regrett=0.1)


def test_default_capacity_from_config_is_200():
    memory = EnvMemory.from_config(CurriculumConfig())
    for i in range(250):
        memory.add(_record(i))
    assert len(memory) == 200 and memory.records[0].env_id == "env50"


def test_positive_candidates_filter_and_order():
    memory = EnvMemory()
    memory.add(_record(0, regret=0.9, win_rate=0.1))  # too hard: not a positive
    memory.add(_record(1, regret=0.3, win_rate=0.15))  # band edges are inclusive
    memory.add(_record(2, regret=0.5, win_rate=0.85))
    memory.add(_record(3, regret=0.8, win_rate=0.5, valid=False))  # invalid
    memory.add(EnvRecord("unmeasured", "src", "logical deduction"))
    memory.add(_record(4, regret=0.1, win_rate=0.6))
    assert [r.env_id for r in memory.positive_candidates()] == ["env2", "env1", "env4"]


def test_positives_come_from_the_top_regret_pool():
    memory = EnvMemory(positive_pool=3)
    for i in range(10):
        memory.add(_record(i, regret=i / 10, win_rate=0.5))
    seen = set()
    for seed in range(40):
        picks = memory.sample_positives(np.random.default_rng(seed), 2)
        assert len(picks) == 2 and picks[0].regret >= picks[1].regret
        seen.update(r.env_id for r in picks)
    assert seen == {"env7", "env8", "env9"}  # all of the top 3, never below them


def test_default_pool_is_the_top_max_3n_10_by_regret():
    # spade-rl/spade spare/core/env_memory.py: n positives come from the top max(3n, 10) by regret.
    memory = EnvMemory()
    assert memory.positive_pool is None and memory.pool_size(2) == 10 and memory.pool_size(5) == 15
    for i in range(30):
        memory.add(_record(i, regret=i / 100, win_rate=0.5))
    top10 = {f"env{i}" for i in range(20, 30)}
    top15 = {f"env{i}" for i in range(15, 30)}
    seen2, seen5 = set(), set()
    for seed in range(200):
        picks = memory.sample_positives(np.random.default_rng(seed), 2)
        assert len(picks) == 2 and picks[0].regret > picks[1].regret
        seen2.update(r.env_id for r in picks)
        seen5.update(r.env_id for r in memory.sample_positives(np.random.default_rng(seed), 5))
    assert seen2 == top10 and seen5 == top15


def test_positives_are_of_the_requested_skill_only():
    memory = EnvMemory()
    memory.add(_record(0, regret=0.9, skill="optimization"))
    memory.add(_record(1, regret=0.1, skill="causal inference"))
    memory.add(_record(2, regret=0.8, skill="optimization"))
    memory.add(_record(3, regret=0.7, win_rate=0.9, skill="causal inference"))  # out of the band
    for seed in range(10):
        picks = memory.sample_positives(np.random.default_rng(seed), 2, skill="causal inference")
        assert [r.env_id for r in picks] == ["env1"]  # no other skill fills in (SPADE)
    assert memory.sample_positives(np.random.default_rng(0), 2, skill="spatial reasoning") == []
    any_skill = {r.env_id for s in range(20) for r in memory.sample_positives(np.random.default_rng(s), 2)}
    assert any_skill == {"env0", "env1", "env2"}  # skill None: every in-band record


def test_negatives_are_of_the_requested_skill_only():
    memory = EnvMemory()
    memory.add(_record(0, win_rate=0.95, skill="optimization"))
    memory.add(_record(1, win_rate=0.05, skill="causal inference"))
    memory.add(_record(2, win_rate=0.5, skill="causal inference"))
    for seed in range(10):
        negatives = memory.sample_negatives(np.random.default_rng(seed), 1, "causal inference")
        assert [r.env_id for r in negatives] == ["env1"]
    pos, neg = memory.sample_for_designer(np.random.default_rng(0), 2, 1, skill="optimization")
    assert pos == [] and [r.env_id for r in neg] == ["env0"]
    assert memory.sample_negatives(np.random.default_rng(0), 1, "spatial reasoning") == []


def test_positive_pool_must_be_positive_or_none():
    with pytest.raises(ValueError, match="positive_pool"):
        EnvMemory(positive_pool=0)


def test_negatives_are_too_easy_or_too_hard():
    memory = EnvMemory()
    memory.add(_record(0, win_rate=0.95))
    memory.add(_record(1, win_rate=0.05))
    memory.add(_record(2, win_rate=0.9))  # exactly 0.9 is not "> 0.9"
    memory.add(_record(3, win_rate=0.5))
    memory.add(_record(4, win_rate=0.0, valid=False))
    assert {r.env_id for r in memory.negative_candidates()} == {"env0", "env1"}
    picks = {memory.sample_negatives(np.random.default_rng(s), 1)[0].env_id for s in range(20)}
    assert picks == {"env0", "env1"}
    assert EnvMemory().sample_for_designer(np.random.default_rng(0)) == ([], [])


def test_sampling_is_deterministic_given_seed():
    memory = EnvMemory()
    for i in range(30):
        memory.add(_record(i, regret=(i * 7 % 11) / 11, win_rate=(i * 3 % 10) / 10))

    def draw(seed):
        return [[r.env_id for r in part] for part in memory.sample_for_designer(np.random.default_rng(seed), 2, 1)]

    assert draw(3) == draw(3)
    assert len({str(draw(s)) for s in range(10)}) > 1


def test_state_dict_json_round_trip():
    memory = EnvMemory(capacity=5, positive_pool=2)
    memory.add(_record(0, regret=0.25, win_rate=0.5))
    memory.add(EnvRecord("pending", "class XEnv: pass", "optimization", iteration=3))  # NaN fields
    state = json.loads(json.dumps(memory.state_dict(), allow_nan=False))
    restored = EnvMemory.from_state_dict(state)
    assert restored.capacity == 5 and restored.positive_pool == 2
    assert [r.env_id for r in restored.records] == ["env0", "pending"]
    assert restored["env0"].to_dict() == memory["env0"].to_dict()
    assert np.isnan(restored["pending"].regret) and not restored["pending"].measured
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)

    def ids(parts):
        return [[r.env_id for r in part] for part in parts]

    assert ids(memory.sample_for_designer(rng_a)) == ids(restored.sample_for_designer(rng_b))
    default = EnvMemory.from_state_dict(json.loads(json.dumps(EnvMemory().state_dict())))
    assert default.positive_pool is None  # SPADE's max(3n, 10) survives a round trip
