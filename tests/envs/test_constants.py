"""A program's tunable constants: which ones are found, and a tune reply's values written over them."""

from spade_jax.envs.constants import apply_tuning, parse_tuning, tunable_constants
from spade_jax.envs.library import library_programs


def _library_source(name):
    return next(p for p in library_programs() if p.name == name).source


# Read off the library files by hand (spade_jax/envs/library/odd_one_out.py, code_breaker.py).
# MAX_TURNS is in both and left out (constants.UNTUNABLE).
ODD_ONE_OUT = {"ROUNDS": 4, "CHOICES": 5, "LIVES": 2,
               "PRIMES": [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]}
CODE_BREAKER = {"MAX_GUESSES": 8, "LENGTH": 4, "DIGITS": 6}

SYNTHETIC = '''"""A made-up program."""
import random

SEED_OFFSET = 3  # module level counts
lower = 4
SHARED = 1


class ToyEnv:
    RATE = 0.5  # a float
    LABEL: str = "café"  # naïve comment survives
    GRID = [
        [1, 2],
        [3, 4],
    ]  # rows of cells
    FLAG = True
    COMPUTED = len("abc")
    POWER = 2 ** 3
    SHARED = 2

    def reset(self, seed=None):
        LOCAL = 5
        return str(LOCAL), {}
'''


def test_tunable_constants_of_library_programs():
    assert tunable_constants(_library_source("odd_one_out")) == ODD_ONE_OUT
    assert tunable_constants(_library_source("code_breaker")) == CODE_BREAKER
    assert list(tunable_constants(_library_source("code_breaker"))) == list(CODE_BREAKER)  # source order
    for program in library_programs():
        assert tunable_constants(program.source), program.name  # every library program has some


def test_tunable_constants_rules():
    found = tunable_constants(SYNTHETIC)
    # Non-literals (a call, a power), lowercase names, method locals and names assigned twice are left out.
    assert found == {"SEED_OFFSET": 3, "RATE": 0.5, "LABEL": "café", "GRID": [[1, 2], [3, 4]], "FLAG": True}
    assert tunable_constants("class Broken(:\n") == {}


def test_apply_tuning_rewrites_only_the_values_and_keeps_comments():
    base = _library_source("code_breaker")
    reply = "Harder:\n```python\nLENGTH = 5\nMAX_GUESSES = 10\n```\n"
    tuned = apply_tuning(base, reply)
    expected = base.replace("    LENGTH = 4\n", "    LENGTH = 5\n").replace(
        "    MAX_GUESSES = 8  # valid guesses before the game is lost\n",
        "    MAX_GUESSES = 10  # valid guesses before the game is lost\n")
    assert tuned == expected and tuned != base
    assert tunable_constants(tuned) == {**CODE_BREAKER, "LENGTH": 5, "MAX_GUESSES": 10}


def test_apply_tuning_ignores_unknown_names_wrong_types_and_non_literals():
    base = _library_source("odd_one_out")
    reply = (
        "```python\n"
        "COLOURS = 4\n"  # unknown name
        "LIVES = True\n"  # a bool is not an int
        "ROUNDS = 4.5\n"  # a float is not an int
        "CHOICES = CHOICES + 1\n"  # not a literal
        "PRIMES = ['two', 'three']\n"  # a list of str is not a list of int
        "MAX_TURNS = 50\n"  # the turn cap is not tunable
        "```"
    )
    assert apply_tuning(base, reply) == base


def test_apply_tuning_tolerates_bare_lines_and_last_assignment_wins():
    base = _library_source("odd_one_out")
    reply = "I will make it harder.\n- ROUNDS = 6  # more rounds\nAlso `CHOICES = 7`.\nROUNDS = 5, to be safe"
    tuned = apply_tuning(base, reply)
    expected = base.replace("    ROUNDS = 4\n", "    ROUNDS = 5\n").replace(
        "    CHOICES = 5  # numbers", "    CHOICES = 7  # numbers")
    assert tuned == expected
    assert parse_tuning(reply) == {"CHOICES": 7, "ROUNDS": 5}
    # A multi-line value inside a code block that parses.
    multi = "```python\nPRIMES = [\n    2, 3, 5,\n    7, 11,\n]\n```"
    assert tunable_constants(apply_tuning(base, multi))["PRIMES"] == [2, 3, 5, 7, 11]
    # Thinking is not read.
    assert apply_tuning(base, "<think>ROUNDS = 9</think>ROUNDS = 4") == base


def test_apply_tuning_on_multiline_unicode_and_float_values():
    reply = "RATE = 2\nLABEL = 'tea'\nGRID = [[0]]\nFLAG = False\nSHARED = 7\n"
    tuned = apply_tuning(SYNTHETIC, reply)
    assert "    RATE = 2.0  # a float\n" in tuned  # a float constant takes an int, written as a float
    assert "    LABEL: str = 'tea'  # naïve comment survives\n" in tuned
    assert "    GRID = [[0]]  # rows of cells\n    FLAG = False\n" in tuned
    assert "SHARED = 1\n" in tuned and "    SHARED = 2\n" in tuned  # ambiguous: untouched
    assert tunable_constants(tuned) == {"SEED_OFFSET": 3, "RATE": 2.0, "LABEL": "tea", "GRID": [[0]], "FLAG": False}
    assert len(tuned.splitlines()) == len(SYNTHETIC.splitlines()) - 3
