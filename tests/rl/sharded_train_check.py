"""Subprocess body for test_train_step: on 8 CPU devices, a sharded (and micro-batched) step equals the
unsharded one (also with rl.update_rows: padded rows, their micro-batches skipped; and with the batch
given as two batches of different widths), with the KL's
reference logprobs computed inside the step from reference params sharded like the policy's, and a
checkpoint restores into the same shardings. Prints one JSON line with the differences.

usage: sharded_train_check.py [CHECKPOINT_DIR]
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from rl_testing import make_train_batch, split_by_width, tiny_decoder, with_empty_rows

from spade_jax.mesh import MeshConfig, make_mesh
from spade_jax.rl import RLConfig, make_train_step


def run(mesh, micro_batches, steps=2, checkpoint_dir=None, update_rows=None, split=False):
    from spade_jax.rl.collate import fill_micro_batches

    model = tiny_decoder(0)
    cfg = RLConfig(lr=1e-2, adam_eps=1.0, micro_batches=micro_batches, kl_coef=0.01, update_rows=update_rows)
    init, step = make_train_step(model, cfg, mesh, verbose=False)
    state = init(model)
    ref_params = step.reference_params(model)  # the starting weights: KL 0 at step 0, > 0 after
    if mesh is not None:
        for p, r in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_params)):
            assert p.sharding == r.sharding, (p.sharding, r.sharding)
    history = []
    for i in range(steps):
        batch = make_train_batch(i, batch=16)
        if update_rows:  # padded, the padding in micro-batches of its own (skipped by the step)
            batch = fill_micro_batches(with_empty_rows(batch, update_rows), micro_batches)
        if split:  # the last 8 rows in a batch of their own, wider (the Learner's long samples apart)
            batch = split_by_width(batch, 8, 20)
        state, metrics = step(state, batch, ref_params)
        history.append({k: float(v) for k, v in metrics.items()})
    if checkpoint_dir is not None:  # sharded save, then restore straight into the mesh shardings
        from spade_jax.run.checkpoint import Checkpointer

        with Checkpointer(checkpoint_dir) as ckpt:
            ckpt.save(steps, state, {"steps": steps})
            ckpt.wait()
            restored, extra = ckpt.restore(step.abstract_state(model))
        assert extra == {"steps": steps}
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
            assert a.sharding == b.sharding, (a.sharding, b.sharding)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    params = jax.tree.map(np.asarray, state.params)
    shardings = jax.tree.leaves(jax.tree.map(lambda x: str(getattr(x.sharding, "spec", "")), state.params))
    return history, params, shardings


def main():
    assert jax.device_count() == 8, jax.devices()
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    plain_hist, plain_params, _ = run(None, 1)
    sharded_hist, sharded_params, specs = run(mesh, 2, checkpoint_dir=sys.argv[1] if len(sys.argv) > 1 else None)
    fixed_hist, fixed_params, _ = run(mesh, 4, update_rows=64)
    split_hist, split_params, _ = run(mesh, 2, split=True)

    def param_diff(params):
        return max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(plain_params), jax.tree.leaves(params)))

    def metric_diff(history):
        return max(abs(a[k] - b[k]) / max(1.0, abs(a[k])) for a, b in zip(plain_hist, history) for k in a)

    print(json.dumps({
        "param_diff": param_diff(sharded_params),
        "metric_diff": metric_diff(sharded_hist),
        "fixed_rows_param_diff": param_diff(fixed_params),  # rl.update_rows: padded, skipped micro-batches
        "fixed_rows_metric_diff": metric_diff(fixed_hist),
        "split_param_diff": param_diff(split_params),  # two batches of different widths, one step
        "split_metric_diff": metric_diff(split_hist),
        "sharded_params": sum("fsdp" in s or "tensor" in s for s in specs),
        "loss": [h["loss"] for h in sharded_hist],
        "kl": [h["kl"] for h in sharded_hist],
    }))


if __name__ == "__main__":
    main()
