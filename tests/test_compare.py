"""experiments.compare: arms per seed in their own runs at an equal budget, saved rows kept, seeds
aggregated (golden Wilson values worked by hand), plots written, one-line errors."""

import json
import math

import pytest

from experiments import compare
from spade_jax.config import load_config
from spade_jax.evaluation.suites import SUITES
from spade_jax.run import curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TASKS = ("game:GuessTheNumber-v0-hard", "rg:maze")


def _fake_row(arm, seed, rate_by_task):
    tasks = [{"env_id": env_id, "successes": s, "episodes": n} for env_id, (s, n) in zip(TASKS, rate_by_task)]
    rate = sum(s / n for s, n in rate_by_task) / len(rate_by_task)
    return {"arm": arm.label, "key": arm.key, "config": arm.config, "seed": seed, "iterations": 3 if arm.trained else 0,
            "train_seconds": 12.0 + seed if arm.trained else 0.0, "success_rate": rate, "ci_low": 0.0, "ci_high": 1.0,
            "tasks": tasks}


def _fake_metrics(arm, seed):
    records = []
    for i in range(3):
        record = {"iteration": i, "agent/win_rate": 0.1 * i + 0.05 * seed, "agent/win_rate_low": 0.0,
                  "agent/win_rate_high": 0.5, "agent/mean_reward": 0.2 * i, "run/train_s": 4.0 * (i + 1) + seed,
                  "wall_s": 4.0 * (i + 1)}
        if i == 1:
            record.update({"eval/success_rate": 0.3, "eval/success_rate_low": 0.1, "eval/success_rate_high": 0.6})
        if arm.key != "fixed_pool" and i % 2 == 0:
            record.update({"designer/valid_rate": 0.25 + 0.25 * seed, "designer/regret_mean": 0.1 * i})
        if arm.key == "spade" and i == 2:
            record["curriculum/in_band_share"] = 0.5
        records.append(record)
    return records


@pytest.fixture
def fake_score(monkeypatch):
    """Replaces training and evaluation: each call writes a run's metrics and returns a row; calls are listed."""
    calls = []

    def score_arm(arm, seed, config, run_dir, suite, args):
        calls.append((arm.key, seed, run_dir, config))
        if arm.trained:
            run_dir.mkdir(parents=True)  # a second run in the same folder would fail here
            lines = "".join(json.dumps(r) + "\n" for r in _fake_metrics(arm, seed))
            (run_dir / "metrics.jsonl").write_text(lines)
        return _fake_row(arm, seed, [(seed + 1, 5), (1, 5)])

    monkeypatch.setattr(compare, "score_arm", score_arm)
    return calls


