"""A program's tunable constants (UPPERCASE literals assigned once): reading them, and rewriting their
values from a designer's tune reply (`NAME = value` lines) without touching any other text."""

from __future__ import annotations

import ast
import re
from typing import Any

from spade_jax.envs.program import strip_thinking

__all__ = ["UNTUNABLE", "apply_tuning", "constant_lines", "parse_tuning", "set_constants", "tunable_constants"]

_CONSTANT_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# The episode's turn cap bounds the game, not its difficulty, and tunes that raised it were past
# validation's turn limit in 5 of 19 failed tunes measured: it is left out of tuning. So is the
# library's partial-credit scale (a loss pays PARTIAL x its progress): a tune raising it would pay
# losses almost like wins, a reward change rather than a difficulty change.
UNTUNABLE = frozenset({"MAX_TURNS", "PARTIAL"})
_ASSIGNMENT_LINE = re.compile(r"(?<![\w.])([A-Z][A-Z0-9_]*)\s*(?::\s*[A-Za-z_][\w.\[\],]*)?\s*=(?!=)\s*(.*)")
_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _constant_nodes(tree: ast.Module) -> dict[str, ast.expr]:
    """Value nodes of the UPPERCASE literal assignments at module level and in top-level classes,
    UNTUNABLE names excepted. A name assigned more than once there is left out: which one to
    rewrite would be a guess."""
    found: dict[str, list[ast.expr]] = {}
    bodies = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.ClassDef)]
    for body in bodies:
        for node in body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name) and _CONSTANT_NAME.match(target.id) and target.id not in UNTUNABLE:
                found.setdefault(target.id, []).append(value)
    nodes = {}
    for name, values in found.items():
        if len(values) != 1:
            continue
        try:
            ast.literal_eval(values[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        nodes[name] = values[0]
    return nodes


def tunable_constants(source: str) -> dict[str, Any]:
    """The program's tunable constants in source order: UPPERCASE names assigned once, at module level
    or in a top-level class body, to a Python literal ({} when the source does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    return {name: ast.literal_eval(node) for name, node in _constant_nodes(tree).items()}


def _fits(old: Any, new: Any) -> bool:
    """Whether `new` may replace `old`: the same type (a float also takes an int), and in a container
    whose items share one type, items of that type."""
    if isinstance(old, float) and type(new) is int:
        return True
    if type(old) is not type(new):
        return False
    if isinstance(old, dict):
        return _fits_items(list(old), list(new)) and _fits_items(list(old.values()), list(new.values()))
    if isinstance(old, (list, tuple, set, frozenset)):
        return _fits_items(list(old), list(new))
    return True


def _fits_items(old: list, new: list) -> bool:
    if not old or len({type(x) for x in old}) != 1:
        return True  # an empty or mixed container says nothing about its items
    return all(_fits(old[0], x) for x in new)


def _literal_prefix(text: str) -> tuple[bool, Any]:
    """The longest prefix of `text` that is a Python literal (a value followed by a comment, a
    closing backtick or prose); (False, None) when none is."""
    text = text.strip()[:500]
    cuts = [len(text)] + [i for i in range(len(text) - 1, 0, -1) if text[i] in " \t#,;`"]
    for cut in cuts:
        piece = text[:cut].strip().rstrip("`,;").strip()  # `5, because ...` is 5, not the tuple (5,)
        if not piece:
            continue
        try:
            return True, ast.literal_eval(piece)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
    return False, None


def _segments(text: str) -> list[tuple[bool, str]]:
    """The reply cut into (is_code, text) pieces in order: fenced blocks and the prose around them."""
    pieces, at = [], 0
    for match in _FENCE.finditer(text):
        pieces.append((False, text[at:match.start()]))
        pieces.append((True, match.group(1)))
        at = match.end()
    pieces.append((False, text[at:]))
    return [(code, piece) for code, piece in pieces if piece.strip()]


def parse_tuning(reply_text: str) -> dict[str, Any]:
    """Every `NAME = literal` assignment in a tune reply, in order, the last one of a name winning.
    A code block that parses is read with `ast` (multi-line values work); other text line by line."""
    assignments: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        assignments.pop(name, None)  # re-insert so the order is that of the last assignment
        assignments[name] = value

    for is_code, piece in _segments(strip_thinking(reply_text)):
        tree = None
        if is_code:
            try:
                tree = ast.parse(piece)
            except (SyntaxError, ValueError):
                tree = None
        if tree is not None:
            nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
            for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                try:
                    value = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                for target in targets:
                    if isinstance(target, ast.Name) and _CONSTANT_NAME.match(target.id):
                        put(target.id, value)
            continue
        for line in piece.splitlines():
            match = _ASSIGNMENT_LINE.search(line)
            if match:
                ok, value = _literal_prefix(match.group(2))
                if ok:
                    put(match.group(1), value)
    return assignments


def _value_text(old: Any, new: Any) -> str:
    return repr(float(new) if isinstance(old, float) else new)


def apply_tuning(base_source: str, reply_text: str) -> str:
    """The base program with the reply's assignments written over its tunable constants.

    Only the value of each assignment is replaced (by its span in the ast), so indentation, the
    annotation, inline comments and every other line stay as they were. Unknown names, non-literal
    values, values of another type and values equal to the current one are ignored; when nothing is
    left the base source comes back unchanged (`designer_program` then rejects it as no change).
    """
    try:
        tree = ast.parse(base_source)
    except (SyntaxError, ValueError):
        return base_source
    nodes = _constant_nodes(tree)
    edits = []  # (value node, new value text)
    for name, new in parse_tuning(reply_text).items():
        node = nodes.get(name)
        if node is None:
            continue
        old = ast.literal_eval(node)
        if _fits(old, new) and not (type(old) is type(new) and old == new):
            edits.append((node, _value_text(old, new)))
    if not edits:
        return base_source
    # ast columns count UTF-8 bytes: cut the byte form of each line.
    lines = [line.encode("utf-8") for line in base_source.splitlines(keepends=True)]
    for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        head = lines[node.lineno - 1][: node.col_offset]
        tail = lines[node.end_lineno - 1][node.end_col_offset :]
        lines[node.lineno - 1 : node.end_lineno] = [head + text.encode("utf-8") + tail]
    return b"".join(lines).decode("utf-8")


def set_constants(source: str, values: dict[str, Any]) -> str:
    """The program with its tunable constants set to `values` (a person's choice, e.g. an easier
    variant in a fixed pool): unlike a designer's tune, a name the program does not have, or a value
    of another type, is an error (ValueError, one line) instead of being ignored."""
    constants = tunable_constants(source)
    for name, value in values.items():
        if name not in constants:
            have = ", ".join(constants) or "none"
            raise ValueError(f"no tunable constant {name}; the program has {have}")
        if not _fits(constants[name], value):
            raise ValueError(f"{name}={value!r} does not fit {name}={constants[name]!r} (another type)")
    return apply_tuning(source, "\n".join(f"{name} = {value!r}" for name, value in values.items()))


def constant_lines(source: str, max_value_chars: int) -> list[str]:
    """`NAME = value  # comment` for each tunable constant whose value's repr has at most
    `max_value_chars` characters, in source order ([] when the source does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    raw = source.splitlines()
    lines = []
    for name, node in _constant_nodes(tree).items():
        text = repr(ast.literal_eval(node))
        if len(text) > max_value_chars:
            continue
        rest = raw[node.end_lineno - 1].encode("utf-8")[node.end_col_offset :].decode("utf-8", "replace").strip()
        lines.append(f"{name} = {text}" + (f"  {rest}" if rest.startswith("#") else ""))
    return lines
