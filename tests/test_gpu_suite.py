"""benchmarks/gpu_suite.{sh,py}: the GPU figures' script, run here in its CPU dry-run mode (tiny shapes)."""

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "benchmarks" / "gpu_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_reports_every_figure(tmp_path):
    suite = _suite()
    assert suite.main(["--dry-run", "--skip", "selfplay", "--out", str(tmp_path), "--peak-hbm-gbs", "100",
                       "--peak-tflops", "10", "--attention", "dot_product"]) == 0
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert report["dry_run"] is True
    for dtype, tol in (("float32", 1e-4), ("bfloat16", 0.1), ("float32 decode", 1e-4), ("bfloat16 decode", 0.1)):
        diffs = report["attention"][dtype]
        assert set(diffs) == {"einsum", "dot_product", "splash"}
        assert all(isinstance(d, float) and d <= tol for d in diffs.values()), diffs
    decode, train = report["decode"], report["train"]
    assert decode["batch"] == 4 and decode["peak_gbs"] == 100 and decode["attention"] == "dot_product"
    assert decode["weight_bytes"] > 0 and decode["kv_bytes_per_step"] > 0
    assert decode["roofline_share"] is not None
    assert train["loss_finite"] and train["peak_tflops"] == 10 and train["mfu"] is not None


def test_peaks_come_from_the_device_kind():
    suite = _suite()
    assert suite.peaks("NVIDIA H200", None, None) == (4.8e12, 989e12)
    assert suite.peaks("NVIDIA H100 PCIe", None, None)[0] == 2.0e12
    assert suite.peaks("NVIDIA H100 80GB HBM3", None, None)[0] == 3.35e12
    assert suite.peaks("NVIDIA GH200 480GB", None, None)[0] == 4.0e12
    assert suite.peaks("cpu", None, None) == (None, None)
    assert suite.peaks("cpu", 50, 2) == (50e9, 2e12)


def test_model_flops_match_a_hand_count():
    from spade_jax.models.presets import get_preset

    spec = get_preset("qwen3-1.7b")  # 28 layers, width 2048, 16 x 128 query heads, 8 KV heads, MLP 6144
    per_layer = 2048 * 2048 * 2 + 2048 * 1024 * 2 + 3 * 2048 * 6144
    params = 28 * per_layer + 151936 * 2048
    want = 6 * params * 8 * 1024 + 6 * 28 * 2048 * 1024 * 1024 * 8
    assert _suite().train_flops(spec, 8, 1024) == want


@pytest.mark.slow
def test_shell_dry_run_includes_a_selfplay_iteration(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "PYTHON": os.environ.get("PYTHON", "python3")}
    import sys

    env["PYTHON"] = sys.executable
    done = subprocess.run(["bash", "benchmarks/gpu_suite.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert report["selfplay"]["returncode"] == 0 and "plays" in report["selfplay"]["phases_s"]
