"""spade_jax.run.metrics: metrics.jsonl, config.yaml, resume, TensorBoard events and the progress bar
(with the plots and summary.md a RunLogger refreshes)."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
import yaml

from spade_jax.run.metrics import RunLogger, read_metrics


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
        "pool/lib-a/win_rate": 0.25 * i,
        "pool/lib-b/win_rate": 0.5,
        "time/designer": 0.5,
        "time/agent": 1.5,
    }



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
                     "designer_valid_rate.png", "loss.png", "pool_win_rate.png"]
    assert _png_size(tmp_path / "plots" / "loss.png") == (600, 350)

    summary = (tmp_path / "summary.md").read_text()
    assert "- **model**: tiny" in summary
    assert "| loss | 0.25 | 0.25 | 3 |" in summary  # lower loss is better
    assert "| designer/regret_mean | 0.06 | 0.06 | 3 |" in summary
    assert "| agent | 1.500 | 6.0 | 75.0% |" in summary
    assert "![loss](plots/loss.png)" in summary



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
