"""The trajectory format the RL update consumes (`Trajectory`), cut to the context limit by
`clip_to_context`, and how an environment failure during play ends an episode (`end_on_env_error`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from spade_jax.envs.api import episode_reward
from spade_jax.rollout.config import RolloutConfig


@dataclasses.dataclass
class Trajectory:
    """A whole episode as one token sequence with a per-token loss mask and behaviour logprobs."""

    tokens: list[int]
    loss_mask: list[int]  # 1 on tokens the agent generated
    behaviour_logprobs: list[float]  # logprob of each token under the sampling policy (0 off-mask)
    rewards: list[float]  # per step
    observations: list[str]
    actions: list[str]
    terminated: bool = False
    truncated: bool = False
    cut_by_context: bool = False
    group: Any = None  # key of the GRPO group (environment and arm)
    meta: dict = dataclasses.field(default_factory=dict)

    @property
    def episode_reward(self) -> float:
        """SPADE: the last step reward clipped to [-1, 1] if the episode terminated, else 0."""
        return episode_reward(self.rewards[-1], self.terminated) if self.rewards else 0.0

    @property
    def won(self) -> bool:
        return self.terminated and bool(self.rewards) and self.rewards[-1] >= 1.0

    @property
    def trainable(self) -> bool:
        return any(self.loss_mask)



def clip_to_context(traj: Trajectory, config: RolloutConfig) -> None:
    """Cuts a finished trajectory at the context limit and masks a truncated one's loss unless
    `loss_on_truncated` (shared by the host and device loops)."""
    if len(traj.tokens) > config.max_context_tokens:
        keep = config.max_context_tokens
        traj.tokens, traj.loss_mask = traj.tokens[:keep], traj.loss_mask[:keep]
        traj.behaviour_logprobs = traj.behaviour_logprobs[:keep]
        traj.cut_by_context = True
    cut_by_env_error = traj.meta.get("env_error") is not None and not config.train_on_env_errors
    if (traj.truncated and not config.loss_on_truncated) or cut_by_env_error:
        traj.loss_mask = [0] * len(traj.loss_mask)


# How an environment failed during play (Trajectory.meta["env_error"]): the program raised or broke
# the TextEnv contract; a call did not return in time (its sandbox worker was killed); the sandbox
# worker died (exit, signal, limit, garbage on the pipe) or could not be started.
ENV_ERROR_KINDS = ("exception", "timeout", "sandbox_died")


def classify_env_error(err: BaseException) -> str:
    """One of ENV_ERROR_KINDS for an exception raised by an environment's reset or step."""
    from spade_jax.envs.backends.sandbox import EnvCrashed, EnvError, EnvTimeout, SandboxError

    if isinstance(err, (EnvTimeout, TimeoutError)):
        return "timeout"
    if isinstance(err, EnvCrashed) or (isinstance(err, SandboxError) and not isinstance(err, EnvError)):
        return "sandbox_died"
    return "exception"


def end_on_env_error(traj: Trajectory, err: BaseException, phase: str, config: RolloutConfig) -> None:
    """Ends an episode whose environment failed in `phase` ("reset" or "step"): the kind and the
    one-line error go to meta; the episode is lost with `env_error_reward` (SPADE) and kept for the
    update, or, without `train_on_env_errors`, cut with no reward and no loss."""
    traj.meta["env_error"] = classify_env_error(err)
    traj.meta["env_error_phase"] = phase
    traj.meta["error"] = " ".join(f"{phase} failed: {err}".split())[:600]
    if config.train_on_env_errors:
        traj.rewards.append(float(config.env_error_reward))
        traj.terminated, traj.truncated = True, False
    else:
        traj.truncated = True
