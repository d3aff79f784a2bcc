"""experiments.compare keeps what it has done: saved arm rows are reused, train time is summed
from each run's metrics."""

import json

from experiments import compare


def _row(label, config, rate):
    tasks = [{"env_id": "game:GuessTheNumber-v0-hard", "successes": int(rate * 3), "episodes": 3}]
    return {"arm": label, "config": config, "train_seconds": 1.5, "success_rate": rate,
            "ci_low": 0.0, "ci_high": 1.0, "tasks": tasks}


def test_saved_rows_are_kept_without_training_or_evaluating(tmp_path, capsys):
    settings = {"iterations": 2, "suite": "quick", "episodes": 3, "seed": 0, "overrides": ["model.name=tiny"]}
    (tmp_path / "rows").mkdir()
    for i, (label, config) in enumerate(compare.ARMS):
        row = {"settings": settings, "row": _row(label, config, i / 3)}
        (tmp_path / "rows" / f"{config or 'base'}.json").write_text(json.dumps(row))

    argv = ["--iterations", "2", "--episodes", "3", "--out", str(tmp_path), "model.name=tiny"]
    assert compare.main(argv) == 0  # nothing to train or evaluate: every arm was saved

    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["arm"] for r in rows] == [label for label, _ in compare.ARMS]
    assert [r["success_rate"] for r in rows] == [0, 1 / 3, 2 / 3, 1.0]
    table = (tmp_path / "results.md").read_text()
    assert "| SPADE, frozen designer | 1.5 | 1.000 [0.000, 1.000] | 3/3 |" in table
    assert capsys.readouterr().out.count("kept from") == 4


def test_bad_batch_size_is_one_line_error(tmp_path, capsys):
    assert compare.main(["--batch-size", "0", "--out", str(tmp_path)]) == 2
    assert "--batch-size must be >= 1" in capsys.readouterr().err


def test_train_seconds_sums_the_iterations_asked_for_across_resumes(tmp_path):
    # wall_s counts from each process's start: iterations 0-1 in one, 2-3 in a resumed one.
    walls = [10.0, 12.5, 5.0, 8.0]
    lines = [{"iteration": i, "wall_s": w} for i, w in enumerate(walls)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert compare.train_seconds(tmp_path, 2) == 12.5
    assert compare.train_seconds(tmp_path, 4) == 12.5 + 5.0 + 3.0
    assert compare.finished_iterations(tmp_path) is None  # no checkpoints folder yet
