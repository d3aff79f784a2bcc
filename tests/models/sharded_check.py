"""Run by test_mesh.py / test_hf_io.py in a child process with 8 CPU devices: sharded == unsharded.

Usage: python tests/models/sharded_check.py [HF_DIR ...]; prints one line per case, exits 1 on a mismatch.
"""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from spade_jax import mesh as mesh_lib
from spade_jax.models.decoder import KVCache
from spade_jax.models.hf import load_hf
from spade_jax.models.presets import init_decoder

TOL = 1e-5


def forward(model, tokens, positions, valid):
    @nnx.jit
    def run(model, tokens, positions, valid):
        logits, _ = model(tokens, positions, valid)
        return logits

    return np.asarray(run(model, tokens, positions, valid))


def decode(model, tokens, positions, valid, steps=3):
    """Prefill then a few greedy steps through the KV cache; returns the chosen tokens."""

    @nnx.jit
    def step(model, tokens, positions, valid, cache):
        logits, cache = model(tokens, positions, valid, cache)
        return jnp.argmax(logits[:, -1], axis=-1), cache

    b, t = tokens.shape
    cache = KVCache.create(model.spec, b, t + steps, jnp.float32)
    nxt, cache = step(model, tokens, positions, valid, cache)
    out = [nxt]
    pos = positions[:, -1]
    for _ in range(steps - 1):
        pos = pos + 1
        nxt, cache = step(model, nxt[:, None], pos[:, None], jnp.ones((b, 1), bool), cache)
        out.append(nxt)
    return np.stack([np.asarray(o) for o in out], axis=1)


def inputs(vocab):
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, vocab, (4, 9)).astype(np.int32)
    valid = np.ones((4, 9), bool)
    valid[1, :3] = False  # left padding
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid)


def check(name, reference, sharded, batch_sharding, with_decode=False):
    tokens, positions, valid = inputs(reference.spec.vocab_size)
    want = forward(reference, tokens, positions, valid)
    put = lambda x: jax.device_put(x, batch_sharding)  # noqa: E731 (local one-liner)
    got = forward(sharded, put(tokens), put(positions), put(valid))
    diff = float(np.abs(got - want).max())
    same_decode = True
    if with_decode:
        want_tokens = decode(reference, tokens, positions, valid)
        same_decode = bool((decode(sharded, put(tokens), put(positions), put(valid)) == want_tokens).all())
    ok = diff <= TOL and same_decode
    print(f"{'OK' if ok else 'FAIL'} {name} max_abs_diff={diff:.2e} decode_equal={same_decode}")
    return ok


def expect_spec(name, param, want):
    got = param[...].sharding.spec
    if got != want:
        print(f"FAIL {name}: param sharding {got}, expected {want}")
    return got == want


def main(hf_dirs):
    assert len(jax.devices()) == 8, jax.devices()
    ok = True
    # Dense: a 2x4 (fsdp, tensor) mesh, parameters moved by shard_model; prefill + cached decode.
    mesh = mesh_lib.make_mesh(mesh_lib.parse_mesh_arg("fsdp=2,tensor=4"))
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 4, "expert": 1}
    reference = init_decoder("tiny", seed=1)
    sharded = mesh_lib.shard_model(init_decoder("tiny", seed=1), mesh)
    ok &= expect_spec("tiny q", sharded.layers[0].attn.q, P("fsdp", "tensor"))
    ok &= check("tiny shard_model fsdp=2,tensor=4", reference, sharded, mesh_lib.batch_sharding(mesh), True)
    # MoE: a 2x4 (data, expert) mesh, parameters created in their shards, layers scanned.
    mesh = mesh_lib.make_mesh(mesh_lib.parse_mesh_arg("data=2,expert=4"))
    reference = init_decoder("tiny-moe", seed=1, scan_layers=True)
    sharded = init_decoder("tiny-moe", seed=1, mesh=mesh, scan_layers=True)
    ok &= expect_spec("tiny-moe experts", sharded.layers.mlp.down, P(None, "expert"))
    ok &= check("tiny-moe init_decoder(mesh, scan) data=2,expert=4", reference, sharded, mesh_lib.batch_sharding(mesh))
    # HF checkpoints streamed straight into shards.
    for hf_dir in hf_dirs:
        mesh = mesh_lib.make_mesh(mesh_lib.parse_mesh_arg("data=-1,fsdp=2,tensor=2,expert=2"))
        reference = load_hf(hf_dir)
        sharded = load_hf(hf_dir, mesh=mesh)
        ok &= expect_spec("load_hf embed", sharded.embed, P("tensor", "fsdp"))
        name = f"load_hf({os.path.basename(hf_dir)}) data=2,fsdp=2,tensor=2,expert=2"
        ok &= check(name, reference, sharded, mesh_lib.batch_sharding(mesh), True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
