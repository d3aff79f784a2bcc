"""Runs SPADE self-play (or the fixed-pool baseline) and writes a run directory.

python -m experiments.run [--config NAME|PATH] [--out DIR] [--resume] [key=value ...]
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
from pathlib import Path

log = logging.getLogger("spade_jax.run")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.run", description=__doc__.splitlines()[0],
        epilog="Overrides use dotted keys, e.g. iterations=2 rl.lr=1e-5 model.name=tiny.",
    )
    parser.add_argument("--config", default="default", help="config name in experiments/configs or a YAML path")
    parser.add_argument("--out", default=None, help="run directory (default: runs/<config>-<time>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    return parser.parse_args(argv)


def run(config, out: Path, *, resume: bool = False) -> Path:
    """Runs `config` into `out`; with `resume`, continues from the last checkpoint there."""
    import jax  # noqa: PLC0415 (heavy imports after argument errors are reported)
    import jax.numpy as jnp  # noqa: PLC0415

    from spade_jax.checkpoint import Checkpointer  # noqa: PLC0415
    from spade_jax.config import to_dict  # noqa: PLC0415
    from spade_jax.envs.sandbox import SandboxPool  # noqa: PLC0415
    from spade_jax.logging import PhaseTimer, RunLogger, setup_logging  # noqa: PLC0415
    from spade_jax.mesh import make_mesh  # noqa: PLC0415
    from spade_jax.models.registry import load_model  # noqa: PLC0415
    from spade_jax.policy import Learner, Policy  # noqa: PLC0415
    from spade_jax.selfplay import SelfPlay  # noqa: PLC0415

    if config.mesh.distributed:
        jax.distributed.initialize()
    mesh = make_mesh(config.mesh)
    setup_logging(out)
    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    loaded = load_model(
        config.model.name, dtype=dtypes[config.model.dtype], param_dtype=dtypes[config.model.param_dtype],
        mesh=mesh if mesh.size > 1 else None, seed=config.seed,
    )
    mesh = mesh if mesh.size > 1 else None
    loaded.model.remat = config.model.remat
    loaded.model.set_attn_chunk(config.model.attn_chunk)
    sandbox = SandboxPool(config.sandbox)
    try:
        policy = Policy(loaded.model, loaded.tokenizer, mesh=mesh)
        learner = Learner(loaded.model, config.rl, mesh=mesh, sandbox=sandbox)
        checkpoints = Checkpointer(out / "checkpoints", keep=config.keep_checkpoints, save_every=config.checkpoint_every)
        start = 0
        trainer_state = None
        if resume:
            step = checkpoints.latest_step()
            if step is None:
                raise FileNotFoundError(f"--resume: no checkpoint in {out / 'checkpoints'}; run without --resume")
            learner.state, trainer_state = checkpoints.restore(learner.train_step.abstract_state(loaded.model), step)
            learner.train_step.write_params(loaded.model, learner.state)
            start = trainer_state["iteration"]
        logger = RunLogger(
            out, to_dict(config), tensorboard=config.tensorboard, progress=config.progress,
            total_iterations=config.iterations, start_iteration=start,
        )
        selfplay = SelfPlay(config, policy, learner, logger.envs, PhaseTimer())
        if trainer_state is not None:
            selfplay.load_state_dict(trainer_state)
        with logger:
            while selfplay.iteration < config.iterations:
                iteration = selfplay.iteration
                metrics = selfplay.step()
                logger.log(iteration, metrics)
                done = selfplay.iteration
                checkpoints.save(done, learner.state, selfplay.state_dict(), force=done == config.iterations)
            checkpoints.close()
    finally:
        sandbox.close()
    return out


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from spade_jax.checkpoint import CheckpointError  # noqa: PLC0415
    from spade_jax.config import ConfigError, load_config  # noqa: PLC0415

    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        out = Path(args.out)
    elif args.resume:
        print("error: --resume needs --out DIR (the run directory to continue)", file=sys.stderr)
        return 2
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"{Path(args.config).stem}-{stamp}"
    if args.resume and not out.is_dir():
        print(f"error: --resume: run directory {out} does not exist", file=sys.stderr)
        return 2
    try:
        run(config, out, resume=args.resume)
    except (FileNotFoundError, ValueError, CheckpointError) as err:
        log.debug("run failed", exc_info=True)
        print(f"error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; continue with: python -m experiments.run --out {out} --resume", file=sys.stderr)
        return 130
    print(f"run directory: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
