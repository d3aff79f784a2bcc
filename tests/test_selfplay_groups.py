"""Which instance each play of a GRPO group meets: its own random seed (SPADE's `env.reset()`), or
one seed per environment and arm (`group_instances=shared`, GRPO's G answers to one prompt)."""

import types

import pytest

from spade_jax import selfplay as selfplay_module
from spade_jax.config import ConfigError, load_config
from spade_jax.selfplay import PoolEnv, SelfPlay


def _seeds_by_group(monkeypatch, group_instances, iterations=1):
    config = load_config("tiny", ["mode=fixed_pool", "group_size=4", f"group_instances={group_instances}"])
    selfplay = SelfPlay(config, types.SimpleNamespace(tokenizer=None), types.SimpleNamespace(sandbox=None), None, None)
    selfplay.pool = [PoolEnv(f"env{i}", "unknown", "file", "source", True, backend="sandbox") for i in range(3)]
    selfplay.pool[0].hint = "look first"
    selfplay.compiled = lambda env: types.SimpleNamespace(make=lambda: types.SimpleNamespace())
    played = []

    def record(instances, seeds, *args, groups, **kwargs):
        played.extend(zip(groups, seeds))
        return []

    monkeypatch.setattr(selfplay_module, "play_episodes", record)
    by_iteration = []
    for _ in range(iterations):
        played.clear()
        selfplay.play(hinted=True)
        by_group = {}
        for group, seed in played:
            by_group.setdefault(group, []).append(seed)
        by_iteration.append(by_group)
    return by_iteration


def test_independent_plays_each_meet_their_own_instance(monkeypatch):
    (by_group,) = _seeds_by_group(monkeypatch, "independent")
    assert sorted(by_group) == [("env0", "hint"), ("env0", "nohint"), ("env1", "nohint"), ("env2", "nohint")]
    seeds = [seed for group in by_group.values() for seed in group]
    assert len(seeds) == 16 and len(set(seeds)) == 16


def test_shared_groups_play_one_instance_each_and_a_new_one_every_iteration(monkeypatch):
    first, second = _seeds_by_group(monkeypatch, "shared", iterations=2)
    for by_group in (first, second):
        assert all(len(seeds) == 4 and len(set(seeds)) == 1 for seeds in by_group.values())
        assert len({seeds[0] for seeds in by_group.values()}) == 4  # each group its own instance
    assert {s[0] for s in first.values()}.isdisjoint({s[0] for s in second.values()})


def test_an_unknown_group_instances_value_is_a_config_error():
    with pytest.raises(ConfigError, match="group_instances"):
        load_config("tiny", ["group_instances=same"])
