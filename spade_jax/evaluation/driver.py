"""`evaluate(policy, suite)`: every episode of a suite played through the training loop (play.py),
scored per task with Wilson intervals and over the suite with a macro average, as an EvalReport."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from spade_jax.evaluation.environments import make_eval_env
from spade_jax.evaluation.play import EvalEpisode, play
from spade_jax.evaluation.policies import Policy
from spade_jax.evaluation.stats import macro_interval, wilson_interval
from spade_jax.evaluation.suites import EvalSuite, get_suite
from spade_jax.rollout import AGENT_SYSTEM


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
    env_id: str  # eval task
    seed: int  # episode seed
    success: bool  # won the game / solved the item
    turns: int  # agent replies
    total_reward: float  # sum of step rewards
    final_reward: float  # last step reward (0 when no step ran)
    error: str | None = None  # env crash, if any (the episode counts as failed)
    replies: tuple[str, ...] = ()  # the agent's replies, in order (what a score alone cannot show)


@dataclasses.dataclass(frozen=True)
class TaskResult:
    env_id: str  # eval task
    episodes: int  # episodes played
    successes: int  # episodes won
    success_rate: float  # successes / episodes
    ci_low: float  # Wilson 95% interval
    ci_high: float
    mean_reward: float  # mean total reward (context only: random play earns some)
    mean_turns: float  # mean agent replies per episode


@dataclasses.dataclass(frozen=True)
class EvalReport:
    suite: str  # suite name
    seed: int  # evaluate(seed=...) (shifts every episode seed)
    tasks: tuple[TaskResult, ...]  # one per suite task, in suite order
    episodes: tuple[EpisodeResult, ...]  # every episode
    success_rate: float  # macro average over tasks
    ci_low: float  # normal-approximation 95% interval of the macro average
    ci_high: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        rows = [("task", "success", "95% CI", "episodes", "mean reward", "mean turns")]
        for t in self.tasks:
            rows.append((
                t.env_id, f"{100 * t.success_rate:.1f}%",
                f"[{100 * t.ci_low:.1f}, {100 * t.ci_high:.1f}]", str(t.episodes),
                f"{t.mean_reward:.3f}", f"{t.mean_turns:.1f}",
            ))
        rows.append((
            "macro average", f"{100 * self.success_rate:.1f}%",
            f"[{100 * self.ci_low:.1f}, {100 * self.ci_high:.1f}]",
            str(sum(t.episodes for t in self.tasks)), "", "",
        ))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = []
        for j, row in enumerate(rows):
            lines.append("  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))
            ).rstrip())
            if j == 0 or j == len(rows) - 2:
                lines.append("  ".join("-" * w for w in widths))
        return f"suite {self.suite} (seed {self.seed})\n" + "\n".join(lines)


def evaluate(
    policy: Policy,
    suite: EvalSuite | str,
    *,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = False,
    system_prompt: str | None = AGENT_SYSTEM,
) -> EvalReport:
    """Plays every episode of `suite` with `policy`, all live episodes batched per turn.

    Episode seeds are the suite's seeds plus `seed` (0 is the canonical held-out set). The
    conversation is the agent's, as in training (rollout.play_episodes): `system_prompt` as system
    turn, observation as user turn, reply as assistant turn, up to each task's max_turns replies.
    `batch_size` caps one policy call.
    """
    if isinstance(suite, str):
        suite = get_suite(suite)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    plan = [(task, episode_seed + seed) for task in suite.tasks for episode_seed in task.episode_seeds]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(plan), desc=f"eval {suite.name}", unit="ep", leave=False)
    on_done = None if bar is None else (lambda: bar.update(1))
    try:
        episodes = [EvalEpisode(make_eval_env(task.env_id), task.max_turns, on_done) for task, _ in plan]
        trajectories = play(policy, episodes, [s for _, s in plan], system_prompt=system_prompt,
                            batch_size=batch_size)
    finally:
        if bar is not None:
            bar.close()

    results = tuple(
        EpisodeResult(
            task.env_id, episode_seed, episode.success, len(traj.actions), float(sum(traj.rewards)),
            float(traj.rewards[-1]) if traj.rewards else 0.0, episode.error, tuple(traj.actions),
        )
        for (task, episode_seed), episode, traj in zip(plan, episodes, trajectories)
    )
    tasks = []
    for task in suite.tasks:
        mine = [r for r in results if r.env_id == task.env_id]
        wins = sum(r.success for r in mine)
        low, high = wilson_interval(wins, len(mine))
        tasks.append(TaskResult(
            task.env_id, len(mine), wins, wins / len(mine), low, high,
            sum(r.total_reward for r in mine) / len(mine), sum(r.turns for r in mine) / len(mine),
        ))
    mean, low, high = macro_interval([(t.successes, t.episodes) for t in tasks])
    return EvalReport(suite.name, seed, tuple(tasks), results, mean, low, high)
