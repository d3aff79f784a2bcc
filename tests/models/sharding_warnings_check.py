"""Run by test_sharding.py in a child process with 8 CPU devices: compiles the train step and runs the
sampler of `tiny` under each standard mesh of `experiments.ablate_sharding`, so that the parent can read
XLA's stderr (where the SPMD partitioner's warnings go). Prints one line per mesh.

Usage: python tests/models/sharding_warnings_check.py [MODEL] [MESH;MESH...]
"""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402 (after XLA_FLAGS)

from experiments.ablate_sharding import _batch, default_meshes  # noqa: E402 (after XLA_FLAGS)
from spade_jax.mesh import make_mesh, parse_mesh_arg  # noqa: E402 (after XLA_FLAGS)
from spade_jax.models.presets import get_preset, init_decoder  # noqa: E402 (after XLA_FLAGS)
from spade_jax.rl.config import RLConfig  # noqa: E402 (after XLA_FLAGS)
from spade_jax.rl.train import make_train_step  # noqa: E402 (after XLA_FLAGS)
from spade_jax.sampling import Sampler, SamplingConfig  # noqa: E402 (after XLA_FLAGS)


def main(model_name="tiny", meshes=None):
    spec = get_preset(model_name)
    for mesh_arg in meshes or default_meshes(jax.device_count(), spec.is_moe):
        mesh = make_mesh(parse_mesh_arg(mesh_arg))
        model = init_decoder(spec, mesh=mesh)
        step = make_train_step(model, RLConfig(), mesh, verbose=False)
        state = step.init(model)
        step.compile(state, step.place_batch(_batch(spec, 8, 64)))
        config = SamplingConfig(max_new_tokens=2, temperature=1.0, ignore_eos=True)
        Sampler(model, mesh=mesh).generate([[5, 6, 7], [8, 9]] * 4, config, 0)
        print(f"compiled {mesh_arg}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:2], sys.argv[2].split(";") if len(sys.argv) > 2 else None)
