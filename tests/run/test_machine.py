"""run.json names the machine of each start and resume: CPU, cores, vector features, a measured matmul rate."""

import json
import platform

import pytest
import yaml

from spade_jax.config import load_config, to_dict
from spade_jax.run import RunDir, machine

X86 = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16
processor\t: 1
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16
"""
ARM64 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes sha2 bf16
"""


@pytest.mark.parametrize("cpuinfo, cpu, features", [
    (X86, "AMD EPYC 9B14", ["avx2", "avx512f", "avx512_bf16"]),
    (ARM64, None, []),  # no model name line: the platform's own name
])
def test_the_cpu_and_its_vector_features_come_from_proc_cpuinfo(tmp_path, monkeypatch, cpuinfo, cpu, features):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    monkeypatch.setattr(machine, "CPUINFO", path)
    found = machine.describe(matmul_size=64)
    assert found["cpu_features"] == features
    assert found["cpu"] == (cpu or platform.processor() or platform.machine())
    assert found["cores"] >= 1 and found["matmul_gflops"] > 0
    assert "accelerator" not in found  # the tests' JAX runs on the CPU


def test_no_proc_cpuinfo_still_describes_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "absent")
    found = machine.describe(matmul_size=64)
    assert found["cpu"] and found["cpu_features"] == []


def test_the_matmul_rate_is_two_n_cubed_over_the_fastest_of_three(monkeypatch):
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 3.0])  # 0.5 s, 0.25 s, 1.0 s
    monkeypatch.setattr(machine.time, "perf_counter", lambda: next(ticks))
    assert machine._matmul_rate(100) == pytest.approx(2 * 100**3 / 0.25)


def test_summary_is_one_line():
    described = {"cpu": "AMD EPYC", "cores": 2, "cpu_features": ["avx2"], "matmul_gflops": 95.04}
    assert machine.summary(described) == "AMD EPYC, 2 cores (avx2), numpy float32 matmul 95.04 GFLOP/s"
    bare = {"cpu": "Ampere", "cores": 4, "cpu_features": [], "matmul_gflops": None, "accelerator": "8 x TPU v5 lite"}
    assert machine.summary(bare) == "Ampere, 4 cores (no AVX2), 8 x TPU v5 lite"


def test_a_start_and_each_resume_record_their_machine(tmp_path, monkeypatch):
    described = iter([{"cpu": "first", "cores": 2}, {"cpu": "second", "cores": 16}])
    monkeypatch.setattr("spade_jax.run.directory.describe_machine", lambda: next(described))
    out = tmp_path / "run"
    with RunDir(out, resume=False, config_name="tiny") as run_dir:
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(load_config("tiny"))))
        run_dir.mark_progress()
    with RunDir(out, resume=True, overrides=["iterations=3"]) as run_dir:
        run_dir.record_resume()
    record = json.loads((out / "run.json").read_text())
    assert record["machine"] == {"cpu": "first", "cores": 2}
    assert record["resumes"][0]["machine"] == {"cpu": "second", "cores": 16}
    assert record["resumes"][0]["overrides"] == ["iterations=3"]


def test_the_real_description_is_json(tmp_path):
    found = machine.describe(matmul_size=128)
    assert json.loads(json.dumps(found)) == found
    # A float32 matmul rate: no CPU reaches 1e5 GFLOP/s.
    assert 0 < found["matmul_gflops"] < 1e5
