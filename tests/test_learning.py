"""The learning test: the fixed-pool trainer raises a tiny model's win rate on a simple environment."""

import json

import numpy as np
import pytest

from experiments.run import main as run_main

FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "learnable"


@pytest.mark.slow
def test_fixed_pool_grpo_raises_the_win_rate_of_a_tiny_model(tmp_path):
    out = tmp_path / "run"
    code = run_main([
        "--config", "fixed_pool", "--out", str(out), "model.name=tiny", f"env_pool={FIXTURES}",
        "iterations=16", "group_size=16", "backend=sandbox", "agent_sampling.max_new_tokens=1",
        "rollout.max_turns=1", "rl.lr=0.01", "rl.micro_batches=1", "progress=false", "tensorboard=false",
        "checkpoint_every=8",
        "rollout.reply_prefix=", "agent_sampling.stop_strings=[]",  # the env reads the reply's first letter
    ])
    assert code == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    win = np.array([r["agent/win_rate"] for r in records])
    start, end = win[:3].mean(), win[-3:].mean()
    assert end >= start + 0.3, win.round(2).tolist()  # seen: 0.06 -> 0.63
