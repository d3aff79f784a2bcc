"""Run by test_attention.py in a child process with 8 CPU devices: the splash kernel under meshes (per-shard
via shard_map) equals the einsum path, values and gradients. Prints one line per mesh, exits 1 on a mismatch."""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402 (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402 (after XLA_FLAGS)
import numpy as np  # noqa: E402 (after XLA_FLAGS)

from spade_jax.mesh import make_mesh, parse_mesh_arg  # noqa: E402 (after XLA_FLAGS)
from spade_jax.models.attention import AttnMask, attend  # noqa: E402 (after XLA_FLAGS)


def main() -> int:
    b, t, kvh, g, d = 4, 20, 2, 2, 16
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(b, t, kvh, g, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, kvh, d, t)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, kvh, t, d)), jnp.float32)
    valid = np.ones((b, t), bool)
    valid[1, :5] = False
    causal = np.tril(np.ones((t, t), bool))
    mask = AttnMask(jnp.asarray(causal[None] & valid[:, None]), jnp.asarray(valid), self_attention=True)

    def loss(impl, q):
        return jnp.sum(attend(impl, q, k, v, mask)[valid] ** 2)

    want = np.asarray(jax.jit(attend, static_argnums=0)("einsum", q, k, v, mask))
    want_grad = np.asarray(jax.jit(jax.grad(loss, argnums=1), static_argnums=0)("einsum", q))
    bad = 0
    for mesh_arg in ("data=2,fsdp=2,tensor=2", "fsdp=8"):
        with jax.set_mesh(make_mesh(parse_mesh_arg(mesh_arg))):
            got = np.asarray(jax.jit(attend, static_argnums=0)("splash", q, k, v, mask))
            got_grad = np.asarray(jax.jit(jax.grad(loss, argnums=1), static_argnums=0)("splash", q))
        err, grad_err = np.abs(got - want)[valid].max(), np.abs(got_grad - want_grad).max()
        ok = err <= 2e-5 and grad_err <= 1e-4
        bad += not ok
        print(f"{mesh_arg}: value {err:.2e} grad {grad_err:.2e} {'ok' if ok else 'MISMATCH'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
