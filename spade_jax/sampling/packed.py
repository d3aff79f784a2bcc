"""The packed-weights decode path on a CPU: when `kernels.packed_matmul` applies, and the
process-wide cache of packed decode weights (`PACKED_WEIGHTS`) every Sampler and device loop shares."""

from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
from flax import nnx

from spade_jax import kernels
from spade_jax.models.decoder import pack_decode_weights
from spade_jax.sampling.config import SamplingConfig
from spade_jax.sampling.versions import ParamsVersion


def _packed_params(graphdef, params):
    """The decode-step weights in `kernels.pack` order (other leaves returned as they are) and the
    packed output projection: see `pack_decode_weights`."""
    model = nnx.merge(graphdef, params)
    head = pack_decode_weights(model)
    return nnx.split(model)[1], head


_PACK = jax.jit(_packed_params, static_argnums=0)


def cpu_kernel_applies(config: SamplingConfig, model) -> bool:
    """Whether decoding `model` under `config` uses `kernels.packed_matmul` (`SamplingConfig.cpu_kernel`):
    "auto", a CPU backend, float32 compute, per-layer (not scanned) weights all on one device, and an
    AVX2 or AVX-512 build of the kernel (`kernels.preferred`)."""
    if config.cpu_kernel != "auto" or jax.default_backend() != "cpu":
        return False
    if model.scan_layers or jnp.dtype(model.dtype) != jnp.float32:
        return False
    if len(model.embed[...].sharding.device_set) != 1:
        return False
    return kernels.preferred()


class PackedWeights:
    """Process-wide: the packed decode weights (`_packed_params`) of the most recently used parameter
    versions, shared by every Sampler and DeviceRollout (one model's policy, hint writer and
    device loops hold one packed copy, not one each). A version is packed on first use and dropped
    when its parameter arrays are freed (a training update makes new ones), when `forget` asks, or
    when more than `keep` versions are held (least recently used first)."""

    keep = 2

    def __init__(self):
        self._held: list[tuple[ParamsVersion, object, jax.Array | None]] = []

    def get(self, graphdef, params):
        """(packed params, packed output projection or None) for these exact parameters."""
        self._held = [entry for entry in self._held if all(ref() is not None for ref in entry[0].refs)]
        for i, (version, state, head) in enumerate(self._held):
            if version.matches(graphdef, params):
                self._held.append(self._held.pop(i))
                return state, head
        while len(self._held) >= self.keep:
            self._held.pop(0)  # free it before packing the new version
        state, head = _PACK(graphdef, params)
        version = ParamsVersion.of(graphdef, params)
        leaves = jax.tree.leaves(params)
        if leaves:  # drop the packed copy as soon as these parameters are freed
            version.refs[0] = weakref.ref(leaves[0], lambda _, v=version: self._drop_version(v))
        self._held.append((version, state, head))
        return state, head

    def _drop_version(self, version) -> None:
        self._held = [entry for entry in self._held if entry[0] is not version]

    def forget(self, graphdef, params) -> None:
        self._held = [entry for entry in self._held if not entry[0].matches(graphdef, params)]

    def holds(self, graphdef, params) -> bool:
        return any(entry[0].matches(graphdef, params) for entry in self._held)


PACKED_WEIGHTS = PackedWeights()
