"""spade_jax.evaluation.evaluate: success counting with scripted policies, turn caps, oracle answers
and the policy's reply count, played through the training loop."""

from __future__ import annotations

import json

import pytest
from eval_testing import _hanoi, _oracle_answers, _scripted_policy

from spade_jax import evaluation as ev
from spade_jax.evaluation import EvalSuite, EvalTask


def test_success_counting_with_scripted_policy():
    seeds = (3, 4, 5)
    suite = EvalSuite("t", (
        EvalTask("game:TowerofHanoi-v0-easy", 3, 10, seeds),
        EvalTask("game:GuessTheNumber-v0-hard", 3, 7, seeds),
        EvalTask("rg:knights_knaves", 3, 1, seeds),
        EvalTask("game:Sudoku-v0-easy", 2, 15, (1, 2)),
    ))
    calls = []
    policy = _scripted_policy(_oracle_answers("knights_knaves", seeds))

    def counting_policy(conversations):
        calls.append(len(conversations))
        return policy(conversations)

    report = ev.evaluate(counting_policy, suite)
    by_id = {t.env_id: t for t in report.tasks}
    assert by_id["game:TowerofHanoi-v0-easy"].successes == 3
    assert by_id["game:TowerofHanoi-v0-easy"].mean_turns == 7
    assert by_id["game:GuessTheNumber-v0-hard"].successes == 3
    assert by_id["rg:knights_knaves"].successes == 3
    assert by_id["game:Sudoku-v0-easy"].successes == 0
    assert report.success_rate == pytest.approx(0.75)
    # Every live episode is in the first batch; Hanoi alone needs seven turns.
    assert calls[0] == 11 and len(calls) == 7
    assert "macro average" in report.format_table()
    assert [e.seed for e in report.episodes[:3]] == [3, 4, 5]



def test_turn_cap_partial_plan_and_wrong_answers_fail():
    suite = EvalSuite("t", (
        EvalTask("game:TowerofHanoi-v0-easy", 2, 5, (1, 2)),
        EvalTask("rg:countdown", 2, 1, (1, 2)),
    ))
    report = ev.evaluate(
        lambda convs: [_hanoi(m) if "Hanoi" in m[1]["content"] else "\\boxed{1+1}" for m in convs],
        suite,
    )
    hanoi, countdown = report.tasks
    assert (hanoi.successes, hanoi.mean_turns) == (0, 5)
    assert countdown.successes == 0 and countdown.mean_turns == 1
    # each episode keeps the agent's replies, so a failure can be read, not only counted
    assert [e.replies for e in report.episodes if e.env_id == "rg:countdown"] == [("\\boxed{1+1}",)] * 2
    assert all(len(e.replies) == e.turns == 5 for e in report.episodes if "Hanoi" in e.env_id)
    assert json.loads(report.to_json())["episodes"][-1]["replies"] == ["\\boxed{1+1}"]



def test_suite_reasoning_tasks_score_oracle_answers():
    seeds = (1, 2)
    tasks = [t for t in ev.get_suite("heldout").tasks if t.kind == "rg"]
    answers = {}
    for task in tasks:
        answers.update(_oracle_answers(task.env_id.split(":", 1)[1], seeds))
    suite = EvalSuite("t", tuple(EvalTask(t.env_id, 2, 1, seeds) for t in tasks))
    report = ev.evaluate(_scripted_policy(answers), suite)
    assert [(t.env_id, t.successes) for t in report.tasks] == [(t.env_id, 2) for t in tasks]
    report = ev.evaluate(lambda convs: ["\\boxed{no idea}"] * len(convs), suite)
    assert all(t.successes == 0 for t in report.tasks)



def test_policy_reply_count_checked():
    suite = EvalSuite("t", (EvalTask("rg:maze", 2, 1, (1, 2)),))
    with pytest.raises(ValueError, match="returned 1 replies for 2"):
        ev.evaluate(lambda convs: ["x"], suite)
