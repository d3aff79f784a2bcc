"""Policies: what plays the agent's side of an evaluation, a batch of chat conversations in and one
reply each out; from a token-level generator or from a model through the sampler."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

_log = logging.getLogger("spade_jax.evaluation")

Messages = list[dict[str, str]]
# A policy maps a batch of chat conversations (each ending with a user turn) to one reply each.
Policy = Callable[[list[Messages]], list[str]]


def _prompt_ids(tokenizer: Any, messages: Messages) -> list[int]:
    """Chat-template prompt ids: our Tokenizer's encode_chat, else a transformers tokenizer."""
    encode_chat = getattr(tokenizer, "encode_chat", None)
    if callable(encode_chat):
        return list(encode_chat(messages, add_generation_prompt=True))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def tokens_policy(
    generate: Callable[[list[list[int]]], Sequence[Any]], tokenizer: Any
) -> Policy:
    """Policy from a token-level generator (prompt ids -> one completion per prompt, each a
    list of ids or an object with `.tokens`, as rollout.GenerateFn returns)."""

    def policy(conversations: list[Messages]) -> list[str]:
        generations = generate([_prompt_ids(tokenizer, messages) for messages in conversations])
        return [
            tokenizer.decode(list(getattr(g, "tokens", g)), skip_special_tokens=True)
            for g in generations
        ]

    return policy


def model_completer(
    model: Any, tokenizer: Any, sampling_config: Any = None, *, mesh: Any = None, seed: int = 0,
) -> Callable[[list[str]], list[str]]:
    """Prompt texts (already rendered by a chat template) -> one reply text each, through
    spade_jax.sampling.Sampler on `model` (greedy, 256 new tokens unless `sampling_config` says otherwise);
    each call draws a fresh key folded from `seed`."""
    import itertools

    import jax

    from spade_jax.sampling import Sampler, SamplingConfig

    config = sampling_config or SamplingConfig(max_new_tokens=256, temperature=0.0)
    sampler = Sampler(model, tokenizer, mesh=mesh)
    calls = itertools.count()
    base_key = jax.random.key(seed)
    # A conversation that no longer fits the context gets an empty reply, which the env
    # scores as an unreadable action: the episode ends unsolved instead of the run failing.
    room = model.spec.max_position - config.max_new_tokens

    def complete_ids(prompts: list[list[int]]) -> list[str | None]:
        """Replies from prompt ids; None for a prompt past the context."""
        fits = [i for i, p in enumerate(prompts) if len(p) <= room]
        if len(fits) < len(prompts):
            _log.warning("%d conversation(s) exceed the model's context; they get an empty reply",
                         len(prompts) - len(fits))
        replies: list[str | None] = [None] * len(prompts)
        if fits:
            key = jax.random.fold_in(base_key, next(calls))
            result = sampler.generate([prompts[i] for i in fits], config, key=key)
            for i, text in zip(fits, result.texts):
                replies[i] = text
        return replies

    def complete(prompts: list[str]) -> list[str]:
        replies = complete_ids([list(tokenizer.encode(p, add_special_tokens=False)) for p in prompts])
        return ["" if r is None else r for r in replies]

    complete.ids = complete_ids  # the same completion from prompt ids (None past the context)
    return complete


def model_policy(
    model: Any, tokenizer: Any, sampling_config: Any = None, *, mesh: Any = None, seed: int = 0,
    reply_prefix: str = "",
) -> Policy:
    """Policy backed by spade_jax.sampling.Sampler on `model` (greedy, 256 new tokens unless
    `sampling_config` says otherwise); each call draws a fresh key folded from `seed`."""
    complete = model_completer(model, tokenizer, sampling_config, mesh=mesh, seed=seed)

    def policy(conversations: list[Messages]) -> list[str]:
        forced = tokenizer.encode(reply_prefix, add_special_tokens=False) if reply_prefix else []
        prompts = [_prompt_ids(tokenizer, messages) + forced for messages in conversations]
        return ["" if text is None else reply_prefix + text for text in complete.ids(prompts)]

    return policy