def test_each_seed_trains_its_own_run_at_the_same_budget_and_rows_are_kept(tmp_path, fake_score, capsys):
    argv = ["--minutes", "0.5", "--seeds", "0,1", "--out", str(tmp_path), "model.name=tiny"]
    assert compare.main(argv) == 0
    trained = [(key, seed) for key, seed, *_ in fake_score if key != "base"]
    assert trained == [(arm.key, s) for arm in compare.ARMS[1:] for s in (0, 1)]
    assert [(key, seed) for key, seed, *_ in fake_score if key == "base"] == [("base", 0)]  # scored once
    for key, seed, run_dir, config in fake_score:
        assert config.seed == seed and config.max_minutes == 0.5 and config.model.name == "tiny"
        assert config.iterations == compare.MINUTES_ITERATION_CAP  # --minutes makes iterations a cap
        if key != "base":
            assert run_dir == tmp_path / key / f"seed{seed}"
    modes = {key: (config.mode, config.train_designer) for key, _, _, config in fake_score}
    assert modes["fixed_pool"] == ("fixed_pool", False) and modes["spade"] == ("selfplay", True)
    assert modes["frozen_designer"] == ("selfplay", False)

    for name in ("learning_curves.png", "designer.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["rows"]) == 7 and [a["seeds"] for a in results["arms"]] == [[0], [0, 1], [0, 1], [0, 1]]
    assert "| SPADE | 0, 1 | 0.250 [" in (tmp_path / "results.md").read_text()
    capsys.readouterr()

    fake_score.clear()
    assert compare.main(argv) == 0  # nothing trained or evaluated again
    assert fake_score == [] and capsys.readouterr().out.count("kept from") == 7
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == results["rows"]

    # Another budget is another experiment: its rows are made again (here, into a new --out).
    other = tmp_path / "other"
    assert compare.main(["--minutes", "1", "--seeds", "0", "--out", str(other), "model.name=tiny"]) == 0
    assert len(fake_score) == 4


def test_a_saved_row_of_other_settings_is_not_reused(tmp_path, fake_score):
    assert compare.main(["--iterations", "2", "--seeds", "3", "--out", str(tmp_path), "model.name=tiny"]) == 0
    row_file = tmp_path / "rows" / "spade-seed3.json"
    saved = json.loads(row_file.read_text())
    assert saved["settings"]["seed"] == 3 and saved["settings"]["minutes"] is None
    saved["settings"]["iterations"] = 5
    row_file.write_text(json.dumps(saved))
    fake_score.clear()
    (tmp_path / "spade" / "seed3" / "metrics.jsonl").unlink()
    (tmp_path / "spade" / "seed3").rmdir()
    assert compare.main(["--iterations", "2", "--seeds", "3", "--out", str(tmp_path), "model.name=tiny"]) == 0
    assert [(key, seed) for key, seed, *_ in fake_score] == [("spade", 3)]


def test_arms_runs_those_arms_only_and_the_full_command_later_keeps_their_rows(tmp_path, fake_score):
    argv = ["--iterations", "2", "--seeds", "0,1", "--out", str(tmp_path), "model.name=tiny"]
    assert compare.main([*argv, "--arms", "base, spade"]) == 0
    assert [(key, seed) for key, seed, *_ in fake_score] == [("base", 0), ("spade", 0), ("spade", 1)]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [a["arm"] for a in results["arms"]] == ["base model (no training)", "SPADE"]
    fake_score.clear()
    assert compare.main(argv) == 0  # the other arms only
    assert {key for key, *_ in fake_score} == {"fixed_pool", "frozen_designer"} and len(fake_score) == 4


def test_arm_base_runs_the_three_methods_on_one_configs_settings():
    laptop = load_config("laptop")
    configs = {arm.key: load_config(arm.config, ["seed=1", *arm.overrides]) for arm in compare.arms_from_base("laptop")}
    assert (configs["fixed_pool"].mode, configs["fixed_pool"].train_designer) == ("fixed_pool", False)
    assert (configs["spade"].mode, configs["spade"].train_designer) == ("selfplay", True)
    assert (configs["frozen_designer"].mode, configs["frozen_designer"].train_designer) == ("selfplay", False)
    for config in configs.values():
        assert config.group_size == laptop.group_size and config.rl.lr == laptop.rl.lr
        assert config.rl.anchor_coef == laptop.rl.anchor_coef == 1.0 and config.anchor == laptop.anchor
        assert config.rollout.max_turns == laptop.rollout.max_turns and config.env_pool == laptop.env_pool


def test_seeds_are_pooled_into_one_row_per_arm():
    arm = compare.ARMS[2]
    rows = [_fake_row(arm, 0, [(2, 5), (1, 5)]), _fake_row(arm, 1, [(4, 5), (0, 5)])]
    (spade,) = compare.aggregate(rows)
    assert spade["per_seed"] == [pytest.approx(0.3), pytest.approx(0.4)]
    assert spade["success_mean"] == pytest.approx(0.35)
    assert (spade["successes"], spade["episodes"]) == (7, 20)
    # Wilson 95% of 7/20 by hand: p = 0.35, z^2/n = 0.19208, centre (0.35 + 0.09604) / 1.19208 = 0.37417,
    # half 1.95996 / 1.19208 * sqrt(0.35 * 0.65 / 20 + 3.84146 / 1600) = 0.19298.
    assert spade["ci_low"] == pytest.approx(0.181192, abs=1e-6)
    assert spade["ci_high"] == pytest.approx(0.567146, abs=1e-6)
    assert spade["tasks"] == [{"env_id": TASKS[0], "successes": 6, "episodes": 10},
                              {"env_id": TASKS[1], "successes": 1, "episodes": 10}]
    assert spade["train_seconds"] == [12.0, 13.0] and spade["iterations"] == [3, 3]
    table = compare.format_table([spade], "python -m experiments.compare", minutes=20)
    assert "20 training minutes per run" in table
    assert "| SPADE | 0, 1 | 0.350 [0.181, 0.567] | 0.300, 0.400 | 12.0, 13.0 | 3, 3 | 6/10 | 1/10 |" in table
    # One seed, no success: the interval is Wilson's for 0/5 (upper z^2 / (n + z^2) = 0.434482).
    (alone,) = compare.aggregate([_fake_row(arm, 0, [(0, 5)])])
    assert (alone["ci_low"], alone["ci_high"]) == (0.0, pytest.approx(0.434482, abs=1e-6))


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "a,b"], "--seeds must be comma-separated integers"),
    (["--seeds", ","], "--seeds must name at least one seed"),
    (["--seeds", "0,0"], "--seeds must be distinct integers >= 0"),
    (["--seeds=-1"], "--seeds must be distinct integers >= 0"),
    (["--minutes", "0"], "--minutes must be a number of minutes > 0"),
    (["--minutes", "nan"], "--minutes must be a number of minutes > 0"),
    (["--iterations", "0"], "--iterations must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--suite", "nope"], "--suite: unknown suite 'nope'"),
    (["--arm-base", "no_such_config", "model.name=tiny"], "config 'no_such_config' not found"),
    (["--arms", "spade,nope", "model.name=tiny"], "--arms 'spade,nope': choose from base, fixed_pool"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, argv, message, capsys):
    assert compare.main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_out_that_is_a_file_is_one_line_error(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert compare.main(["--out", str(tmp_path / "file"), "model.name=tiny"]) == 2
    err = capsys.readouterr().err
    assert "cannot create" in err and "choose a writable directory" in err and err.count("\n") == 1


def test_train_seconds_sums_the_iterations_asked_for_across_resumes(tmp_path):
    # wall_s counts from each process's start: iterations 0-1 in one, 2-3 in a resumed one (a run from
    # before run/train_s was recorded).
    walls = [10.0, 12.5, 5.0, 8.0]
    lines = [{"iteration": i, "wall_s": w} for i, w in enumerate(walls)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert compare.train_seconds(tmp_path, 2) == 12.5
    assert compare.train_seconds(tmp_path, 4) == 12.5 + 5.0 + 3.0
    assert compare.budget_spent(tmp_path, 4, 20.5 / 60) and not compare.budget_spent(tmp_path, 2, 20.5 / 60)
    assert not compare.budget_spent(tmp_path, 4, None)
    assert compare.finished_iterations(tmp_path) is None  # no checkpoints folder yet


def test_a_run_is_resumed_until_its_iterations_or_its_minutes_are_done(tmp_path, monkeypatch):
    import dataclasses

    import yaml

    from spade_jax.config import ConfigError, to_dict

    done, calls = {}, []

    def train(config, out, *, resume):  # one iteration of 40 s per call
        calls.append((out.name, resume))
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(config)))
        done[out] = done.get(out, 0) + 1
        with (out / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"iteration": done[out] - 1, "run/train_s": 40.0 * done[out]}) + "\n")

    monkeypatch.setattr(compare, "train", train)
    monkeypatch.setattr(compare, "finished_iterations", lambda out: done.get(out))
    config = load_config("tiny", ["iterations=3", "max_minutes=1"])
    timed = tmp_path / "timed"
    assert compare.ensure_trained(config, timed) == 1 and calls == [("timed", False)]  # fresh
    assert compare.ensure_trained(config, timed) == 2 and calls[1:] == [("timed", True)]  # 40 s < 60 s: resumed
    assert compare.ensure_trained(config, timed) == 2 and len(calls) == 2  # 80 s spent: finished
    with pytest.raises(ConfigError, match="holds a run made with other settings; choose another --out"):
        compare.ensure_trained(load_config("tiny", ["iterations=3", "max_minutes=2"]), timed)

    counted = dataclasses.replace(config, iterations=1, max_minutes=None)
    assert compare.ensure_trained(counted, tmp_path / "counted") == 1
    assert compare.ensure_trained(counted, tmp_path / "counted") == 1  # its iterations are done
    assert calls[2:] == [("counted", False)]


