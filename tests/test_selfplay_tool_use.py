"""End to end in the tool-use domain: a `tiny` self-play run of two iterations on tool-use skills, with a
tool-use library environment played in the sandbox, then a resumed third."""

import json

import pytest
import yaml

from experiments.run import main as run_main
from spade_jax.envs.library import TOOL_USE_SKILLS

# tiny.yaml is a games config: the overrides a tool-use run needs (whole replies, no forced \boxed{, no stop at
# "}", room for the first observation's tool list), with malformed calls masked. The recipe's tool_turns would
# not fit the tiny model's 2048-token context with the tool schemas (tests/rollout/test_tool_use_play.py has it).
TOOL_USE = ["domain=tool_use", "rollout.action=reply", "rollout.reply_prefix=", "agent_sampling.stop_strings=[]",
            "rollout.max_context_tokens=2048", "rollout.mask_malformed_tool_calls=true"]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_tiny_tool_use_run_two_iterations_then_resume_a_third(tmp_path):
    out = tmp_path / "run"
    assert run_main(["--config", "tiny", "--out", str(out), "iterations=2", *TOOL_USE]) == 0
    first = _lines(out / "metrics.jsonl")
    assert [m["iteration"] for m in first] == [0, 1]
    assert yaml.safe_load((out / "config.yaml").read_text())["domain"] == "tool_use"
    index = _lines(out / "envs" / "index.jsonl")
    designed = [e for e in index if "valid" in e and e.get("origin") == "designer"]
    assert designed and {e["skill"] for e in designed} <= set(TOOL_USE_SKILLS)
    # A random model writes no valid program: the pool was topped up from the tool-use library and its
    # episodes were played in the sandbox to the turn limit without an environment failure.
    assert all(not e["valid"] for e in designed)
    assert first[0]["agent/episodes"] > 0 and first[0]["agent/mean_turns"] == 2  # tiny.yaml's max_turns
    assert first[0]["agent/env_errors"] == 0
    # Resume for a third iteration (a regeneration step with the delayed designer update).
    assert run_main(["--config", "tiny", "--out", str(out), "--resume", "iterations=3"]) == 0
    resumed = _lines(out / "metrics.jsonl")
    assert [m["iteration"] for m in resumed] == [0, 1, 2]
    assert resumed[:2] == first
    assert (out / "checkpoints" / "3").is_dir()


def test_memory_and_plr_keep_and_replay_a_tool_use_environment():
    """A measured tool-use environment enters the memory and the PLR buffer; the replay is validated again
    in the sandbox, the designer's next prompt for its skill shows it, and the state survives JSON."""
    import types

    import numpy as np

    from spade_jax import roles
    from spade_jax.config import load_config
    from spade_jax.envs.backends.sandbox import SandboxPool
    from spade_jax.envs.library import library_program
    from spade_jax.selfplay import PoolEnv, SelfPlay

    config = load_config("tiny", [*TOOL_USE, "curriculum.plr=true", "curriculum.plr_min_fill=0.0",
                                  "curriculum.plr_replay_prob=1.0"])
    program = library_program("flaky_payment")
    with SandboxPool(config.sandbox) as sandbox:
        selfplay = SelfPlay(config, None, types.SimpleNamespace(sandbox=sandbox), None, None)
        selfplay.pool = [PoolEnv("env00001", program.skill, "designer", program.source, True, r_hint=0.75,
                                 r_nohint=0.25, wins=[0.5, 0.5], regen_positive_share=0.5)]
        selfplay.iteration = config.regen_interval
        selfplay.remember_pool()
        assert len(selfplay.memory) == 1 and int(selfplay.plr.size) == 1
        np.testing.assert_allclose(float(selfplay.plr.scores[0]), 0.5, rtol=1e-6)  # 0.75 - 0.25

        replay = selfplay.replay_envs()[0]
        assert replay.valid and replay.backend == "sandbox" and replay.source == program.source

        request = roles.design_request(np.random.default_rng(0), program.skill, memory=selfplay.memory,
                                       cfg=roles.RolesConfig(edit_prob=0.0), domain="tool_use")
        assert request.positive_ids == ("env00001",)
        assert "class FlakyPaymentEnv(ToolEnv)" in request.messages[1]["content"]

        restored = SelfPlay(config, None, types.SimpleNamespace(sandbox=sandbox), None, None)
        restored.load_state_dict(json.loads(json.dumps(selfplay.state_dict())))
        assert len(restored.memory) == 1 and restored.plr_levels == selfplay.plr_levels


def test_fixed_pool_and_compare_arms_take_the_tool_use_domain():
    from experiments.compare import ARMS, arms_from_base
    from spade_jax.config import load_config
    from spade_jax.envs.library import library_programs
    from spade_jax.selfplay import fixed_pool_envs

    pool = fixed_pool_envs(None, "tool_use")
    assert [e.env_id for e in pool] == [f"lib-{p.name}" for p in library_programs(domain="tool_use")]
    assert {e.skill for e in pool} == set(TOOL_USE_SKILLS)
    for arm in (*ARMS, *arms_from_base("tool_use")):
        assert load_config(arm.config, [*TOOL_USE, *arm.overrides]).domain == "tool_use", arm.label
