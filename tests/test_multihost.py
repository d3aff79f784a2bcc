"""Multi-controller runs on one machine: 2 processes x 4 CPU devices (jax.distributed over localhost,
started with the environment `tpu/launch.py local` gives them) against 1 process x 8 CPU devices.
The single-process run is the golden reference; process 0 alone writes the run directory."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spade_jax import distributed
from spade_jax.config import ConfigError, load_config
from spade_jax.mesh import MeshConfig
from spade_jax.placement import make_placement
from spade_jax.run import FollowerLogger
from spade_jax.run.budget import TRAIN_SECONDS

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "multihost_run.py"


def _launch_module():
    spec = importlib.util.spec_from_file_location("tpu_launch_mh", ROOT / "tpu" / "launch.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tpu_launch_mh"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _rows(path: Path) -> list[dict]:
    clocks = ("wall_s", TRAIN_SECONDS)  # wall-clock readings differ run to run
    # and so does memory: a process holds its own shards, a resident set is the process's
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "memory/")) and k not in clocks}
            for line in path.read_text().splitlines()]


def _files(run_dir: Path) -> set[str]:
    """Paths in a run directory, orbax's array storage (named per process and by content) left out."""
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
            if "/state/" not in str(p.relative_to(run_dir)) + "/"}


def test_leader_only_single_process_is_a_plain_call():
    assert distributed.leader_only(lambda: 41 + 1) == 42
    with pytest.raises(KeyError, match="boom"):
        distributed.leader_only(lambda: {}["boom"])
    assert distributed.broadcast_object({"a": [1]}) == {"a": [1]}
    assert distributed.is_leader() and distributed.process_count() == 1


def test_initialize_names_a_missing_coordinator(monkeypatch):
    monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "2")
    monkeypatch.delenv(distributed.ENV_COORDINATOR, raising=False)
    with pytest.raises(ValueError, match="JAX_COORDINATOR_ADDRESS"):
        distributed.initialize()


def test_placement_config_is_checked():
    with pytest.raises(ConfigError, match="mesh.placement='split' is not allowed; choose one of colocated, disagg"):
        load_config("tiny", ["mesh.placement=split"])
    assert load_config("tiny", ["mesh.placement=disaggregated"]).mesh.placement == "disaggregated"
    colocated = make_placement(MeshConfig())
    assert colocated.trainer is colocated.sampler and not colocated.disaggregated
    with pytest.raises(ValueError, match="even number of devices on every host"):
        make_placement(MeshConfig(placement="disaggregated"))  # this test process has one CPU device


def test_gs_run_directory_is_refused_in_one_line(capsys):
    from experiments.run import main

    assert main(["--config", "tiny", "--out", "gs://bucket/runs/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be a filesystem path" in err and "gcsfuse" in err


def test_follower_logger_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with FollowerLogger() as logger:
        assert logger.envs.add("class E: pass", {"env_id": "env00001"}) == "env00001"
        logger.envs.update("env00001", regret=0.5)
        logger.log(0, {"loss": 1.0})
    assert logger.history == [{"iteration": 0, "loss": 1.0}]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    launch = _launch_module()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SPADE_", "XLA_"))}
    base["PYTHONPATH"] = str(ROOT)
    # the flags the two processes get from launch.local_env: ours (tests/conftest.py) and 8 devices
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
    single_env = dict(base, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    args = launch.build_parser().parse_args(["local", "--processes", "2", "--devices", "4",
                                             "--port", str(_free_port())])
    one_cmd = [sys.executable, str(WORKER), str(tmp_path / "one" / "res"), str(tmp_path / "one" / "run")]
    procs = [subprocess.Popen(one_cmd, env=single_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)]
    for pid in range(2):
        env = {k: v for k, v in launch.local_env(args, pid).items()
               if not k.startswith("JAX_") or k in ("JAX_COORDINATOR_ADDRESS", "JAX_PLATFORMS")}
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), str(tmp_path / "two" / "res"), str(tmp_path / "two" / "run")],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [proc.communicate(timeout=900)[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-3000:]

    one = json.loads((tmp_path / "one" / "res" / "proc0.json").read_text())
    two = [json.loads((tmp_path / "two" / "res" / f"proc{i}.json").read_text()) for i in range(2)]
    assert one["devices"] == two[0]["devices"] == 8 and two[1]["processes"] == 2
    for placement in ("colocated", "disaggregated"):
        ref = one[placement]
        for got in (g[placement] for g in two):
            # Train step: the same update up to float reduction order (gloo vs in-process collectives).
            assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
            assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
            assert got["params"] == pytest.approx(ref["params"], rel=1e-5, abs=1e-6)
            # The sampler's copy is the trainer's weights (the transfer when disaggregated).
            assert got["sampler_params"] == got["params"]
            if placement == "disaggregated":
                method, collective = got["both_ways"]
                assert method == "local" and collective == got["params"]
            assert got["tokens"] == ref["tokens"]
            for a, b in zip(got["logprobs"], ref["logprobs"]):
                assert a == pytest.approx(b, abs=1e-5)
            assert got["restored_equal"] and got["restored_trainer"] == {"placement": placement}

    # Two self-play iterations: the same metrics, the same files, all written by process 0 (process 1
    # writes only orbax's own per-process array files under checkpoints/<step>/state/).
    rows_two, rows_one = (_rows(tmp_path / d / "run" / "metrics.jsonl") for d in ("two", "one"))
    assert [sorted(r) for r in rows_two] == [sorted(r) for r in rows_one] and len(rows_one) == 2
    for got, ref in zip(rows_two, rows_one):
        for key, value in ref.items():
            assert got[key] == (pytest.approx(value, rel=1e-5, abs=1e-7) if isinstance(value, float) else value), key
    assert all(r["update/skipped"] == 0 and r["agent/samples"] > 0 for r in rows_one)  # the loop trained
    assert _files(tmp_path / "two" / "run") == _files(tmp_path / "one" / "run")
    assert two[0]["writes"] == []  # audited on processes other than 0 only
    assert two[1]["writes"], "the audit hook saw nothing: it is not watching"
    assert all("/checkpoints/" in w and "/state" in w and "process_1" in w for w in two[1]["writes"]), two[1]["writes"]
    lock = json.loads((tmp_path / "two" / "run" / ".lock").read_text() or "{}")
    assert lock == {}  # released by its holder at the end
