"""Runs SPADE self-play (or the fixed-pool baseline) and writes a run directory.

python -m experiments.run [--config NAME|PATH] [--out DIR] [--resume] [key=value ...]
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("spade_jax.run")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.run", description=__doc__.splitlines()[0],
        epilog="Overrides use dotted keys, e.g. iterations=2 rl.lr=1e-5 model.name=tiny. "
               "--resume continues the run with its own config.yaml; overrides apply on top.",
    )
    parser.add_argument("--config", default=None,
                        help="config name in spade_jax/configs or a YAML path (default: default; "
                             "with --resume: the run's own config.yaml)")
    parser.add_argument("--out", default=None, help="run directory (default: runs/<config>-<time>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    return parser.parse_args(argv)


def run(config, out: Path, *, resume: bool = False, config_name: str | None = None,
        overrides: tuple[str, ...] | list[str] = ()) -> Path:
    """Runs `config` into `out`; with `resume`, continues from the newest intact checkpoint there.

    The directory is held with a lock for the whole run; a fresh run refuses a directory that already
    holds a run, and a start that fails before its first iteration removes the directory it created.
    With `mesh.distributed` every process of the run calls it; process 0 alone writes `out`.
    """
    from spade_jax.run import RunDir

    if config.mesh.distributed:
        from spade_jax import distributed

        distributed.initialize()  # first: which process leads decides who writes the run directory

    from spade_jax.run.interrupt import remember_interrupts

    with remember_interrupts(), RunDir(out, resume=resume, config_name=config_name, overrides=overrides) as run_dir:
        _run_locked(config, run_dir)
    return out


def _run_locked(config, run_dir) -> None:
    import jax.numpy as jnp  # heavy imports after argument errors are reported

    from spade_jax import distributed
    from spade_jax.cache import enable_compilation_cache
    from spade_jax.config import to_dict
    from spade_jax.envs.backends.sandbox import SandboxPool
    from spade_jax.models.registry import load_model
    from spade_jax.placement import make_placement
    from spade_jax.policy import Learner, Policy
    from spade_jax.run import FollowerLogger, PhaseTimer, RunLogger, setup_logging
    from spade_jax.run.budget import TRAIN_SECONDS, Budget, spent_seconds
    from spade_jax.run.checkpoint import Checkpointer
    from spade_jax.run.interrupt import raise_if_interrupted
    from spade_jax.run.memory import memory_metrics, release_free_memory
    from spade_jax.selfplay import SelfPlay

    out, resume = run_dir.out, run_dir.resume
    enable_compilation_cache()  # a resume or another seed loads the compiled update instead of recompiling
    leader = distributed.is_leader()  # in a multi-process run only process 0 writes files and runs programs
    placement = make_placement(config.mesh)  # the trainer's mesh, and the sampler's (the same unless disaggregated)
    setup_logging(out if leader else None)
    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    keep_mesh = placement.disaggregated or placement.trainer.size > 1
    mesh = placement.trainer if keep_mesh else None
    loaded = load_model(
        config.model.name, dtype=dtypes[config.model.dtype], param_dtype=dtypes[config.model.param_dtype],
        mesh=mesh, seed=config.seed,
    )
    loaded.model.remat = config.model.remat
    loaded.model.set_attn_chunk(config.model.attn_chunk)
    loaded.model.set_attention(config.model.attention)
    sandbox = SandboxPool(config.sandbox) if leader else None
    checkpoints = None
    try:
        sampler_model = placement.sampler_model(loaded.model)
        policy = Policy(sampler_model, loaded.tokenizer, mesh=placement.sampler if keep_mesh else None)
        publish = None if sampler_model is loaded.model else (lambda: placement.publish(loaded.model, sampler_model))
        learner = Learner(loaded.model, config.rl, mesh=mesh, sandbox=sandbox, publish=publish)
        checkpoints = Checkpointer(
            out / "checkpoints", keep=config.keep_checkpoints, save_every=config.checkpoint_every
        )
        start = 0
        trainer_state = None
        if resume:
            if not checkpoints.all_steps():
                raise FileNotFoundError(f"--resume: no checkpoint in {out / 'checkpoints'} yet; "
                                        "start a new run with another --out")
            # The newest intact checkpoint; damaged later ones are moved to checkpoints-damaged/.
            learner.state, trainer_state = checkpoints.restore(
                learner.train_step.abstract_state(loaded.model), quarantine=True
            )
            learner.train_step.write_params(loaded.model, learner.state)
            if publish is not None:
                publish()
            start = trainer_state["iteration"]
        logger = RunLogger(
            out, to_dict(config), tensorboard=config.tensorboard, progress=config.progress,
            total_iterations=config.iterations, start_iteration=start,
        ) if leader else FollowerLogger()
        run_dir.record_resume()  # config.yaml now holds the resumed config
        selfplay = SelfPlay(config, policy, learner, logger.envs, PhaseTimer())
        if trainer_state is not None:
            selfplay.load_state_dict(trainer_state)
        # The wall-clock budget continues from the kept iterations' training time (resumes included).
        # Multi-process: process 0's history and clock decide for every process (they must stop together).
        budget = Budget(config.max_minutes, distributed.broadcast_object(spent_seconds(logger.history)))
        if budget.exhausted and selfplay.iteration < config.iterations:
            log.info("max_minutes=%s already spent (%.0f s); nothing to run", config.max_minutes, budget.spent)
        with logger:
            stop = budget.exhausted
            while selfplay.iteration < config.iterations and not stop:
                raise_if_interrupted()  # the last iteration is saved; a Ctrl-C dropped during it stops here
                iteration = selfplay.iteration
                started = time.perf_counter()
                metrics = selfplay.step()
                metrics[TRAIN_SECONDS] = budget.add(time.perf_counter() - started)
                release_free_memory()  # the update's freed temporaries, before the next plays
                metrics.update(memory_metrics())
                stop = distributed.broadcast_object(budget.exhausted)
                if config.eval_every and selfplay.iteration % config.eval_every == 0:
                    metrics.update(evaluate_agent(config, loaded, mesh))
                logger.log(iteration, metrics)
                run_dir.mark_progress()
                done = selfplay.iteration
                checkpoints.save(done, learner.state, selfplay.state_dict(),
                                 force=done == config.iterations or stop)
                if stop and done < config.iterations:
                    log.info("max_minutes=%s spent (%.0f s) after %d iterations; stopping", config.max_minutes,
                             budget.spent, done)
    finally:
        try:
            if checkpoints is not None:
                checkpoints.close()  # an asynchronous save in flight lands, with its digest
        finally:
            if sandbox is not None:
                sandbox.close()


def evaluate_agent(config, loaded, mesh) -> dict:
    """The agent's held-out success now (config.eval_suite), greedy, in the run's answer format."""
    import time

    from spade_jax import evaluation
    from spade_jax.rollout import AGENT_SYSTEM
    from spade_jax.sampling import SamplingConfig

    started = time.perf_counter()
    sampling = SamplingConfig(max_new_tokens=config.agent_sampling.max_new_tokens, temperature=0.0,
                              stop_strings=config.agent_sampling.stop_strings)
    policy = evaluation.model_policy(loaded.model, loaded.tokenizer, sampling, mesh=mesh, seed=config.seed,
                                     reply_prefix=config.rollout.reply_prefix)
    system = AGENT_SYSTEM if config.rollout.system_prompt is None else config.rollout.system_prompt
    report = evaluation.evaluate(policy, config.eval_suite, batch_size=config.max_parallel_episodes,
                                 system_prompt=system or None)
    out = {"eval/success_rate": report.success_rate, "eval/success_rate_low": report.ci_low,
           "eval/success_rate_high": report.ci_high, "time/eval": time.perf_counter() - started}
    out.update({f"eval/{task.env_id}": task.success_rate for task in report.tasks})
    return out


def _resume_config(args):
    """The run's own config.yaml with the command line's overrides on top; a --config that names
    another experiment than the run's is refused."""
    from spade_jax.config import ConfigError, load_config, to_dict
    from spade_jax.run import read_record

    out = Path(args.out)
    if not out.is_dir():
        raise ConfigError(f"--resume: run directory {out} does not exist")
    own = out / "config.yaml"
    if not own.is_file():
        raise ConfigError(f"--resume: {out} holds no run (no config.yaml); start it without --resume")
    if not _has_checkpoint(out):
        raise ConfigError(f"--resume: no checkpoint in {out / 'checkpoints'} yet; start a new run with another --out")
    try:
        config = load_config(str(own), args.overrides)
    except ConfigError as err:
        raise ConfigError(f"{own}: {err}") from None
    if args.config is not None:
        record = read_record(out)
        created_with = list(record.get("overrides") or [])
        for resume in record.get("resumes") or []:
            created_with += list(resume.get("overrides") or [])
        expected = load_config(args.config, [*created_with, *args.overrides])
        if expected != config:
            a, b = _flatten(to_dict(expected)), _flatten(to_dict(config))
            key = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            raise ConfigError(
                f"--config {args.config} disagrees with the run in {out} ({key}: {a.get(key)!r} vs the run's "
                f"{b.get(key)!r}); drop --config to resume with the run's own config.yaml"
            )
    return config


