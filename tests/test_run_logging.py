"""Run directory output of spade_jax.logging: metrics, resume, TensorBoard, plots, summary,
env archive, phase timer and package logging."""

from __future__ import annotations

import importlib
import json
import logging
import struct
import time
import zlib

import numpy as np
import pytest
import yaml

from spade_jax.logging import EnvArchive, PhaseTimer, RunLogger, read_metrics, setup_logging


def _png_size(path):
    """Width and height from the PNG IHDR chunk, read independently of matplotlib."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and zlib.crc32(data[12:16 + length]) == struct.unpack(
        ">I", data[16 + length:20 + length])[0]
    return struct.unpack(">II", data[16:24])


def _metrics(i):
    return {
        "loss": 1.0 / (i + 1),
        "agent/win_rate": np.float32(0.1 * i),
        "designer/valid_rate": 0.5,
        "designer/regret_mean": 0.02 * i,
        "memory/size": i * 3,
        "agent/win_rate_per_env": np.array([0.5, 0.25]),
        "time/designer": 0.5,
        "time/agent": 1.5,
    }


def test_stdlib_logging_is_not_shadowed():
    # The package module is reachable only as a submodule; plain `import logging` is stdlib.
    assert logging.__name__ == "logging" and hasattr(logging, "getLogger")
    package_logging = importlib.import_module("spade_jax.logging")
    assert package_logging is not logging
    assert package_logging.logging is logging


def test_metrics_config_plots_summary(tmp_path):
    config = {"model": {"name": "tiny"}, "rl": {"lr": 1e-6, "betas": (0.9, 0.98)}}
    with RunLogger(tmp_path, config, tensorboard=False, progress=False, plot_every=100) as run:
        for i in range(4):
            run.log(i, _metrics(i))
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {
        "model": {"name": "tiny"}, "rl": {"lr": 1e-6, "betas": [0.9, 0.98]}}
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["iteration"] for r in records] == [0, 1, 2, 3]
    assert records[3]["agent/win_rate"] == pytest.approx(0.3, abs=1e-6)
    assert records[2]["memory/size"] == 6
    assert records[0]["agent/win_rate_per_env"] == [0.5, 0.25]
    assert {"time/designer", "time/agent", "wall_s"} <= set(records[0])

    plots = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    # in-band share was never logged, so it gets no figure.
    assert plots == ["agent_win_rate.png", "designer_regret_mean.png",
                     "designer_valid_rate.png", "loss.png"]
    assert _png_size(tmp_path / "plots" / "loss.png") == (600, 350)

    summary = (tmp_path / "summary.md").read_text()
    assert "- **model**: tiny" in summary
    assert "| loss | 0.25 | 0.25 | 3 |" in summary  # lower loss is better
    assert "| designer/regret_mean | 0.06 | 0.06 | 3 |" in summary
    assert "| agent | 1.500 | 6.0 | 75.0% |" in summary
    assert "![loss](plots/loss.png)" in summary


def test_summary_shows_env_errors_by_kind_and_skipped_updates(tmp_path):
    errors = [(0, 0, 0), (3, 1, 0), (0, 0, 0), (2, 0, 1)]  # (exception, timeout, sandbox_died) per iteration
    with RunLogger(tmp_path, {}, tensorboard=False, progress=False, plot_every=100) as run:
        for i, (raised, timed_out, died) in enumerate(errors):
            run.log(i, {"loss": 1.0, "agent/env_errors": raised + timed_out + died,
                        "agent/env_errors/exception": raised, "agent/env_errors/timeout": timed_out,
                        "agent/env_errors/sandbox_died": died, "train/skipped": int(i == 2)})
    summary = (tmp_path / "summary.md").read_text()
    assert "## Failures" in summary
    assert "| plays whose environment failed | 7 | 2 iterations, last 3 |" in summary
    assert "| ... the program raised | 5 | 2 iterations, last 3 |" in summary
    assert "| ... a call timed out | 1 | 1 iterations, last 1 |" in summary
    assert "| ... the sandbox worker died | 1 | 1 iterations, last 3 |" in summary
    assert "| updates skipped as non-finite | 1 | 1 iterations, last 2 |" in summary
    assert "| agent/env_errors | 3 | 0 | 0 |" in summary  # fewer failures is better


def test_summary_has_no_failures_section_without_failure_metrics(tmp_path):
    with RunLogger(tmp_path, {}, tensorboard=False, progress=False, plot_every=100) as run:
        run.log(0, {"loss": 1.0})
    assert "## Failures" not in (tmp_path / "summary.md").read_text()


def test_resume_truncates_later_iterations(tmp_path):
    run = RunLogger(tmp_path, {}, tensorboard=False, progress=False)
    for i in range(5):
        run.log(i, {"loss": float(i)})
    run.close()
    # A crash left a torn last line; the reader must skip it.
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 5, "lo')
    resumed = RunLogger(tmp_path, {}, tensorboard=False, progress=False, start_iteration=3)
    with pytest.raises(ValueError, match="already logged"):
        resumed.log(2, {"loss": 9.0})
    resumed.log(3, {"loss": 30.0})
    resumed.log(4, {"loss": 40.0})
    resumed.close()
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["loss"] for r in records] == [0.0, 1.0, 2.0, 30.0, 40.0]


def _read_scalars(event_file):
    """(tag, step, value) of every scalar in a TFRecord event file, parsed record by record."""
    from tensorboardX.proto import event_pb2

    data = event_file.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        payload = data[pos + 12:pos + 12 + length]
        pos += 12 + length + 4  # length, its crc, payload, payload crc
        event = event_pb2.Event.FromString(payload)
        for value in event.summary.value:
            out.append((value.tag, event.step, value.simple_value))
    return out


def test_tensorboard_events_readable(tmp_path):
    with RunLogger(tmp_path, {}, tensorboard=True, progress=False) as run:
        for i in range(3):
            run.log(i, {"loss": float(10 - i), "agent/win_rate": 0.25 * i, "note": "text"})
    files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    scalars = _read_scalars(files[0])
    assert [(s, v) for t, s, v in scalars if t == "loss"] == [(0, 10.0), (1, 9.0), (2, 8.0)]
    assert [(s, v) for t, s, v in scalars if t == "agent/win_rate"] == [
        (0, 0.0), (1, 0.25), (2, 0.5)]
    assert not any(t == "note" for t, _, _ in scalars)


def test_progress_bar_on_stderr(tmp_path, capsys):
    with RunLogger(tmp_path, {}, tensorboard=False, progress=True, total_iterations=2) as run:
        run.log(0, {"loss": 0.5, "agent/win_rate": 0.25})
        run.log(1, {"loss": 0.25, "agent/win_rate": 0.5})
    err = capsys.readouterr().err
    assert "2/2" in err and "win_rate=0.5" in err


def test_env_archive_add_update_and_summary(tmp_path):
    archive = EnvArchive(tmp_path)
    a = archive.add("class AEnv: pass\n", {"verdict": "valid", "backend": "jax", "iteration": 0,
                                           "skill": "spatial reasoning", "hint": "go left"})
    b = archive.add("class BEnv: pass\n", {"verdict": "invalid", "backend": None,
                                           "errors": ["no reset"], "iteration": 1})
    archive.update(a, regret=0.3, win_rate=0.5)
    archive.update(a, win_rate=0.75)
    assert a != b and (tmp_path / "envs" / f"{a}.py").read_text() == "class AEnv: pass\n"
    entries = archive.read_index()
    assert [e["env_id"] for e in entries] == [a, b]
    assert entries[0]["regret"] == 0.3 and entries[0]["win_rate"] == 0.75
    assert entries[1]["errors"] == ["no reset"] and entries[1]["regret"] is None
    with pytest.raises(ValueError, match="at least one field"):
        archive.update(a)

    # Callers may name the id (self-play updates by its own ids); `valid` sets the verdict.
    named = archive.add("class DEnv: pass\n", {"env_id": "env00007", "valid": False, "iteration": 0})
    assert named == "env00007"
    archive.update("env00007", regret=0.5)
    entry = next(e for e in archive.read_index() if e["env_id"] == "env00007")
    assert entry["verdict"] == "invalid" and entry["regret"] == 0.5
    with pytest.raises(ValueError, match="already in the archive"):
        archive.add("x", {"env_id": "env00007"})
    with pytest.raises(ValueError, match="must be letters"):
        archive.add("x", {"env_id": "../escape"})

    run = RunLogger(tmp_path, {}, tensorboard=False, progress=False)
    run.log(0, {"loss": 1.0})
    run.close()
    summary = (tmp_path / "summary.md").read_text()
    assert "- programs: 3" in summary
    assert "- verdicts: invalid: 2, valid: 1" in summary
    assert "- mean regret: 0.4" in summary

    # Resuming at iteration 1 forgets the program of iteration 1 (it is generated again).
    resumed = EnvArchive(tmp_path, start_iteration=1)
    assert [e["env_id"] for e in resumed.read_index()] == [a, "env00007"]
    assert not (tmp_path / "envs" / f"{b}.py").exists()
    c = resumed.add("class CEnv: pass\n", {"iteration": 1})
    assert [e["env_id"] for e in resumed.read_index()] == [a, "env00007", c]
    assert resumed.source(c) == "class CEnv: pass\n" and resumed.source(a) == "class AEnv: pass\n"


def test_phase_timer():
    timer = PhaseTimer()
    with timer.phase("designer"):
        time.sleep(0.01)
    with timer.phase("designer"):
        pass
    with pytest.raises(RuntimeError):
        with timer.phase("agent"):
            raise RuntimeError("boom")
    out = timer.pop()
    assert set(out) == {"time/designer", "time/agent"}
    assert out["time/designer"] >= 0.01
    assert timer.pop() == {}
    with pytest.raises(ValueError, match="phase name"):
        with timer.phase("a/b"):
            pass


def test_setup_logging_writes_run_log(tmp_path, capsys):
    logger = setup_logging(tmp_path)
    setup_logging(tmp_path)  # idempotent: no doubled lines
    logging.getLogger("spade_jax.selfplay").info("iteration %d done", 7)
    for handler in logger.handlers:
        handler.flush()
    text = (tmp_path / "run.log").read_text()
    assert text.count("iteration 7 done") == 1 and "INFO spade_jax.selfplay" in text
    assert capsys.readouterr().err.count("iteration 7 done") == 1
    setup_logging(None)  # detach the file handler before tmp_path goes away
