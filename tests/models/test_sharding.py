"""Activation sharding constraints (spade_jax.models.sharding): no-ops without a mesh; under the standard
meshes of `experiments.ablate_sharding` XLA's SPMD partitioner never falls back to a full rematerialization."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from spade_jax.models.sharding import activation_mesh, constrain

CHECK = Path(__file__).with_name("sharding_warnings_check.py")


def test_constrain_is_the_identity_without_a_mesh():
    x = jnp.arange(12.0).reshape(3, 4)
    assert constrain(x, ("activation_batch", "activation_embed")) is x
    with activation_mesh(None):
        jaxpr = jax.make_jaxpr(lambda a: constrain(a, ("activation_batch", "activation_embed")))(x)
    assert "sharding_constraint" not in str(jaxpr)


@pytest.mark.slow
def test_standard_meshes_compile_without_involuntary_rematerialization():
    """The child compiles the train step and runs the sampler under each standard mesh on 8 CPU devices;
    the partitioner's warnings go to its stderr."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"}
    done = subprocess.run([sys.executable, str(CHECK), "tiny"], capture_output=True, text=True, env=env,
                          timeout=900, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled ") >= 5, done.stdout
    assert "involuntary full rematerialization" not in done.stderr.lower(), done.stderr[-3000:]
