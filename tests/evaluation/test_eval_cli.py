"""python -m experiments.eval: usage errors in one line, --out checked before any work, reports never
lost, a run's latest checkpoint restored and its archive checked for duplicates."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from eval_testing import HANOI_REWRITE, _scripted_policy

from spade_jax import evaluation as ev


def test_eval_cli_usage_errors(tmp_path, capsys):
    from experiments import eval as eval_cli

    assert eval_cli.main(["--run", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert eval_cli.main(["--run", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    assert eval_cli.main(["--model", "no-such-model", "--suite", "quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model") and err.count("\n") == 1
    assert eval_cli.main(["--model", "tiny", "--episodes", "0"]) == 2
    assert eval_cli.main(["--model", "tiny", "--tasks", "rg:nope"]) == 2
    assert "has no task 'rg:nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_cli.main(["--model", "tiny", "--run", str(tmp_path)])



@pytest.mark.slow
def test_eval_cli_end_to_end_tiny_model(tmp_path, capsys):
    import json

    from experiments import eval as eval_cli

    out = tmp_path / "report.json"
    code = eval_cli.main(["--model", "tiny", "--suite", "quick", "--episodes", "2",
                          "--tasks", "rg:largest_island,rg:countdown", "--max-new-tokens", "4",
                          "--no-progress", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["source"] == {"model": "tiny"}
    assert [t["env_id"] for t in report["tasks"]] == ["rg:largest_island", "rg:countdown"]
    assert all(t["episodes"] == 2 for t in report["tasks"]) and len(report["episodes"]) == 4
    assert "macro average" in capsys.readouterr().out



def test_load_run_restores_latest_checkpoint_params(tmp_path):
    import jax
    import yaml
    from flax import nnx

    from experiments import eval as eval_cli
    from spade_jax.models.registry import load_model
    from spade_jax.rl.config import RLConfig
    from spade_jax.rl.train import make_train_step
    from spade_jax.run.checkpoint import Checkpointer

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"model": {"name": "tiny"}, "rl": {"grad_clip": None, "lr": 1e-5}}))
    model = load_model("tiny").model
    step_fn = make_train_step(model, RLConfig(grad_clip=None, lr=1e-5), verbose=False)
    state = step_fn.init(model)
    # Stand-in for training: params the fresh random init does not have.
    trained = state.replace(params=jax.tree.map(lambda x: x * 0.5 + 0.25, state.params))
    with Checkpointer(tmp_path / "checkpoints", async_save=False) as ckpt:
        ckpt.save(1, state, {"iteration": 1}, force=True)
        ckpt.save(2, trained, {"iteration": 2}, force=True)

    loaded, source = eval_cli.load_run(tmp_path)
    assert source == {"run": str(tmp_path), "model": "tiny", "checkpoint_step": 2, "iteration": 2}
    got = nnx.to_pure_dict(nnx.state(loaded.model, nnx.Param))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(trained.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=0)

    empty = tmp_path / "fresh"
    empty.mkdir()
    (empty / "config.yaml").write_text(yaml.safe_dump({"model": {"name": "tiny"}}))
    with pytest.raises(eval_cli.UsageError, match="no checkpoints/ yet"):
        eval_cli.load_run(empty)



def test_run_archive_duplicates(tmp_path):
    from experiments import eval as eval_cli
    from spade_jax.run import EnvArchive

    archive = EnvArchive(tmp_path)
    hanoi = archive.add(HANOI_REWRITE, {"iteration": 0, "valid": True})
    archive.add((Path(ev.__file__).parent.parent / "envs" / "library" / "grid_maze.py").read_text(),
                {"iteration": 0, "valid": True})
    flags = eval_cli._run_duplicates(tmp_path, ev.get_suite("quick"))
    assert [(f["env_id"], f["eval_env"]) for f in flags] == [(hanoi, "game:TowerofHanoi-v0-easy")]
    assert eval_cli._run_duplicates(tmp_path / "none", ev.get_suite("quick")) == []



def _no_model_load(*_args, **_kwargs):
    raise AssertionError("the --out check must come before loading a model")



def test_eval_cli_out_is_checked_before_any_work(tmp_path, capsys, monkeypatch):
    from experiments import eval as eval_cli

    monkeypatch.setattr(eval_cli, "_load_policy", _no_model_load)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        (tmp_path, "is a directory"),  # --out names a file; a directory is refused
        (a_file / "report.json", "is not a directory"),
        (a_file / "deeper" / "report.json", "is not a directory"),
    ]
    if Path("/proc/self").is_dir():
        cases += [(Path("/proc/eval.json"), "is not writable"), (Path("/proc/no/such/eval.json"), "cannot create")]
    for out, needle in cases:
        assert eval_cli.main(["--model", "tiny", "--suite", "quick", "--out", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out {out}") and needle in err and err.count("\n") == 1, err
    # A --run whose default report path cannot be written fails before the checkpoint is read.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "eval_quick.json").mkdir()
    assert eval_cli.main(["--run", str(run_dir), "--suite", "quick"]) == 2
    assert "eval_quick.json is a directory" in capsys.readouterr().err



def test_eval_cli_unwritable_directory_is_refused(tmp_path, capsys, monkeypatch):
    import tempfile

    from experiments import eval as eval_cli

    monkeypatch.setattr(eval_cli, "_load_policy", _no_model_load)

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    out = tmp_path / "report.json"
    assert eval_cli.main(["--model", "tiny", "--suite", "quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {out} is not writable (Read-only file system); choose another path\n"



def _scripted_cli_run(monkeypatch, eval_cli):
    monkeypatch.setattr(eval_cli, "_load_policy",
                        lambda args: (_scripted_policy({}), {"model": "scripted"}))
    return ["--model", "scripted", "--suite", "quick", "--episodes", "1", "--tasks",
            "game:TowerofHanoi-v0-easy", "--no-progress"]



def test_eval_cli_writes_report_and_makes_missing_parents(tmp_path, capsys, monkeypatch):
    import json

    from experiments import eval as eval_cli

    args = _scripted_cli_run(monkeypatch, eval_cli)
    out = tmp_path / "new" / "deeper" / "report.json"
    assert eval_cli.main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["source"] == {"model": "scripted"} and len(report["episodes"]) == 1
    assert f"wrote {out}" in capsys.readouterr().out
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.json"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # readable as any new file, not mkstemp's 0600



def test_eval_cli_report_is_never_lost_when_writing_fails(tmp_path, capsys, monkeypatch):
    import json

    from experiments import eval as eval_cli

    args = _scripted_cli_run(monkeypatch, eval_cli)

    def disk_full(out, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(eval_cli, "_write_report", disk_full)
    out = tmp_path / "report.json"
    assert eval_cli.main([*args, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out[captured.out.index("\n{") + 1:])
    assert report["source"] == {"model": "scripted"} and len(report["episodes"]) == 1
    assert captured.err == (f"error: cannot write {out} (No space left on device); "
                            "the JSON report is on stdout above\n")
    assert not out.exists()



@pytest.mark.parametrize("text,needle", [
    ("model: {name: tiny\n", "is not valid YAML (line"),
    (b"\xff\xfe\x00", "cannot read"),
    ("- a list\n", "is not a mapping"),
])
def test_eval_cli_broken_run_config_names_the_file(tmp_path, capsys, text, needle):
    from experiments import eval as eval_cli

    config = tmp_path / "config.yaml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert eval_cli.main(["--run", str(tmp_path), "--suite", "quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(config) in err and needle in err and err.count("\n") == 1, err


def test_train_suite_tasks_keep_the_commas_of_their_constants(tmp_path, capsys):
    import json

    from experiments import eval as eval_cli

    out = tmp_path / "train.json"
    code = eval_cli.main(["--model", "tiny", "--suite", "train", "--episodes", "1", "--max-turns", "1",
                          "--env-pool", "library:odd_one_out(ROUNDS=2, CHOICES=3), code_breaker",
                          "--tasks", "lib:odd_one_out(ROUNDS=2,CHOICES=3)", "--max-new-tokens", "2",
                          "--no-progress", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert [t["env_id"] for t in report["tasks"]] == ["lib:odd_one_out(ROUNDS=2,CHOICES=3)"]
    assert eval_cli.main(["--model", "tiny", "--suite", "small", "--env-pool", "library:code_breaker"]) == 2
    assert "--suite train only" in capsys.readouterr().err
