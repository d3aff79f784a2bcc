"""End to end: a `tiny` self-play run of two iterations, then a resumed third, and the run directory."""

import json

import pytest
import yaml

from experiments.run import main as run_main


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_tiny_run_two_iterations_then_resume_a_third(tmp_path):
    out = tmp_path / "run"
    assert run_main(["--config", "tiny", "--out", str(out), "iterations=2"]) == 0
    first = _metrics(out)
    assert [m["iteration"] for m in first] == [0, 1]
    for key in ("loss", "agent/win_rate", "designer/valid_rate", "designer/regret_mean", "memory/size",
                "agent/env_errors", "agent/env_errors/timeout", "train/skipped", "train/skipped_steps"):
        assert key in first[0], key
    assert any(k.startswith("time/") for k in first[0])
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["name"] == "tiny"
    index = [json.loads(line) for line in (out / "envs" / "index.jsonl").read_text().splitlines()]
    designed = [e for e in index if "valid" in e]
    assert len(designed) == 4  # pool_size slots x design_attempts from the one regeneration
    assert sorted(e["attempt"] for e in designed) == [1, 1, 2, 2]  # each invalid design was tried again
    assert all((out / "envs" / f"{e['env_id']}.py").is_file() for e in designed)
    assert all(not e["valid"] and e["errors"] for e in designed)  # a random model writes no valid program
    assert (out / "summary.md").is_file() and list((out / "plots").glob("*.png"))
    assert "plays whose environment failed" in (out / "summary.md").read_text()
    assert list((out / "tensorboard").iterdir())
    assert (out / "checkpoints" / "2").is_dir()

    # Resume for a third iteration: iteration 2 is a regeneration step with a delayed designer update.
    assert run_main(["--config", "tiny", "--out", str(out), "--resume", "iterations=3"]) == 0
    resumed = _metrics(out)
    assert [m["iteration"] for m in resumed] == [0, 1, 2]
    assert resumed[:2] == first
    # Every random-model design is invalid: none is scored or trained (SPADE never trains invalid designs).
    assert resumed[2]["designer/scored"] == 0 and resumed[2]["designer/samples"] == 0
    assert (out / "checkpoints" / "3").is_dir()


def test_bad_override_and_missing_resume_dir_are_one_line_errors(tmp_path, capsys):
    assert run_main(["--config", "tiny", "rl.lrr=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown config key 'rl.lrr'" in err
    assert run_main(["--config", "nope"]) == 2
    assert "config 'nope' not found" in capsys.readouterr().err
    assert run_main(["--config", "tiny", "--out", str(tmp_path / "absent"), "--resume"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_every_scores_the_agent_during_the_run_and_plots_it(tmp_path):
    out = tmp_path / "run"
    assert run_main(["--config", "tiny", "--out", str(out), "iterations=1", "eval_every=1", "eval_suite=small",
                     "tensorboard=false"]) == 0
    (record,) = _metrics(out)
    assert 0.0 <= record["eval/success_rate_low"] <= record["eval/success_rate"] <= record["eval/success_rate_high"]
    assert {"eval/rg:ransom_note", "eval/rg:course_schedule", "eval/rg:syllogism"} <= set(record)
    assert record["agent/win_rate_low"] <= record["agent/win_rate"] <= record["agent/win_rate_high"]
    # Refreshed every iteration, not only at the end.
    assert (out / "plots" / "eval_success_rate.png").is_file() and (out / "plots" / "agent_win_rate.png").is_file()
    assert "eval/success_rate" in (out / "summary.md").read_text()
