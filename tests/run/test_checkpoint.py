"""Orbax checkpoints: round trip, keep-last-K, half-written saves ignored, digests verified, damaged ones
skipped and named, resume after a kill."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rl"))
from rl_testing import make_train_batch, tiny_decoder

from spade_jax.rl import RLConfig, make_train_step
from spade_jax.run.checkpoint import Checkpointer, CheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def trained():
    model = tiny_decoder(0)
    init, step = make_train_step(model, RLConfig(lr=1e-2), verbose=False)
    state = init(model)
    state, _ = step(state, make_train_batch(0))
    return model, step, state


def _leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_then_identical_next_step(trained, tmp_path):
    model, step, state = trained
    trainer = {"iteration": 1, "memory": [{"regret": 0.25, "skill": "logic"}], "loader": [3, 7]}
    copy = jax.tree.map(lambda x: np.array(x), state)
    doomed = jax.tree.map(jax.numpy.copy, state)
    with Checkpointer(tmp_path, keep=2, async_save=True) as ckpt:
        assert ckpt.save(1, doomed, trainer)
        # save() returned after copying off the device: deleting the buffers (as donation does) is safe.
        for leaf in jax.tree.leaves(doomed):
            leaf.delete()
        ckpt.wait()
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 1
        restored, extra = ckpt.restore(step.abstract_state(model))
    assert extra == trainer
    _leaves_equal(restored, copy)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    batch = make_train_batch(1)
    _, m1 = step(restored, batch)
    _, m2 = step(jax.tree.map(jax.numpy.asarray, copy), batch)
    assert {k: float(v) for k, v in m1.items()} == {k: float(v) for k, v in m2.items()}


def test_save_interval_and_keep_last(trained, tmp_path):
    _, _, state = trained
    with Checkpointer(tmp_path, keep=2, save_every=3) as ckpt:
        saved = [s for s in range(1, 11) if ckpt.save(s, state, {"s": s})]
        ckpt.wait()
        assert saved == [3, 6, 9]
        assert ckpt.all_steps() == [6, 9]


def test_half_written_checkpoint_is_ignored(trained, tmp_path):
    model, step, state = trained
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state, {"ok": True})
    # What a save killed before its rename leaves behind.
    tmp = tmp_path / "2.orbax-checkpoint-tmp-1712345678"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "garbage").write_bytes(b"\x00" * 100)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 1
        _, extra = ckpt.restore(step.abstract_state(model))
    assert extra == {"ok": True}


def _data_files(step_dir):
    """The largest file of a checkpoint's state item (where the arrays' bytes live)."""
    files = [os.path.join(root, name) for root, _, names in os.walk(step_dir / "state") for name in names]
    return sorted(files, key=os.path.getsize)[::-1]


def _flip_bytes(path, offset_fraction=0.5, count=16):
    with open(path, "r+b") as f:
        size = os.path.getsize(path)
        f.seek(int(size * offset_fraction))
        data = f.read(count)
        f.seek(int(size * offset_fraction))
        f.write(bytes(b ^ 0xFF for b in data))


def _save_two(state, directory):
    with Checkpointer(directory, keep=None) as ckpt:
        ckpt.save(1, state, {"at": 1})
        ckpt.save(2, state, {"at": 2}, force=True)


def test_digest_written_for_every_finished_save(trained, tmp_path):
    _, _, state = trained
    _save_two(state, tmp_path)
    for step in ("1", "2"):
        digest = json.loads((tmp_path / step / "digest.json").read_text())
        hashed = set(digest["files"])
        on_disk = {os.path.relpath(os.path.join(r, n), tmp_path / step)
                   for r, _, ns in os.walk(tmp_path / step) for n in ns} - {"digest.json"}
        assert hashed == on_disk and any(name.startswith("state/") for name in hashed)


def test_keep_one_writes_each_digest_before_the_save_that_deletes_its_checkpoint(trained, tmp_path, monkeypatch):
    # With keep=1, save N's finalisation deletes checkpoint N-1; a digest still being written there then
    # raced orbax's rmtree ("Directory not empty") and killed a run. A slow digest makes the race certain.
    from spade_jax.run import checkpoint as checkpoint_module

    _, _, state = trained
    slow_write = checkpoint_module.write_digest

    def write_digest(step_dir):
        time.sleep(0.3)
        slow_write(step_dir)

    monkeypatch.setattr(checkpoint_module, "write_digest", write_digest)
    digested_before_save = []
    with Checkpointer(tmp_path, keep=1) as ckpt:
        manager_save = ckpt._manager.save

        def save(step, *args, **kwargs):
            if step > 1:
                digested_before_save.append((tmp_path / str(step - 1) / "digest.json").is_file())
            return manager_save(step, *args, **kwargs)

        monkeypatch.setattr(ckpt._manager, "save", save)
        for step in (1, 2, 3):
            assert ckpt.save(step, state, {"at": step})
        ckpt.wait()
        assert ckpt.all_steps() == [3]
    assert digested_before_save == [True, True]
    assert (tmp_path / "3" / "digest.json").is_file() and not (tmp_path / "2").exists()


def test_flipped_bytes_are_caught_and_the_newest_intact_checkpoint_restored(trained, tmp_path, caplog):
    model, step, state = trained
    _save_two(state, tmp_path)
    _flip_bytes(_data_files(tmp_path / "2")[0])
    with Checkpointer(tmp_path) as ckpt:
        with pytest.raises(CheckpointError) as err:  # asked for exactly the damaged one
            ckpt.restore(step.abstract_state(model), step=2)
        message = str(err.value)
        assert "\n" not in message and str(tmp_path / "2") in message and "digest" in message
        with caplog.at_level("WARNING", logger="spade_jax.run.checkpoint"):
            restored, extra = ckpt.restore(step.abstract_state(model))  # the newest intact one
    assert extra == {"at": 1}
    _leaves_equal(restored.params, state.params)
    assert any("damaged" in r.message and str(tmp_path / "2") in r.message for r in caplog.records)
    assert (tmp_path / "2").is_dir()  # reported, not deleted


def test_quarantine_moves_the_damaged_checkpoint_aside_so_its_step_can_be_saved_again(trained, tmp_path):
    model, step, state = trained
    directory = tmp_path / "checkpoints"
    _save_two(state, directory)
    _flip_bytes(_data_files(directory / "2")[0])
    with Checkpointer(directory, keep=None) as ckpt:
        _, extra = ckpt.restore(step.abstract_state(model), quarantine=True)
        assert extra == {"at": 1} and ckpt.all_steps() == [1]
        ckpt.save(2, state, {"at": "2 again"}, force=True)
    moved = os.listdir(tmp_path / "checkpoints-damaged")
    assert len(moved) == 1 and moved[0].startswith("2-")
    with Checkpointer(directory) as ckpt:
        assert ckpt.restore(step.abstract_state(model))[1] == {"at": "2 again"}


def test_non_finite_values_without_a_digest_are_not_restored(trained, tmp_path):
    """A checkpoint written before digests existed (or whose run died before writing the digest)
    is still checked for NaN/inf weights."""
    model, step, state = trained
    poisoned = state.replace(params=jax.tree.map(lambda x: x * np.nan, state.params))
    with Checkpointer(tmp_path, keep=None) as ckpt:
        ckpt.save(1, state, {"at": 1})
        ckpt.save(2, poisoned, {"at": 2}, force=True)
    os.remove(tmp_path / "2" / "digest.json")
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore(step.abstract_state(model))[1] == {"at": 1}


def test_unreadable_checkpoints_give_one_line_errors(trained, tmp_path):
    model, step, state = trained
    _save_two(state, tmp_path)
    for step_dir in ("1", "2"):
        for root, _, files in os.walk(tmp_path / step_dir / "state"):
            for name in files:
                with open(os.path.join(root, name), "wb") as f:
                    f.write(b"corrupt")
        os.remove(tmp_path / step_dir / "digest.json")  # so orbax itself meets the damage
    with Checkpointer(tmp_path) as ckpt:
        with pytest.raises(CheckpointError) as err:
            ckpt.restore(step.abstract_state(model))
    message = str(err.value)
    assert "\n" not in message and "no intact checkpoint" in message and "steps 2, 1" in message
    assert "nothing was deleted" in message and sorted(os.listdir(tmp_path)) == ["1", "2"]
    with Checkpointer(tmp_path) as ckpt:  # a resume with none intact moves nothing aside either
        with pytest.raises(CheckpointError, match="no intact checkpoint"):
            ckpt.restore(step.abstract_state(model), quarantine=True)
    assert sorted(os.listdir(tmp_path)) == ["1", "2"] and not (tmp_path.parent / f"{tmp_path.name}-damaged").exists()
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        Checkpointer(tmp_path / "empty").restore(state)


def test_kill_during_async_save_leaves_previous_checkpoint(tmp_path):
    """SIGKILL while a large asynchronous save is being written: the earlier checkpoint stays latest."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        import jax.numpy as jnp
        sys.path.insert(0, {ROOT!r})
        from spade_jax.run.checkpoint import Checkpointer
        from spade_jax.rl.train import TrainState
        def state(v, n):
          return TrainState(params={{"w": jnp.full((n,), v, jnp.float32)}}, opt_state=(),
                            step=jnp.asarray(v, jnp.int32), rng=jnp.zeros(2, jnp.uint32))
        ckpt = Checkpointer({str(tmp_path)!r}, async_save=True)
        ckpt.save(1, state(1, 1000), {{"step": 1}})
        ckpt.wait()
        ckpt.save(2, state(2, 48_000_000), {{"step": 2}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith("2")]
    assert "2" not in leftovers  # never finalised
    import jax.numpy as jnp

    from spade_jax.rl.train import TrainState
    target = TrainState(params={"w": jnp.zeros(1000)}, opt_state=(), step=jnp.zeros((), jnp.int32),
                        rng=jnp.zeros(2, jnp.uint32))
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 1
        restored, extra = ckpt.restore(target)
    assert extra == {"step": 1} and int(restored.step) == 1
    assert float(restored.params["w"][0]) == 1.0


@pytest.mark.slow
def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "checkpoint_resume_run.py")

    def run(out, *extra):
        os.makedirs(out, exist_ok=True)
        proc = subprocess.run([sys.executable, script, str(out), "6", *extra], capture_output=True,
                              text=True, cwd=ROOT, timeout=600)
        return proc

    def rows(out):
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f]

    full = run(tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run(tmp_path / "killed", "--kill-after", "5")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed_from = Checkpointer(tmp_path / "killed" / "checkpoints").latest_step()
    assert resumed_from in (2, 4)  # 4 unless the kill landed while its async save was in flight
    resumed = run(tmp_path / "killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = rows(tmp_path / "full")
    got = rows(tmp_path / "killed")
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5] + list(range(resumed_from + 1, 7))
    after_resume = got[5:]
    assert after_resume == want[resumed_from:]  # bit-identical metrics and RNG after the resume
    shutil.rmtree(tmp_path)


def test_a_full_disk_is_one_line_naming_the_checkpoints_kept(trained, tmp_path, monkeypatch):
    _, _, state = trained
    with Checkpointer(tmp_path, keep=None) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        ckpt.save(2, state)
        real_wait = ckpt._manager.wait_until_finished
        orbax_text = ('RESOURCE_EXHAUSTED: Error writing "opt_state.1.0.mu.embed/0.0" in OCDBT database: Failed to '
                      "write 323923968 bytes to file 81: No space left on device [os_error_code='28']\n  more")

        def full_disk():
            real_wait()
            raise ValueError(orbax_text)  # how orbax 0.12 reports ENOSPC from its async writer

        monkeypatch.setattr(ckpt._manager, "wait_until_finished", full_disk)
        with pytest.raises(CheckpointError) as raised:
            ckpt.wait()
        monkeypatch.setattr(ckpt._manager, "wait_until_finished", real_wait)
    message = str(raised.value)
    assert "\n" not in message and "no space left on device" in message
    assert str(tmp_path) in message and "(1)" in message and "--resume" in message
