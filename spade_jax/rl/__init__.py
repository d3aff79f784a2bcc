"""RL update for both SPADE roles: GRPO losses, advantage estimators (registry), TrainState, train_step.

Import from here: `RLConfig`, `TrainBatch`, `make_train_step`, `compute_advantages`, `grpo_loss`,
`kl_penalty`, `truncated_importance_weights`.
"""

from spade_jax.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    get_advantage_estimator,
    register_advantage_estimator,
)
from spade_jax.rl.batch import AGENT, ANCHOR, DESIGNER, ROLE_NAMES, TrainBatch
from spade_jax.rl.config import KL_ESTIMATORS, RLConfig
from spade_jax.rl.losses import (
    LossNormalisers,
    grpo_loss,
    grpo_token_terms,
    kl_penalty,
    loss_normalisers,
    score_index,
    token_logprobs,
    token_logprobs_at,
    truncated_importance_weights,
)
from spade_jax.rl.train import TrainState, TrainStep, make_optimizer, make_train_step, prepare_batch

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGENT", "ANCHOR", "DESIGNER", "KL_ESTIMATORS", "ROLE_NAMES", "LossNormalisers", "RLConfig",
    "TrainBatch", "TrainState", "TrainStep", "compute_advantages",
    "get_advantage_estimator", "grpo_loss", "grpo_token_terms", "loss_normalisers",
    "make_optimizer", "make_train_step", "prepare_batch", "register_advantage_estimator",
    "kl_penalty", "score_index", "token_logprobs", "token_logprobs_at", "truncated_importance_weights",
]
