"""One SPADE iteration composed from the parts: design, validate, hint, play, score, update.

Owns the order of the phases and the trainer state carried between iterations; every mechanism it
calls lives in its own module (roles, envs, rollout, rl, curriculum, run).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import hashlib
import itertools
import logging
import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax import distributed, roles
from spade_jax.anchor import anchor_batch, make_anchor_samples, samples_from_state, samples_to_state
from spade_jax.curriculum import (
    DESIGNER_SCORES,
    EnvMemory,
    EnvRecord,
    ScoreInputs,
    designer_advantages,
    designer_scores,
    hint_regret,
    plr,
    skills_for_regeneration,
)
from spade_jax.curriculum.corpus import load_corpus
from spade_jax.envs.api import extract_boxed
from spade_jax.envs.backends import compile_env
from spade_jax.envs.library import DOMAIN_SKILLS
from spade_jax.envs.program import ProgramError
from spade_jax.envs.validate import validate
from spade_jax.evaluation.stats import wilson_interval
from spade_jax.rl.advantages import get_advantage_estimator
from spade_jax.rl.batch import AGENT, DESIGNER
from spade_jax.rl.collate import Sample
from spade_jax.rollout import (
    ENV_ERROR_KINDS,
    Generation,
    play_episodes,
    play_episodes_device,
    with_hint,
)
from spade_jax.run.memory import release_free_memory

log = logging.getLogger("spade_jax.selfplay")

_ENV_ERROR_LINES = 8  # warning lines per play phase about failed plays (one per environment and kind)


class AllPlaysFailed(RuntimeError):
    """Every play of an iteration failed in its environment: there is nothing to train on."""


@dataclasses.dataclass
class PoolEnv:
    """One environment of the current pool and everything measured on it."""

    env_id: str
    skill: str
    origin: str  # "designer", "library" (pool fill or fixed pool), "file"
    source: str | None
    valid: bool
    errors: list[str] = dataclasses.field(default_factory=list)
    backend: str | None = None
    hint: str | None = None
    r_hint: float = float("nan")  # mean hinted episode reward at the regeneration step
    r_nohint: float = float("nan")  # mean unhinted episode reward at the regeneration step
    r_hint_max: float = float("nan")
    hung: bool = False  # a step timed out during play (the pure-regret variant's -0.5)
    wins: list[float] = dataclasses.field(default_factory=list)  # per-iteration share of no-hint plays won
    rewards: list[float] = dataclasses.field(default_factory=list)  # per-iteration mean no-hint episode reward
    regen_positive_share: float = float("nan")  # share of no-hint plays with reward > 0 at the regeneration step
    attempt: int = 1  # which generation attempt of its pool slot this design is
    designer_sample: dict | None = None  # prompt/completion tokens and logprobs of the designer
    plr_slot: int = -1  # slot in the PLR buffer when this environment is a replay

    @property
    def win_rate(self) -> float:
        return float(np.mean(self.wins)) if self.wins else float("nan")

    @property
    def mean_reward(self) -> float:
        """Mean raw episode reward over the window, failed plays counting their -1 (SPADE's plateau input)."""
        return float(np.mean(self.rewards)) if self.rewards else float("nan")

    @property
    def regret(self) -> float:
        return float(hint_regret(self.r_hint, self.r_nohint))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def generations_of(result) -> list[Generation]:
    return [
        Generation(tokens, logprobs, reason)
        for tokens, logprobs, reason in zip(result.tokens, result.logprobs, result.finish_reasons)
    ]


class SelfPlay:
    """Runs SPADE (or the fixed-pool baseline) for `config.iterations` iterations."""

    def __init__(self, config, policy, learner, archive, timer):
        self.cfg, self.policy, self.learner = config, policy, learner
        self.archive, self.timer = archive, timer  # run.EnvArchive and run.PhaseTimer
        self.rng = np.random.default_rng(config.seed)
        if config.play_loop == "device" and distributed.process_count() > 1:
            raise ValueError("play_loop=device is single-process only for now; use play_loop=host with "
                             "mesh.distributed")
        rollout = config.rollout
        if rollout.system_prompt is None:  # the agent's own prompt (for the domain) unless the config gives one
            rollout = dataclasses.replace(rollout, system_prompt=roles.agent_system(config.domain))
        self.rollout = rollout
        self.memory = EnvMemory.from_config(config.curriculum)
        self.corpus = load_corpus(config.corpus)
        self.seed_programs = seed_programs(config.env_pool, config.domain)
        self.pool: list[PoolEnv] = []
        self._compiled: dict = {}  # source sha256 -> envs.backends.Runnable
        c = config.curriculum
        self.plr = plr.plr_init(c.plr_capacity) if c.plr else None  # replay buffer (beyond SPADE)
        self.plr_levels: list[dict] = []  # PLR level id -> {"source", "skill"}
        self.envs_made = 0
        self.iteration = 0
        # Asynchronous play (async_staleness > 0): the next iteration's rollouts in flight, the trainer state
        # from before they started (what a checkpoint holds), and how many updates the sampler's weights hold.
        self._next: concurrent.futures.Future | None = None
        self._next_done = 0.0
        self._checkpoint: dict | None = None
        self._sampler_version = 0
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # rl.anchor_coef > 0: the starting policy's replies to `anchor` questions, made at the first update
        self.anchor: list[Sample] | None = None

    # -- trainer state for checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict:
        """The trainer state at the start of iteration `iteration`. With the next iteration's rollouts
        already collected (asynchronous play), the state from before them: a resumed run collects them
        again, with the checkpoint's weights, and the prefetched ones are dropped."""
        if self._next is not None and self._checkpoint is not None:
            return self._checkpoint
        return {
            "iteration": self.iteration,
            "envs_made": self.envs_made,
            "pool": [e.to_json() for e in self.pool],
            "memory": self.memory.state_dict(),
            "rng": self.rng.bit_generator.state,
            "plr": None if self.plr is None else {k: np.asarray(v).tolist() for k, v in vars(self.plr).items()},
            "plr_levels": self.plr_levels,
            "anchor": None if self.anchor is None else samples_to_state(self.anchor),
        }

    def load_state_dict(self, state: dict) -> None:
        self.iteration, self.envs_made = state["iteration"], state["envs_made"]
        self.pool = [PoolEnv(**e) for e in state["pool"]]
        self.memory = EnvMemory.from_state_dict(state["memory"])
        self.rng.bit_generator.state = state["rng"]
        if state.get("plr") is not None:
            dtypes = {"scores": np.float32}
            self.plr = plr.PLRState(**{k: jnp.asarray(v, dtypes.get(k, np.int32)) for k, v in state["plr"].items()})
            self.plr_levels = state["plr_levels"]
        self._sampler_version = self.iteration  # a resumed run's model holds the checkpoint's weights
        if state.get("anchor") is not None:
            self.anchor = samples_from_state(state["anchor"])

    # -- phases -------------------------------------------------------------------------------------

    def _new_id(self, prefix: str) -> str:
        self.envs_made += 1
        return f"{prefix}{self.envs_made:05d}"

    def design_pool(self) -> tuple[list[PoolEnv], list[PoolEnv]]:
        """The designer writes `pool_size` programs over this regeneration's skills; each is validated and
        a slot whose design is invalid is generated again (a fresh prompt), up to `design_attempts` times.

        Returns (one design per slot: its valid one, else its last attempt; every attempt made).
        """
        cfg = self.cfg
        regen_index = self.iteration // cfg.regen_interval
        skills = skills_for_regeneration(regen_index, cfg.curriculum.skills_per_regen, DOMAIN_SKILLS[cfg.domain])
        slot_skills = [skills[i % len(skills)] for i in range(cfg.pool_size)]
        pool: list = [None] * cfg.pool_size
        made = []  # (env, request, reply text) of every attempt, for the archive
        pending = list(range(cfg.pool_size))
        for attempt in range(1, cfg.design_attempts + 1):
            if not pending:
                break
            for i, (env, request, text) in zip(pending, self._write_designs([slot_skills[i] for i in pending])):
                env.attempt = attempt
                pool[i] = env
                made.append((env, request, text))
            pending = [i for i in pending if not pool[i].valid]
        if cfg.roles.repair:
            self.repair([e for e in pool if not e.valid and e.source])
        for env, request, text in made:
            self.archive.add(env.source or text, {
                "env_id": env.env_id, "iteration": self.iteration, "skill": env.skill, "mode": request.mode,
                "base": request.base_name, "valid": env.valid, "backend": env.backend, "errors": env.errors,
                "origin": env.origin, "attempt": env.attempt,
            })
        return pool, [env for env, _, _ in made]

    def _write_designs(self, skills: list[str]) -> list[tuple[PoolEnv, Any, str]]:
        """One batched designer generation for the given slot skills, each design validated."""
        cfg = self.cfg
        requests = [
            roles.design_request(
                self.rng, skill, self.corpus, self.memory if cfg.use_memory else None, self.seed_programs,
                cfg=cfg.roles, positives=cfg.curriculum.positives, negatives=cfg.curriculum.negatives,
                domain=cfg.domain,
            )
            for skill in skills
        ]
        prompts = [self.policy.chat_tokens(r.messages) for r in requests]
        # Tune replies are a few assignments: they are sampled in their own batch with a small budget.
        budget_of = {"tune": min(cfg.roles.tune_max_new_tokens, cfg.designer_sampling.max_new_tokens)}
        budgets = [budget_of.get(r.mode, cfg.designer_sampling.max_new_tokens) for r in requests]
        rows: list = [None] * len(requests)  # (prompt length used, tokens, logprobs, text) per request
        for budget in sorted(set(budgets)):
            picked = [i for i, b in enumerate(budgets) if b == budget]
            sampling = dataclasses.replace(cfg.designer_sampling, max_new_tokens=budget)
            with self._phase("designer"):
                part = self.policy.generate([prompts[i] for i in picked], sampling, self._key("designer"))
            for j, i in enumerate(picked):
                rows[i] = (part.prompt_lengths[j], part.tokens[j], part.logprobs[j], part.texts[j])
        out = []
        for request, prompt, (used, tokens, logprobs, text) in zip(requests, prompts, rows):
            source, rejected = roles.designer_program(request, text)  # a tune reply is applied to its base
            env = PoolEnv(self._new_id("env"), request.skill, "designer", source, False)
            with self._phase("validation"):
                env = self.check(env) if rejected is None else dataclasses.replace(env, errors=[rejected])
            # The prompt as the sampler saw it (Policy.generate keeps the tail of an over-long prompt).
            env.designer_sample = {"prompt": prompt[len(prompt) - used:], "tokens": tokens, "logprobs": logprobs}
            out.append((env, request, text))
        return out

    def check(self, env: PoolEnv) -> PoolEnv:
        """Validates the program, then picks its backend (`config.backend`; auto: the first that admits
        the program, e.g. JAX where it fits and matches the program step for step, else the sandbox)
        and records both. In a multi-process run the leader checks and every process gets its verdict."""
        return distributed.leader_only(lambda: self._check(env))

    def _check(self, env: PoolEnv) -> PoolEnv:
        if not env.source:
            env.valid, env.errors = False, ["no Python code block found in the designer's reply"]
            return env
        verdict = validate(env.source, config=self.cfg.validation, pool=self.learner.sandbox, backend=None)
        env.valid, env.errors = verdict.valid, list(verdict.errors)
        if env.valid:
            try:
                env.backend = self.compiled(env).backend
            except (ProgramError, ValueError) as err:  # the backend named in the config cannot run it
                env.valid, env.errors = False, [str(err)]
        return env

    def repair(self, envs: list[PoolEnv]) -> None:
        """One batched repair turn: a valid repaired program feeds the agent; the designer is still
        scored on what it first wrote (its sample is kept unchanged)."""
        if not envs:
            return
        prompts = [self.policy.chat_tokens(roles.repair_prompt(e.source, e.errors, self.cfg.roles, self.cfg.domain))
                   for e in envs]
        with self._phase("designer"):
            result = self.policy.generate(prompts, self.cfg.designer_sampling, self._key("repair"))
        for env, text in zip(envs, result.texts):
            repaired = roles.parse_designer_output(text)
            if not repaired:
                continue
            with self._phase("validation"):
                trial = self.check(PoolEnv(env.env_id, env.skill, env.origin, repaired, False))
            if trial.valid:
                env.source, env.backend, env.errors = repaired, trial.backend, []
                env.valid, env.origin = True, "designer-repaired"

    def top_up(self, pool: list[PoolEnv]) -> list[PoolEnv]:
        """Tops the pool up to `min_valid_envs` valid environments, drawn at random from `env_pool` when
        it is set (e.g. a small model's calibrated library variants), else from the domain's library."""
        valid = sum(e.valid for e in pool)
        stock = fixed_pool_envs(self.cfg.env_pool, self.cfg.domain)
        order = self.rng.permutation(len(stock))
        for idx in order[: max(0, self.cfg.min_valid_envs - valid)]:
            pool.append(self.check(stock[idx]))
        return pool

    def write_hints(self) -> None:
        envs = [e for e in self.pool if e.valid]
        if not envs:
            return
        prompts = [self.policy.chat_tokens(roles.hint_prompt(e.source, self.cfg.roles, self.cfg.domain)) for e in envs]
        result = self.policy.generate(prompts, self.cfg.hint_sampling, self._key("hint"))
        for env, text in zip(envs, result.texts):
            env.hint = roles.parse_hint(text, self.cfg.roles.max_hint_sentences) or None

    def play(self, hinted: bool) -> list:
        """G plays of every valid environment without the hint (and G with it when `hinted`)."""
        cfg = self.cfg
        jobs = []  # (pool env, arm, seed)
        games = sum(e.valid for e in self.pool)
        plays = {"nohint": self.nohint_plays(games), "hint": cfg.group_size}
        for env in self.pool:
            if not env.valid:
                continue
            arms = ("nohint", "hint") if hinted and env.hint else ("nohint",)
            for arm in arms:
                shared_seed = int(self.rng.integers(2**31)) if cfg.group_instances == "shared" else None
                for _ in range(plays[arm]):
                    seed = shared_seed if shared_seed is not None else int(self.rng.integers(2**31))
                    jobs.append((env, arm, seed))
        trajectories = []
        if cfg.play_loop == "device":
            trajectories, jobs = self._play_on_device(jobs)
        for start in range(0, len(jobs), cfg.max_parallel_episodes):
            chunk = jobs[start : start + cfg.max_parallel_episodes]
            instances = []
            for env, _, _ in chunk:
                if not distributed.is_leader():  # the leader runs every environment (rollout.play_episodes)
                    instances.append(None)
                    continue
                try:
                    instances.append(self.compiled(env).make())
                except (ProgramError, ValueError, RuntimeError, OSError) as err:
                    instances.append(_BrokenEnv(err))  # its plays fail at reset, classified by `err`
            try:
                trajectories += play_episodes(
                    instances, [seed for _, _, seed in chunk], self._agent_generate, self.policy.tokenizer,
                    self.rollout, hints=[env.hint if arm == "hint" else None for env, arm, _ in chunk],
                    groups=[(env.env_id, arm) for env, arm, _ in chunk],
                    format_observation=with_hint,
                )
            finally:
                for instance in instances:
                    close = getattr(instance, "close", None)
                    if close:
                        try:
                            close()
                        except Exception:  # closing a crashed env must not end the run
                            pass
        self.report_env_errors(trajectories)
        return trajectories

    def nohint_plays(self, games: int) -> int:
        """No-hint plays per game: SPADE's ceil(nohint_plays_total / games), else group_size."""
        total = self.cfg.nohint_plays_total
        return self.cfg.group_size if total is None else max(1, math.ceil(total / max(games, 1)))

    def report_env_errors(self, trajectories) -> None:
        """Warns about plays whose environment failed (one line per environment and kind, a few lines
        at most) and stops the run when every play failed."""
        failed: dict = {}  # (env_id, kind) -> failed trajectories
        for traj in trajectories:
            if traj.meta.get("env_error"):
                failed.setdefault((traj.group[0], traj.meta["env_error"]), []).append(traj)
        if not failed:
            return
        plays: dict = {}
        for traj in trajectories:
            plays[traj.group[0]] = plays.get(traj.group[0], 0) + 1
        backends = {e.env_id: e.backend for e in self.pool}
        for n, ((env_id, kind), trajs) in enumerate(failed.items()):
            if n == _ENV_ERROR_LINES:
                rest = sum(len(t) for t in list(failed.values())[n:])
                log.warning("iteration %d: %d more failed plays in %d more environment/kind pairs not shown",
                            self.iteration, rest, len(failed) - n)
                break
            log.warning("iteration %d: env %s (%s): %d of %d plays failed (%s): %s", self.iteration, env_id,
                        backends.get(env_id) or "?", len(trajs), plays[env_id], kind, trajs[0].meta["error"])
        total = sum(len(t) for t in failed.values())
        if total == len(trajectories):
            counts = ", ".join(f"{k} {sum(len(t) for (_, kind), t in failed.items() if kind == k)}"
                               for k in ENV_ERROR_KINDS)
            env_id, kind = next(iter(failed))
            raise AllPlaysFailed(
                f"all {total} plays of iteration {self.iteration} failed in their environments ({counts}); "
                f"nothing to train on; first: env {env_id}: {failed[env_id, kind][0].meta['error'][:200]}"
            )

    def _play_on_device(self, jobs):
        """Plays the jobs of environments whose backend gives a device environment in the compiled
        device loop, one call per environment; returns their trajectories and the jobs left for the
        host loop."""
        by_env: dict = {}
        rest = []
        for job in jobs:
            try:
                compiled = self.compiled(job[0])
            except (ProgramError, ValueError, RuntimeError, OSError):
                compiled = None  # the host loop reports the error in the trajectory
            if compiled is not None and compiled.device_env is not None:
                by_env.setdefault(job[0].env_id, (compiled, []))[1].append(job)
            else:
                rest.append(job)
        trajectories = []
        for compiled, env_jobs in by_env.values():
            trajectories += play_episodes_device(
                compiled.device_env, [seed for _, _, seed in env_jobs], self.policy.model, self.policy.tokenizer,
                self.cfg.agent_sampling, self.rollout, self._key("agent"),
                hints=[env.hint if arm == "hint" else None for env, arm, _ in env_jobs],
                groups=[(env.env_id, arm) for env, arm, _ in env_jobs],
            )
        return trajectories, rest

    def compiled(self, env: PoolEnv):
        """The runnable form of a program, built once per distinct source (a backend's admission, such
        as transpiling and the JAX equivalence check, is the expensive part of admitting an environment)."""
        key = hashlib.sha256(env.source.encode()).hexdigest()
        if key not in self._compiled:
            self._compiled[key] = compile_env(env.source, self.cfg.backend, pool=self.learner.sandbox)
        return self._compiled[key]

    def anchor_samples(self) -> list[Sample]:
        """The anchor samples (`anchor`), made on first use: at the first update, from the starting policy."""
        if self.anchor is not None:
            return self.anchor
        # Later than the first iteration is fine while no update has landed (iterations without a sample to
        # train on); after one (a checkpoint from before the anchor existed, or rl.anchor_coef set on resume)
        # the replies are no longer the starting policy's.
        if updates := int(self.learner.state.step):
            log.warning("anchor: made from the weights after %d updates (iteration %d), not the starting "
                        "policy's (the checkpoint holds none)", updates, self.iteration)
        a = self.cfg.anchor
        sampling = self.cfg.agent_sampling
        if a.temperature is not None:
            sampling = dataclasses.replace(sampling, temperature=a.temperature)
        with self._phase("anchor"):
            self.anchor, written = make_anchor_samples(
                a, lambda envs, seeds, key: self._play_one_turn(envs, seeds, key, sampling),
                jax.random.key(self.cfg.seed),
            )
        if not self.anchor:
            raise ValueError(f"anchor: none of the policy's {written} replies to the anchor questions was kept "
                             f"(anchor.keep={a.keep}); ask more (anchor.prompts), other tasks, or keep: all")
        log.info("anchor: %d of the starting policy's %d replies kept (anchor.keep=%s)", len(self.anchor),
                 written, a.keep)
        return self.anchor

    def _play_one_turn(self, envs, seeds, key, sampling) -> list:
        """One-turn episodes of `envs` played as the games are (the agent's conversation and answer format)
        with `sampling`, `max_parallel_episodes` at a time; draws from its own `key`, not the run's RNG."""
        calls = itertools.count()

        def generate(prompts):
            call_key = jax.random.fold_in(key, next(calls))
            return generations_of(self.policy.generate(prompts, sampling, call_key))

        rollout = dataclasses.replace(self.rollout, step_workers=1)  # reasoning-gym steps swap the global RNG
        trajectories = []
        for start in range(0, len(envs), self.cfg.max_parallel_episodes):
            chunk = envs[start : start + self.cfg.max_parallel_episodes]
            instances = chunk if distributed.is_leader() else [None] * len(chunk)
            trajectories += play_episodes(
                instances, seeds[start : start + len(chunk)], generate, self.policy.tokenizer, rollout,
                groups=[("anchor", "nohint")] * len(chunk), format_observation=with_hint,
            )
        return trajectories

    def _agent_generate(self, prompts):
        return generations_of(self.policy.generate(prompts, self.cfg.agent_sampling, self._key("agent")))

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else contextlib.nullcontext()

    def _key(self, what: str):
        return jax.random.key(int(self.rng.integers(2**31)))

    # -- scoring ------------------------------------------------------------------------------------

    def measure(self, trajectories, hinted: bool) -> dict:
        """Per environment: the no-hint arm's share of wins and mean episode reward this iteration; at a
        regeneration step also both arms' mean rewards (the regret's terms). A step that timed out during
        play marks its environment hung (the pure-regret variant's penalty)."""
        by_env = {e.env_id: e for e in self.pool}
        rewards: dict = {}
        for traj in trajectories:
            rewards.setdefault(traj.group, []).append(traj)
            if traj.meta.get("env_error") == "timeout":
                by_env[traj.group[0]].hung = True
        for (env_id, arm), trajs in rewards.items():
            env = by_env[env_id]
            episode = np.array([t.episode_reward for t in trajs], np.float64)
            if arm == "nohint":
                env.wins.append(float(np.mean([t.won for t in trajs])))
                env.rewards.append(float(episode.mean()))
                if hinted:
                    env.r_nohint = float(episode.mean())
                    env.regen_positive_share = float(np.mean(episode > 0))
            else:
                env.r_hint, env.r_hint_max = float(episode.mean()), float(episode.max())
        played = [t for t in trajectories if t.group[1] == "nohint"]
        low, high = wilson_interval(sum(t.won for t in played), len(played)) if played else (math.nan, math.nan)
        out = {
            "agent/win_rate": float(np.mean([t.won for t in played])) if played else float("nan"),
            "agent/win_rate_low": low,  # 95% Wilson interval of the win rate over this iteration's plays
            "agent/win_rate_high": high,
            "agent/mean_reward": float(np.mean([t.episode_reward for t in played])) if played else float("nan"),
            "agent/episodes": len(trajectories),
            "agent/mean_turns": float(np.mean([len(t.actions) for t in trajectories])) if trajectories else 0.0,
            "agent/boxed_share": float(np.mean([boxed_share(t) for t in trajectories])) if trajectories else 0.0,
            "agent/truncated_share": float(np.mean([t.truncated for t in trajectories])) if trajectories else 0.0,
            **env_error_metrics(trajectories),
        }
        if self.cfg.mode == "fixed_pool":  # the pool never changes: a curve per environment
            for (env_id, arm), trajs in sorted(rewards.items()):
                if arm != "nohint":
                    continue
                wins = sum(t.won for t in trajs)
                mean = float(np.mean([t.episode_reward for t in trajs]))
                out[f"pool/{env_id}/win_rate"] = wins / len(trajs)
                out[f"pool/{env_id}/mean_reward"] = mean
                log.info("plays: %s won %d of %d, mean reward %.3f", env_id, wins, len(trajs), mean)
        if hinted:
            regrets = [e.regret for e in self.pool if e.valid and not math.isnan(e.r_hint)]
            out["designer/regret_mean"] = float(np.mean(regrets)) if regrets else 0.0
        return out

    def agent_samples(self, trajectories) -> list[Sample]:
        """GRPO samples of the agent's plays (no-hint arm unless train_on_hinted), zero advantages
        included: they count toward the designer's scale and can fill a fixed global batch."""
        estimator = get_advantage_estimator(self.cfg.rl.agent_advantage)
        trajectories = [t for t in trajectories if self.cfg.train_on_hinted or t.group[1] == "nohint"]
        if not trajectories:
            return []
        groups = {g: i for i, g in enumerate(dict.fromkeys(t.group for t in trajectories))}
        bonus = self.cfg.rl.format_bonus
        rewards = np.array([t.episode_reward + bonus * boxed_share(t) for t in trajectories], np.float32)
        advantages = np.asarray(estimator(rewards, np.array([groups[t.group] for t in trajectories])))
        return [
            Sample(t.tokens, t.loss_mask, t.behaviour_logprobs, float(a), AGENT)
            for t, a in zip(trajectories, advantages)
            if t.trainable
        ]

    def fit_batch(self, designer: list[Sample], agent: list[Sample]) -> list[Sample]:
        """The update's samples. With `global_batch` (SPADE: 192): designer samples first, then agent
        samples trimmed or upsampled (drawn again at random) to fill it. Without: every sample with a
        non-zero advantage once (a zero-advantage row adds no gradient, only compute)."""
        size = self.cfg.global_batch
        if size is None:
            return designer + [a for a in agent if a.advantage != 0.0]
        room = max(size - len(designer), 0)
        if not agent or room == 0:
            return designer[:size]
        if len(agent) >= room:
            picked = np.sort(self.rng.choice(len(agent), room, replace=False))
        else:
            extra = self.rng.choice(len(agent), room - len(agent), replace=True)
            picked = np.concatenate([np.arange(len(agent)), np.sort(extra)])
        return designer + [agent[i] for i in picked]

    def remember_pool(self) -> None:
        """SPADE's memory keeps every designed environment with its regret, win rate and skill; the
        PLR buffer (when on) takes them with their replay score, and rescores the replayed ones."""
        for env in self.pool:
            if env.valid and env.source and env.origin.startswith("designer") and self.cfg.use_memory:
                # SPADE's record: the raw regret and the share of no-hint plays with reward > 0, both
                # measured at the regeneration step.
                # A design without a hint has no regret measured: recorded as 0, as the reference does.
                self.memory.add(EnvRecord(
                    env.env_id, env.source, env.skill, _finite(env.regret) or 0.0, env.regen_positive_share, True,
                    self.iteration - self.cfg.regen_interval,
                ))
        if self.plr is None:
            return
        c = self.cfg.curriculum
        for env in self.pool:
            if not (env.valid and env.source and (env.origin.startswith("designer") or env.plr_slot >= 0)):
                continue
            inputs = ScoreInputs(
                r_hint=np.nan_to_num([env.r_hint]), r_nohint=np.nan_to_num([env.r_nohint]),
                win_rate=np.nan_to_num([env.win_rate]), r_hint_max=np.nan_to_num([env.r_hint_max]),
                win_rate_history=np.array([_pad(env.wins, self.cfg.regen_interval)]),
                mean_reward=np.nan_to_num([env.mean_reward]),
            )
            score = float(np.asarray(DESIGNER_SCORES[c.plr_score](inputs, c))[0])
            if env.plr_slot >= 0:
                self.plr = plr.update_scores(self.plr, [env.plr_slot], [score])
            else:
                self.plr_levels.append({"source": env.source, "skill": env.skill})
                self.plr, _ = plr.insert(self.plr, len(self.plr_levels) - 1, score)

    def replay_envs(self) -> list[PoolEnv]:
        """PLR: each pool slot is, with probability plr_replay_prob, a replay of a high-scoring past
        environment (rank and staleness prioritised) once the buffer is filled enough."""
        c = self.cfg.curriculum
        if self.plr is None or not bool(plr.should_replay(self._key("plr"), self.plr, 1.0, c.plr_min_fill)):
            return []
        n = min(int(self.rng.binomial(self.cfg.pool_size, c.plr_replay_prob)), int(self.plr.size))
        if n == 0:
            return []
        self.plr, slots, level_ids = plr.sample_replay(
            self._key("plr"), self.plr, n, c.plr_temperature, c.plr_staleness
        )
        envs = []
        for slot, level_id in zip(np.asarray(slots).tolist(), np.asarray(level_ids).tolist()):
            level = self.plr_levels[level_id]
            env = PoolEnv(self._new_id("replay"), level["skill"], "replay", level["source"], False, plr_slot=slot)
            envs.append(self.check(env))
        return envs

    def score_pool(self, pool: list[PoolEnv], agent_samples: int) -> tuple[list[Sample], dict]:
        """The delayed designer update for `pool`, written `regen_interval` iterations ago: each kept design
        (the valid ones; invalid too with `train_invalid_designs`) is scored, centred on its skill's mean
        and scaled by min(agent_samples / designs * regen_interval, cap); its stale sample carries that."""
        c = self.cfg.curriculum
        designed = [e for e in pool if e.designer_sample is not None and (e.valid or c.train_invalid_designs)]
        if not designed:
            return [], {"designer/scored": 0}
        inputs = ScoreInputs(
            r_hint=np.nan_to_num([e.r_hint for e in designed]),
            r_nohint=np.nan_to_num([e.r_nohint for e in designed]),
            win_rate=np.nan_to_num([e.win_rate for e in designed]),
            valid=np.array([e.valid for e in designed]),
            hung=np.array([e.hung for e in designed]),
            r_hint_max=np.nan_to_num([e.r_hint_max for e in designed]),
            win_rate_history=np.array([_pad(e.wins, self.cfg.regen_interval) for e in designed]),
            mean_reward=np.nan_to_num([e.mean_reward for e in designed]),
        )
        scores = np.asarray(designer_scores(inputs, c))
        advantages = designer_advantages(
            scores, [e.skill for e in designed], max(agent_samples, 1), len(designed),
            self.cfg.regen_interval, c.max_designer_scale,
        )
        samples = []
        for env, score, adv in zip(designed, scores, advantages):
            self.archive.update(env.env_id, score=float(score), regret=_finite(env.regret),
                                win_rate=_finite(env.win_rate), mean_reward=_finite(env.mean_reward),
                                hint=env.hint, designer_advantage=float(adv))
            if env.env_id in self.memory:
                self.memory.update(env.env_id, score=float(score))
            if adv == 0.0:  # no signal (e.g. every design of its skill scored alike): not trained on
                continue
            d = env.designer_sample
            samples.append(Sample(
                d["prompt"] + d["tokens"], [0] * len(d["prompt"]) + [1] * len(d["tokens"]),
                [0.0] * len(d["prompt"]) + list(d["logprobs"]), float(adv), DESIGNER, stale=True,
            ))
        return samples, {
            "designer/scored": len(designed),
            "designer/score_mean": float(np.mean(scores)),
            "designer/advantage_abs_mean": float(np.mean(np.abs(advantages))),
        }

    def in_band_share(self, pool: list[PoolEnv]) -> float | None:
        """The share of the designer's valid programs in `pool` whose agent win rate lies in the curriculum
        band (None when it wrote none). It measures the pool, so a frozen designer's runs log it too."""
        c = self.cfg.curriculum
        in_band = [c.band_low <= e.win_rate <= c.band_high for e in pool if e.designer_sample is not None and e.valid]
        return float(np.mean(in_band)) if in_band else None

    # -- one iteration ------------------------------------------------------------------------------

    def step(self) -> dict:
        """One iteration: its rollouts, then its update (with `async_staleness` > 0, the next iteration's
        rollouts run during the update: `_step_async`)."""
        if self.cfg.async_staleness:
            return self._step_async()
        samples, metrics = self.collect()
        self.policy.sampler.forget()  # the update invalidates the kept KV cache: free it first
        release_free_memory()  # and give the plays' freed buffers back before the update allocates its own
        with self.timer.phase("update"):
            metrics.update(self.learner.update(samples))
        metrics.update(self.timer.pop())
        self.iteration += 1
        return metrics

    def collect(self) -> tuple[list[Sample], dict]:
        """The iteration's rollouts: (re)design the pool at a regeneration step, write hints, play, score,
        and the samples of its update (with the metrics so far)."""
        cfg, timer = self.cfg, self.timer
        metrics: dict[str, Any] = {}
        regen = cfg.mode == "selfplay" and self.iteration % cfg.regen_interval == 0
        if cfg.mode == "fixed_pool" and not self.pool:
            self.pool = [self.check(e) for e in fixed_pool_envs(cfg.env_pool, cfg.domain)]
            for env in self.pool:
                if not env.valid:
                    log.warning("env_pool: %s is invalid and left out: %s", env.env_id, "; ".join(env.errors))
            if not any(e.valid for e in self.pool):
                raise ValueError(f"env_pool {cfg.env_pool or 'library'}: no valid environment program (see run.log)")
        scored_pool = None  # the previous pool, whose window is over: its designer is scored this step
        if regen and self.pool:
            self.remember_pool()
            if (share := self.in_band_share(self.pool)) is not None:
                metrics["curriculum/in_band_share"] = share
            scored_pool = self.pool if cfg.train_designer else None
        if regen:
            pool, attempts = self.design_pool()  # timed as its "designer" (generation) and "validation" phases
            # Valid as first written (what the designer is rewarded for); repairs are counted apart.
            metrics["designer/valid_rate"] = float(np.mean([e.valid and e.origin == "designer" for e in attempts]))
            metrics["designer/slots_valid"] = float(np.mean([e.valid for e in pool]))
            metrics["designer/attempts"] = len(attempts) / max(len(pool), 1)
            metrics["designer/repaired_rate"] = float(np.mean([e.origin == "designer-repaired" for e in pool]))
            metrics["designer/programs"] = len(pool)
            self.pool = self.top_up(pool) + self.replay_envs()
            with self._phase("validation"):  # top-ups and replays get their backend here, not mid-play
                for env in self.pool if distributed.is_leader() else ():
                    try:
                        self.compiled(env)
                    except (ProgramError, ValueError, RuntimeError, OSError):
                        pass  # the plays record the error in each trajectory
            with timer.phase("hints"):
                self.write_hints()
        with timer.phase("plays"):
            trajectories = self.play(hinted=regen)
        metrics.update(self.measure(trajectories, hinted=regen))
        agent = self.agent_samples(trajectories)
        designer: list[Sample] = []
        if scored_pool is not None:
            designer, score_metrics = self.score_pool(scored_pool, len(agent))
            metrics.update(score_metrics)
        samples = self.fit_batch(designer, agent)
        if cfg.rl.anchor_coef > 0 and samples:  # a regulariser of updates, no update of its own
            anchors = anchor_batch(self.anchor_samples(), cfg.anchor.per_update, self.iteration)
            samples += anchors
            metrics["anchor/samples"] = len(anchors)
        metrics["agent/samples"] = sum(s.role == AGENT for s in samples)
        metrics["designer/samples"] = sum(s.role == DESIGNER for s in samples)
        # what the sampler computed this iteration, every role (the device play loop is not counted)
        metrics.update({f"tokens/{k}": v for k, v in self.policy.sampler.pop_counts().items()})
        metrics["memory/size"] = len(self.memory)
        return samples, metrics

    # -- asynchronous play --------------------------------------------------------------------------

    def _step_async(self) -> dict:
        """Update i runs in this thread while a worker thread collects iteration i+1's rollouts with the
        weights from before update i (the model keeps them: the update lands in the learner's state and is
        written back only after both finish). Iteration i trains on rollouts collected during update i-1,
        so its agent rows are `staleness` updates old and marked stale: the loss clips them around the
        current policy and weights them by min(pi / pi_behaviour, rl.tis_cap) with their kept logprobs.
        The sampler's weights are refreshed whenever the next rollouts would otherwise be more than
        `async_staleness` updates old (so never more: nothing is dropped or waited for)."""
        if self._next is None:  # the first iteration, or the first after a resume: collected now, fresh
            self._next = self._pool().submit(self._collect_at, self._sampler_version, self.timer)
        samples, metrics, version, timer = self._next.result()  # raises what the rollouts raised
        self._next = None
        staleness = self.iteration - version
        if staleness > 0:
            samples = [dataclasses.replace(s, stale=True) if s.role == AGENT else s for s in samples]
        agent_rows = sum(s.role == AGENT for s in samples)
        metrics["async/staleness"] = staleness
        metrics["async/stale_share"] = float(staleness > 0) if agent_rows else 0.0
        self.iteration += 1
        self._checkpoint = None
        started = time.perf_counter()
        if self.iteration < self.cfg.iterations:  # the next iteration's rollouts, alongside this update
            self._checkpoint = copy.deepcopy(self.state_dict())  # before they change the pool, memory, RNG
            self.policy.sampler.forget()  # each iteration's rollouts start without a kept cache, as in step()
            self.timer = type(timer)()  # they time their phases for their own iteration
            self._next = self._pool().submit(self._collect_at, self._sampler_version, self.timer)
        try:
            with timer.phase("update"):
                metrics.update(self.learner.update(samples, write_back=False))
        finally:
            updated = time.perf_counter()
            if self._next is not None:  # also on an error here: no rollout may outlive the step
                concurrent.futures.wait([self._next])
        if self._next is not None:  # seconds both ran, and the update's wait for the rollouts after it
            metrics["async/overlap_s"] = min(self._next_done, updated) - started
            metrics["async/wait_s"] = max(self._next_done - updated, 0.0)
        next_staleness = self.iteration + 1 - self._sampler_version
        last = self.iteration >= self.cfg.iterations
        evaluated = self.cfg.eval_every and self.iteration % self.cfg.eval_every == 0
        if next_staleness > self.cfg.async_staleness or last or evaluated:  # evaluations read the model
            metrics.update(self.learner.write_back())
            self.policy.sampler.forget()
            self._sampler_version = self.iteration
        if last and self._executor is not None:
            self._executor.shutdown()
            self._executor = None
        metrics.update(timer.pop())
        return metrics

    def _collect_at(self, version: int, timer):
        try:
            return (*self.collect(), version, timer)
        finally:
            self._next_done = time.perf_counter()

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spade-rollouts")
        return self._executor


def env_error_metrics(trajectories) -> dict[str, int]:
    """Plays whose environment failed, in all and by kind (rollout.ENV_ERROR_KINDS); 0 when none
    (the device loop's JAX environments cannot fail at play time)."""
    kinds = [t.meta.get("env_error") for t in trajectories]
    out = {"agent/env_errors": sum(k is not None for k in kinds)}
    out.update({f"agent/env_errors/{kind}": kinds.count(kind) for kind in ENV_ERROR_KINDS})
    return out


def boxed_share(trajectory) -> float:
    """Share of the agent's replies that hold a complete \\boxed{...} action (0 with no replies)."""
    if not trajectory.actions:
        return 0.0
    return sum(extract_boxed(a) is not None for a in trajectory.actions) / len(trajectory.actions)


def _pad(values: list[float], n: int) -> list[float]:
    values = list(values)[-n:] or [0.0]
    return [values[0]] * (n - len(values)) + values


def _finite(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


class _BrokenEnv:
    """Stands in for an environment that could not be started: its episode ends with the error
    (of the original type, so that it is classified like a failure during play)."""

    def __init__(self, error: BaseException):
        self.error = error

    def reset(self, seed=None):
        raise self.error.with_traceback(None)

    def step(self, action):
        raise self.error.with_traceback(None)


class SeedProgram(NamedTuple):
    """A program the designer may edit, tune or be shown as an example (roles.design_request)."""

    name: str
    skill: str
    source: str


def seed_programs(env_pool: str | None, domain: str = "games") -> list[SeedProgram] | None:
    """The designer's seed programs: `env_pool`'s when it is set (a small model's calibrated variants are
    then what it edits and tunes, as they are what tops its pool up), else None: the domain's library."""
    if not env_pool:
        return None
    return [SeedProgram(env.env_id, env.skill, env.source) for env in fixed_pool_envs(env_pool, domain)]


def fixed_pool_envs(env_pool: str | None, domain: str = "games") -> list[PoolEnv]:
    """The fixed pool: every `*.py` program in a directory, the library programs named after
    `library:` (comma-separated, each optionally with constants set: `knights_knaves(PEOPLE=3)`), or
    the domain's whole library when none is given."""
    from spade_jax.envs.library import LIBRARY_POOL, library_program, library_programs, parse_library_pool

    if not env_pool:
        return [PoolEnv(f"lib-{p.name}", p.skill, "library", p.source, True) for p in library_programs(domain=domain)]
    if env_pool.startswith(LIBRARY_POOL):
        return [PoolEnv(entry.env_id, library_program(entry.name).skill, "library", entry.source(), True)
                for entry in parse_library_pool(env_pool)]
    root = Path(env_pool)
    if not root.is_dir():
        raise FileNotFoundError(f"env_pool {env_pool} is not a directory of environment programs (*.py)")
    files = sorted(root.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"env_pool {env_pool} holds no *.py environment programs")
    return [PoolEnv(f"file-{f.stem}", "unknown", "file", f.read_text(), True) for f in files]
