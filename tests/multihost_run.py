"""Subprocess body for test_multihost: one process of a (possibly multi-process) run on CPU devices.

usage: multihost_run.py RESULTS_DIR RUN_DIR

With SPADE_NUM_PROCESSES / SPADE_PROCESS_ID / JAX_COORDINATOR_ADDRESS set (as `tpu/launch.py local`
sets them) it joins the others through jax.distributed. Under both placements it runs one Learner
update (train step, and for disaggregated the weight transfer), samples from the updated sampler
model, saves and restores an orbax checkpoint; then two iterations of the `tiny` self-play config
(disaggregated, with updates) into RUN_DIR through experiments.run. Writes RESULTS_DIR/proc<i>.json
with what each step gave and, for processes other than 0, every file write Python saw under RUN_DIR
(an audit hook).
"""

import json
import os
import sys
from pathlib import Path


def _audit_writes(run_dir: Path, seen: list) -> None:
    """Records opens for writing, creations, renames and removals of paths under run_dir."""
    root = str(run_dir.resolve())
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def hook(event, args):
        path = None
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = args[1], args[2]
            by_mode = isinstance(mode, str) and any(c in mode for c in "wax+")
            if by_mode or (isinstance(flags, int) and flags & writing):
                path = args[0]
        elif event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.truncate", "shutil.rmtree"):
            path = args[0] if args else None
        if path is not None and not isinstance(path, int):
            text = os.path.abspath(os.fsdecode(path))
            if text == root or text.startswith(root + os.sep):
                seen.append(f"{event} {text}")

    sys.addaudithook(hook)


def _fingerprint(tree) -> list[float]:
    """Per-leaf float64 sums and sums of squares (order: the tree's leaves), on every process."""
    import jax
    import numpy as np

    from spade_jax import distributed

    out = []
    for leaf in jax.tree.leaves(distributed.fetch(tree)):
        a = np.asarray(leaf, np.float64)
        out += [float(a.sum()), float((a * a).sum())]
    return out


def _learner_checks(placement_name: str, ckpt_dir: Path) -> dict:
    import jax
    from flax import nnx

    from spade_jax.mesh import MeshConfig
    from spade_jax.models.registry import load_model
    from spade_jax.placement import make_placement
    from spade_jax.policy import Learner, Policy
    from spade_jax.rl import RLConfig
    from spade_jax.rl.batch import AGENT, DESIGNER
    from spade_jax.rl.collate import Sample
    from spade_jax.run.checkpoint import Checkpointer
    from spade_jax.sampling import SamplingConfig

    placement = make_placement(MeshConfig(data=-1, placement=placement_name))
    loaded = load_model("tiny", mesh=placement.trainer, seed=3)
    sampler_model = placement.sampler_model(loaded.model)
    publish = None if sampler_model is loaded.model else (lambda: placement.publish(loaded.model, sampler_model))
    learner = Learner(loaded.model, RLConfig(lr=1e-2, micro_batches=1), mesh=placement.trainer,
                      verbose=False, publish=publish)
    samples = [
        Sample(list(range(5 + i, 15 + 2 * i)), [0] * 4 + [1] * (6 + i), [-1.5 - 0.1 * i] * (10 + i),
               advantage=(-1.0) ** i * (0.5 + 0.25 * i), role=DESIGNER if i % 3 == 0 else AGENT)
        for i in range(8)
    ]
    metrics = learner.update(samples)
    policy = Policy(sampler_model, loaded.tokenizer, mesh=placement.sampler)
    result = policy.generate([[1, 5, 9, 13], [2, 4], [7, 7, 7]], SamplingConfig(max_new_tokens=6, temperature=1.0),
                             jax.random.key(11))
    with Checkpointer(ckpt_dir, keep=1) as checkpoints:
        checkpoints.save(1, learner.state, {"placement": placement_name}, force=True)
        checkpoints.wait()
        restored, trainer = checkpoints.restore(learner.train_step.abstract_state(loaded.model))
    both_ways = None
    if placement.disaggregated:  # the collective transfer gives what the default (local) one gave
        from spade_jax.placement import WeightTransfer

        collective = WeightTransfer(placement.trainer, placement.sampler, method="collective")
        source = nnx.to_pure_dict(nnx.state(loaded.model, nnx.Param))
        both_ways = [placement.transfer.method, _fingerprint(collective(source))]
    return {
        "both_ways": both_ways,
        "loss": metrics["loss"], "grad_norm": metrics.get("grad_norm"),
        "params": _fingerprint(nnx.to_pure_dict(nnx.state(loaded.model, nnx.Param))),
        "sampler_params": _fingerprint(nnx.to_pure_dict(nnx.state(sampler_model, nnx.Param))),
        "tokens": result.tokens, "logprobs": result.logprobs,
        "restored_equal": _fingerprint(restored.params) == _fingerprint(learner.state.params)
        and _fingerprint(restored.opt_state) == _fingerprint(learner.state.opt_state),
        "restored_trainer": trainer,
    }


def main() -> int:
    results_dir, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    writes: list[str] = []
    process_id = int(os.environ.get("SPADE_PROCESS_ID", "0"))
    if process_id != 0:
        _audit_writes(run_dir, writes)

    from spade_jax import distributed

    if os.environ.get("SPADE_NUM_PROCESSES"):
        distributed.initialize()
    import jax

    from experiments.run import run
    from spade_jax.config import load_config

    report = {"process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count()}
    for placement in ("colocated", "disaggregated"):
        report[placement] = _learner_checks(placement, run_dir.parent / f"ckpt-{placement}")
    # Disaggregated, so the loop also publishes weights; truncated plays trained on (the tiny model's
    # 2-turn plays all end truncated) and a fixed batch, so each iteration runs a real update.
    config = load_config("tiny", ["iterations=2", "mesh.distributed=" + str(jax.process_count() > 1).lower(),
                                  "mesh.placement=disaggregated", "rollout.loss_on_truncated=true",
                                  "global_batch=4", "tensorboard=false", "progress=false"])
    run(config, run_dir, config_name="tiny")
    report["writes"] = writes
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"proc{jax.process_index()}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
