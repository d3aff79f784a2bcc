"""Where `min_valid_envs` tops a designed pool up from: `env_pool` when it is set (a small model's
calibrated variants), else the domain's library."""

import types

from spade_jax.config import load_config
from spade_jax.envs.library import library_programs
from spade_jax.selfplay import PoolEnv, SelfPlay, fixed_pool_envs

CALIBRATED = "library:odd_one_out(ROUNDS=2, CHOICES=3), knights_knaves(PEOPLE=2, QUESTIONS=1)"


def _top_up(overrides):
    config = load_config("tiny", ["mode=selfplay", "min_valid_envs=3", *overrides])
    selfplay = SelfPlay(config, types.SimpleNamespace(tokenizer=None), types.SimpleNamespace(sandbox=None), None, None)
    selfplay.check = lambda env: env  # the programs are the library's own: no sandbox here
    designed = [PoolEnv("d0", "rules", "designer", "source", True), PoolEnv("d1", "rules", "designer", "source", False)]
    pool = selfplay.top_up(list(designed))
    assert pool[:2] == designed
    return pool[2:]


def test_top_ups_come_from_env_pool_when_it_is_set():
    added = _top_up([f"env_pool={CALIBRATED}"])
    assert len(added) == 2  # one valid design, three wanted
    assert sorted(e.env_id for e in added) == sorted(e.env_id for e in fixed_pool_envs(CALIBRATED))
    assert {e.source for e in added} == {e.source for e in fixed_pool_envs(CALIBRATED)}  # the variants' constants
    assert all(e.valid and e.origin == "library" for e in added)


def test_top_ups_come_from_the_library_without_env_pool():
    added = _top_up([])
    library = {f"lib-{p.name}": p.source for p in library_programs(domain="games")}
    assert len(added) == 2 and all(library.get(e.env_id) == e.source for e in added)
