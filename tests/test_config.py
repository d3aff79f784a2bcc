"""Config machinery: YAML + key=value overrides into frozen dataclasses, with one-line errors."""

import dataclasses
import re

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


# Every float knob refuses NaN, infinities and values outside its meaning, naming the key in one line.
BAD_OVERRIDES = [
    ("rl.lr=nan", "rl.lr"), ("rl.lr=inf", "rl.lr"), ("rl.lr=.inf", "rl.lr"), ("rl.lr=-1e30", "lr"),
    ("rl.lr=1e400", "rl.lr"), ("rl.eps_low=nan", "rl.eps_low"), ("rl.eps_low=-0.1", "eps_low"),
    ("rl.eps_high=-inf", "rl.eps_high"), ("rl.eps_high=-0.1", "eps_high"), ("rl.kl_coef=-1", "kl_coef"),
    ("rl.tis_cap=nan", "rl.tis_cap"), ("rl.tis_cap=0.5", "tis_cap"), ("rl.weight_decay=-1", "weight_decay"),
    ("rl.b1=inf", "rl.b1"), ("rl.b2=1.5", "AdamW betas"), ("rl.adam_eps=0", "rl.adam_eps"),
    ("rl.adam_eps=-1e-8", "rl.adam_eps"), ("rl.grad_clip=-1", "grad_clip"), ("rl.grad_clip=inf", "rl.grad_clip"),
    ("rl.format_bonus=nan", "rl.format_bonus"), ("rl.format_bonus=2", "format_bonus"), ("rl.seed=-1", "rl.seed"),
    ("rl.micro_batches=0", "micro_batches"), ("seed=-1", "seed"), ("iterations=-1", "iterations"),
    ("agent_sampling.temperature=-1", "temperature"), ("agent_sampling.temperature=inf", "agent_sampling.temperature"),
    ("hint_sampling.top_p=0", "top_p"), ("hint_sampling.top_p=1.5", "top_p"), ("designer_sampling.top_p=nan", "top_p"),
    ("agent_sampling.top_k=-1", "top_k"), ("agent_sampling.stop_token_ids=[-1]", "stop_token_ids"),
    ("curriculum.band_low=nan", "curriculum.band_low"), ("curriculum.band_high=1.5", "band_high"),
    ("curriculum.band_ramp=inf", "curriculum.band_ramp"), ("curriculum.band_ramp=-1", "band_ramp"),
    ("curriculum.regret_scale=0", "regret_scale"), ("curriculum.regret_weight=-1", "regret_weight"),
    ("curriculum.band_weight=nan", "curriculum.band_weight"), ("curriculum.lp_fast_rate=2", "lp_fast_rate"),
    ("curriculum.lp_slow_rate=0", "lp_slow_rate"), ("curriculum.hung_penalty=5", "hung_penalty"),
    ("curriculum.hung_penalty=-inf", "curriculum.hung_penalty"),
    ("curriculum.max_designer_scale=-1", "max_designer_scale"),
    ("curriculum.positive_low=-0.5", "positive_low"),
    ("curriculum.positive_high=2", "positive_high"), ("curriculum.negative_easy=1.5", "negative_easy"),
    ("curriculum.negative_hard=-1", "negative_hard"), ("curriculum.positive_pool=0", "positive_pool"),
    ("curriculum.plr_temperature=0", "plr_temperature"), ("curriculum.plr_staleness=nan", "curriculum.plr_staleness"),
    ("curriculum.plr_replay_prob=1.5", "plr_replay_prob"), ("curriculum.plr_min_fill=-0.1", "plr_min_fill"),
    ("roles.edit_prob=nan", "roles.edit_prob"),
    ("roles.edit_from_memory_prob=2", "roles.edit_from_memory_prob"), ("roles.tune_prob=-1", "roles.tune_prob"),
    ("sandbox.call_timeout_s=inf", "sandbox.call_timeout_s"), ("sandbox.load_timeout_s=0", "sandbox.load_timeout_s"),
    ("sandbox.start_timeout_s=-1", "sandbox.start_timeout_s"), ("sandbox.workers=-1", "sandbox.workers"),
    ("validation.reward_bound=inf", "validation.reward_bound"),
    ("validation.reward_bound=0", "validation.reward_bound"),
    ("validation.win_threshold=nan", "validation.win_threshold"),
    ("validation.win_threshold=2", "validation.win_threshold"),
    ("validation.budget_s=-1", "validation.budget_s"), ("validation.step_timeout_s=inf", "validation.step_timeout_s"),
    ("validation.seeds=[-1]", "validation.seeds"), ("model.attn_chunk=-5", "model.attn_chunk"),
    ("rollout.max_turns=0", "rollout.max_turns"), ("corpus.min_chars=-1", "corpus.min_chars"),
]


