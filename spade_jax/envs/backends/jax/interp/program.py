"""The frontend: a parsed environment program, its class, module- and class-level constants, methods,
supported imports and the attributes its methods mutate."""

from __future__ import annotations

import ast

from spade_jax.envs.backends.jax.interp.interpreter import Interp
from spade_jax.envs.backends.jax.interp.predication import Frame
from spade_jax.envs.backends.jax.interp.values import _MODULES, Module
from spade_jax.envs.backends.jax.ir import StringTable, UnsupportedProgram, unsupported


class Program:
    """Parsed environment program: the class, its constants, methods and mutable attributes."""

    def __init__(self, source: str, class_name: str | None = None):
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise UnsupportedProgram(f"line {exc.lineno}: syntax error: {exc.msg}") from None
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        if class_name is None:
            from spade_jax.envs.program import ProgramError, find_env_class

            try:
                class_name = find_env_class(tree)
            except ProgramError as exc:
                raise UnsupportedProgram(str(exc)) from None
        if class_name not in classes:
            raise UnsupportedProgram(f"no class named {class_name!r} in the program")
        self.source = source
        self.class_name = class_name
        self.cls = classes[class_name]
        for base in self.cls.bases:
            if not (isinstance(base, ast.Name) and base.id == "object"):
                raise unsupported(base, "the environment class has a base class (only plain classes are supported)")
        self.module_funcs: dict[str, ast.FunctionDef] = {}
        self.module_consts: dict = {}
        self.imports: dict[str, object] = {}
        host = Interp(self, StringTable(), host=True)
        self.imports = {}
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in _MODULES:
                        self.imports[alias.asname or alias.name] = Module(alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.module in _MODULES:
                    for alias in node.names:
                        self.imports[alias.asname or alias.name] = ("from", node.module, alias.name)
            elif isinstance(node, ast.FunctionDef):
                self.module_funcs[node.name] = node
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                try:
                    value = host.eval(node.value, Frame({}))
                except UnsupportedProgram:
                    continue  # module constant we cannot fold; fails later only if used
                for t in targets:
                    if isinstance(t, ast.Name):
                        self.module_consts[t.id] = value
        self.methods: dict[str, ast.FunctionDef] = {}
        self.consts: dict = {}
        for node in self.cls.body:
            if isinstance(node, ast.FunctionDef):
                self.methods[node.name] = node
        for node in self.cls.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = host.eval(node.value, Frame(dict(self.consts)))
                for t in targets:
                    if isinstance(t, ast.Name):
                        self.consts[t.id] = value
        for required in ("reset", "step"):
            if required not in self.methods:
                raise UnsupportedProgram(f"the class {class_name} has no {required}() method")
        self.mutable = self._mutable_attrs()

    def _mutable_attrs(self) -> set[str]:
        names: set[str] = set()

        def root(t):
            while isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                return t.attr
            return None

        for name, fn in self.methods.items():
            if name == "__init__":
                continue
            for node in ast.walk(fn):
                targets = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                    targets = [node.target]
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    targets = [node.func.value] + list(node.args)
                for t in targets:
                    for sub in ast.walk(t) if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                        r = root(sub)
                        if r is not None and r not in self.methods:
                            names.add(r)
        return names
