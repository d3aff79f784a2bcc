"""python -m experiments.screen: one-line usage errors; candidates played on seeds outside every
suite's, each line printed and saved as soon as it is known."""

from __future__ import annotations

import json

from spade_jax.evaluation.suites import HELDOUT_SEED_BASE, SUITES


def test_screen_usage_errors(capsys):
    from experiments import screen

    assert screen.main(["--model", "tiny", "--episodes", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --episodes must be >= 1")
    assert screen.main(["--model", "tiny", "--low", "0.7", "--high", "0.6"]) == 2
    assert "the band must satisfy" in capsys.readouterr().err
    assert screen.main(["--model", "tiny", "--candidates", " , "]) == 2
    assert "names no dataset" in capsys.readouterr().err
    assert screen.main(["--model", "tiny", "--candidates", "ransom_note,no_such_generator"]) == 2
    assert capsys.readouterr().err.startswith("error: no reasoning-gym dataset 'no_such_generator'")
    assert screen.main(["--model", "tiny", "--candidates", "gcd,chain_sum(max_terms=2, no_field=1)"]) == 2
    assert "chain_sum has no config field 'no_field'" in capsys.readouterr().err
    assert screen.main(["--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model") and err.count("\n") == 1


def test_screen_seeds_never_touch_a_suite_seed():
    from experiments.screen import SCREEN_SEED_BASE

    longest = max(task.episodes for suite in SUITES.values() for task in suite.tasks)
    assert SCREEN_SEED_BASE >= HELDOUT_SEED_BASE + longest
    suite_seeds = {seed for suite in SUITES.values() for task in suite.tasks for seed in task.episode_seeds}
    assert not suite_seeds & set(range(SCREEN_SEED_BASE, SCREEN_SEED_BASE + 200))


def test_screen_writes_each_candidate(tmp_path, capsys):
    from experiments import screen

    out = tmp_path / "screen.json"
    candidates = "basic_arithmetic,ransom_note,chain_sum(min_terms=2, max_terms=2, max_digits=1)"
    assert screen.main(["--model", "tiny", "--candidates", candidates, "--episodes", "2",
                        "--max-new-tokens", "4", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["env_id"] for r in rows] == ["rg:basic_arithmetic", "rg:ransom_note",
                                           "rg:chain_sum(min_terms=2, max_terms=2, max_digits=1)"]
    assert all(r["episodes"] == 2 and r["in_band"] == (0.1 <= r["success_rate"] <= 0.6) for r in rows)
    assert "of 3 candidates inside [10%, 60%]" in capsys.readouterr().out


def test_answer_line_is_used_for_the_screen_and_put_back(tmp_path, monkeypatch):
    from experiments import screen
    from spade_jax import evaluation
    from spade_jax.evaluation.environments import RG_ANSWER_INSTRUCTION, make_eval_env

    seen, real = [], evaluation.evaluate

    def spy(policy, suite, **kwargs):
        task = suite.tasks[0]
        seen.append(make_eval_env(task.env_id).reset(task.episode_seeds[0]))
        return real(policy, suite, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", spy)
    out = tmp_path / "screen.json"
    assert screen.main(["--model", "tiny", "--candidates", "gcd", "--episodes", "1", "--max-new-tokens", "2",
                        "--answer-line", "Answer in \\boxed{}.", "--out", str(out)]) == 0
    assert seen[0].endswith("\n\nAnswer in \\boxed{}.")
    assert json.loads(out.read_text())[0]["answer_line"] == "Answer in \\boxed{}."
    assert make_eval_env("rg:gcd").reset(0).endswith("\n\n" + RG_ANSWER_INSTRUCTION)  # the suites' line again