@pytest.mark.parametrize("override,key", BAD_OVERRIDES)
def test_out_of_range_and_non_finite_values_are_refused(override, key):
    from spade_jax.config import load_config

    with pytest.raises(ConfigError) as info:
        load_config("default", [override])
    message = str(info.value)
    assert key in message and "\n" not in message, message


def test_non_finite_floats_are_refused_for_any_float_field():
    with pytest.raises(ConfigError, match=r"^inner\.lr must be a finite number, got 'nan'$"):
        from_dict(Outer, parse_overrides(["inner.lr=nan"]))
    with pytest.raises(ConfigError, match=r"inner\.lr must be a finite number"):
        from_dict(Outer, {"inner": {"lr": float("-inf")}})
    assert from_dict(Outer, {"inner": {"lr": "1e-5"}}).inner.lr == 1e-5


def test_sections_built_in_code_are_checked_for_finite_floats():
    from spade_jax.config import Config
    from spade_jax.rl.config import RLConfig

    with pytest.raises(ConfigError, match=r"rl\.lr=nan must be a finite number"):
        Config(rl=RLConfig(lr=float("nan")))


def test_every_shipped_config_loads():
    from spade_jax.config import CONFIG_DIR, load_config

    paths = sorted(CONFIG_DIR.glob("*.yaml"))
    assert paths
    for path in paths:
        load_config(str(path))
        load_config(path.stem)


@pytest.mark.parametrize("files,start,cycle", [
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "base: a.yaml\nseed: 1\n"}, "a.yaml", ["a.yaml", "b.yaml", "a.yaml"]),
    ({"self.yaml": "base: self.yaml\n"}, "self.yaml", ["self.yaml", "self.yaml"]),
    ({"x.yaml": "base: y.yaml\n", "y.yaml": "base: z.yaml\n", "z.yaml": "base: y.yaml\n"}, "x.yaml",
     ["y.yaml", "z.yaml", "y.yaml"]),
])
def test_base_cycle_is_one_line_naming_the_cycle(tmp_path, files, start, cycle):
    from spade_jax.config import load_config

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / start))
    message = str(info.value)
    assert "\n" not in message and "loops" in message
    assert " -> ".join(str(tmp_path / name) for name in cycle) in message


def test_a_base_reached_twice_without_a_loop_is_fine(tmp_path):
    from spade_jax.config import load_config

    (tmp_path / "mid.yaml").write_text("base: default\nseed: 5\n")
    (tmp_path / "top.yaml").write_text("base: mid.yaml\niterations: 2\n")
    config = load_config(str(tmp_path / "top.yaml"))
    assert (config.seed, config.iterations) == (5, 2)


def test_broken_or_unreadable_yaml_names_the_file(tmp_path):
    from spade_jax.config import load_config

    broken = tmp_path / "broken.yaml"
    broken.write_text("iterations: [1\n")
    with pytest.raises(ConfigError, match=rf"config {broken} is not valid YAML: line \d+") as info:
        load_config(str(broken))
    assert "\n" not in str(info.value)
    child = tmp_path / "child.yaml"
    child.write_text("base: broken.yaml\n")
    with pytest.raises(ConfigError, match=rf"{broken} \(the base of {child}\) is not valid YAML"):
        load_config(str(child))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=rf"cannot read config {binary}"):
        load_config(str(binary))
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        load_config(str(folder))
    missing_base = tmp_path / "orphan.yaml"
    missing_base.write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=rf"\(the base of {missing_base}\) not found"):
        load_config(str(missing_base))
    bad_base = tmp_path / "bad_base.yaml"
    bad_base.write_text("base: [default]\n")
    with pytest.raises(ConfigError, match="base must be a config name or path"):
        load_config(str(bad_base))


