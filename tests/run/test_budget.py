"""max_minutes: the wall-clock training budget is summed across resumes and stops a run cleanly."""

import json
from pathlib import Path

import pytest

from experiments.run import main as run_main
from spade_jax.config import ConfigError, load_config
from spade_jax.run.budget import TRAIN_SECONDS, Budget, cumulative_seconds, spent_seconds

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "learnable"


def test_spent_seconds_reads_the_last_recorded_total():
    history = [{"iteration": 0, TRAIN_SECONDS: 4.0, "wall_s": 5.0}, {"iteration": 1, TRAIN_SECONDS: 9.5, "wall_s": 2.0}]
    assert spent_seconds(history) == 9.5
    assert spent_seconds([]) == 0.0


def test_runs_from_before_the_budget_sum_wall_time_per_process():
    # wall_s counts from each process's start: iterations 0-1 in one, 2 in a resumed one; then a record
    # with the total continues from it.
    history = [{"wall_s": 10.0}, {"wall_s": 12.5}, {"wall_s": 5.0}, {"wall_s": 7.0, TRAIN_SECONDS: 30.0}]
    assert cumulative_seconds(history) == [10.0, 12.5, 17.5, 30.0]


def test_budget_is_spent_at_its_limit_and_unlimited_when_off():
    budget = Budget(1.0, spent=30.0)
    assert not budget.exhausted
    assert budget.add(29.0) == 59.0 and not budget.exhausted
    budget.add(1.0)
    assert budget.exhausted
    for off in (None, 0.0):
        unlimited = Budget(off)
        unlimited.add(1e9)
        assert not unlimited.exhausted


@pytest.mark.parametrize("value, message", [
    ("-1", "max_minutes=-1.0 must be >= 0"),
    ("soon", "max_minutes must be a number, got 'soon'"),
    (".nan", "max_minutes must be a finite number"),
])
def test_bad_max_minutes_is_one_line_error(value, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")) as err:
        load_config("tiny", [f"max_minutes={value}"])
    assert "\n" not in str(err.value)


def test_max_minutes_off_by_default_and_settable():
    assert load_config("tiny").max_minutes is None
    assert load_config("tiny", ["max_minutes=2.5"]).max_minutes == 2.5


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(out):
    return sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_a_spent_budget_stops_the_run_with_a_checkpoint_and_a_resume_continues_it(tmp_path):
    out = tmp_path / "run"
    # One-turn fixed pool, one-token replies: the cheapest real iteration. checkpoint_every=5 checks that
    # the budget's stop saves a checkpoint anyway.
    args = ["--config", "fixed_pool", "--out", str(out), "model.name=tiny", f"env_pool={FIXTURES}",
            "group_size=2", "agent_sampling.max_new_tokens=1", "rollout.max_turns=1", "rl.micro_batches=1",
            "progress=false", "tensorboard=false", "checkpoint_every=5", "iterations=4", "max_minutes=0.0001"]
    assert run_main(args) == 0
    first = _records(out)
    assert [r["iteration"] for r in first] == [0]  # 6 ms of budget: spent by the first iteration
    assert first[0][TRAIN_SECONDS] > 0.006
    assert _checkpoints(out) == [1]

    # The same budget on resume is already spent: nothing runs, nothing is lost.
    assert run_main(["--out", str(out), "--resume"]) == 0
    assert _records(out) == first and _checkpoints(out) == [1]

    # Lifting the budget continues the clock from the first process's total, not from 0.
    assert run_main(["--out", str(out), "--resume", "max_minutes=0", "iterations=2"]) == 0
    records = _records(out)
    assert [r["iteration"] for r in records] == [0, 1]
    assert records[1][TRAIN_SECONDS] > records[0][TRAIN_SECONDS] == first[0][TRAIN_SECONDS]
    assert _checkpoints(out) == [1, 2]
