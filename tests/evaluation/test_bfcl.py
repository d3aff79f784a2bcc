"""BFCL scoring against BFCL's own possible answers: replaying the ground truth scores 1, a wrong or empty
transcript 0, for multi-turn (state and response checks on the executable backends) and AST categories;
the play loop and the suite driver end to end with scripted repliers."""

import pytest

from spade_jax.evaluation import bfcl
from spade_jax.evaluation.stats import wilson_interval
from spade_jax.models.tokenizer import byte_tokenizer
from spade_jax.rollout.tool_calls import ToolCall, render_tool_calls


def _gt_transcript(entry, answer):
    """The ground truth as our agent would play it: per turn one step with the calls, via ToolCall."""
    turns = []
    for strings in answer["ground_truth"]:
        calls = bfcl.ground_truth_calls(strings, entry)
        turns.append([[bfcl.call_string(c) for c in calls]] if calls else [])
    return turns


@pytest.mark.parametrize("category", bfcl.MULTI_TURN)
def test_multi_turn_ground_truth_scores_one_and_wrong_transcripts_zero(category):
    for entry, answer in bfcl.load_category(category, 4):
        perfect = _gt_transcript(entry, answer)
        assert bfcl.score_multi_turn(entry, answer, perfect)["valid"], entry["id"]
        assert not bfcl.score_multi_turn(entry, answer, [[] for _ in perfect])["valid"]
        # the last turn that calls anything loses its last call: its state or its results differ
        last = max(i for i, turn in enumerate(perfect) if turn)
        short = [list(t) for t in perfect]
        short[last] = [short[last][0][:-1]]
        verdict = bfcl.score_multi_turn(entry, answer, short)
        assert not verdict["valid"], entry["id"]
        assert verdict["error_type"] in ("multi_turn:instance_state_mismatch", "multi_turn:execution_response_mismatch",
                                         "multi_turn:empty_turn_model_response")
        # a transcript missing a turn was force-terminated
        assert not bfcl.score_multi_turn(entry, answer, perfect[:-1])["valid"]


def _first_option(options):
    return _pick(next(o for o in options if o != ""))


def _pick(value):
    """A possible answer's value with every nested option list resolved to its first option."""
    if isinstance(value, dict):
        return {k: _first_option(v) for k, v in value.items() if any(o != "" for o in v)}
    if isinstance(value, list):
        return [_pick(v) if isinstance(v, dict) else v for v in value]
    return value


def _answer_calls(ground_truth):
    calls = []
    for item in ground_truth:
        ((name, params),) = item.items()
        calls.append(ToolCall(name, {k: _first_option(v) for k, v in params.items() if any(o != "" for o in v)}))
    return calls