def test_t_quantiles_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 40):
        assert curves.t95(df) == pytest.approx(stats.t.ppf(0.975, df) if df <= 30 else stats.norm.ppf(0.975),
                                               abs=1e-5)


def test_curves_average_seeds_per_iteration_with_a_t_band():
    seed0 = [{"iteration": 0, "x": 0.2, "run/train_s": 30.0}, {"iteration": 1, "x": 0.4, "run/train_s": 90.0}]
    seed1 = [{"iteration": 0, "x": 0.4, "run/train_s": 60.0}]
    first, second = curves.curve([seed0, seed1], "x")
    # mean 0.3, sd sqrt(0.02), half-width t(1) * sd / sqrt(2) = 12.706205 * 0.1 = 1.2706205
    assert (first["mean"], first["minutes"], first["seeds"]) == (pytest.approx(0.3), 0.75, 2)
    assert first["low"] == pytest.approx(0.3 - 1.2706205) and first["high"] == pytest.approx(0.3 + 1.2706205)
    assert (second["mean"], second["minutes"], second["seeds"]) == (0.4, 1.5, 1)
    assert math.isnan(second["low"])  # one of two seeds reached it: no band
    # Only where every seed got: the second iteration was reached by seed 0 alone.
    assert [p["iteration"] for p in curves.curve([seed0, seed1], "x", every_seed=True)] == [0]
    # A seed that never logs the key does not count (a run without held-out evaluations).
    assert [p["iteration"] for p in curves.curve([seed0, [{"iteration": 0, "y": 1.0}]], "x", every_seed=True)] == [0, 1]
    # One run: the interval it logged beside the metric.
    (alone,) = curves.curve([[{"iteration": 0, "x": 0.5, "x_low": 0.2, "x_high": 0.8, "wall_s": 1.0}]], "x")
    assert (alone["low"], alone["high"], alone["minutes"]) == (0.2, 0.8, 1.0 / 60)


