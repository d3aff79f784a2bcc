"""Held-out evaluation: success counting with scripted policies, Wilson intervals, RNG
isolation against GEM played directly, and duplicate flagging."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from spade_jax import evaluation as ev
from spade_jax.evaluation import EvalSuite, EvalTask

# The optimal 3-disk Tower of Hanoi plan from tower A to tower C.
HANOI_PLAN = ["A C", "A B", "C B", "A C", "B A", "B C", "A C"]


def _assistant_turns(messages):
    return sum(m["role"] == "assistant" for m in messages)


def _hanoi(messages, moves=HANOI_PLAN):
    k = _assistant_turns(messages)
    return f"Next move: \\boxed{{{moves[k]}}}" if k < len(moves) else "I give up."


def _guess_binary_search(messages, low=1, high=50):
    # Narrow the range from the game's own feedback ("... is higher than 25.").
    for m in messages:
        if m["role"] == "user":
            for word, number in re.findall(r"is (higher|lower) than (\d+)", m["content"]):
                if word == "higher":
                    low = max(low, int(number) + 1)
                else:
                    high = min(high, int(number) - 1)
    return f"\\boxed{{{(low + high) // 2}}}"


def _oracle_answers(name, seeds):
    """Reference answers straight from reasoning-gym, keyed by question text."""
    import reasoning_gym

    answers = {}
    for seed in seeds:
        entry = reasoning_gym.create_dataset(name, size=1, seed=seed)[0]
        answers[entry["question"].strip()] = entry["answer"]
    return answers


def _scripted_policy(rg_answers):
    def policy(conversations):
        replies = []
        for messages in conversations:
            first = next(m["content"] for m in messages if m["role"] == "user")
            if "Tower of Hanoi" in first:
                replies.append(_hanoi(messages))
            elif "Guess The Number" in first:
                replies.append(_guess_binary_search(messages))
            else:
                question = first.split("\n\n" + ev.RG_ANSWER_INSTRUCTION)[0].strip()
                if question in rg_answers:
                    replies.append(f"The answer is \\boxed{{{rg_answers[question]}}}")
                else:
                    replies.append("no idea")  # Sudoku: unparseable, ends the episode
        return replies

    return policy


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


def test_wilson_interval_against_quadratic_roots():
    # The Wilson bounds are the roots in p of (phat - p)^2 = z^2 p (1 - p) / n.
    z = 1.959963984540054
    for k, n in [(3, 10), (0, 7), (7, 7), (41, 50), (1, 1)]:
        phat = k / n
        a = 1 + z * z / n
        roots = np.roots([a, -(2 * phat + z * z / n), phat * phat])
        low, high = sorted(float(np.real(r)) for r in roots)
        assert ev.wilson_interval(k, n) == pytest.approx((max(low, 0.0), min(high, 1.0)), abs=1e-9)
    # Textbook value (Newcombe 1998, 95%): 3 of 10 gives [0.1078, 0.6032].
    assert ev.wilson_interval(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    with pytest.raises(ValueError):
        ev.wilson_interval(11, 10)


def test_macro_interval_covers_mean():
    mean, low, high = ev.macro_interval([(10, 10), (0, 10), (5, 10)])
    assert mean == pytest.approx(0.5)
    assert 0 <= low < 0.5 < high <= 1


def _gem_transcript(env_id, seed, actions):
    """Observations of one episode played on GEM directly, with nothing interleaved."""
    import gem

    env = gem.make(env_id)
    obs, info = env.reset(seed=seed)
    out = [(obs, info.get("suffix"))]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, info.get("suffix"), reward))
        if terminated or truncated:
            break
    return out


def test_rng_isolation_matches_gem_played_alone():
    env_id = "game:Minesweeper-v0-easy"
    actions = ["\\boxed{reveal 2 2}", "\\boxed{reveal 0 0}", "\\boxed{reveal 4 4}"]
    expected = {seed: _gem_transcript(env_id, seed, actions) for seed in (11, 12)}

    random.seed(123)
    np.random.seed(123)
    py_before, np_before = random.getstate(), np.random.get_state()[1].copy()
    # Two Minesweeper boards and a 2048 game (which draws tiles from the global RNG on every
    # step) played in lockstep must each see exactly what GEM shows when played alone.
    env_a, env_b = ev.make_eval_env(env_id), ev.make_eval_env(env_id)
    other = ev.make_eval_env("game:Game2048-v0-easy")
    first = [env_a.reset(11), env_b.reset(12), other.reset(99)]
    got = {11: [first[0]], 12: [first[1]]}
    done = {11: False, 12: False}
    for action in actions:
        for seed, env in ((11, env_a), (12, env_b)):
            if not done[seed]:
                obs, reward, terminated, truncated = env.step(action)
                got[seed].append((obs, reward))
                done[seed] = terminated or truncated
            other.step("\\boxed{left}")
    for seed in (11, 12):
        exp = expected[seed]
        assert got[seed][0] == f"{exp[0][0].strip()}\n{exp[0][1].strip()}"
        for (obs, reward), (e_obs, e_suffix, e_reward) in zip(got[seed][1:], exp[1:]):
            assert obs == f"{e_obs.strip()}\n{e_suffix.strip()}" and reward == e_reward
        assert len(got[seed]) == len(exp)
    # The caller's global generators are untouched.
    assert random.getstate() == py_before
    assert (np.random.get_state()[1] == np_before).all()


def test_rg_item_matches_reasoning_gym():
    import reasoning_gym

    env = ev.make_eval_env("rg:maze")
    text = env.reset(7)
    entry = reasoning_gym.create_dataset("maze", size=1, seed=7)[0]
    assert text.startswith(entry["question"].strip())
    _, score, terminated, _ = env.step(f"\\boxed{{{entry['answer']}}}")
    assert terminated and score == 1.0 and env.success
    env.reset(7)
    env.step(entry["answer"])  # not boxed: not read, as in GEM
    assert not env.success


HANOI_REWRITE = '''
import re

class HanoiEnv:
    def reset(self, seed=None):
        self.towers = {"A": [3, 2, 1], "B": [], "C": []}
        intro = ("Tower of Hanoi with 3 disks. Move every disk from tower A to tower C. "
                 "Each move takes the top disk of one tower to another tower, written like \\\\boxed{A C}. "
                 "A bigger disk can never be placed on a smaller disk.")
        return intro + "\\n" + self._board(), {}

    def _board(self):
        return "\\n".join(f"{k}: {v}" for k, v in self.towers.items()) + "\\nEnter your move."

    def step(self, action):
        return "Illegal move.", 0.0, False, False, {}
'''

GUESS_REWRITE = '''
class NumberGuessEnv:
    def reset(self, seed=None):
        return ("Guess the secret number between 1 and 50 within 7 guesses. After each guess you are "
                "told whether the target number is higher or lower. Put your guess in \\\\boxed{}, "
                "e.g. \\\\boxed{25}."), {}

    def step(self, action):
        return "The target number is higher.", 0.0, False, False, {}
'''


def test_flag_duplicates():
    library = Path(ev.__file__).parent / "envs" / "library"
    programs = {p.stem: p.read_text() for p in sorted(library.glob("*.py")) if p.stem != "__init__"}
    assert programs, "the hand-written library is the non-duplicate reference"
    programs["hanoi_rewrite"] = HANOI_REWRITE
    programs["guess_rewrite"] = GUESS_REWRITE
    programs["broken"] = "class Oops(:\n"  # unparseable text is compared as it is
    flags = ev.flag_duplicates(programs, "quick")
    assert {(f.env_id, f.eval_env) for f in flags} == {
        ("hanoi_rewrite", "game:TowerofHanoi-v0-easy"),
        ("guess_rewrite", "game:GuessTheNumber-v0-hard"),
    }
    assert all(f.similarity >= ev.DUPLICATE_THRESHOLD for f in flags)
    # An observation seen in a rollout counts too: a verbatim copy of an eval observation.
    copied = ev.first_observation("rg:countdown")
    flags = ev.flag_duplicates(["class XEnv: pass"], "quick", observations={"0": copied})
    assert flags == [("0", "rg:countdown", 1.0, 0.9091)]


def _library():
    from spade_jax.envs.library import library_programs

    return {p.name: p.source for p in library_programs()}


def test_no_library_env_overlaps_a_suite_task():
    """The training library (fixed pool and designer bases) shares no puzzle family with any
    held-out task: rg:knights_knaves was in the suite next to the library's KnightsKnavesEnv
    while the text similarity scored the pair 0.07."""
    library = _library()
    for name in ev.SUITES:
        suite = ev.get_suite(name)
        assert ev.flag_duplicates(library, suite) == [], name
        for env_id, source in library.items():
            text, names = ev._program_text(source), ev._program_names(source)
            for task in suite.tasks:
                score = ev.family_score(text, task.env_id, names)
                assert score < ev.FAMILY_THRESHOLD, (env_id, task.env_id, score)
    # The check catches the contamination it is here for: with rg:knights_knaves (or rg:maze)
    # back in the suite, the library's own envs of those families are flagged.
    tasks = ev.get_suite("quick").tasks + (EvalTask("rg:knights_knaves", 1, 1), EvalTask("rg:maze", 1, 1))
    flags = ev.flag_duplicates(library, EvalSuite("contaminated", tasks))
    assert [(f.env_id, f.eval_env, f.family) for f in flags] == [
        ("grid_maze", "rg:maze", 1.0),
        ("knights_knaves", "rg:knights_knaves", 1.0),
    ]
    assert all(f.similarity < ev.DUPLICATE_THRESHOLD for f in flags)  # text alone misses both
    # Renamed, a knights-and-knaves program is still caught by its words.
    knights = ev._program_text(library["knights_knaves"])
    assert ev.family_score(knights, "rg:knights_knaves") >= ev.FAMILY_THRESHOLD


def test_family_score_names_words_and_unrelated_pairs():
    words = ev.family_words("rg:knights_knaves")
    assert {"knigh", "knave", "truth", "lie", "islan"} <= words
    # Per-episode role names (heroes and villains, angels and devils, ...) are not family words.
    assert not {"hero", "villa", "angel", "devil"} & words
    # Named after the task, as whole words of its class names or docstrings: 1.0.
    assert ev.family_score("", "game:TowerofHanoi-v0-easy", "TowerOfHanoi") == 1.0
    assert ev.family_score("", "rg:knights_knaves", "Knights and knaves on an island") == 1.0
    assert ev.family_score("", "rg:countdown", "Count the lights") == 0.0  # whole words only
    # Library envs against unrelated eval tasks of a nearby skill stay well below the threshold.
    library = _library()
    for env_id, task in [
        ("target_number", "rg:countdown"),  # reach a number by fixed operations vs. build an expression
        ("code_breaker", "game:GuessTheNumber-v0-hard"),  # Mastermind feedback vs. higher/lower
        ("grid_maze", "game:Sokoban-v0-easy"),  # the highest unrelated pair: 0.20
        ("sliding_puzzle", "game:Sokoban-v0-easy"),
        ("knights_knaves", "rg:zebra_puzzles"),  # both logic puzzles, different families
        ("sequence_rule", "rg:arc_1d"),
        ("knights_knaves", "rg:largest_island"),  # "islanders" alone is not the family
    ]:
        source = library[env_id]
        score = ev.family_score(ev._program_text(source), task, ev._program_names(source))
        assert score <= 0.2, (env_id, task, score)


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


def test_similarity_bounds():
    assert ev.similarity("Tower of Hanoi disks", "tower hanoi DISKS") == 1.0
    assert ev.similarity("alpha beta", "gamma delta") == 0.0
    assert ev.similarity("", "anything") == 0.0


def test_suites_are_valid_and_fixed():
    heldout = ev.get_suite("heldout")
    ids = [t.env_id for t in heldout.tasks]
    assert "game:TowerofHanoi-v0-easy" in ids and "rg:zebra_puzzles" in ids
    # Puzzle families of the training library (KnightsKnavesEnv, GridMazeEnv) are not held out.
    assert "rg:knights_knaves" not in ids and "rg:maze" not in ids
    assert all(len(t.episode_seeds) == t.episodes for t in heldout.tasks)
    assert ev.get_suite("heldout").tasks[0].episode_seeds == heldout.tasks[0].episode_seeds
    assert all(t.episodes == 3 for t in ev.get_suite("quick", episodes=3).tasks)
    with pytest.raises(ValueError, match="choose one of"):
        ev.get_suite("nope")
    with pytest.raises(ValueError, match="must look like"):
        EvalTask("TowerofHanoi", 1, 1)
    with pytest.raises(ValueError, match="one seed per episode"):
        EvalTask("rg:maze", 2, 1, (1,))


def test_policy_reply_count_checked():
    suite = EvalSuite("t", (EvalTask("rg:maze", 2, 1, (1, 2)),))
    with pytest.raises(ValueError, match="returned 1 replies for 2"):
        ev.evaluate(lambda convs: ["x"], suite)


def test_tokens_policy_renders_chat_template():
    class CharTokenizer:
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    seen = []

    def generate(prompts):
        seen.extend(prompts)
        return [[ord(c) for c in "\\boxed{5}"] for _ in prompts]

    policy = ev.tokens_policy(generate, CharTokenizer())
    assert policy([[{"role": "user", "content": "hi"}]]) == ["\\boxed{5}"]
    assert "".join(map(chr, seen[0])) == "<user>hi<assistant>"


def test_eval_cli_usage_errors(tmp_path, capsys):
    from experiments import eval as eval_cli

    assert eval_cli.main(["--run", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert eval_cli.main(["--run", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    assert eval_cli.main(["--model", "no-such-model", "--suite", "quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown model") and err.count("\n") == 1
    assert eval_cli.main(["--model", "tiny", "--episodes", "0"]) == 2
    assert eval_cli.main(["--model", "tiny", "--tasks", "rg:nope"]) == 2
    assert "has no task 'rg:nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_cli.main(["--model", "tiny", "--run", str(tmp_path)])


@pytest.mark.slow
def test_eval_cli_end_to_end_tiny_model(tmp_path, capsys):
    import json

    from experiments import eval as eval_cli

    out = tmp_path / "report.json"
    code = eval_cli.main(["--model", "tiny", "--suite", "quick", "--episodes", "2",
                          "--tasks", "rg:largest_island,rg:countdown", "--max-new-tokens", "4",
                          "--no-progress", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["source"] == {"model": "tiny"}
    assert [t["env_id"] for t in report["tasks"]] == ["rg:largest_island", "rg:countdown"]
    assert all(t["episodes"] == 2 for t in report["tasks"]) and len(report["episodes"]) == 4
    assert "macro average" in capsys.readouterr().out


def test_model_policy_skips_conversations_past_the_context(monkeypatch):
    import types

    from spade_jax import sampling

    class CharTokenizer:
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return "".join(m["content"] for m in messages)

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    calls = []

    class FakeSampler:
        def __init__(self, model, tokenizer, mesh=None):
            pass

        def generate(self, prompts, config, key=0):
            calls.append(prompts)
            return types.SimpleNamespace(texts=[f"\\boxed{{{len(p)}}}" for p in prompts])

    monkeypatch.setattr(sampling, "Sampler", FakeSampler)
    model = types.SimpleNamespace(spec=types.SimpleNamespace(max_position=30))
    policy = ev.model_policy(model, CharTokenizer(), sampling.SamplingConfig(max_new_tokens=10))
    short, long = [{"role": "user", "content": "x" * 20}], [{"role": "user", "content": "y" * 21}]
    assert policy([long, short, long]) == ["", "\\boxed{20}", ""]
    assert calls == [[[ord("x")] * 20]]
    assert policy([long]) == [""] and len(calls) == 1
    # A forced reply prefix ends every prompt and starts every reply.
    forced = ev.model_policy(model, CharTokenizer(), sampling.SamplingConfig(max_new_tokens=10),
                             reply_prefix="\\boxed{")
    assert forced([[{"role": "user", "content": "z" * 10}]]) == ["\\boxed{\\boxed{17}"]
    assert calls[-1] == [[ord("z")] * 10 + [ord(c) for c in "\\boxed{"]]


def test_load_run_restores_latest_checkpoint_params(tmp_path):
    import jax
    import yaml
    from flax import nnx

    from experiments import eval as eval_cli
    from spade_jax.checkpoint import Checkpointer
    from spade_jax.models.registry import load_model
    from spade_jax.rl.config import RLConfig
    from spade_jax.rl.train import make_train_step

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"model": {"name": "tiny"}, "rl": {"grad_clip": None, "lr": 1e-5}}))
    model = load_model("tiny").model
    step_fn = make_train_step(model, RLConfig(grad_clip=None, lr=1e-5), verbose=False)
    state = step_fn.init(model)
    # Stand-in for training: params the fresh random init does not have.
    trained = state.replace(params=jax.tree.map(lambda x: x * 0.5 + 0.25, state.params))
    with Checkpointer(tmp_path / "checkpoints", async_save=False) as ckpt:
        ckpt.save(1, state, {"iteration": 1}, force=True)
        ckpt.save(2, trained, {"iteration": 2}, force=True)

    loaded, source = eval_cli.load_run(tmp_path)
    assert source == {"run": str(tmp_path), "model": "tiny", "checkpoint_step": 2, "iteration": 2}
    got = nnx.to_pure_dict(nnx.state(loaded.model, nnx.Param))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(trained.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=0)

    empty = tmp_path / "fresh"
    empty.mkdir()
    (empty / "config.yaml").write_text(yaml.safe_dump({"model": {"name": "tiny"}}))
    with pytest.raises(eval_cli.UsageError, match="no checkpoints/ yet"):
        eval_cli.load_run(empty)


def test_run_archive_duplicates(tmp_path):
    from experiments import eval as eval_cli
    from spade_jax.logging import EnvArchive

    archive = EnvArchive(tmp_path)
    hanoi = archive.add(HANOI_REWRITE, {"iteration": 0, "valid": True})
    archive.add((Path(ev.__file__).parent / "envs" / "library" / "grid_maze.py").read_text(),
                {"iteration": 0, "valid": True})
    flags = eval_cli._run_duplicates(tmp_path, ev.get_suite("quick"))
    assert [(f["env_id"], f["eval_env"]) for f in flags] == [(hanoi, "game:TowerofHanoi-v0-easy")]
    assert eval_cli._run_duplicates(tmp_path / "none", ev.get_suite("quick")) == []


def _no_model_load(*_args, **_kwargs):
    raise AssertionError("the --out check must come before loading a model")


def test_eval_cli_out_is_checked_before_any_work(tmp_path, capsys, monkeypatch):
    from experiments import eval as eval_cli

    monkeypatch.setattr(eval_cli, "_load_policy", _no_model_load)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        (tmp_path, "is a directory"),  # --out names a file; a directory is refused
        (a_file / "report.json", "is not a directory"),
        (a_file / "deeper" / "report.json", "is not a directory"),
    ]
    if Path("/proc/self").is_dir():
        cases += [(Path("/proc/eval.json"), "is not writable"), (Path("/proc/no/such/eval.json"), "cannot create")]
    for out, needle in cases:
        assert eval_cli.main(["--model", "tiny", "--suite", "quick", "--out", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out {out}") and needle in err and err.count("\n") == 1, err
    # A --run whose default report path cannot be written fails before the checkpoint is read.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "eval_quick.json").mkdir()
    assert eval_cli.main(["--run", str(run_dir), "--suite", "quick"]) == 2
    assert "eval_quick.json is a directory" in capsys.readouterr().err


def test_eval_cli_unwritable_directory_is_refused(tmp_path, capsys, monkeypatch):
    import tempfile

    from experiments import eval as eval_cli

    monkeypatch.setattr(eval_cli, "_load_policy", _no_model_load)

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    out = tmp_path / "report.json"
    assert eval_cli.main(["--model", "tiny", "--suite", "quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {out} is not writable (Read-only file system); choose another path\n"


def _scripted_cli_run(monkeypatch, eval_cli):
    monkeypatch.setattr(eval_cli, "_load_policy",
                        lambda args: (_scripted_policy({}), {"model": "scripted"}))
    return ["--model", "scripted", "--suite", "quick", "--episodes", "1", "--tasks",
            "game:TowerofHanoi-v0-easy", "--no-progress"]


def test_eval_cli_writes_report_and_makes_missing_parents(tmp_path, capsys, monkeypatch):
    import json

    from experiments import eval as eval_cli

    args = _scripted_cli_run(monkeypatch, eval_cli)
    out = tmp_path / "new" / "deeper" / "report.json"
    assert eval_cli.main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["source"] == {"model": "scripted"} and len(report["episodes"]) == 1
    assert f"wrote {out}" in capsys.readouterr().out
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.json"]  # no temporary file left


def test_eval_cli_report_is_never_lost_when_writing_fails(tmp_path, capsys, monkeypatch):
    import json

    from experiments import eval as eval_cli

    args = _scripted_cli_run(monkeypatch, eval_cli)

    def disk_full(out, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(eval_cli, "_write_report", disk_full)
    out = tmp_path / "report.json"
    assert eval_cli.main([*args, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out[captured.out.index("\n{") + 1:])
    assert report["source"] == {"model": "scripted"} and len(report["episodes"]) == 1
    assert captured.err == (f"error: cannot write {out} (No space left on device); "
                            "the JSON report is on stdout above\n")
    assert not out.exists()


@pytest.mark.parametrize("text,needle", [
    ("model: {name: tiny\n", "is not valid YAML (line"),
    (b"\xff\xfe\x00", "cannot read"),
    ("- a list\n", "is not a mapping"),
])
def test_eval_cli_broken_run_config_names_the_file(tmp_path, capsys, text, needle):
    from experiments import eval as eval_cli

    config = tmp_path / "config.yaml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert eval_cli.main(["--run", str(tmp_path), "--suite", "quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(config) in err and needle in err and err.count("\n") == 1, err
