"""Tests of spade_jax.envs.backends.sandbox: isolation detection, the worker pool, the TextEnv proxy,
timeouts and crashes with respawn, attribute access and batched stepping."""

import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # sandbox_helpers sits in tests/envs
from sandbox_helpers import processes_with_uid_in

from spade_jax.envs.backends.sandbox import (
    EnvCrashed,
    EnvError,
    EnvTimeout,
    SandboxConfig,
    SandboxPool,
    SandboxUnavailable,
    detect_isolation,
)

pytestmark = pytest.mark.timeout(120)

PROGRAM = '''
import random
import numpy as np

class CounterEnv:
    max_turns = 6

    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.target = self.rng.randint(0, 99)
        self.grid = np.arange(6).reshape(2, 3) * (seed or 1)
        self.history = (seed, "start")
        self.turn = 0
        return f"target {self.target}", {"grid": self.grid, "seed": seed}

    def step(self, action):
        self.turn += 1
        if action == "hang":
            while True:
                pass
        if action == "crash":
            import ctypes
            ctypes.string_at(0)
        if action == "raise":
            raise ValueError("bad move")
        noise = self.rng.random()
        done = action == str(self.target)
        return f"turn {self.turn} noise {noise:.6f}", float(done), done, self.turn >= self.max_turns, {"turn": self.turn}

    def solution(self):
        return [str(self.target)]
'''  # noqa: E501 (program text, run in the sandbox)


def reference_episode(seed, actions):
    """The same program executed in-process: the independent reference for the sandbox."""
    namespace = {}
    exec(PROGRAM, namespace)
    env = namespace["CounterEnv"]()
    out = [env.reset(seed=seed)[0]]
    for action in actions:
        out.append(env.step(action)[:4])
    return out


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, call_timeout_s=2.0, load_timeout_s=5.0)) as p:
        yield p


def test_detect_isolation_has_all_layers_here():
    report = detect_isolation()
    assert report["backend"] in ("bwrap", "unshare", "none")
    if shutil.which("bwrap"):
        # .ci/run installs bubblewrap and pyseccomp: the tests must run with isolation on.
        assert report["backend"] == "bwrap", report["details"]
        assert report["layers"]["network"] and report["layers"]["filesystem"]
        assert report["layers"]["seccomp"], report["details"]
        assert report["layers"]["unprivileged_uid"]


def test_config_validation():
    with pytest.raises(ValueError, match="call_timeout_s"):
        SandboxConfig(call_timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=16)
    with pytest.raises(ValueError, match="isolation"):
        SandboxConfig(isolation="docker")


def test_refuses_without_isolation_unless_allowed():
    with pytest.raises(SandboxUnavailable, match="allow_unisolated"):
        SandboxPool(SandboxConfig(isolation="none", workers=0))


def test_worker_reports_layers(pool):
    env = pool.load(PROGRAM, "CounterEnv")
    try:
        ready = env._worker.ready
        assert ready["numpy"] is True
        if pool.isolation["layers"]["seccomp"]:
            assert ready["seccomp"] is True
        if os.geteuid() == 0:
            assert ready["uid"] != 0 and ready["euid"] != 0
        assert ready["rlimits"]["as"] == pool.config.memory_mb << 20
    finally:
        env.close()


def test_episode_matches_in_process_reference(pool):
    actions = ["1", "x", "\\boxed{3}", "", "7", "9"]
    env = pool.load(PROGRAM, "CounterEnv")
    try:
        assert env.class_name == "CounterEnv" and env.has_solution and env.max_turns == 6
        for seed in (0, 5):
            got = [env.reset(seed=seed)[0]] + [env.step(a)[:4] for a in actions]
            assert got == reference_episode(seed, actions)
        obs, info = env.reset(seed=2)
        assert info == {"grid": [[0, 2, 4], [6, 8, 10]], "seed": 2}
        assert env.solution() == [obs.split()[-1]]
    finally:
        env.close()


