"""The roles in the tool-use domain: the designer sees the ToolEnv contract and tool-use examples, the hint
writer is asked for a plan of tool calls, the agent's system turn states the call format; games unchanged."""

import numpy as np
import pytest

from spade_jax import roles
from spade_jax.envs.library import TOOL_USE_SKILLS, library_programs
from spade_jax.rollout import AGENT_SYSTEM

TOOL_NAMES = {p.name for p in library_programs(domain="tool_use")}


@pytest.mark.parametrize("skill", TOOL_USE_SKILLS)
def test_design_requests_use_the_tool_use_contract_and_library(skill):
    cfg = roles.RolesConfig(edit_prob=0.5, tune_prob=0.0)
    for seed in range(4):
        request = roles.design_request(np.random.default_rng(seed), skill, cfg=cfg, domain="tool_use")
        system, user = request.messages[0]["content"], request.messages[-1]["content"]
        assert system == roles.TOOL_DESIGNER_SYSTEM and "extends ToolEnv" in system and "subgoals(self)" in system
        assert roles.JAX_SUBSET_ADVICE not in system
        assert f"Skill to train: {skill} ({roles.SKILL_DESCRIPTIONS[skill]})" in user
        if request.mode == "edit":
            assert request.base_name in TOOL_NAMES and "extend ToolEnv" in user
        else:
            assert "Write a NEW tool-use environment" in user and "class " in user and "(ToolEnv)" in user


def test_games_prompts_are_unchanged_by_default():
    request = roles.design_request(np.random.default_rng(0), "optimization")
    assert request.messages[0]["content"] == roles.designer_system(roles.RolesConfig())
    assert "ToolEnv" not in request.messages[0]["content"]
    assert roles.agent_system() == AGENT_SYSTEM and roles.agent_messages("obs")[0]["content"] == AGENT_SYSTEM


def test_hint_and_repair_prompts_and_the_agent_turn_for_tool_use():
    source = library_programs(domain="tool_use")[0].source
    hint = roles.hint_prompt(source, domain="tool_use")
    assert hint[0]["content"] == roles.TOOL_HINT_SYSTEM and "which tools it needs in which order" in hint[1]["content"]
    repair = roles.repair_prompt(source, ["tools: x"], domain="tool_use")
    assert repair[0]["content"] == roles.TOOL_DESIGNER_SYSTEM
    agent = roles.agent_messages("Task", domain="tool_use")
    assert agent[0]["content"] == roles.TOOL_AGENT_SYSTEM and "<tool_call>" in agent[0]["content"]
    with pytest.raises(ValueError, match="domain must be one of games, tool_use"):
        roles.agent_system("robots")


def test_hints_that_spell_out_calls_or_answers_are_dropped():
    text = ('Look the customer up first. Then call <tool_call>{"name": "refund_item"}</tool_call>. '
            "Finish with <answer>RF1</answer>. Send the confirmation last.")
    assert roles.parse_hint(text) == "Look the customer up first. Send the confirmation last."
