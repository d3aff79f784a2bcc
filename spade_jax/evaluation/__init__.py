"""Held-out evaluation: offline GEM games and reasoning-gym tasks at fixed seeds, played through the
training loop, and BFCL tool use (bfcl.py); success rates with Wilson intervals, model-backed policies,
and duplicate flags."""

from spade_jax.evaluation.bfcl import (
    TOOL_SUITES,
    ToolSuite,
    evaluate_tools,
    get_tool_suite,
    load_category,
)
from spade_jax.evaluation.driver import (
    EpisodeResult,
    EvalReport,
    TaskResult,
    evaluate,
)
from spade_jax.evaluation.duplicates import (
    DUPLICATE_THRESHOLD,
    FAMILY_THRESHOLD,
    DuplicateFlag,
    family_score,
    family_words,
    flag_duplicates,
    similarity,
)
from spade_jax.evaluation.environments import (
    RG_ANSWER_INSTRUCTION,
    first_observation,
    make_eval_env,
)
from spade_jax.evaluation.policies import Policy, model_completer, model_policy, tokens_policy
from spade_jax.evaluation.stats import macro_interval, wilson_interval
from spade_jax.evaluation.suites import SUITES, TRAIN, EvalSuite, EvalTask, get_suite, train_suite

__all__ = [
    "DUPLICATE_THRESHOLD",
    "FAMILY_THRESHOLD",
    "RG_ANSWER_INSTRUCTION",
    "SUITES",
    "TOOL_SUITES",
    "TRAIN",
    "DuplicateFlag",
    "EpisodeResult",
    "EvalReport",
    "EvalSuite",
    "EvalTask",
    "Policy",
    "TaskResult",
    "ToolSuite",
    "evaluate",
    "evaluate_tools",
    "family_score",
    "family_words",
    "first_observation",
    "flag_duplicates",
    "get_suite",
    "get_tool_suite",
    "load_category",
    "macro_interval",
    "make_eval_env",
    "model_completer",
    "model_policy",
    "similarity",
    "tokens_policy",
    "train_suite",
    "wilson_interval",
]