def test_get_and_set_attrs_round_trip(pool):
    env = pool.load(PROGRAM, "CounterEnv")
    try:
        env.reset(seed=4)
        attrs = env.get_attrs()
        reference = random.Random(4)
        assert attrs["target"] == reference.randint(0, 99)
        assert isinstance(attrs["grid"], np.ndarray) and attrs["grid"].dtype == np.arange(1).dtype
        np.testing.assert_array_equal(attrs["grid"], np.arange(6).reshape(2, 3) * 4)
        assert attrs["history"] == (4, "start")
        assert attrs["rng"].getstate() == reference.getstate()
        # Inject a state, then the program continues from it.
        env.set_attrs({"target": 55, "turn": 5, "rng": random.Random(123)})
        obs, reward, terminated, truncated, _ = env.step("55")
        assert (reward, terminated, truncated) == (1.0, True, True)
        assert obs == f"turn 6 noise {random.Random(123).random():.6f}"
    finally:
        env.close()


def test_clone_is_an_independent_instance(pool):
    env = pool.load(PROGRAM, "CounterEnv")
    twin = env.clone()
    try:
        env.reset(seed=1)
        twin.reset(seed=2)
        assert env.get_attrs()["history"] == (1, "start")
        assert twin.get_attrs()["history"] == (2, "start")
        twin.close()
        env.step("x")  # the worker survives closing one of its instances
    finally:
        env.close()


def test_error_in_program_is_one_line_and_env_survives(pool):
    env = pool.load(PROGRAM, "CounterEnv")
    try:
        env.reset(seed=0)
        with pytest.raises(EnvError, match=r"step\(\) raised ValueError: bad move at line \d+") as info:
            env.step("raise")
        assert "\n" not in str(info.value)
        assert not isinstance(info.value, (EnvTimeout, EnvCrashed))
        env.step("x")
    finally:
        env.close()


def test_timeout_kills_and_pool_recovers(pool):
    env = pool.load(PROGRAM, "CounterEnv")
    env.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(EnvTimeout, match="did not return within 2 s"):
        env.step("hang")
    assert time.monotonic() - start < 10
    assert not env.alive
    with pytest.raises(EnvCrashed, match="no longer running"):
        env.step("x")
    env.close()
    fresh = pool.load(PROGRAM, "CounterEnv")
    assert fresh.reset(seed=0)[0] == reference_episode(0, [])[0]
    fresh.close()


def test_crash_is_reported_with_signal(pool):
    env = pool.load(PROGRAM, "CounterEnv")
    env.reset(seed=0)
    with pytest.raises(EnvCrashed, match="SIGSEGV"):
        env.step("crash")
    env.close()


def test_step_many_runs_across_workers_and_matches_sequential(pool):
    envs = [pool.load(PROGRAM, "CounterEnv") for _ in range(3)]
    twin = envs[0].clone()
    try:
        for i, env in enumerate(envs):
            env.reset(seed=i)
        twin.reset(seed=0)
        calls = [(envs[0], "a"), (envs[1], "b"), (twin, "a"), (envs[2], "raise"), (envs[0], "b")]
        results = pool.step_many(calls)
        assert results[0][:4] == reference_episode(0, ["a"])[1]
        assert results[1][:4] == reference_episode(1, ["b"])[1]
        assert results[2][:4] == reference_episode(0, ["a"])[1]  # twin: own instance
        assert isinstance(results[3], EnvError)
        assert results[4][:4] == reference_episode(0, ["a", "b"])[2]
        with pytest.raises(EnvError):
            pool.step_many([(envs[2], "raise")], return_exceptions=False)
    finally:
        twin.close()
        for env in envs:
            env.close()


def test_step_many_parallel_hangs_cost_one_timeout(pool):
    envs = [pool.load(PROGRAM, "CounterEnv") for _ in range(2)]
    for env in envs:
        env.reset(seed=0)
    start = time.monotonic()
    results = pool.step_many([(envs[0], "hang"), (envs[1], "hang")])
    elapsed = time.monotonic() - start
    assert all(isinstance(r, EnvTimeout) for r in results)
    # Bounded: both timeouts ran concurrently (2 s each), not one after the other plus slack.
    assert elapsed < 15
    for env in envs:
        env.close()


