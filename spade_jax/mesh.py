"""The device mesh (axes data, fsdp, tensor, expert) built from config, and the one table that maps
the model's logical parameter axes onto it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert")
PLACEMENTS = ("colocated", "disaggregated")  # MeshConfig.placement: see spade_jax/placement.py

# Logical axis -> mesh axes (a name, a tuple of names, or None for replicated). Layers name logical
# axes only; changing the parallelism means changing this table (or passing another), not the model.
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),  # batch rows of inputs, caches and activations
    "activation_batch": ("data", "fsdp"),
    "embed": "fsdp",  # model width: the ZeRO-3 style parameter shard
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "moe_mlp": "tensor",
    "expert": "expert",
    "layers": None,  # the stacked-layer axis under scan_layers
    "head_dim": None,
    "norm": None,
    "length": None,
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = -1  # data-parallel replicas; -1 takes the devices the other axes leave
    fsdp: int = 1  # parameter/optimizer sharding over the embed axis (ZeRO-3 style)
    tensor: int = 1  # Megatron-style sharding of heads, MLP width and vocab
    expert: int = 1  # MoE experts spread over this many devices
    distributed: bool = False  # call jax.distributed.initialize() first (multi-host TPU/GPU pods)
    # Where the sampler runs: "colocated" shares every device with the trainer (one mesh); "disaggregated"
    # gives each host's first half of its devices to the sampler and the second half to the trainer (two
    # meshes of the axis sizes above over half the devices each; new weights cross over after each update).
    placement: str = "colocated"

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ValueError(f"mesh.placement={self.placement!r} is not allowed; choose one of {', '.join(PLACEMENTS)}")
        sizes = self.sizes
        if sum(s == -1 for s in sizes) > 1:
            raise ValueError(f"mesh: at most one axis may be -1 (the rest), got {self.describe()}")
        bad = [f"{a}={s}" for a, s in zip(MESH_AXES, sizes) if s == 0 or s < -1]
        if bad:
            raise ValueError(f"mesh: axis sizes must be positive or -1, got {', '.join(bad)}")

    @property
    def sizes(self) -> tuple[int, ...]:
        return (self.data, self.fsdp, self.tensor, self.expert)

    def describe(self) -> str:
        return ",".join(f"{a}={s}" for a, s in zip(MESH_AXES, self.sizes))

    def resolve(self, num_devices: int) -> tuple[int, ...]:
        """Axis sizes with -1 filled in; ValueError when they cannot cover num_devices exactly."""
        known = math.prod(s for s in self.sizes if s != -1)
        if -1 in self.sizes:
            if num_devices % known:
                raise ValueError(
                    f"mesh {self.describe()}: {num_devices} devices are not divisible by the fixed axes' "
                    f"product {known}; change the mesh sizes"
                )
            return tuple(num_devices // known if s == -1 else s for s in self.sizes)
        if known != num_devices:
            raise ValueError(
                f"mesh {self.describe()} needs {known} devices but {num_devices} are present; set one "
                "axis to -1 or change the sizes"
            )
        return self.sizes


def parse_mesh_arg(text: str) -> MeshConfig:
    """'data=2,tensor=4' -> MeshConfig (axes not named keep their defaults; data stays -1)."""
    values: dict[str, int | bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in (*MESH_AXES, "distributed"):
            raise ValueError(
                f"mesh argument {item!r} is not axis=size; use e.g. 'data=2,tensor=4' with axes "
                f"{', '.join(MESH_AXES)}"
            )
        if key == "distributed":
            values[key] = raw.strip().lower() in ("1", "true", "yes")
            continue
        try:
            values[key] = int(raw)
        except ValueError:
            raise ValueError(f"mesh axis {key} needs an integer size, got {raw!r}") from None
    return MeshConfig(**values)


def make_mesh(cfg: MeshConfig | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over `devices` (default: all devices, after jax.distributed.initialize() if configured)."""
    cfg = cfg or MeshConfig()
    if cfg.distributed and devices is None:
        from spade_jax import distributed

        distributed.initialize()
    devices = list(jax.devices() if devices is None else devices)
    sizes = cfg.resolve(len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    # Auto axes: explicit ones make sharded contractions in nnx layers fail (see FACTS.md).
    return jax.make_mesh(sizes, MESH_AXES, axis_types=auto, devices=devices)


def _as_tuple(mesh_axes) -> tuple[str, ...]:
    if mesh_axes is None:
        return ()
    return (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)


def logical_to_spec(
    axes: Sequence[str | None],
    rules: Mapping[str, str | tuple[str, ...] | None] | None = None,
    *,
    mesh: Mesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """PartitionSpec for an array whose dims carry logical `axes`.

    With a mesh (and shape), mesh axes of size 1, axes already used by an earlier dim and axes whose
    size does not divide the dim are dropped, so tiny models shard on any mesh.
    """
    rules = LOGICAL_RULES if rules is None else rules
    used: set[str] = set()
    entries = []
    for i, name in enumerate(axes):
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; add it to the rules table")
        chosen = []
        remaining = None if shape is None else shape[i]
        for mesh_axis in _as_tuple(None if name is None else rules[name]):
            if mesh_axis in used:
                continue
            size = None if mesh is None else mesh.shape.get(mesh_axis)
            if mesh is not None:
                if size is None:
                    raise ValueError(f"rule for {name!r} names mesh axis {mesh_axis!r} that the mesh lacks")
                if size == 1 or (remaining is not None and remaining % size):
                    continue
                if remaining is not None:
                    remaining //= size
            chosen.append(mesh_axis)
            used.add(mesh_axis)
        entries.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def logical_sharding(axes, mesh: Mesh, rules=None, shape=None) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, rules, mesh=mesh, shape=shape))


def _variable_sharding(var: nnx.Variable, mesh: Mesh, rules) -> NamedSharding:
    axes = var.get_metadata().get("logical_axes")
    shape = var.shape
    if axes is None or len(axes) != len(shape):
        return NamedSharding(mesh, PartitionSpec())
    return logical_sharding(axes, mesh, rules, shape)


def param_shardings(model_or_state, mesh: Mesh, rules=None):
    """NamedShardings in the structure of `nnx.state(model)` (usable as jit in/out shardings)."""
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state)
    return jax.tree.map(
        lambda var: var.replace(_variable_sharding(var, mesh, rules)),
        state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )


def shard_model(model: nnx.Module, mesh: Mesh, rules=None) -> nnx.Module:
    """Moves every variable of `model` into its sharding on `mesh` (in place); returns the model."""
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Variable) and hasattr(var.get_value(), "shape"):
            var.set_value(jax.device_put(var.get_value(), _variable_sharding(var, mesh, rules)))
    return model


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=None, shape=None) -> NamedSharding:
    """Sharding for [batch, ...] inputs: rows over the batch axes, other dims replicated."""
    return logical_sharding(("batch",) + (None,) * (ndim - 1), mesh, rules, shape)
