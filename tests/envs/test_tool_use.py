"""Tests of spade_jax.envs.tool_use and the tool-use library: the ToolEnv protocol (calls, malformed calls,
errors, answers, partial progress, turn limit), the library's twelve programs (solutions win, wrong plays
do not), and validation of good, broken and hostile tool-use programs in the sandbox."""

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spade_jax.envs.backends import select_backend
from spade_jax.envs.backends.sandbox import SandboxConfig, SandboxPool
from spade_jax.envs.library import TOOL_USE_SKILLS, library_program, library_programs, load_library_env
from spade_jax.envs.tool_use import is_tool_use_program, load_in_process, needs_runtime
from spade_jax.envs.validate import CHECKS, ValidationConfig, validate

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
FAST = ValidationConfig(step_timeout_s=2.0, budget_s=20.0)
NAMES = [p.name for p in library_programs(domain="tool_use")]

# A small tool-use program: a counter with one limit, two subgoals (count reached, answer given).
COUNTER = textwrap.dedent('''
    """Count to a target with an add tool; the answer is the final count."""


    class CounterEnv(ToolEnv):
        MAX_TURNS = 4
        TOOLS = [
            {"name": "add", "description": "Add an amount (1 to 3) to the counter.",
             "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}},
                            "required": ["amount"]}},
            {"type": "function", "function": {"name": "read", "description": "The counter's value.",
                                              "parameters": {"type": "object", "properties": {}}}},
        ]

        def setup(self, rng):
            self.value, self.target = 0, rng.randint(4, 6)
            return f"Bring the counter to {self.target}, then answer with its value."

        def tool_add(self, amount):
            if not 1 <= amount <= 3:
                raise ToolError("amount must be 1, 2 or 3")
            self.value += amount
            return {"value": self.value}

        def tool_read(self):
            return str(self.value)

        def subgoals(self):
            return [self.value == self.target, self.answer_matches(self.target)]

        def solution(self):
            return [self.call("add", amount=3) + self.call("add", amount=self.target - 3), self.final(self.target)]
''')


def block(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture
def counter():
    env = load_in_process(COUNTER, "CounterEnv")()
    env.reset(seed=1)
    return env


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, call_timeout_s=2.0, load_timeout_s=5.0)) as p:
        yield p


# ---- the protocol ------------------------------------------------------------------------------


def test_reset_declares_tools_in_openai_format():
    env = load_in_process(COUNTER, "CounterEnv")()
    obs, info = env.reset(seed=0)
    assert [t["type"] for t in info["tools"]] == ["function", "function"]
    assert info["tools"][0]["function"] == {
        "name": "add", "description": "Add an amount (1 to 3) to the counter.",
        "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]},
    }
    assert info["tools"][1]["function"]["name"] == "read"
    assert "- add(amount: integer)" in obs and "- read()" in obs and "<answer>" in obs
    assert info["progress"] == 0.0


def test_several_calls_in_one_reply_run_in_order(counter):
    obs, reward, terminated, truncated, info = counter.step(
        "Let me add twice.\n" + block("add", {"amount": 2}) + block("add", {"amount": 1}) + block("read", {}))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert [c["name"] for c in info["tool_calls"]] == ["add", "add", "read"]
    assert obs.splitlines()[:3] == ['Result of add: {"value": 2}', 'Result of add: {"value": 3}', "Result of read: 3"]
    assert info["malformed_tool_calls"] == [] and info["tool_errors"] == []


def test_malformed_calls_are_reported_and_cost_only_the_turn(counter):
    _, reward, terminated, _, info = counter.step('<tool_call>{"name": "add", "arguments": {</tool_call>'
                                                  + block("add", {"amount": 1}))
    assert reward == 0.0 and not terminated
    assert len(info["malformed_tool_calls"]) == 1
    assert info["malformed_tool_calls"][0]["reason"].startswith("invalid JSON")
    assert [c["name"] for c in info["tool_calls"]] == ["add"]  # the well-formed call still ran
    _, _, _, _, info = counter.step('<tool_call>{"arguments": {}}</tool_call>')
    assert info["malformed_tool_calls"][0]["reason"] == 'missing "name"'


@pytest.mark.parametrize("call, error", [
    (("nope", {}), "unknown tool 'nope'; the tools are: add, read"),
    (("add", {}), "missing required argument 'amount'"),
    (("add", {"amount": "2"}), "argument 'amount' must be of type integer, got \"2\""),
    (("add", {"amount": True}), "argument 'amount' must be of type integer, got true"),
    (("add", {"amount": 1, "unit": "x"}), "unknown argument 'unit' (arguments: amount)"),
    (("add", {"amount": 7}), "amount must be 1, 2 or 3"),  # the tool's own ToolError
])
def test_failed_calls_are_error_results_not_exceptions(counter, call, error):
    obs, reward, terminated, truncated, info = counter.step(block(*call))
    assert info["tool_errors"] == [{"name": call[0], "error": error}]
    assert obs.startswith(f"Error of {call[0]}: {error}")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert counter.value == 0


