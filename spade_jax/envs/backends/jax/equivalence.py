"""Differential check of a transpiled environment against its program: same state, same action
texts, and every observation, reward and flag must agree; plus the backend choice built on it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from spade_jax.envs.backends.jax.env import TranspiledEnv, transpile
from spade_jax.envs.backends.jax.ir import UnsupportedProgram


@dataclasses.dataclass
class EquivalenceReport:
    """Outcome of check_equivalence: ok when no step disagreed."""

    class_name: str  # the environment class checked
    episodes: int  # episodes played on both backends
    steps: int  # steps compared
    mismatches: list[str]  # one line per disagreement (episode, step, what differed)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        if self.ok:
            return f"{self.class_name}: {self.steps} steps over {self.episodes} episodes agree"
        return f"{self.class_name}: {len(self.mismatches)} mismatches; first: {self.mismatches[0]}"


class InProcessProgram:
    """The program exec'd in this process: only for trusted code (the library, tests)."""

    def __init__(self, source: str, class_name: str):
        namespace: dict = {"__name__": "spade_jax_reference"}
        exec(compile(source, f"<{class_name}>", "exec"), namespace)
        self.instance = namespace[class_name]()

    def reset(self, seed=None):
        return self.instance.reset(seed=seed)

    def step(self, action: str):
        return self.instance.step(action)

    def solution(self):
        return self.instance.solution()

    def get_attrs(self) -> dict:
        return dict(vars(self.instance))

    def set_attrs(self, attrs: dict) -> None:
        for k, v in attrs.items():
            setattr(self.instance, k, v)

    def close(self) -> None:
        pass


def _texts(solution) -> list[str]:
    if isinstance(solution, str):
        return [solution]
    if isinstance(solution, (list, tuple)):
        return [s for s in solution if isinstance(s, str)]
    return []


def _compare(where: str, py, jx, mismatches: list[str]) -> bool:
    (p_obs, p_rew, p_term, p_trunc), (j_obs, j_rew, j_term, j_trunc) = py, jx
    if p_obs != j_obs:
        i = next((k for k, (a, b) in enumerate(zip(p_obs, j_obs)) if a != b), min(len(p_obs), len(j_obs)))
        mismatches.append(
            f"{where}: observation differs at char {i}: python {p_obs[max(0, i - 30):i + 30]!r} "
            f"vs jax {j_obs[max(0, i - 30):i + 30]!r}"
        )
        return False
    if not math.isclose(float(p_rew), float(j_rew), rel_tol=1e-5, abs_tol=1e-5):
        mismatches.append(f"{where}: reward python {p_rew} vs jax {j_rew}")
        return False
    if bool(p_term) != bool(j_term) or bool(p_trunc) != bool(j_trunc):
        mismatches.append(f"{where}: flags python ({p_term}, {p_trunc}) vs jax ({j_term}, {j_trunc})")
        return False
    return True


