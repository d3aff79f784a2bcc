"""spade_jax.evaluation.rg_items: reasoning-gym items the same in every process, whatever its hash
seed, as reasoning-gym itself makes them under PYTHONHASHSEED=0; the helper process comes back after
it dies."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spade_jax.evaluation import rg_items

ITEMS = ("ransom_note", 5)  # its letters come from a set of strings: the order follows the hash seed

OURS = """
import json
from spade_jax.evaluation.environments import make_eval_env
env = make_eval_env("rg:ransom_note")
print(json.dumps([env.reset(seed) for seed in range(5)]))
"""

REASONING_GYM = """
import json, reasoning_gym
from spade_jax.evaluation.environments import RG_ANSWER_INSTRUCTION
items = [reasoning_gym.create_dataset("ransom_note", size=1, seed=seed)[0] for seed in range(5)]
print(json.dumps([item["question"].rstrip() + "\\n\\n" + RG_ANSWER_INSTRUCTION for item in items]))
"""


def _run(code: str, hash_seed: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_items_are_reasoning_gyms_under_hash_seed_zero_in_every_process():
    reference = _run(REASONING_GYM, "0")
    assert _run(REASONING_GYM, "1") != reference  # the flaw: another process, other questions
    assert _run(OURS, "1") == _run(OURS, "2") == reference


def test_scores_are_reasoning_gyms():
    item = rg_items.rg_item(*ITEMS)
    wrong = "False" if item["answer"] == "True" else "True"
    assert rg_items.rg_score(*ITEMS, item["answer"]) == 1.0
    assert rg_items.rg_score(*ITEMS, wrong) == 0.0


@pytest.mark.skipif(not sys.flags.hash_randomization, reason="PYTHONHASHSEED=0: no helper process")
def test_helper_restarts_after_it_dies():
    first = rg_items.rg_item(*ITEMS)
    rg_items._HELPER._proc.kill()
    rg_items._HELPER._proc.wait()
    assert rg_items.rg_item(*ITEMS) == first


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="reasoning-gym: .*no_such_task"):
        rg_items.rg_item("no_such_task", 0)


def test_a_configured_task_is_reasoning_gyms_dataset_at_that_config():
    import reasoning_gym

    spec = "basic_arithmetic(min_terms=2, max_terms=2, max_digits=1, operators=['+', '-'])"
    for seed in (0, 7):
        expected = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=seed, min_terms=2, max_terms=2,
                                                max_digits=1, operators=("+", "-"))[0]
        assert rg_items.rg_item(spec, seed) == {"question": expected["question"], "answer": str(expected["answer"])}
        assert rg_items.rg_score(spec, seed, str(expected["answer"])) == 1.0
    assert rg_items.rg_item(spec, 0) != rg_items.rg_item("basic_arithmetic", 0)


@pytest.mark.parametrize("spec, message", [
    ("chain_sum(no_field=1)", "chain_sum has no config field 'no_field'; its fields: allow_negation, max_digits"),
    ("chain_sum(max_terms=two)", "max_terms=two is not a Python literal"),
    ("chain_sum(2)", "is not name or name\\(field=value, ...\\)"),
    ("chain_sum(max_terms=2", "does not parse"),
    ("no_such_task(x=1)", "unknown reasoning-gym task 'no_such_task'"),
])
def test_a_bad_task_config_is_a_one_line_error(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        rg_items.parse_rg_task(spec)
    assert "\n" not in str(err.value)


def test_a_config_reasoning_gym_refuses_is_its_error_at_first_use():
    from spade_jax.evaluation.environments import make_eval_env

    env = make_eval_env("rg:chain_sum(min_terms=5, max_terms=2)")  # the fields exist; their values clash
    with pytest.raises(ValueError, match="reasoning-gym: AssertionError: max_terms must be >= min_terms"):
        env.reset(0)
