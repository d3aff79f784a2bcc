"""ToolEnv: the base class of a tool-use environment program. It speaks GEM's TextEnv contract and owns the
protocol (tool calls in, tool results out, <answer> ends the episode, partial-progress reward).

This file is shipped into the sandbox as source and executed there after spade_jax/rollout/tool_calls.py
(its parser): it imports only the standard library, and parse_tool_calls / render_tool_call / ToolCall are
the names that file defines. A program subclasses ToolEnv without defining or importing it.
"""

import json
import random
import re

try:  # in the package; in the sandbox tool_calls.py has run in this namespace already
    from spade_jax.rollout.tool_calls import ToolCall, parse_tool_calls, render_tool_call
except ImportError:
    pass

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
# JSON-schema type name -> the Python types a decoded JSON value of that type has (bool is no number).
_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}
_RESULT_MAX_CHARS = 4000  # a tool result longer than this is cut in the observation
# A thinking model's reasoning (an unclosed block runs to the end): calls it drafts there are not made.
_THINKING = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)


class ToolError(Exception):
    """Raised by a tool method when the call fails (unknown id, bad state, refused): the agent sees the
    message as the call's error result and the episode goes on."""


def _type_ok(value, type_name):
    types = _JSON_TYPES.get(type_name)
    if types is None:
        return True  # a type this check does not know is not held against the caller
    if type_name in ("integer", "number") and isinstance(value, bool):
        return False
    if type_name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, types)


def _short_json(value):
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


