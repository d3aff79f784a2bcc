"""The qwen3_* configs reproduce SPADE's reference recipe (spade-rl/spade at 9b2b813,
cmd/games/train_spade_{4b,8b,30b}.sh and the code under spade/core): the numbers below are written
from the reference, as docs/recipe.md's reference column, never read from our YAML."""

from __future__ import annotations

import math

import pytest

from spade_jax.config import load_config
from spade_jax.curriculum import designer_scale

# Setting -> the reference's value, common to the 4B, 8B and 30B scripts.
REFERENCE = {
    "iterations": 400,  # --num-rollout 400
    "regen_interval": 4,  # --spade-game-regeneration-interval 4, --spade-proposer-training-delay 4
    "pool_size": 24,  # --rollout-batch-size 24
    "group_size": 16,  # --spade-hint-plays-per-game 16
    "nohint_plays_total": 192,  # ceil(global batch / games) no-hint plays per game
    "global_batch": 192,  # --global-batch-size 192
    "design_attempts": 5,  # max_attempts=5 per game slot
    "min_valid_envs": 0,
    "train_designer": True,
    "use_memory": True,  # --spade-use-env-memory
    "train_on_hinted": False,  # hinted plays only measure r_hint
    "checkpoint_every": 16,  # --save-interval 16
    "designer_sampling.temperature": 0.6,  # --spade-env-temperature 0.6
    "designer_sampling.top_p": 0.95,  # --spade-env-top-p default
    "designer_sampling.top_k": 20,  # --spade-env-top-k default
    "hint_sampling.temperature": 0.3,  # --spade-hint-temperature 0.3
    "hint_sampling.max_new_tokens": 4096,  # --spade-hint-max-tokens 4096
    "hint_sampling.top_p": 0.9,  # generate_async's default top_p (the hint call passes none)
    "hint_sampling.top_k": 0,  # slime's --rollout-top-k default -1: off
    "agent_sampling.temperature": 0.6,  # --spade-actor-temperature 0.6
    "agent_sampling.top_p": 0.95,
    "agent_sampling.top_k": 20,
    "agent_sampling.max_new_tokens": 8192,  # --spade-actor-max-tokens 8192
    "rollout.max_turns": 25,  # --spade-max-turns 25
    "rollout.max_context_tokens": 32768,  # --spade-max-context-length 32768
    "rollout.loss_on_truncated": True,  # --spade-compact-filter is not set by the games scripts
    "rollout.system_prompt": "",  # the qwen3_game template is one user turn
    "rollout.reply_prefix": "",
    "rollout.env_error_reward": -1.0,  # SyntheticGameEnv.step: an exception ends the episode with -1
    "rollout.train_on_env_errors": True,
    "rollout.action": "first_boxed",  # parse_action: the first \boxed{...}
    "rollout.end_on_cut_reply": True,  # no EOS: the episode ends, truncated
    "rl.lr": 1e-6,
    "rl.weight_decay": 0.1,
    "rl.b1": 0.9,
    "rl.b2": 0.98,
    "rl.grad_clip": 1.0,  # slime's --clip-grad default
    "rl.eps_low": 0.2,
    "rl.eps_high": 0.28,
    "rl.kl_estimator": "k3",  # low_var_kl
    "rl.aggregation": "sequence",  # no --calculate-per-token-loss
    "rl.tis_cap": 2.0,  # --use-tis, --tis-clip 2
    "rl.agent_advantage": "grpo_zscore",  # --spade-reward-normalization grpo
    "rl.format_bonus": 0.0,
    "curriculum.score": "spade_blend",  # --spade-env-reward-variant blend
    "curriculum.regret_weight": 0.4,
    "curriculum.band_weight": 0.6,  # --spade-plateau-weight 0.6
    "curriculum.regret_scale": 0.15,
    "curriculum.band_low": 0.4,
    "curriculum.band_high": 0.6,
    "curriculum.band_ramp": 0.25,
    "curriculum.plateau_input": "mean_reward",
    "curriculum.hung_penalty": -0.5,
    "curriculum.train_invalid_designs": False,
    "curriculum.max_designer_scale": 50.0,
    "curriculum.skills_per_regen": 3,
    "curriculum.memory_size": 200,
    "curriculum.positives": 2,
    "curriculum.negatives": 1,
    "curriculum.positive_low": 0.15,
    "curriculum.positive_high": 0.85,
    "curriculum.negative_easy": 0.9,
    "curriculum.negative_hard": 0.1,
    "curriculum.positive_pool": None,  # max(3n, 10)
    "curriculum.plr": False,
    "roles.memory_example_max_chars": 2000,  # code_snippet_max_chars
    "validation.reward_bound": 10.0,
    "validation.budget_s": 60.0,  # VALIDATE_GAME_TIMEOUT
    "validation.step_timeout_s": 30.0,  # ENV_STEP_TIMEOUT
    "sandbox.call_timeout_s": 30.0,
}

# Where the scripts differ.
PER_MODEL = {
    "qwen3_4b": {"designer_sampling.max_new_tokens": 16384, "rl.kl_coef": 0.0},
    "qwen3_8b": {"designer_sampling.max_new_tokens": 20000, "rl.kl_coef": 0.005},
    "qwen3_30b_a3b": {"designer_sampling.max_new_tokens": 16384, "rl.kl_coef": 0.0},
}

# Our additions, switched off in the recipe (the reference has none of them).
OURS_OFF = {
    "roles.edit_prob": 0.0,
    "roles.tune_prob": 0.0,
    "roles.repair": False,
    "roles.library_example": False,
    "rl.format_bonus": 0.0,
    "curriculum.plr": False,
    "play_loop": "host",
}