def test_unreadable_config_names_the_file(tmp_path, monkeypatch):
    from pathlib import Path

    from spade_jax.config import load_config

    locked = tmp_path / "locked.yaml"
    locked.write_text("seed: 1\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(ConfigError, match=rf"^cannot read config {locked}: Permission denied$"):
        load_config(str(locked))


def test_config_errors_exit_2_in_one_line_from_the_cli(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    root = Path(__file__).resolve().parents[1]
    for args in (["--config", str(tmp_path / "a.yaml")], ["rl.lr=nan"]):
        result = subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=root,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


def test_a_library_pool_names_library_programs_and_refuses_unknown_ones():
    from spade_jax.config import load_config
    from spade_jax.selfplay import fixed_pool_envs

    config = load_config("fixed_pool", ["env_pool=library:knapsack, grid_maze"])
    assert [env.env_id for env in fixed_pool_envs(config.env_pool)] == ["lib-knapsack", "lib-grid_maze"]
    with pytest.raises(ConfigError, match=r"^env_pool: no library environment named 'knapsak'; choose one of"):
        load_config("fixed_pool", ["env_pool=library:knapsak"])
    with pytest.raises(ConfigError, match="names no library program"):
        load_config("fixed_pool", ["env_pool='library: ,'"])


@pytest.mark.parametrize("overrides, message", [
    (["domain=robots"], "domain='robots' is not allowed; choose one of games, tool_use"),
    (["domain=tool_use"], "domain=tool_use needs rollout.action=reply"),
    (["domain=tool_use", "rollout.action=reply", "backend=jax"], "domain=tool_use needs backend=auto or sandbox"),
])
def test_tool_use_domain_knob_errors_are_one_line(overrides, message):
    from spade_jax.config import load_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        load_config("default", overrides)
    assert "\n" not in str(info.value)
    assert load_config("tool_use").domain == "tool_use"


def test_a_library_pool_sets_constants_of_its_programs():
    from spade_jax.config import load_config
    from spade_jax.envs.constants import tunable_constants
    from spade_jax.selfplay import fixed_pool_envs

    config = load_config("fixed_pool", ["env_pool=library:knights_knaves(PEOPLE=3, QUESTIONS=2),knights_knaves"])
    easy, default = fixed_pool_envs(config.env_pool)
    assert (easy.env_id, default.env_id) == ("lib-knights_knaves-PEOPLE=3-QUESTIONS=2", "lib-knights_knaves")
    assert tunable_constants(easy.source) == {**tunable_constants(default.source), "PEOPLE": 3, "QUESTIONS": 2}
    for pool, message in [
        ("library:knights_knaves(PEOPEL=3)", "no tunable constant PEOPEL; the program has PEOPLE, QUESTIONS"),
        ("library:knights_knaves(PEOPLE='3')", "PEOPLE='3' does not fit PEOPLE=5"),
        ("library:knights_knaves(MAX_TURNS=30)", "no tunable constant MAX_TURNS"),  # not tunable
        ("library:knights_knaves(PEOPLE=3),knights_knaves(PEOPLE=3)", "same program with the same constants twice"),
        ("library:knights_knaves(3)", "is not name or name(CONSTANT=value, ...)"),
        ("library:knights_knaves(PEOPLE=x)", "PEOPLE=x is not a Python literal"),
        ("library:knights_knaves(", "does not parse"),
    ]:
        with pytest.raises(ConfigError, match=r"^env_pool: .*" + re.escape(message)) as info:
            load_config("fixed_pool", [f"env_pool={pool}"])
        assert "\n" not in str(info.value)
