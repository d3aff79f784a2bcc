"""Where the sampler and the trainer run (`mesh.placement`), and how new weights reach the sampler.

Colocated: one mesh for both. Disaggregated: each host gives the first half of its devices to the
sampler and the second half to the trainer, two meshes of the same axis sizes; after each update the
trainer's weights cross over shard by shard to twin devices (`WeightTransfer`: same-host copies, or a
jitted ppermute on a mesh holding both halves), which works multi-controller, where `jax.device_put`
of a global array between disjoint meshes cannot cross hosts.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spade_jax.mesh import MeshConfig, make_mesh

ROLE = "role"  # leading axis of the combined mesh: index 0 the sampler's devices, 1 the trainer's


@dataclasses.dataclass
class Placement:
    """The trainer's and the sampler's meshes (the same one when colocated)."""

    trainer: Mesh
    sampler: Mesh
    transfer: WeightTransfer | None = None  # disaggregated only

    @property
    def disaggregated(self) -> bool:
        return self.transfer is not None

    def sampler_model(self, model: nnx.Module) -> nnx.Module:
        """The model the sampler reads: `model` itself when colocated, else a copy on the sampler mesh."""
        if not self.disaggregated:
            return model
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        moved = self.transfer(nnx.to_pure_dict(params))
        nnx.replace_by_pure_dict(params, moved)
        rest = jax.tree.map(lambda x: self.transfer.place(x) if isinstance(x, jax.Array) else x, rest)
        return nnx.merge(graphdef, params, rest)

    def publish(self, trainer_model: nnx.Module, sampler_model: nnx.Module) -> None:
        """Copies the trainer model's weights into the sampler's model (no-op when they are one model)."""
        if sampler_model is trainer_model:
            return
        source = nnx.to_pure_dict(nnx.state(trainer_model, nnx.Param))
        target = nnx.state(sampler_model, nnx.Param)
        nnx.replace_by_pure_dict(target, self.transfer(source, nnx.to_pure_dict(target)))
        nnx.update(sampler_model, target)


def make_placement(cfg: MeshConfig, devices=None) -> Placement:
    """The meshes `cfg.placement` asks for over `devices` (default: every device of every process)."""
    if cfg.placement == "colocated":
        mesh = make_mesh(cfg, devices)
        return Placement(mesh, mesh)
    if cfg.distributed and devices is None:
        from spade_jax import distributed

        distributed.initialize()
    devices = list(jax.devices() if devices is None else devices)
    by_process: dict[int, list] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    counts = {len(ds) for ds in by_process.values()}
    if len(counts) != 1 or counts.pop() % 2:
        raise ValueError(
            "mesh.placement=disaggregated needs an even number of devices on every host (each host gives "
            f"half to the sampler), got {', '.join(str(len(d)) for d in by_process.values())}"
        )
    sampler_devices = [d for p in sorted(by_process) for d in by_process[p][: len(by_process[p]) // 2]]
    trainer_devices = [d for p in sorted(by_process) for d in by_process[p][len(by_process[p]) // 2:]]
    sampler = make_mesh(cfg, sampler_devices)
    trainer = make_mesh(cfg, trainer_devices)
    return Placement(trainer, sampler, WeightTransfer(trainer, sampler))


def _move_role(tree):
    """Inside shard_map: every sampler device receives the block its trainer twin holds."""
    return jax.tree.map(lambda x: jax.lax.ppermute(x, ROLE, perm=[(1, 0)]), tree)


METHODS = ("auto", "local", "collective")


class WeightTransfer:
    """`transfer(params) -> params` from the trainer mesh to the sampler mesh (same axis sizes).

    Every trainer device has a twin, the sampler device at the same mesh position, which needs
    exactly the shards it holds. Two ways to move them, both multi-controller safe because every
    process touches only its own shards:

    - `local`: when each twin lives on the same process as its trainer device (the per-host split of
      `make_placement`), every process copies its shards to their twins with one batched
      `jax.device_put` of single-device arrays and assembles the sampler's arrays from them.
    - `collective`: each array is viewed, without a copy, as one global array on the combined mesh
      (role, *axes), its first dimension doubled, the sampler's block first and the trainer's second;
      one jitted `shard_map` with a `ppermute` over `role` sends every trainer shard to its twin, across
      hosts over the interconnect when twins live on different hosts.

    `auto` takes `local` when every twin pair shares a process, else `collective`. Either way the
    parameter bytes cross once, device to device.
    """

    def __init__(self, trainer: Mesh, sampler: Mesh, method: str = "auto"):
        if method not in METHODS:
            raise ValueError(f"weight transfer method {method!r} is not one of {', '.join(METHODS)}")
        if trainer.axis_names != sampler.axis_names or trainer.devices.shape != sampler.devices.shape:
            raise ValueError("the trainer and sampler meshes must have the same axes and sizes")
        self.trainer, self.sampler = trainer, sampler
        auto = (jax.sharding.AxisType.Auto,) * (1 + len(trainer.axis_names))
        self.combined = Mesh(np.stack([sampler.devices, trainer.devices]), (ROLE, *trainer.axis_names),
                             axis_types=auto)
        self._jitted: dict = {}  # one compiled transfer per tree of shardings
        self.twin = dict(zip(trainer.devices.flat, sampler.devices.flat))
        same_process = all(t.process_index == s.process_index for t, s in self.twin.items())
        self.method = ("local" if same_process else "collective") if method == "auto" else method
        if self.method == "local" and not same_process:
            raise ValueError("weight transfer 'local' needs every sampler device on its trainer twin's host")

    def place(self, x: jax.Array) -> jax.Array:
        """A non-parameter array (e.g. a RoPE table), replicated on the sampler mesh, through the host."""
        from spade_jax import distributed

        return jax.device_put(distributed.fetch(x), NamedSharding(self.sampler, PartitionSpec()))

    def _spec(self, x: jax.Array) -> PartitionSpec:
        sharding = x.sharding
        if isinstance(sharding, NamedSharding) and sharding.mesh.devices.shape == self.trainer.devices.shape \
                and set(sharding.mesh.devices.flat) == set(self.trainer.devices.flat):
            return sharding.spec
        if sharding.is_fully_replicated and set(sharding.device_set) == set(self.trainer.devices.flat):
            return PartitionSpec()
        raise ValueError(f"an array to transfer is not on the trainer mesh (sharding {sharding})")

    def _combined_spec(self, spec: PartitionSpec, ndim: int) -> PartitionSpec:
        entries = list(spec) + [None] * (ndim - len(spec))
        first = entries[0]
        first = () if first is None else (first,) if isinstance(first, str) else tuple(first)
        return PartitionSpec((ROLE, *first), *entries[1:])

    def _zeros_on_sampler(self, x: jax.Array, spec: PartitionSpec) -> jax.Array:
        return jax.jit(lambda: jax.numpy.zeros(x.shape, x.dtype),
                       out_shardings=NamedSharding(self.sampler, spec))()

    def _stack(self, src: jax.Array, dst: jax.Array, spec: PartitionSpec) -> jax.Array:
        """src (trainer) and dst (sampler) as blocks 1 and 0 of one array on the combined mesh; no copy."""
        shape = (2 * src.shape[0], *src.shape[1:])
        sharding = NamedSharding(self.combined, self._combined_spec(spec, src.ndim))
        shards = {s.device: s.data for s in src.addressable_shards}
        shards.update({s.device: s.data for s in dst.addressable_shards})
        local = [shards[d] for d in sharding.addressable_devices_indices_map(shape)]
        return jax.make_array_from_single_device_arrays(shape, sharding, local, dtype=src.dtype)

    def _unstack(self, moved: jax.Array, like: jax.Array, spec: PartitionSpec) -> jax.Array:
        sharding = NamedSharding(self.sampler, spec)
        order = {s.device: s for s in moved.addressable_shards}
        shards = [order[d].data for d in sharding.addressable_devices_indices_map(like.shape)]
        return jax.make_array_from_single_device_arrays(like.shape, sharding, shards, dtype=like.dtype)

    def __call__(self, params, previous=None):
        """`params` (a pytree of arrays on the trainer mesh) on the sampler mesh. For `collective`,
        `previous`, the sampler's current copy (same structure), lends its buffers to the combined
        view; without it zeros are made once."""
        if self.method == "local":
            return self._local(params)
        return self._collective(params, previous)

    def _local(self, params):
        leaves, tree = jax.tree.flatten(params)
        datas, devices, plan = [], [], []
        for x in leaves:
            sharding = NamedSharding(self.sampler, self._spec(x))
            held = {self.twin[s.device]: s.data for s in x.addressable_shards}
            targets = list(sharding.addressable_devices_indices_map(x.shape))
            datas += [held[d] for d in targets]
            devices += targets
            plan.append((x, sharding, len(targets)))
        moved = jax.device_put(datas, devices)  # one batched call: every local shard to its twin
        out, start = [], 0
        for x, sharding, count in plan:
            shards = moved[start:start + count]
            out.append(jax.make_array_from_single_device_arrays(x.shape, sharding, shards, dtype=x.dtype))
            start += count
        return jax.tree.unflatten(tree, out)

    def _collective(self, params, previous=None):
        leaves, tree = jax.tree.flatten(params)
        old = jax.tree.leaves(previous) if previous is not None else [None] * len(leaves)
        scalars = [i for i, x in enumerate(leaves) if x.ndim == 0]
        specs = [None if x.ndim == 0 else self._spec(x) for x in leaves]
        stacked, in_specs = [], []
        for x, dst, spec in zip(leaves, old, specs):
            if spec is None:
                continue
            dst = self._zeros_on_sampler(x, spec) if dst is None else dst
            stacked.append(self._stack(x, dst, spec))
            in_specs.append(self._combined_spec(spec, x.ndim))
        key = tuple(in_specs)
        fn = self._jitted.get(key)
        if fn is None:
            fn = jax.jit(jax.shard_map(_move_role, mesh=self.combined, in_specs=(in_specs,), out_specs=in_specs))
            self._jitted[key] = fn
        moved = iter(fn(stacked))
        out = []
        for i, (x, spec) in enumerate(zip(leaves, specs)):
            out.append(self.place(x) if i in scalars else self._unstack(next(moved), x, spec))
        return jax.tree.unflatten(tree, out)

    def param_bytes(self, params) -> int:
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