class ToolEnv:
    """A task solved by calling tools. A subclass defines:

    - TOOLS: list of tool declarations, each {"name", "description", "parameters"} (a JSON-schema object
      with "properties" and "required") or the same wrapped OpenAI-style as {"type": "function",
      "function": {...}}; a tool `name` is served by the method `tool_<name>(self, **arguments)`, which
      returns the result (str or JSON-able) or raises ToolError;
    - setup(self, rng) -> str: builds the hidden state from rng (a random.Random(seed)) and returns the task;
    - subgoals(self) -> list of bool: the required state changes and facts, read from the hidden state
      (use self.answer_matches(x) for a required final answer); the episode's score is their share met;
    - solution(self) -> list of replies (self.call(name, **arguments) texts, several may be joined, and a
      last self.final(answer)) that wins the episode of the last reset.

    The agent calls tools with <tool_call>{"name": ..., "arguments": {...}}</tool_call> (several per reply)
    and ends the episode with <answer>...</answer>: reward 1.0 when every subgoal is met, else the share
    met (below 1.0), terminated. Other steps earn 0.0; at MAX_TURNS the episode is truncated with 0.0.
    """

    MAX_TURNS = 12  # hard cap on replies, invalid ones included (then truncated)
    MAX_CALLS_PER_TURN = 8  # calls after this many in one reply are not run
    TOOLS = []

    # ---- the part a subclass writes --------------------------------------------------------
    def setup(self, rng):
        raise NotImplementedError("a ToolEnv subclass must define setup(self, rng) returning the task text")

    def subgoals(self):
        raise NotImplementedError("a ToolEnv subclass must define subgoals(self) returning a list of bools")

    # ---- GEM contract ------------------------------------------------------------------------
    def reset(self, seed=None):
        self.rng = random.Random(seed)
        self.turn = 0
        self.done = False
        self.answer = None
        self.history = []  # (name, arguments, ok) per call that ran
        task = self.setup(self.rng)
        lines = [self.describe_tool(spec) for spec in self.tool_specs()]
        text = (
            f"{task}\n\nTools:\n" + "\n".join(lines) + "\n\n"
            "Call tools with <tool_call>{\"name\": \"TOOL\", \"arguments\": {...}}</tool_call> (several per reply "
            "are allowed); finish with <answer>your final answer</answer> (write <answer>done</answer> when "
            f"the task asks for no value). Turn 0/{self.MAX_TURNS}."
        )
        return text, {"tools": self.tool_specs(), "progress": 0.0}

    def step(self, action):
        if self.done:
            return "The episode is over; call reset().", 0.0, True, False, self._info([], [], [])
        self.turn += 1
        parsed = parse_tool_calls(_THINKING.sub("", action) if isinstance(action, str) else "")
        malformed = [{"text": m.text, "reason": m.reason} for m in parsed.malformed]
        parts, calls, errors = [], [], []
        for index, call in enumerate(parsed.calls):
            if index >= self.MAX_CALLS_PER_TURN:
                parts.append(f"Only {self.MAX_CALLS_PER_TURN} tool calls run per reply; the rest were skipped.")
                break
            ok, result = self._run(call.name, call.arguments)
            calls.append({"name": call.name, "arguments": call.arguments, "ok": ok})
            if not ok:
                errors.append({"name": call.name, "error": result})
            shown = result if len(result) <= _RESULT_MAX_CHARS else result[:_RESULT_MAX_CHARS] + " ...(cut)"
            parts.append(f"{'Result' if ok else 'Error'} of {call.name}: {shown}")
        for bad in malformed:
            parts.append(f"Malformed tool call ({bad['reason']}); write <tool_call>{{\"name\": \"TOOL\", "
                         "\"arguments\": {...}}</tool_call> with valid JSON.")
        answer = self._read_answer(parsed.text)
        if answer is not None:
            self.answer = answer
            self.done = True
            score = self.progress()
            won = score >= 1.0
            parts.append("Task complete, well done!" if won else
                         f"Answer recorded, but the task is not complete ({self._met()} of "
                         f"{len(self._goals())} goals met).")
            return "\n".join(parts), (1.0 if won else score), True, False, self._info(calls, errors, malformed)
        if not parsed.calls and not malformed:
            parts.append("Invalid action (turn lost): no tool call and no <answer>. Call a tool with "
                         "<tool_call>{\"name\": \"TOOL\", \"arguments\": {...}}</tool_call> or finish with "
                         "<answer>...</answer>.")
        if self.turn >= self.MAX_TURNS:
            self.done = True
            parts.append("Out of turns.")
            return "\n".join(parts), 0.0, False, True, self._info(calls, errors, malformed)
        parts.append(f"Turn {self.turn}/{self.MAX_TURNS}.")
        return "\n".join(parts), 0.0, False, False, self._info(calls, errors, malformed)

    def close(self):
        pass

    # ---- helpers for subclasses ----------------------------------------------------------
    def call(self, name, **arguments):
        """The text of one tool call (for solution())."""
        return render_tool_call(ToolCall(name=name, arguments=arguments))

    def final(self, answer):
        """The text that ends the episode with `answer` (for solution())."""
        return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"

    def answer_matches(self, expected):
        """Whether the final answer equals `expected`: case and spacing ignored; numbers (with $ and
        thousands commas dropped) equal within 1e-6 of their size."""
        if self.answer is None:
            return False
        given, wanted = " ".join(str(self.answer).split()).lower(), " ".join(str(expected).split()).lower()
        if given == wanted:
            return True
        try:
            a = float(given.replace("$", "").replace(",", ""))
            b = float(wanted.replace("$", "").replace(",", ""))
        except ValueError:
            return False
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))

    def progress(self):
        """Share of subgoals met, in [0, 1]."""
        goals = self._goals()
        return self._met() / len(goals) if goals else 0.0

    def tool_specs(self):
        """The tools in OpenAI function format: [{"type": "function", "function": {name, description,
        parameters}}]."""
        specs = []
        for tool in self.TOOLS:
            inner = tool.get("function", tool) if isinstance(tool, dict) else {}
            specs.append({"type": "function", "function": {
                "name": inner.get("name", ""),
                "description": inner.get("description", ""),
                "parameters": inner.get("parameters", {"type": "object", "properties": {}}),
            }})
        return specs

    @staticmethod
    def describe_tool(spec):
        """`- name(arg: type, optional?: type): description` (malformed declarations are shown as they
        are; validation's tools check names the fault)."""
        function = spec["function"]
        parameters = function["parameters"] if isinstance(function["parameters"], dict) else {}
        params = parameters.get("properties") if isinstance(parameters.get("properties"), dict) else {}
        required = parameters.get("required") if isinstance(parameters.get("required"), list) else []
        args = ", ".join(
            f"{name}{'' if name in required else '?'}: {info.get('type', 'any') if isinstance(info, dict) else 'any'}"
            for name, info in params.items())
        return f"- {function['name']}({args}): {function['description']}"

    # ---- internals -----------------------------------------------------------------------
    def _goals(self):
        return [bool(goal) for goal in self.subgoals()]

    def _met(self):
        return sum(self._goals())

    def _info(self, calls, errors, malformed):
        return {"tool_calls": calls, "tool_errors": errors, "malformed_tool_calls": malformed,
                "progress": self.progress(), "answer": self.answer}

    def _read_answer(self, text):
        start = text.rfind(ANSWER_OPEN)
        if start < 0:
            return None
        end = text.find(ANSWER_CLOSE, start)
        if end < 0:
            return None
        return text[start + len(ANSWER_OPEN):end].strip()

    def _spec(self, name):
        for spec in self.tool_specs():
            if spec["function"]["name"] == name:
                return spec["function"]
        return None

    def _check_arguments(self, spec, arguments):
        schema = spec.get("parameters") or {}
        properties = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in arguments:
                return f"missing required argument '{name}'"
        for name, value in arguments.items():
            if name not in properties:
                allowed = ", ".join(properties) or "none"
                return f"unknown argument '{name}' (arguments: {allowed})"
            declared = properties[name] or {}
            type_name = declared.get("type")
            if isinstance(type_name, str) and not _type_ok(value, type_name):
                return f"argument '{name}' must be of type {type_name}, got {_short_json(value)}"
            if "enum" in declared and value not in declared["enum"]:
                return f"argument '{name}' must be one of {_short_json(declared['enum'])}, got {_short_json(value)}"
        return None

    def _run(self, name, arguments):
        """(ok, result text) of one call; a failed call (unknown tool, bad arguments, ToolError) is an
        error result, never an exception."""
        spec = self._spec(name)
        method = getattr(self, f"tool_{name}", None) if spec is not None else None
        if method is None:
            known = ", ".join(s["function"]["name"] for s in self.tool_specs())
            return False, f"unknown tool '{name}'; the tools are: {known}"
        problem = self._check_arguments(spec, arguments)
        if problem is not None:
            return False, problem
        try:
            result = method(**arguments)
        except ToolError as exc:
            self.history.append((name, arguments, False))
            return False, str(exc) or "the call failed"
        self.history.append((name, arguments, True))
        if isinstance(result, str):
            return True, result
        try:
            return True, json.dumps(result, ensure_ascii=False)
        except (TypeError, ValueError):
            return True, str(result)
