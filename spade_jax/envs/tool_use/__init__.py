"""The tool-use domain's environment side: which programs are tool-use programs (a class extending ToolEnv),
the runtime source shipped with them into the sandbox, in-process loading, and validation's tool probes."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

__all__ = [
    "BASE_CLASS",
    "runtime_units",
    "is_tool_use_program",
    "needs_runtime",
    "load_in_process",
    "probe_actions",
    "check_tool_specs",
]

BASE_CLASS = "ToolEnv"  # the class a tool-use program's environment extends (runtime.py)
_HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def _units() -> tuple[tuple[str, str], ...]:
    parser = _HERE.parent.parent / "rollout" / "tool_calls.py"
    return (("tool_calls.py", parser.read_text(encoding="utf-8")),
            ("tool_env.py", (_HERE / "runtime.py").read_text(encoding="utf-8")))


def runtime_units() -> list[tuple[str, str]]:
    """(file name, source) of the code a tool-use program runs on, in execution order: the tool-call
    parser (spade_jax/rollout/tool_calls.py, the one parser the rollout also uses), then ToolEnv."""
    return [list(unit) for unit in _units()]


def _tree(source: str | ast.Module) -> ast.Module | None:
    if isinstance(source, ast.Module):
        return source
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def is_tool_use_program(source: str | ast.Module) -> bool:
    """Whether a top-level class of the program extends ToolEnv (False when it does not parse)."""
    tree = _tree(source)
    if tree is None:
        return False
    return any(
        isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == BASE_CLASS for b in node.bases)
        for node in tree.body
    )


def needs_runtime(source: str | ast.Module) -> bool:
    """A tool-use program that does not define ToolEnv itself: it runs after runtime_units()."""
    if isinstance(source, str) and BASE_CLASS not in source:
        return False
    tree = _tree(source)
    if tree is None or not is_tool_use_program(tree):
        return False
    return not any(isinstance(node, ast.ClassDef) and node.name == BASE_CLASS for node in tree.body)


def load_in_process(source: str, class_name: str, module_name: str = "spade_tool_program"):
    """The class `class_name` of a trusted program (library code), executed in-process on the runtime."""
    from spade_jax.envs.tool_use import runtime

    namespace: dict = {"__name__": module_name}
    if needs_runtime(source):
        namespace.update({name: getattr(runtime, name) for name in ("ToolEnv", "ToolError")})
    exec(compile(source, f"<{module_name}>", "exec"), namespace)
    return namespace[class_name]


# ---- validation ---------------------------------------------------------------------------------

_SAMPLE = {"string": "test", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}


def _sample_arguments(function: dict) -> dict:
    """Arguments of the declared types for every required parameter (an enum's first value)."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    arguments = {}
    for name in parameters.get("required") or []:
        declared = properties.get(name) or {}
        if declared.get("enum"):
            arguments[name] = declared["enum"][0]
        else:
            arguments[name] = _SAMPLE.get(declared.get("type"), "test")
    return arguments


def _block(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def probe_actions(tools: list[dict]) -> list[tuple[str, str]]:
    """(what, reply) probes for a tool-use program's step(): a well-formed call of every declared tool
    with arguments of the declared types, a call with a missing argument, malformed calls (broken JSON,
    no name, an unclosed block), an unknown tool, two calls in one reply, text without any call, and an
    empty reply. Each runs right after a reset; none may raise."""
    probes = []
    for spec in tools:
        function = spec["function"]
        probes.append((f"a call of {function['name']}", _block(function["name"], _sample_arguments(function))))
    if tools:
        first = tools[0]["function"]
        required = (first.get("parameters") or {}).get("required") or []
        if required:
            probes.append((f"a call of {first['name']} without its arguments", _block(first["name"], {})))
        probes.append(("two calls in one reply", _block(first["name"], _sample_arguments(first)) * 2))
    probes += [
        ("a call with broken JSON", '<tool_call>\n{"name": "x", "arguments": {\n</tool_call>'),
        ("a call without a name", '<tool_call>\n{"arguments": {}}\n</tool_call>'),
        ("an unclosed call", '<tool_call>\n{"name": "x", "arguments": {}}'),
        ("an unknown tool", _block("no_such_tool_xyz", {})),
        ("text without a call", "I am not sure what to do."),
        ("an empty reply", ""),
    ]
    return probes


def check_tool_specs(tools) -> str | None:
    """Why reset()'s info["tools"] is not a usable list of OpenAI function tools, or None when it is."""
    if not isinstance(tools, list) or not tools:
        return "reset() info must hold 'tools': a non-empty list of tool declarations (set TOOLS)"
    names = []
    for i, spec in enumerate(tools):
        function = spec.get("function") if isinstance(spec, dict) else None
        if not isinstance(function, dict) or spec.get("type") != "function":
            return f"tool {i} must look like {{'type': 'function', 'function': {{name, description, parameters}}}}"
        name = function.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            return f"tool {i} needs a name that is a Python identifier, got {name!r}"
        if not isinstance(function.get("description"), str) or not function["description"].strip():
            return f"tool {name} needs a description"
        parameters = function.get("parameters")
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            return f"tool {name}: parameters must be a JSON-schema object ({{'type': 'object', 'properties': ...}})"
        properties = parameters.get("properties", {})
        if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
            return f"tool {name}: parameters.properties must map each argument to its schema"
        required = parameters.get("required", [])
        if not isinstance(required, list) or any(r not in properties for r in required):
            return f"tool {name}: every name in parameters.required must be a declared property"
        names.append(name)
    if len(set(names)) != len(names):
        return "tool names must be unique"
    return None
