"""The host episode loop (`play_episodes`): one batched generation per turn over all live episodes,
environment steps run concurrently on threads; `Generation` is what the sampler returns per reply."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from typing import Any, Callable, Sequence

from spade_jax import distributed
from spade_jax.rollout.actions import agent_action
from spade_jax.rollout.chat import ChatStream, Tokenizer, with_hint
from spade_jax.rollout.config import RolloutConfig
from spade_jax.rollout.tool_calls import parse_tool_calls
from spade_jax.rollout.trajectory import Trajectory, clip_to_context, end_on_env_error
from spade_jax.run.interrupt import raise_if_interrupted


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sampled reply: token ids (ending with EOS when the model stopped), their logprobs."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos" | "stop" | "length"


GenerateFn = Callable[[list[list[int]]], list[Generation]]


def _step_all(executor, envs, actions):
    return _results([executor.submit(env.step, action) for env, action in zip(envs, actions)])


def _reset_all(executor, envs, seeds):
    return _results([executor.submit(env.reset, seed) for env, seed in zip(envs, seeds)])


def _results(futures):
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

    In a multi-process run every process calls it; only the leader (process 0) holds and steps the
    environments (the others may pass placeholders) and their results are broadcast each turn.
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
        resets = distributed.leader_only(lambda: _reset_all(executor, envs, seeds))
        for i, result in enumerate(resets):
            traj = Trajectory([], [], [], [], [], [], group=groups[i], meta={"hinted": hints[i] is not None})
            trajectories.append(traj)
            stream = ChatStream(tokenizer, config.system_prompt, config.reply_prefix)
            streams.append(stream)
            try:
                if isinstance(result, Exception):
                    raise result
                obs, info = result
            except Exception as err:  # an environment crash ends its episode, not the run
                end_on_env_error(traj, err, "reset", config)
                continue
            if config.tool_turns and isinstance(info, dict) and info.get("tools"):
                stream.tools = list(info["tools"])  # rendered by the chat template (rollout/tool_chat.py)
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
            raise_if_interrupted()  # a turn's start is a safe place to stop (plays keep nothing)
            replies = generate([trajectories[i].tokens for i in live])
            actions = []
            for i, reply in zip(live, replies):
                traj = trajectories[i]
                text = config.reply_prefix + tokenizer.decode(reply.tokens, skip_special_tokens=True)
                masked = config.mask_malformed_tool_calls and not parse_tool_calls(text).well_formed
                if masked:
                    traj.meta["malformed_tool_calls"] = traj.meta.get("malformed_tool_calls", 0) + 1
                traj.tokens.extend(reply.tokens)
                traj.loss_mask.extend([0 if masked else 1] * len(reply.tokens))
                traj.behaviour_logprobs.extend(reply.logprobs)
                traj.actions.append(text)
                actions.append(agent_action(text, config.action))
            if config.end_on_cut_reply:  # SPADE: an unfinished reply ends its episode unplayed
                for i, reply in zip(live, replies):
                    if reply.finish_reason == "length":
                        trajectories[i].truncated = True
                        trajectories[i].meta["cut_reply"] = True
                kept = [k for k, i in enumerate(live) if not trajectories[i].meta.get("cut_reply")]
                live, replies, actions = [live[k] for k in kept], [replies[k] for k in kept], [actions[k] for k in kept]
            stepped = [envs[i] for i in live]
            results = distributed.leader_only(lambda: _step_all(executor, stepped, actions))  # noqa: B023 (called at once)
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
                # a reply that called tools hears back in a tool turn under rollout.tool_turns
                role = "tool" if config.tool_turns and parse_tool_calls(traj.actions[-1]).calls else "user"
                follow = streams[i].next_turn(reply.tokens, format_observation(obs + config.observation_suffix, None),
                                              role=role)
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
