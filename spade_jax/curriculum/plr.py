"""Prioritised Level Replay buffer (beyond SPADE): replays high-regret environments to the agent.
A fixed-capacity pytree of scores, staleness timestamps and environment ids, with pure jittable updates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class PLRState:
    """Buffer of environment ids (indices into the run's environment archive) and their scores."""

    level_ids: jax.Array  # int32 [capacity]: environment id in each slot, -1 when empty
    scores: jax.Array  # float32 [capacity]: replay score (higher = replay sooner)
    timestamps: jax.Array  # int32 [capacity]: replay counter value when the slot was last sampled or inserted
    size: jax.Array  # int32 []: filled slots (slots [0, size) are filled)
    replay_count: jax.Array  # int32 []: number of replay draws so far (the staleness clock)

    @property
    def capacity(self) -> int:
        return self.scores.shape[0]


def plr_init(capacity: int) -> PLRState:
    if capacity < 1:
        raise ValueError(f"PLR capacity must be >= 1, got {capacity}")
    return PLRState(
        level_ids=jnp.full((capacity,), -1, jnp.int32),
        scores=jnp.zeros((capacity,), jnp.float32),
        timestamps=jnp.zeros((capacity,), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        replay_count=jnp.zeros((), jnp.int32),
    )


def _filled(state: PLRState) -> jax.Array:
    return jnp.arange(state.capacity) < state.size


def insert(state: PLRState, level_id, score) -> tuple[PLRState, jax.Array]:
    """Add an environment; when full it replaces the lowest-scoring one if its score is higher.

    Returns the new state and the slot used (-1 when the environment was not good enough to enter).
    """
    level_id = jnp.asarray(level_id, jnp.int32)
    score = jnp.asarray(score, jnp.float32)
    full = state.size >= state.capacity
    masked = jnp.where(_filled(state), state.scores, jnp.inf)
    weakest = jnp.argmin(masked)
    slot = jnp.where(full, weakest, state.size)
    accept = jnp.logical_or(~full, score > state.scores[weakest])
    new = state.replace(
        level_ids=jnp.where(accept, state.level_ids.at[slot].set(level_id), state.level_ids),
        scores=jnp.where(accept, state.scores.at[slot].set(score), state.scores),
        timestamps=jnp.where(accept, state.timestamps.at[slot].set(state.replay_count), state.timestamps),
        size=jnp.minimum(state.size + accept.astype(jnp.int32), state.capacity),
    )
    return new, jnp.where(accept, slot, -1)


def insert_batch(state: PLRState, level_ids, scores) -> tuple[PLRState, jax.Array]:
    """Insert several environments in order (a scan over `insert`)."""

    def body(state, item):
        return insert(state, item[0], item[1])

    return jax.lax.scan(body, state, (jnp.asarray(level_ids, jnp.int32), jnp.asarray(scores, jnp.float32)))


def update_scores(state: PLRState, slots, scores) -> PLRState:
    """Overwrite the scores of the given slots (e.g. the regret measured when they were replayed).
    Slots < 0 are ignored."""
    slots = jnp.asarray(slots, jnp.int32)
    keep = slots >= 0
    safe = jnp.where(keep, slots, state.capacity)  # out of range: dropped by mode="drop"
    return state.replace(scores=state.scores.at[safe].set(jnp.asarray(scores, jnp.float32), mode="drop"))


def score_weights(state: PLRState, temperature: float) -> jax.Array:
    """Rank prioritisation: P_S(i) proportional to rank_i^(-1/beta), rank 1 = highest score."""
    filled = _filled(state)
    masked = jnp.where(filled, state.scores, -jnp.inf)
    order = jnp.argsort(-masked, stable=True)  # slot indices, best first; ties broken by slot
    ranks = jnp.empty_like(order).at[order].set(jnp.arange(1, state.capacity + 1))
    weights = jnp.where(filled, ranks.astype(jnp.float32) ** (-1.0 / temperature), 0.0)
    return weights / jnp.maximum(weights.sum(), 1e-30)


def staleness_weights(state: PLRState) -> jax.Array:
    """P_C(i) proportional to replay_count - timestamp_i; uniform over filled slots when all are fresh."""
    filled = _filled(state)
    staleness = jnp.where(filled, (state.replay_count - state.timestamps).astype(jnp.float32), 0.0)
    total = staleness.sum()
    uniform = filled.astype(jnp.float32) / jnp.maximum(filled.sum(), 1)
    return jnp.where(total > 0, staleness / jnp.maximum(total, 1e-30), uniform)


def replay_weights(state: PLRState, temperature: float = 0.3, staleness: float = 0.3) -> jax.Array:
    """Robust PLR's replay distribution (1 - rho) * P_S + rho * P_C over the filled slots."""
    return (1.0 - staleness) * score_weights(state, temperature) + staleness * staleness_weights(state)


def should_replay(key: jax.Array, state: PLRState, replay_prob: float = 0.5, min_fill: float = 0.1) -> jax.Array:
    """Replay (True) or design new (False): replay with probability replay_prob once the buffer holds
    at least min_fill * capacity environments (and at least one)."""
    enough = state.size >= jnp.maximum(jnp.ceil(min_fill * state.capacity), 1)
    return jnp.logical_and(enough, jax.random.uniform(key) < replay_prob)


def sample_replay(
    key: jax.Array, state: PLRState, num: int = 1, temperature: float = 0.3, staleness: float = 0.3
) -> tuple[PLRState, jax.Array, jax.Array]:
    """Draw `num` distinct filled slots from the replay distribution; returns (state, slots, level_ids).

    One call is one tick of the staleness clock: the clock advances by one and the drawn slots are
    stamped with it. The caller must ensure size >= num (check with `should_replay`).
    """
    probs = replay_weights(state, temperature, staleness)
    slots = jax.random.choice(key, state.capacity, shape=(num,), replace=False, p=probs)
    clock = state.replay_count + 1
    new = state.replace(replay_count=clock, timestamps=state.timestamps.at[slots].set(clock))
    return new, slots, state.level_ids[slots]
