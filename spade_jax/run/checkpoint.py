"""Orbax checkpoints of a run: params, optimizer state, step, RNG (one sharded pytree) and trainer state (JSON).

Saves every N steps, keeps the last K, asynchronously; orbax writes into a temporary folder and renames it
when complete, so a run killed mid-save leaves the previous checkpoint as the latest one. Each finished
checkpoint gets a content digest (`digest.json`, one hash per file); restoring verifies it, and the newest
intact checkpoint is restored when later ones are damaged (they are moved aside, never deleted).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from spade_jax import distributed
from spade_jax.rl.train import TrainState

STATE_ITEM = "state"  # params, opt_state, step, rng: restored straight into their shardings
TRAINER_ITEM = "trainer"  # JSON: iteration counters, memory records, PLR buffer, loader position, history
DIGEST_NAME = "digest.json"  # per-file content hashes of a finished checkpoint, written after orbax finishes

log = logging.getLogger("spade_jax.run.checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing or cannot be read; the message is one line naming the folder."""


def _state_tree(state: TrainState) -> dict[str, Any]:
    return {"params": state.params, "opt_state": state.opt_state, "step": state.step, "rng": state.rng}


def _file_digests(step_dir: str) -> dict[str, str]:
    """blake2b of every file under a checkpoint folder (the digest file itself excluded)."""
    digests = {}
    for root, dirs, files in os.walk(step_dir):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, step_dir)
            if rel == DIGEST_NAME:
                continue
            digest = hashlib.blake2b(digest_size=32)
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    digest.update(chunk)
            digests[rel] = digest.hexdigest()
    return digests


