"""Tests of spade_jax.envs.program: code extraction, environment class choice, import allowlist."""

import pytest

from spade_jax.envs.program import ProgramError, check_imports, extract_code, find_env_class

CLASS = (
    "class GameEnv:\n    def reset(self, seed=None):\n        return 'x', {}\n"
    "    def step(self, a):\n        return 'x', 0.0, True, False, {}\n"
)


def test_extract_code_python_block():
    text = f"Here it is:\n```python\n{CLASS}```\nEnjoy."
    assert extract_code(text) == CLASS


def test_extract_code_prefers_block_with_class_over_usage_snippet():
    text = f"```python\n{CLASS}```\nUsage:\n```python\nenv = GameEnv()\n```"
    assert extract_code(text) == CLASS


def test_extract_code_last_version_wins():
    old = CLASS.replace("'x'", "'old'")
    text = f"Draft:\n```python\n{old}```\nFixed:\n```python\n{CLASS}```"
    assert extract_code(text) == CLASS


def test_extract_code_unlabelled_fence_and_unclosed_fence():
    assert extract_code(f"```\n{CLASS}```") == CLASS
    assert extract_code(f"```python\n{CLASS}") == CLASS


def test_extract_code_raw_python_and_prose():
    assert extract_code(CLASS) == CLASS
    with pytest.raises(ProgramError, match="no code found"):
        extract_code("I could not write an environment, sorry.")


@pytest.mark.parametrize(
    "source, expected",
    [
        (CLASS, "GameEnv"),
        ("class Board:\n    pass\n" + CLASS.replace("GameEnv", "Game"), "Game"),
        ("class HelperEnv:\n    pass\n" + CLASS, "GameEnv"),
        ("class Util:\n    pass\nclass MazeEnv:\n    pass\n", "MazeEnv"),
    ],
)
def test_find_env_class(source, expected):
    assert find_env_class(source) == expected


@pytest.mark.parametrize(
    "source, message",
    [
        ("def reset(seed=None):\n    pass\n", "no class found"),
        ("class A:\n    def reset(self): pass\n", "none of the classes"),
        (CLASS.replace("GameEnv", "A") + CLASS.replace("GameEnv", "B"), "ambiguous"),
        ("class A(:\n", "SyntaxError at line 1"),
        ("", "empty"),
    ],
)
def test_find_env_class_errors(source, message):
    with pytest.raises(ProgramError, match=message):
        find_env_class(source)


def test_check_imports_allows_stdlib_and_numpy():
    check_imports(
        "import random, re\nimport numpy as np\nfrom collections import deque\n"
        "from numpy.random import default_rng\nimport os.path\n"
    )


@pytest.mark.parametrize(
    "source, line, module",
    [
        ("import random\nimport requests\n", 2, "requests"),
        ("from torch import nn\n", 1, "torch"),
        ("def f():\n    import jax.numpy as jnp\n", 2, "jax.numpy"),
    ],
)
def test_check_imports_reports_offender_and_line(source, line, module):
    with pytest.raises(ProgramError, match=f"line {line}: import of '{module}'") as info:
        check_imports(source)
    assert info.value.check == "imports"


def test_check_imports_rejects_relative_import():
    with pytest.raises(ProgramError, match="relative import"):
        check_imports("from . import helpers\n")


def test_find_env_class_skips_base_classes():
    source = (
        "class BaseEnv:\n    def reset(self, seed=None): pass\n    def step(self, a): pass\n"
        "class MazeEnv(BaseEnv):\n    pass\n"
    )
    assert find_env_class(source) == "MazeEnv"
