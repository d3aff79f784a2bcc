"""Config machinery: YAML + key=value overrides into frozen dataclasses, with one-line errors."""

import dataclasses

import pytest

from spade_jax.config import ConfigError, choice, from_dict, parse_overrides, to_dict


@dataclasses.dataclass(frozen=True)
class Inner:
    lr: float = 1e-6
    kind: str = "token"

    def __post_init__(self):
        choice(self.kind, ("token", "sequence"), "inner.kind")


@dataclasses.dataclass(frozen=True)
class Outer:
    seed: int = 0
    name: str | None = None
    flags: tuple[str, ...] = ()
    inner: Inner = dataclasses.field(default_factory=Inner)


def test_overrides_build_nested_values():
    data = parse_overrides(["seed=3", "inner.lr=1e-5", "flags=a,b", "name=null"])
    cfg = from_dict(Outer, data)
    assert cfg == Outer(seed=3, name=None, flags=("a", "b"), inner=Inner(lr=1e-5))
    assert to_dict(cfg)["inner"] == {"lr": 1e-5, "kind": "token"}


def test_unknown_key_names_the_key_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key 'inner\.lrr' \(did you mean 'lr'\?\)"):
        from_dict(Outer, parse_overrides(["inner.lrr=1"]))


def test_bad_type_and_bad_choice_are_one_line():
    with pytest.raises(ConfigError, match="seed must be an integer"):
        from_dict(Outer, {"seed": "three"})
    with pytest.raises(ConfigError, match="inner.kind='tok' is not allowed; choose one of token, sequence"):
        from_dict(Outer, {"inner": {"kind": "tok"}})


def test_override_without_equals_is_rejected():
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["seed"])


def test_a_forced_reply_prefix_needs_the_host_loop():
    from spade_jax.config import load_config

    assert load_config("default").rollout.reply_prefix == "\\boxed{"
    with pytest.raises(ConfigError, match="rollout.reply_prefix needs play_loop=host"):
        load_config("default", ["play_loop=device"])
    assert load_config("default", ["play_loop=device", "rollout.reply_prefix="]).play_loop == "device"