def _flatten(tree, prefix=""):
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _has_checkpoint(out: Path) -> bool:
    """A finished checkpoint (orbax names it by its step) exists in the run; cheap, no orbax import."""
    checkpoints = out / "checkpoints"
    return checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())


def _interrupted_message(out: Path) -> str:
    if _has_checkpoint(out):
        return f"interrupted; continue with: python -m experiments.run --out {out} --resume"
    if not out.exists():
        return "interrupted before the first iteration; nothing was saved"
    return (f"interrupted before the first checkpoint; {out} keeps the logs so far but cannot be resumed: "
            "start again with another --out")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from spade_jax.config import ConfigError, load_config
    from spade_jax.rl.train import TrainingDiverged
    from spade_jax.run import RunDirError, RunDirLocked, check_writable
    from spade_jax.run.checkpoint import CheckpointError
    from spade_jax.selfplay import AllPlaysFailed

    if args.out and "://" in args.out:
        print(f"error: --out {args.out}: the run directory must be a filesystem path (its lock, checkpoint digests "
              "and metrics are POSIX files); mount the bucket (gcsfuse) or use a shared filesystem and pass "
              "that path, see tpu/README.md", file=sys.stderr)
        return 2
    if args.resume and not args.out:
        print("error: --resume needs --out DIR (the run directory to continue)", file=sys.stderr)
        return 2
    try:
        config = _resume_config(args) if args.resume else load_config(args.config or "default", args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        out = Path(args.out)
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"{Path(args.config or 'default').stem}-{stamp}"
    try:
        check_writable(out)  # before any work starts
        run(config, out, resume=args.resume, config_name=args.config or (None if args.resume else "default"),
            overrides=args.overrides)
    except (RunDirError, RunDirLocked) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, CheckpointError) as err:
        log.debug("run failed", exc_info=True)
        print(f"error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 2
    except (TrainingDiverged, AllPlaysFailed) as err:
        print(f"error: {err}", file=sys.stderr)  # raised before the iteration's checkpoint: the last good one stays
        return 1
    except KeyboardInterrupt:
        print(_interrupted_message(out), file=sys.stderr)
        return 130
    print(f"run directory: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