def test_answer_ends_with_the_share_of_subgoals_met(counter):
    target = random.Random(1).randint(4, 6)  # the program's draw for seed 1
    assert counter.target == target
    counter.step(block("add", {"amount": 3}) + block("add", {"amount": target - 3}))
    obs, reward, terminated, truncated, info = counter.step(f"<answer>{target + 1}</answer>")
    assert (reward, terminated, truncated) == (0.5, True, False)  # count reached, answer wrong: 1 of 2
    assert info["progress"] == 0.5 and info["answer"] == str(target + 1)
    assert counter.step(block("read", {}))[2] is True  # a finished episode stays finished


def test_calls_drafted_while_thinking_are_not_made(counter):
    reply = "<think>maybe " + block("add", {"amount": 3}) + " no</think>" + block("add", {"amount": 1})
    _, _, _, _, info = counter.step(reply)
    assert [c["arguments"] for c in info["tool_calls"]] == [{"amount": 1}] and counter.value == 1


def test_a_reply_without_call_or_answer_loses_the_turn_and_the_limit_truncates(counter):
    for _ in range(3):
        obs, reward, terminated, truncated, _ = counter.step("I think the answer is five.")
        assert obs.startswith("Invalid action (turn lost)") and not (terminated or truncated)
    obs, reward, terminated, truncated, _ = counter.step("")
    assert (reward, terminated, truncated) == (0.0, False, True) and "Out of turns." in obs


def test_detection_of_tool_use_programs():
    assert is_tool_use_program(COUNTER) and needs_runtime(COUNTER)
    own = "class ToolEnv:\n    pass\n\nclass MyEnv(ToolEnv):\n    pass\n"
    assert is_tool_use_program(own) and not needs_runtime(own)
    game = library_program("grid_maze").source
    assert not is_tool_use_program(game) and not needs_runtime(game)
    assert not is_tool_use_program("class (")


def test_sandboxed_episode_matches_the_in_process_one(pool):
    """The runtime shipped into the sandbox (parser + ToolEnv as source) behaves as the package's."""
    actions = [block("add", {"amount": 9}), "<tool_call>{oops</tool_call>", block("add", {"amount": 3}),
               block("read", {}) + "<answer>3</answer>"]
    local = load_in_process(COUNTER, "CounterEnv")()
    remote = pool.load(COUNTER, "CounterEnv")
    try:
        for seed in (0, 5):
            assert remote.reset(seed=seed) == local.reset(seed=seed)
            for action in actions:
                assert remote.step(action) == local.step(action)
    finally:
        remote.close()


# ---- the library --------------------------------------------------------------------------------


def test_library_has_two_programs_per_tool_use_skill():
    assert len(NAMES) == 12 == len(set(NAMES))
    for skill in TOOL_USE_SKILLS:
        assert len(library_programs(skill, domain="tool_use")) == 2, skill
    files = sorted(p.stem for p in (ROOT / "spade_jax/envs/library/tool_use").glob("*.py"))
    assert files == sorted(NAMES)
    with pytest.raises(ValueError, match="unknown domain"):
        library_programs(domain="robots")
    with pytest.raises(ValueError, match="unknown skill"):
        library_programs("optimization", domain="tool_use")


@pytest.mark.parametrize("name", NAMES)
def test_solution_wins_and_wrong_plays_do_not(name):
    for seed in range(6):
        env = load_library_env(name)
        env.reset(seed=seed)
        for reply in env.solution():
            _, reward, terminated, truncated, info = env.step(reply)
            assert not info["malformed_tool_calls"], (name, seed, reply)
            if terminated or truncated:
                break
        assert (reward, terminated) == (1.0, True), (name, seed)
        # Answering at once, before any tool call, earns nothing (no subgoal holds by default).
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step("<answer>done</answer>")
        assert terminated and reward == 0.0 == info["progress"], (name, seed)
        # Talking without calling tools runs out of turns with nothing.
        env.reset(seed=seed)
        for _ in range(env.MAX_TURNS):
            _, reward, terminated, truncated, _ = env.step("Let me think about which tool to use.")
        assert (reward, terminated, truncated) == (0.0, False, True), name


