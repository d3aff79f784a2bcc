"""Environment programs as text: pull the code out of designer output, find the environment
class, and check statically that it imports only the standard library and numpy."""

from __future__ import annotations

import ast
import re
import sys

__all__ = [
    "ProgramError",
    "ALLOWED_THIRD_PARTY",
    "strip_thinking",
    "extract_code",
    "parse_program",
    "find_env_class",
    "check_imports",
]

# Third-party top-level packages a program may import besides the standard library.
ALLOWED_THIRD_PARTY = frozenset({"numpy"})

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


class ProgramError(ValueError):
    """A problem in an environment program, phrased so that its author can fix it."""

    def __init__(self, message: str, check: str = "program"):
        super().__init__(message)
        # Name of the validation check that failed (syntax, imports, class, ...).
        self.check = check


def strip_thinking(text: str) -> str:
    """A model reply without its <think>...</think> blocks (an unclosed one runs to the end)."""
    return re.sub(r"<think>.*?(</think>|\Z)", "", text, flags=re.DOTALL)


def extract_code(designer_text: str) -> str:
    """Code block of designer output: among the ```python blocks (any fenced block when none
    is labelled python), the last that defines a class with reset and step, else the last with
    a class, else the longest; without fences, the whole text when it parses as Python."""
    if not isinstance(designer_text, str):
        raise ProgramError(f"designer output must be a str, got {type(designer_text).__name__}")
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(designer_text)]
    python_blocks = [code for lang, code in blocks if lang in ("python", "py", "python3")]
    candidates = python_blocks or [code for _, code in blocks]
    # Designers often show a usage snippet after the class and sometimes a draft before it:
    # take the last block defining a class with reset and step, else the last with a class,
    # else the longest block.
    with_class = [c for c in candidates if re.search(r"^\s*class\s+\w+", c, re.MULTILINE)]
    playable = [c for c in with_class if re.search(r"def\s+reset\b", c) and re.search(r"def\s+step\b", c)]
    chosen = (playable or with_class or [max(candidates, key=len)] if candidates else [None])[-1]
    if chosen is not None:
        return chosen.strip("\n") + "\n"
    try:
        ast.parse(designer_text)
    except SyntaxError:
        raise ProgramError(
            "no code found: put the environment in a ```python ... ``` block", check="syntax"
        ) from None
    return designer_text


def parse_program(source: str) -> ast.Module:
    """AST of a program, or ProgramError naming the line of the syntax error."""
    if not isinstance(source, str) or not source.strip():
        raise ProgramError("the program is empty", check="syntax")
    try:
        return ast.parse(source, filename="env_program.py")
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        where = f"line {exc.lineno}" if exc.lineno else "unknown line"
        shown = f": `{line[:120]}`" if line else ""
        raise ProgramError(f"SyntaxError at {where}: {exc.msg}{shown}", check="syntax") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        raise ProgramError(f"the program cannot be parsed: {exc}", check="syntax") from None


def _has_method(cls: ast.ClassDef, name: str) -> bool:
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
        for node in cls.body
    )


def find_env_class(source: str | ast.Module) -> str:
    """Name of the environment class: the top-level class whose name ends in `Env` (the last
    such class that defines reset and step when there are several), else the only class that
    has both reset and step."""
    tree = parse_program(source) if isinstance(source, str) else source
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    if not classes:
        raise ProgramError(
            "no class found: define one class whose name ends in `Env` with reset(seed) and "
            "step(action) methods",
            check="class",
        )
    playable = [c for c in classes if _has_method(c, "reset") and _has_method(c, "step")]
    named = [c for c in classes if c.name.endswith("Env")]
    # A base class (`class BaseEnv` with `class MazeEnv(BaseEnv)`) is not the environment.
    bases = {b.id for c in classes for b in c.bases if isinstance(b, ast.Name)}
    leaves = [c for c in named if c.name not in bases]
    if len(leaves) == 1:
        return leaves[0].name
    if len(named) == 1:
        return named[0].name
    if len(named) > 1:
        named_playable = [c for c in named if c in playable]
        if named_playable:
            return named_playable[-1].name
        return named[-1].name
    if len(playable) == 1:
        return playable[0].name
    if not playable:
        names = ", ".join(c.name for c in classes)
        raise ProgramError(
            f"no environment class: none of the classes ({names}) ends in `Env` or defines "
            "both reset and step",
            check="class",
        )
    names = ", ".join(c.name for c in playable)
    raise ProgramError(
        f"ambiguous environment class: {names} all define reset and step; name the environment "
        "class with the suffix `Env`",
        check="class",
    )


def _allowed(module: str) -> bool:
    top = module.split(".", 1)[0]
    return top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY


def check_imports(source: str | ast.Module) -> None:
    """Raise ProgramError for the first import outside the standard library and numpy."""
    tree = parse_program(source) if isinstance(source, str) else source
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise ProgramError(
                    f"line {node.lineno}: relative import `from {'.' * node.level}"
                    f"{node.module or ''} import ...` is not allowed; an environment program is "
                    "one self-contained file",
                    check="imports",
                )
            modules = [node.module or ""]
        for module in modules:
            if not _allowed(module):
                raise ProgramError(
                    f"line {node.lineno}: import of '{module}' is not allowed; environment "
                    "programs may import only the Python standard library and numpy",
                    check="imports",
                )