@pytest.mark.slow
def test_tiny_model_end_to_end_at_an_equal_budget(tmp_path, capsys):
    """Real runs of the random tiny model: each stops after its first iteration (a 6 ms budget), each seed
    in its own run directory with its own checkpoint; a rerun keeps every row and trains nothing."""
    out = tmp_path / "compare"
    argv = ["--minutes", "0.0001", "--seeds", "0,1", "--arm-base", "tiny", "--suite", "small", "--episodes", "1",
            "--batch-size", "3", "--out", str(out), "tensorboard=false"]
    assert compare.main(argv) == 0
    for key in ("fixed_pool", "spade", "frozen_designer"):
        for seed in (0, 1):
            run_dir = out / key / f"seed{seed}"
            assert compare.finished_iterations(run_dir) == 1
            assert load_config(str(run_dir / "config.yaml")).seed == seed
    results = json.loads((out / "results.json").read_text())
    assert [a["iterations"] for a in results["arms"]] == [[0], [1, 1], [1, 1], [1, 1]]
    assert [a["seeds"] for a in results["arms"]] == [[0], [0, 1], [0, 1], [0, 1]]
    tasks = len(SUITES["small"].tasks)  # one episode of each one-turn task per seed
    assert all(a["episodes"] == tasks * len(a["seeds"]) for a in results["arms"])
    for name in ("learning_curves.png", "designer.png"):
        assert (out / name).read_bytes().startswith(PNG_SIGNATURE)
    capsys.readouterr()
    assert compare.main(argv) == 0
    assert capsys.readouterr().out.count("kept from") == 7


def test_defaults_are_three_seeds_and_an_iteration_budget():
    args = compare.parse_args([])
    assert (args.seeds, args.iterations, args.minutes) == ([0, 1, 2], 4, None)
    assert compare.parse_args(["--seed", "5"]).seeds == [5]  # the old single-seed flag still works


def test_the_table_names_the_machines_the_rows_trained_on(tmp_path):
    arm = compare.ARMS[2]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fast = {"cpu": "AMD EPYC", "cores": 2, "cpu_features": ["avx2", "avx512f"], "matmul_gflops": 171.0}
    slow = {"cpu": "AMD EPYC", "cores": 2, "cpu_features": ["avx2"], "matmul_gflops": 90.5}
    (run_dir / "run.json").write_text(json.dumps({"machine": fast, "resumes": [{"machine": slow}, {"time": "t"}]}))
    assert compare.training_machines(run_dir) == [fast, slow]  # a resume without a record is skipped
    assert compare.training_machines(tmp_path / "absent") == []
    rows = [{**_fake_row(arm, 0, [(2, 5), (1, 5)]), "machines": [fast]},
            {**_fake_row(arm, 1, [(4, 5), (0, 5)]), "machines": [{**fast, "matmul_gflops": 160.0}, slow]}]
    table = compare.format_table(compare.aggregate(rows), "python -m experiments.compare", minutes=20)
    assert "The rows were trained on different machines" in table
    assert ("- Trained on AMD EPYC, 2 cores (avx2, avx512f); numpy float32 matmul 160-171 GFLOP/s: "
            "SPADE seed 0; SPADE seed 1.") in table
    assert "- Trained on AMD EPYC, 2 cores (avx2); numpy float32 matmul 90.5 GFLOP/s: SPADE seed 1." in table
    # Rows from before machines were recorded: no paragraph, unless other rows have one.
    old_row = _fake_row(arm, 2, [(2, 5)])
    assert "Trained on" not in compare.format_table(compare.aggregate([old_row]), "cmd")
    base = _fake_row(compare.ARMS[0], 0, [(2, 5)])  # untrained: no machine to record
    mixed = compare.format_table(compare.aggregate([base, rows[0], old_row]), "cmd")
    assert "Not every row recorded its machine" in mixed
    assert "- No machine recorded: SPADE seed 2." in mixed