def check_equivalence(
    source: str,
    class_name: str | None = None,
    n_episodes: int = 8,
    n_steps: int = 12,
    sandbox_pool=None,
    *,
    env: TranspiledEnv | None = None,
    seed: int = 0,
    in_process: bool | None = None,
) -> EquivalenceReport:
    """Plays both backends in lockstep. Half the episodes start from the JAX reset state
    injected into the program (set_attrs), half from the program's own reset loaded into JAX
    (which also checks that the reset distributions share their support). Actions: the
    program's solution() texts on some episodes, random vocabulary entries (unrecognised
    included) on the others. The program runs in `sandbox_pool` when given, else in this
    process (trusted code only)."""
    env = env if env is not None else transpile(source, class_name, fast_compile=True)
    class_name = env.name
    if sandbox_pool is None and in_process is False:
        from spade_jax.envs.backends.sandbox import default_pool

        sandbox_pool = default_pool()
    mismatches: list[str] = []
    steps = 0
    rng = np.random.default_rng(seed)
    for episode in range(n_episodes):
        program: Any = (
            sandbox_pool.load(source, class_name) if sandbox_pool is not None else InProcessProgram(source, class_name)
        )
        try:
            steps += _play_episode(env, program, episode, seed, n_steps, rng, mismatches)
        except Exception as exc:  # the program itself raised: the backends disagree
            mismatches.append(f"episode {episode}: python raised {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            program.close()
        if len(mismatches) >= 5:
            break
    return EquivalenceReport(class_name, n_episodes, steps, mismatches)


def _play_episode(env, program, episode, seed, n_steps, rng, mismatches) -> int:
    python_seed = seed * 10_000 + episode
    program.reset(seed=python_seed)
    if episode % 2 == 0:
        attrs, record = env._jit_reset(jax.random.PRNGKey(python_seed))
        state = env.state_with(attrs, record)
        program.set_attrs(env.python_state(state))
        origin = "jax reset"
        if bool(env.loop_cap_hit(attrs)):
            mismatches.append(f"episode {episode} (jax reset): {_cap_message(env)}")
            return 0
    else:
        try:
            state = env.state_from_python(program.get_attrs())
        except ValueError as exc:
            mismatches.append(f"episode {episode}: the program's reset state is outside the JAX support: {exc}")
            return 0
        origin = "python reset"
    plan: list[str] = []
    if episode % 4 in (0, 1) and hasattr(program, "solution"):
        try:
            plan = _texts(program.solution())
        except Exception:
            plan = []
    n = len(env.vocab)
    steps = 0
    for t in range(n_steps):
        if t < len(plan) and rng.random() < 0.85:
            text = plan[t]
        elif rng.random() < 0.2:
            text = env.vocab[-1] if rng.random() < 0.5 else "no boxed answer here"
        else:
            text = env.vocab[int(rng.integers(n))]
        action_id = env.action_id(text)
        py = program.step(text)
        attrs, record, reward, terminated, truncated = env._jit_step(state.attrs, np.int32(action_id))
        state = env.state_with(attrs, record, t + 1, terminated, truncated)
        jx = (env.render_text(record), float(reward), bool(terminated), bool(truncated))
        steps += 1
        where = f"episode {episode} ({origin}) step {t} action {text!r}"
        if bool(env.loop_cap_hit(attrs)):
            mismatches.append(f"{where}: {_cap_message(env)}")
            break
        if not _compare(where, py[:4], jx, mismatches):
            break
        if py[2] or py[3]:
            break
    return steps


def _cap_message(env) -> str:
    loops = ", ".join(f"line {line} (cap {cap} passes)" for line, cap in sorted(env.loop_cap_lines.items()))
    return (f"a loop ran past its cap on the JAX backend: {loops} (the device episode is truncated there; the program "
            "keeps looping)")


def verify_equivalence(transpiled: TranspiledEnv, source: str, class_name: str, pool=None) -> None:
    """Raises ValueError naming the first disagreement; the program runs in the sandbox."""
    report = check_equivalence(source, class_name, env=transpiled, sandbox_pool=pool, in_process=False)
    if not report.ok:
        raise ValueError(report.mismatches[0])


def try_jax_backend(source: str, class_name: str | None = None, pool=None, *, in_process: bool = False,
                    n_episodes: int = 8, n_steps: int = 12) -> tuple[TranspiledEnv | None, str | None]:
    """(env, None) when the program transpiles and passes the equivalence check, else
    (None, reason), e.g. "line 12: while loop with a data-dependent bound"."""
    try:
        env = transpile(source, class_name)
    except UnsupportedProgram as exc:
        return None, str(exc)
    except Exception as exc:  # a transpiler bug must not take the run down: the sandbox still works
        return None, f"JAX transpiler error ({type(exc).__name__}: {exc})"
    try:
        report = check_equivalence(source, env.name, n_episodes, n_steps, pool, env=env,
                                   in_process=True if in_process else None if pool is not None else False)
    except Exception as exc:
        return None, f"equivalence check could not run ({type(exc).__name__}: {exc})"
    if not report.ok:
        return None, f"JAX version differs from the program: {report.mismatches[0]}"
    return env, None
