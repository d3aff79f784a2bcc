"""Subprocess body for test_checkpoint: trains the tiny model with checkpoints; can SIGKILL itself
after a given step and resume from the latest checkpoint. Appends one JSON line per step to OUT/metrics.jsonl.

usage: checkpoint_resume_run.py OUT STEPS [--kill-after N] [--resume]
"""

import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rl"))
from rl_testing import make_train_batch, tiny_decoder

from spade_jax.rl import RLConfig, make_train_step
from spade_jax.run.checkpoint import Checkpointer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("steps", type=int)
    ap.add_argument("--kill-after", type=int)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    model = tiny_decoder(0)
    init, step = make_train_step(model, RLConfig(lr=1e-2), verbose=False)
    ckpt = Checkpointer(os.path.join(args.out, "checkpoints"), keep=2, save_every=2)
    trainer = {"history": []}
    if args.resume and ckpt.latest_step() is not None:
        state, trainer = ckpt.restore(step.abstract_state(model))
    else:
        state = init(model)
    with open(os.path.join(args.out, "metrics.jsonl"), "a") as log:
        while int(state.step) < args.steps:
            i = int(state.step)
            state, metrics = step(state, make_train_batch(i))
            row = {"step": i + 1, **{k: float(v) for k, v in metrics.items()}, "rng": [int(x) for x in state.rng]}
            trainer["history"].append(row["loss"])
            log.write(json.dumps(row) + "\n")
            log.flush()
            ckpt.save(i + 1, state, trainer)
            if args.kill_after == i + 1:
                os.kill(os.getpid(), signal.SIGKILL)
    ckpt.close()


if __name__ == "__main__":
    main()