def _spoil(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7
    if isinstance(value, dict):
        return {k: _spoil(v) for k, v in value.items()}
    return "spoiled-value"


@pytest.mark.parametrize("category", bfcl.AST_CATEGORIES)
def test_ast_possible_answers_score_one_and_wrong_values_zero(category):
    for entry, answer in bfcl.load_category(category, 25):
        calls = _answer_calls(answer["ground_truth"])
        assert bfcl.score_ast(entry, answer, render_tool_calls(calls), category)["valid"], entry["id"]
        spoiled = [ToolCall(c.name, {k: _spoil(v) for k, v in c.arguments.items()}) for c in calls]
        assert not bfcl.score_ast(entry, answer, render_tool_calls(spoiled), category)["valid"], entry["id"]
        assert not bfcl.score_ast(entry, answer, "I would call the function.", category)["valid"]
        renamed = [ToolCall(c.name + "_x", c.arguments) for c in calls]
        assert not bfcl.score_ast(entry, answer, render_tool_calls(renamed), category)["valid"]


def test_calls_outside_the_backend_are_never_executed():
    methods = {"cd", "ls"}
    calls = [ToolCall("cd", {"folder": "x"}), ToolCall("open", {"file": "/etc/passwd"}),
             ToolCall("__import__", {"name": "os"}), ToolCall("ls", {"a=1)or(1": 1}), ToolCall("ls", {"class": 1})]
    assert bfcl.safe_call_strings(calls, methods) == ["cd(folder='x')"] + ["spade_unknown_function()"] * 4
    assert bfcl.call_string(ToolCall("mv", {"source": "a'b", "n": [1, None]})) == "mv(source=\"a'b\",n=[1, None])"


class _ReplayGroundTruth:
    """Replies with each turn's ground-truth calls, then with a plain sentence that ends the turn."""

    def __init__(self, entry, answer):
        self.turns = [bfcl.ground_truth_calls(s, entry) for s in answer["ground_truth"]]
        self.turn, self.called = 0, False

    def __call__(self, prompts):
        (prompt,) = prompts
        calls = self.turns[self.turn]
        if calls and not self.called:
            self.called = True
            return [render_tool_calls(calls)]
        self.turn, self.called = self.turn + 1, False
        return ["Done."]


@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_miss_func"])
def test_playing_the_ground_truth_through_the_loop_scores_one(category):
    tokenizer = byte_tokenizer()
    ((entry, answer),) = bfcl.load_category(category, 1)
    (episode,) = bfcl.play_multi_turn(_ReplayGroundTruth(entry, answer), tokenizer, [(entry, answer)])
    assert not episode.force_quit and len(episode.calls_per_turn) == len(answer["ground_truth"])
    assert bfcl.score_multi_turn(entry, answer, episode.calls_per_turn)["valid"]
    roles = [m["role"] for m in episode.messages]
    assert "tool" in roles and roles.count("assistant") == episode.model_steps
    # the tools reached the prompt in the fallback's system turn (the byte tokenizer's template has no tools)
    assert entry["function"][0]["name"] in bfcl.render_tool_chat(tokenizer, episode.messages, entry["function"])


def test_a_model_that_never_stops_calling_is_force_quit():
    ((entry, answer),) = bfcl.load_category("multi_turn_base", 1)
    (episode,) = bfcl.play_multi_turn(lambda prompts: [render_tool_calls([ToolCall("pwd", {})])] * len(prompts),
                                      byte_tokenizer(), [(entry, answer)])
    assert episode.force_quit and episode.model_steps == bfcl.MAX_STEPS + 1


def test_the_quick_suite_reports_wilson_intervals_per_category():
    tokenizer = byte_tokenizer()
    suite = bfcl.get_tool_suite("tool_use_quick", 3)
    answers = {}
    for category in suite.categories:
        for entry, answer in bfcl.load_category(category, 3):
            answers[entry["question"][0][-1]["content"]] = (category, entry, answer)

    def complete(prompts):  # right on simple and parallel, silent on multiple
        replies = []
        for prompt in prompts:
            ((category, entry, answer),) = [v for k, v in answers.items() if k in prompt]
            replies.append("" if category == "multiple" else render_tool_calls(_answer_calls(answer["ground_truth"])))
        return replies

    report = bfcl.evaluate_tools(complete, tokenizer, suite, batch_size=2)
    rates = {t.env_id: (t.successes, t.episodes) for t in report.tasks}
    assert rates == {"bfcl:simple_python": (3, 3), "bfcl:multiple": (0, 3), "bfcl:parallel": (3, 3)}
    task = report.tasks[1]
    assert (task.ci_low, task.ci_high) == pytest.approx(wilson_interval(0, 3))
    assert report.success_rate == pytest.approx(2 / 3)
    assert all(r.error == "ast_decoder:no_call" for r in report.episodes if r.env_id == "bfcl:multiple")


def test_unknown_suites_and_categories_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown tool-use suite"):
        bfcl.get_tool_suite("tools")
    with pytest.raises(ValueError, match="unknown BFCL categories"):
        bfcl.ToolSuite("x", ("web_search",), 1)


def test_eval_cli_tool_use_usage_errors(capsys):
    from experiments import eval as eval_cli

    assert eval_cli.main(["--model", "tiny", "--suite", "tool_use_quick", "--tasks", "bfcl:web_search"]) == 2
    assert "has no task 'bfcl:web_search'" in capsys.readouterr().err
    assert eval_cli.main(["--model", "tiny", "--suite", "tool_use", "--seed", "1"]) == 2
    assert eval_cli.main(["--model", "tiny", "--suite", "tool_use", "--episodes", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and all(line.startswith("error: ") for line in err.splitlines())


@pytest.mark.slow
def test_eval_cli_tool_use_quick_end_to_end_tiny_model(tmp_path):
    import json

    from experiments import eval as eval_cli

    out = tmp_path / "tools.json"
    code = eval_cli.main(["--model", "tiny", "--suite", "tool_use_quick", "--episodes", "1", "--tasks",
                          "bfcl:simple_python,bfcl:parallel", "--max-new-tokens", "4", "--no-progress",
                          "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert [t["env_id"] for t in report["tasks"]] == ["bfcl:simple_python", "bfcl:parallel"]
    assert report["entries_per_category"] == 1 and len(report["episodes"]) == 2