def write_digest(step_dir: str) -> None:
    """Records the content digest of a finished checkpoint folder (atomically)."""
    record = {"algorithm": "blake2b-256", "files": _file_digests(step_dir)}
    tmp = os.path.join(step_dir, f".{DIGEST_NAME}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=0, sort_keys=True)
    os.replace(tmp, os.path.join(step_dir, DIGEST_NAME))


def verify_digest(step_dir: str) -> str | None:
    """None when the folder matches its digest; else why not (one line). A folder without a digest
    (its run stopped before writing it) verifies as None: `has_digest` tells the two apart."""
    path = os.path.join(step_dir, DIGEST_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            expected = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its digest file cannot be read ({type(err).__name__})"
    actual = _file_digests(step_dir)
    for rel in sorted(expected):
        if rel not in actual:
            return f"{rel} is missing"
        if actual[rel] != expected[rel]:
            return f"{rel} does not match its digest"
    extra = sorted(set(actual) - set(expected))
    if extra:
        return f"{extra[0]} was added after the checkpoint was written"
    return None


def has_digest(step_dir: str) -> bool:
    return os.path.isfile(os.path.join(step_dir, DIGEST_NAME))


def _non_finite_leaf(tree) -> str | None:
    """The path of the first floating-point leaf holding NaN or inf, else None."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating):
            if not bool(jnp.all(jnp.isfinite(leaf))):
                return jax.tree_util.keystr(path)
    return None


def _abstract(x):
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


class Checkpointer:
    """`save(step, state, trainer_json)`, `latest_step()`, `restore(target) -> (state, trainer_json)`.

    Layout: `DIR/<step>/state/` (orbax pytree, OCDBT), `DIR/<step>/trainer/` (JSON) and
    `DIR/<step>/_CHECKPOINT_METADATA`; an unfinished save is `DIR/<step>.orbax-checkpoint-tmp*` and
    is never listed as a step.
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int | None = 3, save_every: int = 1,
                 async_save: bool = True):
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 (or None for all), got {keep}")
        if save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {save_every}")
        self.save_every = save_every
        self.keep = keep
        self.directory = os.path.abspath(os.fspath(directory))
        if jax.process_index() == 0:  # on a pod the folder is shared storage; orbax's own writes follow it
            os.makedirs(self.directory, exist_ok=True)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=1,  # the interval is ours (step % save_every); orbax would also save the first step
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # leftovers of a killed save are removed, never read
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(STATE_ITEM, TRAINER_ITEM))
        self._undigested: list[int] = []  # saved steps whose digest is not written yet
        self._digest_thread: threading.Thread | None = None

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(int(step)))

    def _write_digests(self, steps: list[int]) -> None:
        for step in steps:
            try:
                write_digest(self._step_dir(step))
            except FileNotFoundError:
                pass  # already rotated out by max_to_keep
            except OSError as err:
                log.warning("checkpoint %s: could not write its digest (%s)", self._step_dir(step), err)

    def _digest_finished_saves(self, *, block: bool) -> None:
        """Hashes the checkpoints whose saves have finished (waits for the one in flight). Hashing runs
        in a thread unless `block`, so a large checkpoint does not stall the next iteration."""
        if self._digest_thread is not None:
            self._digest_thread.join()
            self._digest_thread = None
        if not self._undigested:
            return
        self._manager.wait_until_finished()
        steps, self._undigested = self._undigested, []
        if jax.process_index() != 0:  # one writer; the folder is shared storage on a pod
            return
        if block:
            self._write_digests(steps)
        else:
            self._digest_thread = threading.Thread(target=self._write_digests, args=(steps,), daemon=True)
            self._digest_thread.start()

    def save(self, step: int, state: TrainState, trainer: dict[str, Any] | None = None, *,
             force: bool = False) -> bool:
        """Starts saving if `step % save_every == 0` (or `force`); True when a save started.

        Returns once the arrays are copied off the device, so the state may be donated right after.
        `trainer` must be JSON-serialisable.
        """
        if not force and int(step) % self.save_every:
            return False
        # With keep=1 this save's finalisation deletes the previous checkpoint, so its digest is written
        # before the save starts: hashed in a thread, its file could land in the folder orbax is deleting
        # (rmtree: "Directory not empty", which killed a laptop run's 7th save)
        self._digest_finished_saves(block=self.keep == 1)
        args = ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(_state_tree(state)),
            TRAINER_ITEM: ocp.args.JsonSave(trainer or {}),
        })
        try:
            started = self._manager.save(int(step), args=args, force=force)  # waits for the save before it
        except Exception as err:
            raise self._write_error(err) from err
        if started:
            self._undigested.append(int(step))
        return started

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        self._manager.reload()
        return self._manager.latest_step()

    def restore(self, target: TrainState, step: int | None = None, *,
                quarantine: bool = False) -> tuple[TrainState, dict[str, Any]]:
        """Loads a checkpoint into the shapes, dtypes and shardings of `target` (concrete or abstract,
        e.g. `TrainStep.abstract_state(model)`).

        With `step`, exactly that checkpoint, or CheckpointError if it is damaged. Without, the newest
        intact one: a checkpoint whose files do not match their digest, that orbax cannot read, or whose
        floats hold NaN/inf is reported in one log line and skipped; with `quarantine` it is also moved
        to `<dir>-damaged/` (never deleted) so the run can save that step again.
        """
        if step is not None:
            problem = self._check(step)
            if problem is None:
                restored = self._restore_step(target, step)
                if isinstance(restored, tuple):
                    return restored
                problem = restored
            raise CheckpointError(f"checkpoint {self._step_dir(step)} is damaged: {problem}")
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"no checkpoint in {self.directory}; start without --resume")
        damaged = []
        for candidate in reversed(steps):
            problem = self._check(candidate)
            restored = self._restore_step(target, candidate) if problem is None else problem
            if isinstance(restored, tuple):
                if not has_digest(self._step_dir(candidate)):
                    log.info("checkpoint %s has no digest (its run stopped before writing it); "
                             "restored unverified", self._step_dir(candidate))
                if quarantine:  # only once an intact one is found: with none, nothing is moved
                    for step_damaged in damaged:
                        self._quarantine(step_damaged)
                return restored
            damaged.append(candidate)
            log.warning("checkpoint %s is damaged (%s); trying an earlier one", self._step_dir(candidate), restored)
        raise CheckpointError(
            f"no intact checkpoint in {self.directory} (damaged: steps {', '.join(map(str, damaged))}); "
            "nothing was deleted"
        )

    def _check(self, step: int) -> str | None:
        """Why checkpoint `step` cannot be used, or None; decided by process 0 for every process."""
        return distributed.leader_only(lambda: self._check_files(step))

    def _check_files(self, step: int) -> str | None:
        step_dir = self._step_dir(step)
        if not os.path.isdir(step_dir):
            return "it does not exist"
        return verify_digest(step_dir)

    def _restore_step(self, target: TrainState, step: int) -> tuple[TrainState, dict[str, Any]] | str:
        """The restored (state, trainer) pair, or why the checkpoint cannot be used (one line)."""
        abstract = jax.tree.map(_abstract, _state_tree(target))
        args = ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardRestore(abstract),
            TRAINER_ITEM: ocp.args.JsonRestore(),
        })
        try:
            restored = self._manager.restore(int(step), args=args)
        except Exception as err:  # orbax raises many types; the user needs one line
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            return f"orbax cannot read it: {type(err).__name__}: {detail[:200]}"
        tree = restored[STATE_ITEM]
        bad = _non_finite_leaf(tree["params"]) or _non_finite_leaf(tree["opt_state"])
        if bad is not None:
            return f"{bad} holds NaN or infinite values"
        state = TrainState(params=tree["params"], opt_state=tree["opt_state"], step=tree["step"], rng=tree["rng"])
        return state, dict(restored[TRAINER_ITEM] or {})

    def _quarantine(self, step: int) -> None:
        """Moves a damaged checkpoint out of orbax's folder (so its step can be saved again)."""
        distributed.leader_only(lambda: self._move_aside(step))
        self._manager.reload()

    def _move_aside(self, step: int) -> None:
        aside = f"{self.directory}-damaged"
        os.makedirs(aside, exist_ok=True)
        dest = os.path.join(aside, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.move(self._step_dir(step), dest)
        log.warning("moved damaged checkpoint %s to %s", self._step_dir(step), dest)

    def wait(self) -> None:
        """Blocks until the asynchronous save in flight (if any) is on disk, with its digest."""
        try:
            self._manager.wait_until_finished()
        except Exception as err:
            raise self._write_error(err) from err
        self._digest_finished_saves(block=True)

    def _write_error(self, err: Exception) -> CheckpointError:
        """One line for a save that failed (orbax reports a full disk as a ValueError many lines long)."""
        text = str(err)
        if (isinstance(err, OSError) and err.errno == errno.ENOSPC) or "No space left on device" in text:
            reason = "no space left on device"
        else:
            reason = text.splitlines()[0] if text else type(err).__name__
        failed = self._undigested[-1:]  # the save in flight
        kept = [s for s in self._manager.all_steps() if s not in failed]
        return CheckpointError(
            f"cannot write a checkpoint in {self.directory}: {reason}; the complete checkpoints "
            f"({', '.join(map(str, kept)) or 'none'}) are kept: free space, then continue with --resume"
        )

    def close(self) -> None:
        self.wait()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
