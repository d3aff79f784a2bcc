"""Multi-turn episodes in chat format: observation as user turn, agent reply as assistant turn.

Owns the host loop (one batched generation per turn over all live episodes, environment steps run
concurrently) and the trajectory format the RL update consumes; the device loop is rollout_device.py.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from typing import Any, Callable, Protocol, Sequence

from spade_jax.envs.api import episode_reward, extract_boxed
from spade_jax.knobs import choice, in_range, positive


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    max_turns: int = 25  # SPADE's turn limit per episode
    max_context_tokens: int = 4096  # an episode whose tokens would pass this is cut (truncated)
    loss_on_truncated: bool = False  # SPADE: trajectories cut by the turn limit carry no loss
    # the agent's system turn (self-play and evaluation: None is AGENT_SYSTEM below, "" none)
    system_prompt: str | None = None
    # Text every agent reply starts with, forced rather than sampled (prompt side: no loss, no
    # logprob). "\\boxed{" with the stop string "}" makes a small model answer in the action format.
    reply_prefix: str = ""
    step_workers: int = 8  # environment steps run concurrently on this many threads
    # An environment failure during play (raised, timed out, sandbox died) ends the episode with this
    # reward (SPADE's synthetic_game_env.py: -1; episode rewards are clipped to [-1, 1]).
    env_error_reward: float = -1.0
    # True: an episode ended by such a failure counts as terminated and carries loss (SPADE);
    # False: cut, no reward, no loss
    train_on_env_errors: bool = True
    # what the environment receives: first_boxed (SPADE: the reply's first \\boxed{...},
    # the whole reply when it has none) or reply (the whole reply)
    action: str = "first_boxed"
    # appended to every observation the agent sees (SPADE's recipe asks to reason step by step and answer in \\boxed{})
    observation_suffix: str = ""
    # SPADE: a reply cut by max_new_tokens (no EOS or stop string) ends the episode, truncated
    end_on_cut_reply: bool = False

    def __post_init__(self):
        positive(self.max_turns, "rollout.max_turns")
        positive(self.max_context_tokens, "rollout.max_context_tokens")
        positive(self.step_workers, "rollout.step_workers")
        in_range(self.env_error_reward, -1.0, 1.0, "rollout.env_error_reward")  # NaN is refused too
        choice(self.action, ACTION_MODES, "rollout.action")


ACTION_MODES = ("first_boxed", "reply")

# The agent's system turn in self-play and evaluation (rollout.system_prompt None selects it there).
AGENT_SYSTEM = (
    "You are playing a text game. Each turn, think briefly about the state, then end your reply "
    "with exactly one action written as \\boxed{...}."
)


def with_hint(observation: str, hint: str | None) -> str:
    """The first observation of the hinted arm: the hint appended after the observation."""
    return observation if not hint else f"{observation}\n\nHint: {hint}"


def agent_action(reply: str, mode: str) -> str:
    """The text an environment receives for a reply: under "first_boxed" the reply's first complete
    \\boxed{...} (as `\\boxed{content}`, so environments that read the last one see the same), else
    the whole reply."""
    if mode == "first_boxed":
        content = extract_boxed(reply, first=True)
        if content is not None:
            return f"\\boxed{{{content}}}"
    return reply


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sampled reply: token ids (ending with EOS when the model stopped), their logprobs."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos" | "stop" | "length"


GenerateFn = Callable[[list[list[int]]], list[Generation]]


class Tokenizer(Protocol):
    """What rollouts need of `spade_jax.models.tokenizer.Tokenizer`."""

    eos_token_ids: tuple[int, ...]

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = ...) -> str: ...


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


class ChatStream:
    """Appends chat turns to a token stream exactly as the tokenizer's chat template renders them.

    Agent replies are kept as the sampled token ids (the update must score exactly what was
    sampled); only the template text between turns is tokenized.
    """

    def __init__(self, tokenizer: Tokenizer, system_prompt: str | None = None, reply_prefix: str = ""):
        self.tokenizer = tokenizer
        self.messages: list[dict] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.reply_prefix = reply_prefix
        # Tokenized on its own, so every reply starts with the same ids whatever precedes them.
        self._prefix_ids = tokenizer.encode(reply_prefix, add_special_tokens=False) if reply_prefix else []

    def _render(self, messages, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def first_turn(self, user_text: str) -> list[int]:
        self.messages.append({"role": "user", "content": user_text})
        return self.tokenizer.encode(self._render(self.messages, True), add_special_tokens=False) + self._prefix_ids

    def next_turn(self, reply_tokens: list[int], user_text: str) -> list[int]:
        """Tokens that follow the agent's reply: the end of its turn, the user turn, the reply header
        (and the forced reply prefix)."""
        ended_with_eos = bool(reply_tokens) and reply_tokens[-1] in self.tokenizer.eos_token_ids
        eos_text = self.tokenizer.decode(reply_tokens[-1:], skip_special_tokens=False) if ended_with_eos else ""
        content = self.reply_prefix + self.tokenizer.decode(reply_tokens, skip_special_tokens=True)
        # Locate the end of the reply through a placeholder, so that short or empty replies (which
        # may also occur inside the template's own text) are found at the right place.
        history = self.messages
        placed = [*history, {"role": "assistant", "content": _PLACEHOLDER}]
        through_reply = self._render(placed, False)
        following = self._render([*placed, {"role": "user", "content": user_text}], True)
        tail = through_reply[through_reply.index(_PLACEHOLDER) + len(_PLACEHOLDER):]
        if ended_with_eos and tail.startswith(eos_text):
            tail = tail[len(eos_text):]
        delta = tail + following[len(through_reply):]
        self.messages = [*history, {"role": "assistant", "content": content}, {"role": "user", "content": user_text}]
        return self.tokenizer.encode(delta, add_special_tokens=False) + self._prefix_ids


_PLACEHOLDER = "\ue000spade-reply\ue001"


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


def _step_all(executor, envs, actions):
    futures = [executor.submit(env.step, action) for env, action in zip(envs, actions)]
    results = []
    for future in futures:
        try:
            results.append(future.result())
        except Exception as err:  # an environment crash ends its episode, not the run
            results.append(err)
    return results


def play_episodes(
    envs: Sequence[Any],
    seeds: Sequence[int],
    generate: GenerateFn,
    tokenizer: Tokenizer,
    config: RolloutConfig,
    *,
    hints: Sequence[str | None] | None = None,
    groups: Sequence[Any] | None = None,
    format_observation: Callable[[str, str | None], str] | None = None,
) -> list[Trajectory]:
    """Plays one episode per env in lockstep: each turn is one batched generation over live episodes.

    An env whose reset or step fails ends its episode (`end_on_env_error`): lost with
    `config.env_error_reward`, the failure's kind in meta["env_error"] and its text in meta["error"].
    """
    n = len(envs)
    hints = list(hints) if hints is not None else [None] * n
    groups = list(groups) if groups is not None else list(range(n))
    if format_observation is None:
        format_observation = with_hint

    trajectories: list[Trajectory] = []
    streams: list[ChatStream] = []
    live: list[int] = []
    with concurrent.futures.ThreadPoolExecutor(config.step_workers) as executor:
        resets = [executor.submit(env.reset, seed) for env, seed in zip(envs, seeds)]
        for i, future in enumerate(resets):
            traj = Trajectory([], [], [], [], [], [], group=groups[i], meta={"hinted": hints[i] is not None})
            trajectories.append(traj)
            stream = ChatStream(tokenizer, config.system_prompt, config.reply_prefix)
            streams.append(stream)
            try:
                obs, _info = future.result()
            except Exception as err:  # an environment crash ends its episode, not the run
                end_on_env_error(traj, err, "reset", config)
                continue
            traj.observations.append(obs)
            prompt = stream.first_turn(format_observation(obs + config.observation_suffix, hints[i]))
            traj.tokens.extend(prompt)
            traj.loss_mask.extend([0] * len(prompt))
            traj.behaviour_logprobs.extend([0.0] * len(prompt))
            live.append(i)

        for _turn in range(config.max_turns):
            for i in live:
                if len(trajectories[i].tokens) >= config.max_context_tokens:  # out of context: cut
                    trajectories[i].truncated = trajectories[i].cut_by_context = True
            live = [i for i in live if not trajectories[i].cut_by_context]
            if not live:
                break
            replies = generate([trajectories[i].tokens for i in live])
            actions = []
            for i, reply in zip(live, replies):
                traj = trajectories[i]
                traj.tokens.extend(reply.tokens)
                traj.loss_mask.extend([1] * len(reply.tokens))
                traj.behaviour_logprobs.extend(reply.logprobs)
                text = config.reply_prefix + tokenizer.decode(reply.tokens, skip_special_tokens=True)
                traj.actions.append(text)
                actions.append(agent_action(text, config.action))
            if config.end_on_cut_reply:  # SPADE: an unfinished reply ends its episode unplayed
                for i, reply in zip(live, replies):
                    if reply.finish_reason == "length":
                        trajectories[i].truncated = True
                        trajectories[i].meta["cut_reply"] = True
                kept = [k for k, i in enumerate(live) if not trajectories[i].meta.get("cut_reply")]
                live, replies, actions = [live[k] for k in kept], [replies[k] for k in kept], [actions[k] for k in kept]
            results = _step_all(executor, [envs[i] for i in live], actions)
            still_live = []
            for i, reply, result in zip(live, replies, results):
                traj = trajectories[i]
                if isinstance(result, Exception):
                    end_on_env_error(traj, result, "step", config)
                    continue
                try:  # an in-process env may break the 5-tuple contract (the sandbox checks it)
                    obs, reward, terminated, truncated, _info = result
                    reward = float(reward)
                except (TypeError, ValueError) as err:
                    end_on_env_error(traj, err, "step", config)
                    continue
                traj.rewards.append(reward if math.isfinite(reward) else 0.0)
                traj.observations.append(obs)
                if terminated or truncated:
                    traj.terminated, traj.truncated = bool(terminated), bool(truncated) and not terminated
                    continue
                follow = streams[i].next_turn(reply.tokens, format_observation(obs + config.observation_suffix, None))
                traj.tokens.extend(follow)
                traj.loss_mask.extend([0] * len(follow))
                traj.behaviour_logprobs.extend([0.0] * len(follow))
                still_live.append(i)
            live = still_live

    for i in live:  # out of turns or out of context
        traj = trajectories[i]
        traj.truncated = True
        traj.cut_by_context = len(traj.tokens) >= config.max_context_tokens
    for traj in trajectories:
        clip_to_context(traj, config)
    return trajectories


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
