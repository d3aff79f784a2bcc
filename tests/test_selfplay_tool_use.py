"""End to end in the tool-use domain: a `tiny` self-play run of two iterations on tool-use skills, with a
tool-use library environment played in the sandbox, then a resumed third."""

import json

import pytest
import yaml

from experiments.run import main as run_main
from spade_jax.envs.library import TOOL_USE_SKILLS

# tiny.yaml is a games config: the overrides a tool-use run needs (whole replies, no forced \boxed{, no stop at
# "}", room for the first observation's tool list).
TOOL_USE = ["domain=tool_use", "rollout.action=reply", "rollout.reply_prefix=", "agent_sampling.stop_strings=[]",
            "rollout.max_context_tokens=2048"]


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
