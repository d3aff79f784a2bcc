"""spade_jax.mesh: mesh config, logical-axis rules, and sharded == unsharded on 8 CPU devices."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from jax.sharding import PartitionSpec as P

from spade_jax import mesh as mesh_lib
from spade_jax.mesh import MeshConfig, logical_to_spec, make_mesh, parse_mesh_arg

ROOT = Path(__file__).resolve().parent.parent


def test_parse_mesh_arg_and_resolve():
    cfg = parse_mesh_arg("data=2, tensor=4")
    assert cfg == MeshConfig(data=2, fsdp=1, tensor=4, expert=1)
    assert parse_mesh_arg("fsdp=2,tensor=2").resolve(8) == (2, 2, 2, 1)  # data=-1 takes the rest
    assert parse_mesh_arg("data=1,expert=-1").resolve(8) == (1, 1, 1, 8)
    assert parse_mesh_arg("distributed=true").distributed


@pytest.mark.parametrize(
    "text,devices,message",
    [
        ("data=-1,fsdp=-1", 8, "at most one"),
        ("data=0", 8, "positive"),
        ("data=3,fsdp=1", 8, "needs 3 devices but 8"),
        ("fsdp=3", 8, "not divisible"),
        ("pipeline=2", 8, "axis=size"),
        ("tensor=two", 8, "integer"),
    ],
)
def test_mesh_errors_name_the_fix(text, devices, message):
    with pytest.raises(ValueError, match=message):
        parse_mesh_arg(text).resolve(devices)


def test_make_mesh_on_this_process_devices():
    mesh = make_mesh(MeshConfig())
    assert mesh.axis_names == mesh_lib.MESH_AXES
    assert mesh.size == len(jax.devices())
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    with pytest.raises(ValueError, match="devices"):
        make_mesh(MeshConfig(data=len(jax.devices()) + 1))


def test_logical_to_spec_rules():
    assert logical_to_spec(("embed", "heads", "head_dim")) == P("fsdp", "tensor")
    assert logical_to_spec(("batch", None)) == P(("data", "fsdp"))
    assert logical_to_spec(("layers", "expert", "embed", "moe_mlp")) == P(None, "expert", "fsdp", "tensor")
    custom = {**mesh_lib.LOGICAL_RULES, "embed": None, "vocab": ("tensor", "fsdp")}
    assert logical_to_spec(("vocab", "embed"), custom) == P(("tensor", "fsdp"))
    with pytest.raises(ValueError, match="no sharding rule"):
        logical_to_spec(("mystery",))


class _FakeMesh:
    """Just the `shape` mapping logical_to_spec reads, so size rules are testable on one device."""

    shape = {"data": 2, "fsdp": 2, "tensor": 4, "expert": 1}


def test_logical_to_spec_drops_axes_that_cannot_shard():
    mesh = _FakeMesh()
    # kv_heads=2 cannot split 4 ways; expert axis has size 1; a mesh axis is used at most once.
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), mesh=mesh, shape=(64, 2, 16)) == P("fsdp")
    assert logical_to_spec(("expert", "embed", "moe_mlp"), mesh=mesh, shape=(8, 64, 32)) == P(None, "fsdp", "tensor")
    assert logical_to_spec(("batch", "embed"), mesh=mesh, shape=(4, 64)) == P(("data", "fsdp"))
    assert logical_to_spec(("batch", "embed"), mesh=mesh, shape=(2, 64)) == P("data", "fsdp")
    assert logical_to_spec(("mlp", "heads"), mesh=mesh, shape=(128, 8)) == P("tensor")


def test_param_shardings_follow_the_model_state():
    from flax import nnx

    from spade_jax.models.decoder import Decoder
    from spade_jax.models.presets import get_preset

    abstract = nnx.eval_shape(lambda: Decoder(get_preset("tiny-moe"), rngs=nnx.Rngs(0)))
    mesh = make_mesh(MeshConfig())
    shardings = mesh_lib.param_shardings(abstract, mesh)
    state = nnx.state(abstract)
    assert jax.tree.structure(shardings) == jax.tree.structure(state)
    assert all(isinstance(s, jax.sharding.NamedSharding) for s in jax.tree.leaves(shardings))


@pytest.mark.slow
def test_sharded_2x4_equals_unsharded_on_8_cpu_devices(tmp_path):
    """Runs tests/models/sharded_check.py in a child with 8 CPU devices (this process has 1)."""
    checkpoints = []
    try:
        sys.path.insert(0, str(ROOT / "tests" / "models"))
        from hf_tiny import hf_model, save_hf

        checkpoints.append(str(save_hf(hf_model("qwen3_moe", seed=21), tmp_path / "qwen3_moe")))
    except ImportError:  # no torch: the random-init cases still run
        pass
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "models" / "sharded_check.py"), *checkpoints],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.count("OK ") == 2 + len(checkpoints)
