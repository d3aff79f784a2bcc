"""Where self-play's stock programs come from: the `min_valid_envs` top-ups and the designer's edit and
tune bases are `env_pool`'s programs when it is set (a small model's calibrated variants), else the
domain's library."""

import types

import numpy as np

from spade_jax import roles
from spade_jax.config import load_config
from spade_jax.envs.library import library_programs
from spade_jax.selfplay import PoolEnv, SelfPlay, fixed_pool_envs

CALIBRATED = "library:odd_one_out(ROUNDS=2, CHOICES=3), knights_knaves(PEOPLE=2, QUESTIONS=1)"


def _selfplay(overrides):
    config = load_config("tiny", ["mode=selfplay", "min_valid_envs=3", *overrides])
    return SelfPlay(config, types.SimpleNamespace(tokenizer=None), types.SimpleNamespace(sandbox=None), None, None)


def _top_up(overrides):
    selfplay = _selfplay(overrides)
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


def _bases(overrides):
    """The base programs of edit and tune requests built the way SelfPlay builds them."""
    selfplay = _selfplay(["roles.edit_prob=1.0", "roles.tune_prob=0.5", *overrides])
    requests = [roles.design_request(np.random.default_rng(seed), "logical deduction", library=selfplay.seed_programs,
                                     cfg=selfplay.cfg.roles) for seed in range(12)]
    assert {r.mode for r in requests} == {"edit", "tune"}
    return requests


def test_designer_edits_and_tunes_env_pool_programs_when_it_is_set():
    variants = {e.env_id: e.source for e in fixed_pool_envs(CALIBRATED)}
    requests = _bases([f"env_pool={CALIBRATED}"])
    assert all(variants[r.base_name] == r.base_source for r in requests)
    tuned = [r for r in requests if r.mode == "tune" and r.base_name.startswith("lib-knights_knaves")]
    assert tuned and all("PEOPLE = 2\n" in r.messages[-1]["content"] for r in tuned)  # the variant's value is shown


def test_designer_edits_library_programs_without_env_pool():
    library = {p.name: p.source for p in library_programs(domain="games")}
    assert all(library[r.base_name] == r.base_source for r in _bases([]))
