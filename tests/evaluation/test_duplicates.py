"""spade_jax.evaluation.duplicates: rewrites and copied observations flagged, the training library never,
and family scores by name and by words."""

from __future__ import annotations

from pathlib import Path

from eval_testing import HANOI_REWRITE

from spade_jax.evaluation import EvalSuite, EvalTask, duplicates as ev

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
    library = Path(ev.__file__).parent.parent / "envs" / "library"
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



def test_similarity_bounds():
    assert ev.similarity("Tower of Hanoi disks", "tower hanoi DISKS") == 1.0
    assert ev.similarity("alpha beta", "gamma delta") == 0.0
    assert ev.similarity("", "anything") == 0.0
