"""The JAX transpiler as an environment backend: it admits a program that transpiles and then matches
the program step for step (run in the sandbox); its runnables can play on device."""

from __future__ import annotations

import dataclasses

from spade_jax.envs.backends.base import EnvBackend, NotAdmitted, Runnable, register_backend
from spade_jax.envs.tool_use import is_tool_use_program


@dataclasses.dataclass(frozen=True)
class JaxRunnable(Runnable):
    """A transpiled program: make() gives its host TextEnv; device_env is the TranspiledEnv."""

    def make(self):
        return self.device_env.text_env()


@register_backend
class JaxBackend(EnvBackend):
    name = "jax"
    title = "JAX"

    def admit(self, source: str, class_name: str, *, pool=None) -> JaxRunnable:
        if is_tool_use_program(source):
            raise NotAdmitted("a tool-use program (ToolEnv) reads JSON tool calls, which the JAX subset has no "
                              "form for; it runs in the sandbox")
        # Imported here: the transpiler pulls in gymnax and flax, and a broken one must leave the
        # sandbox working.
        try:
            from spade_jax.envs.backends.jax.env import transpile
            from spade_jax.envs.backends.jax.equivalence import verify_equivalence
            from spade_jax.envs.backends.jax.ir import UnsupportedProgram
        except Exception as exc:
            raise NotAdmitted(f"JAX backend unavailable ({type(exc).__name__}: {exc})") from None
        try:
            transpiled = transpile(source, class_name)
        except UnsupportedProgram as exc:
            raise NotAdmitted(f"outside the JAX subset: {exc}") from None
        except Exception as exc:
            raise NotAdmitted(f"JAX transpiler failed ({type(exc).__name__}: {exc})") from None
        try:
            verify_equivalence(transpiled, source, class_name, pool=pool)
        except Exception as exc:
            raise NotAdmitted(f"JAX translation differs from the program: {exc}") from None
        return JaxRunnable(self.name, class_name, source, device_env=transpiled)
