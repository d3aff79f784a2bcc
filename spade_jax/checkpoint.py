"""Orbax checkpoints of a run: params, optimizer state, step, RNG (one sharded pytree) and trainer state (JSON).

Saves every N steps, keeps the last K, asynchronously; orbax writes into a temporary folder and renames it
when complete, so a run killed mid-save leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from spade_jax.rl.train import TrainState

STATE_ITEM = "state"  # params, opt_state, step, rng: restored straight into their shardings
TRAINER_ITEM = "trainer"  # JSON: iteration counters, memory records, PLR buffer, loader position, history


class CheckpointError(RuntimeError):
    """A checkpoint that is missing or cannot be read; the message is one line naming the folder."""


def _state_tree(state: TrainState) -> dict[str, Any]:
    return {"params": state.params, "opt_state": state.opt_state, "step": state.step, "rng": state.rng}


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
        self.directory = os.path.abspath(os.fspath(directory))
        os.makedirs(self.directory, exist_ok=True)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=1,  # the interval is ours (step % save_every); orbax would also save the first step
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # leftovers of a killed save are removed, never read
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(STATE_ITEM, TRAINER_ITEM))

    def save(self, step: int, state: TrainState, trainer: dict[str, Any] | None = None, *,
             force: bool = False) -> bool:
        """Starts saving if `step % save_every == 0` (or `force`); True when a save started.

        Returns once the arrays are copied off the device, so the state may be donated right after.
        `trainer` must be JSON-serialisable.
        """
        if not force and int(step) % self.save_every:
            return False
        args = ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardSave(_state_tree(state)),
            TRAINER_ITEM: ocp.args.JsonSave(trainer or {}),
        })
        return self._manager.save(int(step), args=args, force=force)

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        self._manager.reload()
        return self._manager.latest_step()

    def restore(self, target: TrainState, step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
        """Loads `step` (default: the latest) into the shapes, dtypes and shardings of `target`.

        `target` may be concrete or abstract (e.g. `TrainStep.abstract_state(model)`).
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"no checkpoint in {self.directory}; start without --resume")
        path = os.path.join(self.directory, str(step))
        abstract = jax.tree.map(_abstract, _state_tree(target))
        args = ocp.args.Composite(**{
            STATE_ITEM: ocp.args.StandardRestore(abstract),
            TRAINER_ITEM: ocp.args.JsonRestore(),
        })
        try:
            restored = self._manager.restore(int(step), args=args)
        except Exception as err:  # noqa: BLE001 (orbax raises many types; the user needs one line)
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            earlier = [s for s in self.all_steps() if s < step]
            hint = f"restore step {earlier[-1]} instead or delete {path}" if earlier else f"delete {path}"
            raise CheckpointError(
                f"checkpoint {path} cannot be read ({type(err).__name__}: {detail[:200]}); {hint}"
            ) from None
        tree = restored[STATE_ITEM]
        state = TrainState(params=tree["params"], opt_state=tree["opt_state"], step=tree["step"], rng=tree["rng"])
        return state, dict(restored[TRAINER_ITEM] or {})

    def wait(self) -> None:
        """Blocks until the asynchronous save in flight (if any) is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
