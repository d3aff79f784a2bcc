"""Tests of `python -m spade_jax.envs` (check and play) run as a subprocess, as users run it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sandbox_helpers sits next to this file
from sandbox_helpers import corpus_files

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def run_cli(*args, stdin=""):
    return subprocess.run(
        [sys.executable, "-m", "spade_jax.envs", *args],
        cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=110,
    )


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def test_check_valid_program_json():
    path = corpus_files("good")[0]
    result = run_cli("check", str(path), "--json", "--backend", "sandbox")
    assert result.returncode == 0, result.stderr
    verdict = last_json(result.stdout)
    assert verdict["valid"] is True and verdict["backend"] == "sandbox" and verdict["errors"] == []
    assert verdict["checks"]["determinism"]["ok"] is True


def test_check_designer_text_with_code_block():
    designer_text = Path(__file__).parent / "corpus" / "good" / "designer_output.md"
    result = run_cli("check", str(designer_text), "--json", "--backend", "sandbox")
    assert result.returncode == 0, result.stdout
    assert last_json(result.stdout)["class_name"] == "ModSumEnv"


@pytest.mark.parametrize("name", ["syntax_error.py", "infinite_loop_step.py", "segfault_ctypes.py"])
def test_check_invalid_program_json(name):
    path = Path(__file__).parent / "corpus" / "broken" / name
    result = run_cli("check", str(path), "--json", "--step-timeout", "2", "--backend", "sandbox")
    assert result.returncode == 1
    verdict = last_json(result.stdout)
    assert verdict["valid"] is False and verdict["errors"]
    assert verdict["backend"] is None  # no backend is certified to run an invalid program


def test_check_human_output():
    path = Path(__file__).parent / "corpus" / "broken" / "reward_nan.py"
    result = run_cli("check", str(path), "--backend", "sandbox")
    assert result.returncode == 1
    assert "INVALID" in result.stdout and "non-finite reward" in result.stdout


@pytest.mark.parametrize(
    "args",
    [("check",), ("check", "/no/such/file.py"), ("frobnicate", "x.py"), ("check", "x.py", "--timeout", "-1")],
)
def test_usage_errors_exit_2(args):
    result = run_cli(*args)
    assert result.returncode == 2


def test_missing_file_with_json_still_ends_in_json():
    result = run_cli("check", "/no/such/file.py", "--json")
    assert result.returncode == 2
    verdict = last_json(result.stdout)
    assert verdict["valid"] is False and "cannot read" in verdict["errors"][0]


def _assert_json_usage_error(result):
    assert result.returncode == 2, (result.stdout, result.stderr)
    verdict = last_json(result.stdout)
    assert verdict["valid"] is False and verdict["backend"] is None
    assert isinstance(verdict["errors"], list) and verdict["errors"] and verdict["errors"][0].startswith("usage: ")
    assert "Traceback" not in result.stderr and result.stderr.strip().splitlines()[-1].count("error: ") == 1
    return verdict


GOOD = str(Path(__file__).parent / "corpus" / "good" / "guess_number.py")


@pytest.mark.parametrize(
    "args,needle",
    [
        (("check", "--json"), "required: file"),
        (("check", "/no/such/file.py", "--json"), "No such file"),
        (("check", str(Path(__file__).parent), "--json"), "Is a directory"),
        (("check", GOOD, "--json", "--bogus"), "unrecognized arguments: --bogus"),
        (("--json", "check", GOOD), "unrecognized arguments: --json"),
        (("check", GOOD, "--json", "--backend", "nope"), "invalid choice: 'nope'"),
        (("check", GOOD, "--json", "--timeout", "x"), "invalid float value"),
        (("check", GOOD, "--json", "--timeout", "-1"), "--timeout must be"),
        (("check", GOOD, "--json", "--timeout", "nan"), "--timeout must be"),
        (("check", GOOD, "--json", "--step-timeout", "inf"), "--step-timeout must be"),
        (("check", GOOD, "--json", "--memory-mb", "5"), "--memory-mb must be >= 128"),
        (("check", GOOD, "--json=yes"), "--json"),
    ],
)
def test_json_usage_errors_still_end_in_json(args, needle):
    verdict = _assert_json_usage_error(run_cli(*args))
    assert needle in verdict["errors"][0]


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_unreadable_file_with_json_ends_in_json():
    # Reading /proc/self/mem from offset 0 fails (EIO) even for root, unlike a chmod 000 file.
    verdict = _assert_json_usage_error(run_cli("check", "/proc/self/mem", "--json"))
    assert "cannot read /proc/self/mem" in verdict["errors"][0]


@pytest.mark.parametrize(
    "args",
    [("check", GOOD, "--step-timeout", "nan"), ("check", GOOD, "--memory-mb", "1"),
     ("play", GOOD, "--episodes", "0"), ("play", GOOD, "--max-turns", "0"), ("play", GOOD, "--seed", "-1")],
)
def test_bad_flag_values_are_one_line_usage_errors(args):
    result = run_cli(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --") and result.stderr.count("\n") == 1, result.stderr


def test_play_session():
    path = Path(__file__).parent / "corpus" / "good" / "guess_number.py"
    result = run_cli("play", str(path), "--seed", "0", stdin="25\n:solution\n:quit\n")
    assert result.returncode == 0, result.stderr
    assert "Guess the hidden integer" in result.stdout
    assert "reward 0" in result.stdout or "reward 1" in result.stdout
    assert "\\boxed{" in result.stdout  # the printed solution


def test_play_to_the_end_of_an_episode():
    path = Path(__file__).parent / "corpus" / "good" / "no_solution.py"
    result = run_cli("play", str(path), stdin="even\nodd\n")
    assert result.returncode == 0, result.stderr
    assert "episode reward 1" in result.stdout
