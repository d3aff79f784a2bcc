"""experiments.curves: run directories in, the learning-curve PNG and a per-iteration table out (the band
checked against scipy's t interval), one-line errors for what is not a run."""

import json

import numpy as np
import pytest
from scipy import stats

from experiments import curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(tmp_path, name, win_rates):
    run = tmp_path / name
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for i, rate in enumerate(win_rates):
            f.write(json.dumps({"iteration": i, "agent/win_rate": rate, "agent/mean_reward": rate / 2,
                                "run/train_s": 60.0 * (i + 1), "wall_s": 60.0 * (i + 1)}) + "\n")
    return str(run)


def test_writes_the_png_and_a_table_with_the_t_band_over_seeds(tmp_path, capsys):
    rates = [[0.2, 0.4], [0.3, 0.5], [0.1, 0.45]]
    runs = [_run(tmp_path, f"s{i}", r) for i, r in enumerate(rates)]
    out = tmp_path / "c.png"
    assert curves.main(runs + ["--label", "laptop", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    printed = capsys.readouterr().out
    last = np.array([r[1] for r in rates])
    low, high = stats.t.interval(0.95, df=2, loc=last.mean(), scale=stats.sem(last))
    assert f"| laptop | 1 | 3 | 2.0 | {last.mean():.3f} [{low:.3f}, {high:.3f}] |" in printed


def test_a_seed_that_stopped_early_counts_where_it_reached(tmp_path, capsys):
    runs = [_run(tmp_path, "a", [0.2, 0.4, 0.6]), _run(tmp_path, "b", [0.3])]
    assert curves.main(["--arm", f"fp={runs[0]},{runs[1]}", "--out", str(tmp_path / "c.png")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| fp |")]
    assert [row.split("|")[3].strip() for row in rows] == ["2", "1", "1"]


@pytest.mark.parametrize("make", [lambda p: str(p / "missing"), lambda p: str(p)])
def test_not_a_run_directory_is_one_line(tmp_path, capsys, make):
    assert curves.main([make(tmp_path), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "metrics.jsonl" in err


def _report(tmp_path, **fields):
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"source": {"model": "smollm2-135m-instruct"}, "suite": "small", **fields}))
    return str(path)


def test_a_baseline_report_is_drawn_on_the_held_out_panels(tmp_path, capsys):
    run = _run(tmp_path, "s0", [0.2, 0.4])  # logged no held-out success: the baseline alone adds the row
    out, out_plain = tmp_path / "c.png", tmp_path / "plain.png"
    base = _report(tmp_path, success_rate=0.428, ci_low=0.379, ci_high=0.477)
    assert curves.main([run, "--baseline", base, "--out", str(out)]) == 0
    assert curves.main([run, "--out", str(out_plain)]) == 0
    from PIL import Image

    # Three rows of panels with the baseline, two without it.
    assert Image.open(out).size[1] > Image.open(out_plain).size[1]
    assert curves._baseline(tmp_path / "base.json").label == "smollm2-135m-instruct on small"


@pytest.mark.parametrize("content", ["not json", json.dumps({"suite": "small"}),
                                     json.dumps({"success_rate": 0.9, "ci_low": 0.1, "ci_high": 0.5}),
                                     json.dumps({"success_rate": "x", "ci_low": 0, "ci_high": 1})])
def test_a_bad_baseline_is_one_line(tmp_path, capsys, content):
    run = _run(tmp_path, "s0", [0.2])
    (tmp_path / "base.json").write_text(content)
    assert curves.main([run, "--baseline", str(tmp_path / "base.json"), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --baseline") and "\n" not in err
    assert not (tmp_path / "c.png").exists()


def test_a_missing_baseline_is_one_line(tmp_path, capsys):
    run = _run(tmp_path, "s0", [0.2])
    assert curves.main([run, "--baseline", str(tmp_path / "nope.json"), "--out", str(tmp_path / "c.png")]) == 2
    assert "cannot read" in capsys.readouterr().err
