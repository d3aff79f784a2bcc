"""Hostile programs against the sandbox: nothing leaks (files, environment variables), nothing
is written on the host, no connection is made, nothing is left running, and we survive."""

import os
import socket
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # sandbox_helpers sits in tests/envs
from sandbox_helpers import corpus_files, processes_with_uid_in, wait_until_gone

from spade_jax.envs.backends.sandbox import EnvError, SandboxConfig, SandboxPool
from spade_jax.envs.validate import ValidationConfig, validate

pytestmark = pytest.mark.timeout(90)

SECRET_FILE = Path("/tmp/spade-sandbox-test-secret.txt")
SECRET_TEXT = "SPADE-FILE-SECRET-" + os.urandom(8).hex()
ENV_SECRET = "SPADE-ENV-SECRET-" + os.urandom(8).hex()
PORT = 47613
# Everything the corpus tries to create on the host.
MARKERS = [
    "/tmp/spade-sandbox-pwned.txt", "/var/tmp/spade-sandbox-pwned.txt", "/dev/shm/spade-sandbox-pwned.txt",
    "/work/main/spade-sandbox-pwned.txt", "/usr/spade-sandbox-pwned.txt", "/spade-sandbox-pwned.txt",
    os.path.expanduser("~/spade-sandbox-pwned.txt"), "/etc/spade-sandbox-pwned.txt",
    "/tmp/spade-sandbox-spawned.txt", "/tmp/spade-sandbox-builtins.txt", "/tmp/spade-sandbox-subclasses.txt",
    "/tmp/spade-sandbox-thread.txt", str(Path(__file__).resolve().parents[4] / "spade-sandbox-pwned.txt"),
]


class Listener:
    """TCP and UDP on 127.0.0.1:PORT; records anything that arrives."""

    def __init__(self):
        self.events = []
        self.tcp = socket.socket()
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", PORT))
        self.tcp.listen(8)
        self.tcp.settimeout(0.2)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", PORT))
        self.udp.settimeout(0.2)
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            for sock, kind in ((self.tcp, "tcp"), (self.udp, "udp")):
                try:
                    if kind == "tcp":
                        conn, addr = sock.accept()
                        self.events.append(("tcp", addr))
                        conn.close()
                    else:
                        data, addr = sock.recvfrom(100)
                        self.events.append(("udp", addr, data))
                except (socket.timeout, OSError):
                    pass

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.tcp.close()
        self.udp.close()


@pytest.fixture(scope="module")
def host():
    SECRET_FILE.write_text(SECRET_TEXT)
    os.environ["SPADE_SANDBOX_TEST_SECRET"] = ENV_SECRET
    for marker in MARKERS:
        assert not os.path.exists(marker), f"stale marker {marker}; remove it"
    try:
        listener = Listener()
    except OSError:
        pytest.skip(f"port {PORT} busy")
    yield listener
    listener.close()
    os.environ.pop("SPADE_SANDBOX_TEST_SECRET", None)
    SECRET_FILE.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def pool(host):
    with SandboxPool(SandboxConfig(workers=1, call_timeout_s=3.0, load_timeout_s=3.0)) as p:
        yield p


def _play_all(pool, source):
    """Run the program directly through the proxy and collect every text it returns."""
    outputs = []
    try:
        env = pool.load(source, "HostileEnv")
    except EnvError as exc:
        return [str(exc)]
    try:
        for call in (lambda: env.reset(seed=0), lambda: env.step("\\boxed{1}"), lambda: env.step("x")):
            try:
                outputs.append(repr(call()))
            except EnvError as exc:
                outputs.append(str(exc))
                break
        if env.alive:
            outputs.append(repr(env.get_attrs()))
    finally:
        env.close()
    return outputs


@pytest.mark.parametrize("path", corpus_files("hostile"), ids=lambda p: p.name)
def test_hostile_program_is_contained(path, host, pool):
    source = path.read_text()
    uids_before = {w.uid for w in pool._idle}
    verdict = validate(source, config=ValidationConfig(step_timeout_s=3.0, budget_s=30.0), pool=pool, backend="sandbox")
    outputs = _play_all(pool, source) + [verdict.to_json()]
    text = "\n".join(outputs)
    # nothing leaks
    assert SECRET_TEXT not in text
    assert ENV_SECRET not in text
    assert "SPADE_SANDBOX_TEST_SECRET" not in text
    # nothing is written on the host
    for marker in MARKERS:
        assert not os.path.exists(marker), f"{path.name} wrote {marker}"
    # no connection is made
    assert host.events == [], host.events
    # nothing is left running: the workers that ran the program are gone
    if os.geteuid() == 0:
        for uid in uids_before:
            assert wait_until_gone(uid) == [], f"{path.name} left processes behind"
    # and the pool still works
    good = pool.load("class OkEnv:\n    def reset(self, seed=None):\n        return 'ok', {}\n"
                     "    def step(self, a):\n        return 'ok', 0.0, True, False, {}\n", "OkEnv")
    assert good.reset(seed=0) == ("ok", {})
    good.close()


def test_file_reads_see_no_host_files(pool, host):
    source = (Path(__file__).resolve().parents[2] / "corpus" / "hostile" / "read_host_files.py").read_text()
    env = pool.load(source, "HostileEnv")
    try:
        obs, _ = env.reset(seed=0)
    finally:
        env.close()
    assert "/tmp/spade-sandbox-test-secret.txt:FileNotFoundError" in obs
    assert "/work/main/pyproject.toml:FileNotFoundError" in obs
    assert "/etc/shadow:FileNotFoundError" in obs


def test_fork_bomb_is_bounded_and_reaped(pool, host):
    source = (Path(__file__).resolve().parents[2] / "corpus" / "hostile" / "fork_bomb.py").read_text()
    env = pool.load(source, "HostileEnv")
    uid = env._worker.uid
    try:
        obs, _ = env.reset(seed=0)
        assert "children=0" in obs  # fork refused outright (seccomp) or bounded by RLIMIT_NPROC
        if os.geteuid() == 0:
            assert len(processes_with_uid_in(uid, uid + 1)) <= pool.config.nproc
    finally:
        env.close()
    if os.geteuid() == 0:
        assert wait_until_gone(uid) == []


def test_fork_bomb_without_seccomp_is_bounded_by_nproc(host):
    if os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC per worker uid needs root to pick the uid")
    config = SandboxConfig(workers=0, seccomp=False, call_timeout_s=3.0, nproc=8)
    with SandboxPool(config) as pool:
        source = (Path(__file__).resolve().parents[2] / "corpus" / "hostile" / "fork_bomb.py").read_text()
        env = pool.load(source, "HostileEnv")
        uid = env._worker.uid
        try:
            try:
                env.reset(seed=0)
            except EnvError:
                pass  # the worker may notice its children and give up
            assert len(processes_with_uid_in(uid, uid + 1)) <= config.nproc
        finally:
            env.close()
        assert wait_until_gone(uid) == []