def test_input_limits(pool):
    env = pool.load(PROGRAM, "CounterEnv")
    try:
        env.reset(seed=0)
        with pytest.raises(TypeError, match="str"):
            env.step(3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_input_chars"):
            env.step("a" * (pool.config.max_input_chars + 1))
    finally:
        env.close()


def test_close_leaves_no_process():
    config = SandboxConfig(workers=2, call_timeout_s=2.0)
    pool = SandboxPool(config)
    env = pool.load(PROGRAM, "CounterEnv")
    env.reset(seed=0)
    pids = pool.live_pids
    uids = {w.uid for w in pool._idle + list(pool._busy)}
    assert len(pids) >= 2  # the loaded worker and at least one idle spare
    pool.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    if os.geteuid() == 0:
        for uid in uids:
            assert processes_with_uid_in(uid, uid + 1) == []
    with pytest.raises(EnvError):
        env.step("x")


def _unshare_pool(call_timeout_s: float) -> SandboxPool:
    """A pool on the unshare backend without seccomp, or a skip where namespaces cannot be made."""
    try:
        return SandboxPool(SandboxConfig(workers=0, isolation="unshare", seccomp=False, call_timeout_s=call_timeout_s))
    except SandboxUnavailable:
        pytest.skip("unshare cannot create namespaces here")


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_unshare_backend_without_seccomp_still_runs_and_blocks_threads():
    with _unshare_pool(5.0) as pool:
        assert pool.backend == "unshare" and not pool.isolation["layers"]["filesystem"]
        env = pool.load(PROGRAM, "CounterEnv")
        assert env.reset(seed=3)[0] == reference_episode(3, [])[0]
        threaded = pool.load(
            "import threading, time\nclass TEnv:\n    def reset(self, seed=None):\n"
            "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n        return 'x', {}\n"
            "    def step(self, a):\n        return 'x', 0.0, True, False, {}\n",
            "TEnv",
        )
        # Without seccomp a thread can start; the worker notices and dies rather than let it run on.
        with pytest.raises(EnvCrashed, match="single-threaded"):
            threaded.reset(seed=0)
        threaded.close()
        env.close()


@pytest.mark.skipif(not shutil.which("unshare") or os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs unshare, and root for the uid drop")
def test_unshare_worker_imports_numpy_that_sits_under_a_private_folder(tmp_path, monkeypatch):
    """A venv below a 0700 folder (a home, `mktemp -d`): the worker's dropped uid cannot reach it
    (ModuleNotFoundError in the sandbox before the fix); the pool hands the worker its own copy."""
    import spade_jax.envs.backends.sandbox.pool as pool_module

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    moved = tuple(shutil.copytree(d, private / os.path.basename(d)) for d in pool_module._numpy_dirs())
    os.chmod(private, 0o700)
    monkeypatch.setattr(pool_module, "_numpy_dirs", lambda: tuple(map(str, moved)))
    with _unshare_pool(20.0) as pool:
        env = pool.load(
            "import numpy as np\nclass NEnv:\n    def reset(self, seed=None):\n"
            "        return str(int(np.arange(5).sum())), {}\n"
            "    def step(self, a):\n        return 'x', 0.0, True, False, {}\n",
            "NEnv",
        )
        assert env.reset(seed=0)[0] == "10"
        env.close()


def test_forgotten_env_is_killed_when_collected(pool):
    import gc

    from sandbox_helpers import wait_until_gone

    env = pool.load(PROGRAM, "CounterEnv")
    env.reset(seed=0)
    uid, proc = env._worker.uid, env._worker.proc
    del env
    gc.collect()
    proc.wait(timeout=10)
    if os.geteuid() == 0:
        assert wait_until_gone(uid) == []


def test_unicode_and_lone_surrogates_survive_the_pipe(pool):
    env = pool.load(
        "class EchoEnv:\n    def reset(self, seed=None):\n        return 'é ✓ 日本', {}\n"
        "    def step(self, a):\n        return a, 0.0, True, False, {'n': len(a)}\n",
        "EchoEnv",
    )
    try:
        assert env.reset(seed=0) == ("é ✓ 日本", {})
        obs, _, _, _, info = env.step("x \ud800 ✓")
        assert obs == "x ? ✓" and info == {"n": 5}
    finally:
        env.close()
