"""Frozen dataclass configs: load from YAML, override with dotted `key=value`, validate with clear errors.

Sections are dataclasses declared next to the code they configure; `Config` composes them into one tree.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

# Sections live with the code they configure (each checks its knobs with spade_jax.knobs).
from spade_jax.anchor import AnchorConfig
from spade_jax.curriculum import CurriculumConfig
from spade_jax.curriculum.corpus import CorpusConfig
from spade_jax.envs.backends import BACKEND_CHOICES
from spade_jax.envs.backends.sandbox import SandboxConfig
from spade_jax.envs.library import LIBRARY_POOL, parse_library_pool
from spade_jax.envs.validate import ValidationConfig
from spade_jax.evaluation.suites import SUITES
from spade_jax.knobs import ConfigError, choice, finite as _finite, in_range, positive
from spade_jax.mesh import MeshConfig
from spade_jax.models.attention import ATTENTION
from spade_jax.rl.config import RLConfig
from spade_jax.roles import DOMAINS, RolesConfig
from spade_jax.rollout import RolloutConfig
from spade_jax.sampling import SamplingConfig

CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # shipped as package data


log = logging.getLogger("spade_jax.config")



# ---------------------------------------------------------------------------------------------
# Building dataclasses from plain data


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Converts YAML/CLI data to the declared type, or raises ConfigError naming the key."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping of its fields, got {value!r}")
        return from_dict(annotation, value, prefix=f"{key}.")
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if value else []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise ConfigError(f"{key} must have {len(args)} items, got {len(value)}")
        return tuple(
            _coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args or [Any] * len(value)))
        )
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{key} must be an integer, got {value!r}") from None
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{key} must be a number, got {value!r}") from None
        # No float knob means anything at NaN or infinity (optional ones say "off" with null).
        if not math.isfinite(number):
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        return number
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return str(value)
    return value


def _unknown_key(key: str, allowed: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}; allowed: {', '.join(sorted(allowed))}")


# Keys that older versions wrote into every run's config.yaml and that no longer mean anything; a
# resumed run ignores them with a note instead of refusing its own config.
REMOVED_KEYS = {
    "rl.designer_advantage": "the designer's advantages are curriculum.designer_advantages",
    "curriculum.tis_cap": "the TIS cap is rl.tis_cap",
    "curriculum.win_rate_window": "the window is regen_interval",
    "curriculum.invalid_in_baseline": "see curriculum.train_invalid_designs",
}


def from_dict(cls, data: dict, prefix: str = ""):
    """Builds dataclass `cls` from nested plain data; unknown keys raise ConfigError."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in (data or {}).items():
        if key not in names and prefix + key in REMOVED_KEYS:
            log.warning(
                "config key %s%s is no longer used and is ignored (%s)", prefix, key, REMOVED_KEYS[prefix + key]
            )
            continue
        if key not in names:
            raise _unknown_key(prefix + key, names)
        kwargs[key] = _coerce(value, hints[key], prefix + key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        # Name the key as the user writes it: "sandbox.call_timeout_s", not "SandboxConfig.call_timeout_s".
        message = str(err).replace(f"{cls.__name__}.", prefix) if prefix else str(err)
        if prefix and message.startswith(prefix):
            raise ConfigError(message) from None
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {message}") from None


def to_dict(config) -> dict:
    """Plain nested data (tuples as lists) for YAML."""

    def plain(v):
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(config)


def parse_overrides(pairs: list[str]) -> dict:
    """['rl.lr=1e-5', 'iterations=3'] -> nested dict; values are parsed as YAML scalars."""
    nested: dict = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} must look like key=value (e.g. rl.lr=1e-5)")
        key, raw = pair.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override {pair!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {pair!r} conflicts with an earlier override of {part!r}")
        node[parts[-1]] = value
    return nested


def merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(name_or_path: str, _chain: tuple[Path, ...] = ()) -> dict:
    """Reads a config by name (spade_jax/configs/NAME.yaml) or path, following `base:` chains."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    via = f" (the base of {_chain[-1]})" if _chain else ""
    if not path.is_file():
        names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        what = "is a directory, not a file" if path.is_dir() else "not found"
        raise ConfigError(f"config {name_or_path!r}{via} {what}; use a path or one of: {', '.join(names)}")
    resolved = path.resolve()
    seen = [p.resolve() for p in _chain]
    if resolved in seen:
        cycle = " -> ".join(str(p) for p in (*_chain[seen.index(resolved):], path))
        raise ConfigError(f"config base: chain loops ({cycle}); remove one of these base: lines")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(f"cannot read config {path}{via}: {reason}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config {path}{via} is not valid YAML:{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}{via} must be a mapping at the top level")
    base = data.pop("base", None)
    if base is not None and base != "":
        if not isinstance(base, str):
            raise ConfigError(f"config {path}: base must be a config name or path, got {base!r}")
        parent = base
        if Path(base).suffix and not Path(base).is_absolute():
            parent = str(path.parent / base)
        data = merge(read_yaml(parent, (*_chain, path)), data)
    return data


# ---------------------------------------------------------------------------------------------
# The run's config tree. Sections are declared next to the code they configure.

MODES = ("selfplay", "fixed_pool")
GROUP_INSTANCES = ("independent", "shared")
DTYPES = ("float32", "bfloat16")
MAX_SEED = 2**63 - 1  # largest seed both numpy and jax.random.key accept


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str = "smollm2-135m-instruct"  # preset name, HF directory or .gguf file
    dtype: str = "float32"  # compute dtype; bfloat16 pays where the CPU has bf16 dots (benchmarks/bf16_parity.py)
    param_dtype: str = "float32"  # stored params; the optimizer keeps f32 masters either way
    attn_chunk: int | None = 512  # attention query block: bounds prefill/training memory (null: off)
    remat: bool = True  # recompute each block in the backward pass (training memory ~ one block)
    attention: str = "einsum"  # einsum | dot_product (cuDNN on GPU in bf16) | splash (TPU Pallas kernel)

    def __post_init__(self):
        choice(self.dtype, DTYPES, "model.dtype")
        choice(self.attention, ATTENTION, "model.attention")
        choice(self.param_dtype, DTYPES, "model.param_dtype")
        if self.attn_chunk is not None:
            positive(self.attn_chunk, "model.attn_chunk")


field = dataclasses.field


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything one run needs; spade_jax/configs/default.yaml is a commented copy."""

    mode: str = "selfplay"  # selfplay (SPADE) or fixed_pool (agent-only GRPO on env_pool)
    # what the environments are: games (text games, \boxed{} actions) or tool_use (ToolEnv tasks: tool calls,
    # <answer>); picks the skills, the library, the designer and hint prompts and the agent's system turn
    domain: str = "games"
    seed: int = 0  # seeds every random choice of the run
    iterations: int = 8  # rollout steps (agent updates) to run
    # Wall-clock budget: stop after the iteration during which this many minutes of training are spent,
    # resumes included (held-out evaluation not counted); null or 0: no limit. `iterations` still caps it.
    max_minutes: float | None = None
    regen_interval: int = 4  # SPADE: a new environment pool every this many iterations
    pool_size: int = 24  # SPADE: environments the designer writes per regeneration
    group_size: int = 16  # SPADE's G: plays per environment and arm (GRPO group size); the hinted arm's plays
    # SPADE: 192, no-hint plays per game = ceil(this / valid games); None: group_size
    nohint_plays_total: int | None = None
    # Which instance each play of a group meets. independent (SPADE: every play resets to its own random
    # instance, so a group's spread is partly instance luck); shared (one seed per environment, arm and
    # iteration, as GRPO's G answers to one prompt: the advantage compares replies to the same observation,
    # and a guess that wins by luck on some instances earns nothing on average)
    group_instances: str = "independent"
    # SPADE: 192 samples per update, designer samples first, agent samples trimmed or upsampled to fill;
    # None: every sample once
    global_batch: int | None = None
    design_attempts: int = 5  # SPADE: an invalid design is generated again, up to this many attempts per pool slot
    min_valid_envs: int = 0  # top the pool up to this many valid environments, from env_pool if set, else the library
    train_designer: bool = True  # False: the frozen-designer ablation
    use_memory: bool = True  # False: the no-memory ablation (designer sees no past environments)
    train_on_hinted: bool = False  # also train the agent on its hinted plays
    # fixed_pool's pool, and selfplay's stock (its min_valid_envs top-ups and the designer's edit and tune
    # bases and write-mode examples): a directory of *.py environment programs, "library:a,b(CONST=value, ...)"
    # for some library programs (spade_jax/envs/library), optionally with tunable constants set (an easier or
    # harder variant), or None for the domain's library
    env_pool: str | None = None
    backend: str = "auto"  # environment backend: auto (JAX where the program fits), jax or sandbox
    max_parallel_episodes: int = 64  # episodes played in lockstep (each sandboxed env is a process)
    # host: one generate call per turn over every env; device: JAX-backend envs play inside one compiled loop
    # each (fast per episode on accelerators, one compile per program)
    play_loop: str = "host"
    # Asynchronous play: 0 runs each iteration's rollouts (design, hints, plays) and then its update; k >= 1
    # samples the next iteration's rollouts during the current update with the weights from before it,
    # refreshes the sampler's weights only as often as keeps every trained agent row at most k updates
    # old, and corrects those rows with truncated importance weights (rl.tis_cap). Single-process only.
    async_staleness: int = 0
    checkpoint_every: int = 1  # save a checkpoint every this many iterations
    keep_checkpoints: int = 3  # checkpoints kept on disk (older ones are deleted)
    tensorboard: bool = True  # write TensorBoard event files
    progress: bool = True  # show a progress bar on the terminal
    # Score the agent on the held-out suite `eval_suite` every this many iterations (0: never); greedy,
    # in the run's answer format; eval/success_rate and its 95% interval go into metrics, plots, summary.
    eval_every: int = 0
    eval_suite: str = "small"  # a suite of spade_jax.evaluation.SUITES (small: calibrated for small models)
    model: ModelConfig = field(default_factory=ModelConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    designer_sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(max_new_tokens=1536, temperature=1.0)
    )
    hint_sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(max_new_tokens=96, temperature=0.7)
    )
    agent_sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(max_new_tokens=256, temperature=1.0)
    )
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    anchor: AnchorConfig = field(default_factory=AnchorConfig)  # rl.anchor_coef's samples
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    roles: RolesConfig = field(default_factory=RolesConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)

    def __post_init__(self):
        choice(self.mode, MODES, "mode")
        choice(self.domain, DOMAINS, "domain")
        if self.domain == "tool_use":
            if self.rollout.action != "reply":
                raise ConfigError("domain=tool_use needs rollout.action=reply (the environment reads the tool "
                                  "calls from the whole reply)")
            if self.backend == "jax":
                raise ConfigError("domain=tool_use needs backend=auto or sandbox (tool-use programs run in the "
                                  "sandbox)")
        choice(self.backend, BACKEND_CHOICES, "backend")
        choice(self.play_loop, ("host", "device"), "play_loop")
        choice(self.group_instances, GROUP_INSTANCES, "group_instances")
        if self.play_loop == "device" and self.rollout.reply_prefix:
            raise ConfigError("rollout.reply_prefix needs play_loop=host (the device loop reads whole replies)")
        for key in ("iterations", "regen_interval", "pool_size", "group_size", "max_parallel_episodes",
                    "checkpoint_every", "keep_checkpoints", "design_attempts"):
            positive(getattr(self, key), key)
        positive(self.min_valid_envs, "min_valid_envs", allow_zero=True)
        positive(self.async_staleness, "async_staleness", allow_zero=True)
        if self.async_staleness and self.mesh.distributed:
            raise ConfigError("async_staleness > 0 is single-process only (every process would have to overlap "
                              "in lockstep); set async_staleness=0 with mesh.distributed")
        positive(self.eval_every, "eval_every", allow_zero=True)
        if self.max_minutes is not None:
            positive(self.max_minutes, "max_minutes", allow_zero=True)
        if self.env_pool is not None and self.env_pool.startswith(LIBRARY_POOL):
            try:
                entries = parse_library_pool(self.env_pool)
                for entry in entries:
                    entry.source()  # the program exists and takes the constants given
                ids = [entry.env_id for entry in entries]
                if len(set(ids)) != len(ids):
                    raise ValueError("names the same program with the same constants twice")
            except ValueError as err:
                raise ConfigError(f"env_pool: {err}") from None
        choice(self.eval_suite, tuple(SUITES), "eval_suite")
        for key in ("nohint_plays_total", "global_batch"):
            if getattr(self, key) is not None:
                positive(getattr(self, key), key)
        in_range(self.seed, 0, MAX_SEED, "seed")
        # Sections built in code skip _coerce; no float knob means anything at NaN or infinity.
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            if dataclasses.is_dataclass(value):
                for knob in dataclasses.fields(value):
                    if not _finite(getattr(value, knob.name)):
                        raise ConfigError(
                            f"{section.name}.{knob.name}={getattr(value, knob.name)!r} must be a finite number"
                        )
        # What RLConfig (spade_jax/rl/config.py) leaves unchecked.
        positive(self.rl.adam_eps, "rl.adam_eps")
        in_range(self.rl.seed, 0, MAX_SEED, "rl.seed")


def load_config(name_or_path: str | None = "default", overrides: list[str] | tuple[str, ...] = ()):
    """The config named (or at a path), with `key=value` overrides applied and validated."""
    data = read_yaml(name_or_path or "default")
    data = merge(data, parse_overrides(list(overrides)))
    return from_dict(Config, data)