def _get(config, dotted: str):
    value = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _same(actual, expected) -> bool:
    if isinstance(expected, float) and not isinstance(actual, bool):
        return actual == pytest.approx(expected, rel=1e-9, abs=1e-12)
    return actual == expected


@pytest.mark.parametrize("name", sorted(PER_MODEL))
def test_recipe_configs_hold_the_reference_settings(name):
    config = load_config(name)
    expected = {**REFERENCE, **PER_MODEL[name], **OURS_OFF}
    drifted = {key: (_get(config, key), value) for key, value in expected.items()
               if not _same(_get(config, key), value)}
    assert not drifted, f"{name} drifted from the reference recipe (ours, reference): {drifted}"


@pytest.mark.parametrize("name", sorted(PER_MODEL))
def test_recipe_derived_numbers(name):
    config = load_config(name)
    # 8 no-hint plays per game with the full pool of 24 (orchestrator.py: ceil(192 / games)).
    assert math.ceil(config.nohint_plays_total / config.pool_size) == 8
    # Designer scale: 192 agent samples / 24 designs x 4 = 32, under the cap of 50.
    assert designer_scale(config.global_batch, config.pool_size, config.regen_interval,
                          config.curriculum.max_designer_scale) == pytest.approx(32.0)
    # The agent is asked to reason and to answer in \boxed{} (in our own words).
    suffix = config.rollout.observation_suffix
    assert "\\boxed{}" in suffix and "step by step" in suffix
    # A 6000-word document (~36k characters) fits the designer prompt whole.
    assert config.corpus.max_chars >= 36000 and config.roles.doc_max_chars >= config.corpus.max_chars
    assert config.roles.max_prompt_chars > config.roles.doc_max_chars
    # The fixed batch splits evenly into micro-batches over the batch shards: no padded rows.
    shards = config.mesh.data * config.mesh.fsdp
    assert config.global_batch % (config.rl.micro_batches * shards) == 0
    # The reference's validation probes, no determinism or solution() replay.
    assert config.validation.probe_actions[:3] == ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}")
    assert config.validation.determinism_seeds == () and config.validation.solution_seeds == ()


# The tool-use recipe: cmd/tool_use/_train_spade_blend.sh (run by train_spade_8b.sh and train_spade_30b.sh); the
# games settings above hold except for these.
TOOL_USE_REFERENCE = {
    "domain": "tool_use",  # --spade-game-type tool_use, the six tool-use --spade-skills
    "regen_interval": 8,  # --spade-game-regeneration-interval 8, --spade-proposer-training-delay 8
    "pool_size": 24,  # --spade-num-games-per-rollout 24, --rollout-batch-size 24
    "group_size": 16,  # --spade-hint-plays-per-game 16
    "global_batch": 192,  # --global-batch-size 192
    "hint_sampling.temperature": 0.3,  # --spade-hint-temperature 0.3
    "hint_sampling.max_new_tokens": 2048,  # --spade-hint-max-tokens 2048
    "rollout.loss_on_truncated": False,  # --spade-compact-filter
    "rl.kl_coef": 0.005,  # --kl-loss-coef 0.005, every size
    "rl.kl_estimator": "k3",  # --kl-loss-type low_var_kl
    "corpus.max_chars": 24000,  # --spade-corpus-max-doc-tokens 4000 (words, ~6 characters each)
    # Ours: the environment reads the calls from the whole reply; our system turn states the call format
    # (the reference renders the tools into Qwen's system turn); no \boxed{} request.
    "rollout.action": "reply",
    "rollout.tool_turns": True,  # apply_chat_template(tools=...), tool results as tool turns
    "rollout.mask_malformed_tool_calls": True,  # SPARE_MASK_MALFORMED_TOOLCALL=1
    "rollout.system_prompt": None,
    "rollout.observation_suffix": "",
    # --spade-use-env-validator asks an LLM whether the program is solvable; ours replays solution().
    "validation.solution_seeds": (0, 1),
}
TOOL_USE_PER_MODEL = {
    "qwen3_4b_tool_use": {"designer_sampling.max_new_tokens": 16384},  # the blend script's 30b value (no thinking)
    "qwen3_8b_tool_use": {"designer_sampling.max_new_tokens": 20000},  # ENV_MAX_TOKENS (8b)
    "qwen3_30b_a3b_tool_use": {"designer_sampling.max_new_tokens": 16384},  # ENV_MAX_TOKENS (30b)
}


@pytest.mark.parametrize("name", sorted(TOOL_USE_PER_MODEL))
def test_tool_use_recipe_configs_hold_the_reference_settings(name):
    config = load_config(name)
    expected = {**REFERENCE, **TOOL_USE_REFERENCE, **TOOL_USE_PER_MODEL[name], **OURS_OFF}
    drifted = {key: (_get(config, key), value) for key, value in expected.items()
               if not _same(_get(config, key), value)}
    assert not drifted, f"{name} drifted from the reference tool-use recipe (ours, reference): {drifted}"
    # 192 agent samples / 24 designs x 8 = 64, capped at 50.
    assert designer_scale(config.global_batch, config.pool_size, config.regen_interval,
                          config.curriculum.max_designer_scale) == pytest.approx(50.0)
    assert math.ceil(config.nohint_plays_total / config.pool_size) == 8
    assert config.roles.doc_max_chars >= config.corpus.max_chars