def test_partial_progress_counts_the_subgoals_reached():
    # travel_booking: three subgoals (cheapest flight booked, hotel linked to it, total answered).
    env = load_library_env("travel_booking")
    env.reset(seed=4)
    plan = env.solution()
    env.step(plan[0])
    env.step(plan[1])  # flight booked, hotel not yet
    assert env.step("<answer>0</answer>")[1] == pytest.approx(1 / 3)
    # support_refund: the refund and the confirmation email after it; an email sent first does not count.
    env = load_library_env("support_refund")
    env.reset(seed=2)
    env.step(env.call("find_customer", email=env.email))
    env.step(env.call("send_email", customer_id=env.customer, template="refund_confirmation"))
    env.step(env.call("refund_item", order_id=env.order, item=env.item, reason="broken"))
    assert env.step("<answer>done</answer>")[1] == pytest.approx(1 / 2)
    # inventory_update: a stray change to an item the note does not name voids every goal.
    env = load_library_env("inventory_update")
    env.reset(seed=0)
    stray = next(sku for sku in env.SKUS if (sku, "A") not in env.changed)
    env.step(env.solution()[0] + env.solution()[1] + env.call("adjust_stock", sku=stray, site="A", delta=1))
    assert env.step("<answer>done</answer>")[1] == 0.0


# ---- validation and backends --------------------------------------------------------------------


def test_library_programs_validate_in_the_sandbox_and_the_jax_backend_declines_them(pool):
    for name in NAMES:
        program = library_program(name)
        verdict = validate(program.source, config=FAST, pool=pool, backend="auto")
        assert verdict.valid and verdict.solvable, (name, verdict.errors)
        assert verdict.backend == "sandbox" and verdict.class_name == program.class_name
        assert verdict.checks["tools"]["ok"] is True
        assert verdict.backend_reason.startswith("a tool-use program (ToolEnv)")
        assert "\n" not in verdict.backend_reason
    chosen, reason = select_backend(library_program("flaky_payment").source, "FlakyPaymentEnv", "jax")
    assert chosen == "sandbox" and "tool-use" in reason


def _broken(replace_from, replace_to):
    assert replace_from in COUNTER
    return COUNTER.replace(replace_from, replace_to)


BROKEN = {
    "tools": [
        _broken("def tool_read(self):", "def tool_reed(self):"),  # declared, not served
        _broken('"required": ["amount"]}},', '"required": ["amount", "unit"]}},'),  # required, undeclared
        _broken("TOOLS = [", "TOOLS = []\n    UNUSED = ["),  # no tools
        _broken('"parameters": {"type": "object", "properties": {}}}}', '"parameters": []}}'),  # not a schema
    ],
    "step": [
        # A step of its own that swallows every reply: malformed calls go unreported.
        _broken("    def tool_add(self, amount):",
                "    def step(self, action):\n        return 'ok', 0.0, False, False, {}\n\n"
                "    def tool_add(self, amount):"),
        # A tool that crashes on an argument it did not expect (KeyError instead of ToolError).
        _broken("        return str(self.value)", "        return {}['missing']"),
    ],
    "solution": [_broken("self.final(self.target)", "self.final(self.target + 1)")],
}


@pytest.mark.parametrize("check, index", [(c, i) for c, items in BROKEN.items() for i in range(len(items))])
def test_broken_tool_use_programs_fail_at_their_check(pool, check, index):
    verdict = validate(BROKEN[check][index], config=FAST, pool=pool, backend="sandbox")
    assert not verdict.valid and verdict.checks[check]["ok"] is False, verdict.checks
    assert len(verdict.errors) == 1 and verdict.errors[0].startswith(f"{check}: ")
    assert "\n" not in verdict.errors[0] and "Traceback" not in verdict.errors[0]
    assert list(verdict.checks) == list(CHECKS)


@pytest.mark.parametrize("body", [
    "        while True:\n            pass",  # a tool that never returns
    "        self.hog = bytearray(1 << 34)\n        return 'x'",  # 16 GiB
], ids=["endless", "memory"])
def test_hostile_tools_fail_validation_and_the_pool_survives(pool, body):
    verdict = validate(_broken("        return str(self.value)", body), config=FAST, pool=pool, backend="sandbox")
    assert not verdict.valid and verdict.checks["step"]["ok"] is False, verdict.errors
    assert validate(COUNTER, config=FAST, pool=pool, backend="sandbox").valid


def test_a_tool_cannot_touch_the_host(pool, tmp_path):
    if not pool.isolation["layers"].get("filesystem"):
        pytest.skip("this machine's sandbox has no filesystem layer")
    target = tmp_path / "pwned"
    body = (f"        import os, subprocess\n        open({str(target)!r}, 'w').write('x')\n"
            f"        subprocess.run(['touch', {str(target)!r}])\n        return 'x'")
    validate(_broken("        return str(self.value)", body), config=FAST, pool=pool, backend="sandbox")
    assert not target.exists()


def test_check_cli_reports_a_tool_use_program():
    path = ROOT / "spade_jax/envs/library/tool_use/support_refund.py"
    proc = subprocess.run([sys.executable, "-m", "spade_jax.envs", "check", str(path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["valid"] is True and report["backend"] == "sandbox" and report["errors"] == []
