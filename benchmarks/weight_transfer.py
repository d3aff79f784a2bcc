"""Seconds per update to send the trainer's weights to a disaggregated sampler (`mesh.placement=
disaggregated`): ours (`placement.WeightTransfer`: same-host twin copies, and the jitted ppermute on
the combined mesh that also serves twins on different hosts) vs a host
round trip (`distributed.fetch`, i.e. jax.device_get / process_allgather, then jax.device_put), the
baseline that also works multi-controller. Same parameters, same run; both results are checked equal.

python benchmarks/weight_transfer.py [--model smollm2-135m-instruct] [--processes 2] [--devices 8]
  [--mesh data=1,fsdp=2,tensor=2] [--repeats 5]

--processes N starts N processes on this machine (jax.distributed over localhost, --devices CPU
devices in all, split evenly) and process 0 prints; 1 runs in this process.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _spawn(args) -> int:
    """Runs this script once per process, each with its share of the CPU devices."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    argv = [a for a in sys.argv[1:]]
    procs = []
    for pid in range(args.processes):
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                   SPADE_NUM_PROCESSES=str(args.processes), SPADE_PROCESS_ID=str(pid),
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices // args.processes}",
                   PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, __file__, *argv, "--child"], env=env,
                                      stdout=None if pid == 0 else subprocess.DEVNULL,
                                      stderr=None if pid == 0 else subprocess.DEVNULL))
    return max(p.wait() for p in procs)


def _time(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of `repeats` calls after one warm-up call (compiles); and the last result."""
    import jax

    out = jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="preset, HF directory or GGUF")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--devices", type=int, default=8, help="CPU devices in all (half sampler, half trainer)")
    ap.add_argument("--mesh", default="data=1,fsdp=2,tensor=2", help="axis sizes of each half's mesh")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.processes > 1 and not args.child:
        return _spawn(args)
    if not args.child:
        os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from spade_jax import distributed

    if os.environ.get("SPADE_NUM_PROCESSES"):
        distributed.initialize()
    import dataclasses

    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding

    from spade_jax.mesh import parse_mesh_arg
    from spade_jax.models.registry import load_model
    from spade_jax.placement import make_placement

    cfg = dataclasses.replace(parse_mesh_arg(args.mesh), placement="disaggregated")
    placement = make_placement(cfg)
    loaded = load_model(args.model, mesh=placement.trainer, seed=0)
    sampler_model = placement.sampler_model(loaded.model)
    source = nnx.to_pure_dict(nnx.state(loaded.model, nnx.Param))
    target = nnx.to_pure_dict(nnx.state(sampler_model, nnx.Param))
    shardings = jax.tree.map(lambda x: NamedSharding(placement.sampler, x.sharding.spec), source)
    nbytes = placement.transfer.param_bytes(source)

    from spade_jax.placement import WeightTransfer

    collective = WeightTransfer(placement.trainer, placement.sampler, method="collective")
    ours_s, ours = _time(lambda: placement.transfer(source, target), args.repeats)
    coll_s, coll = _time(lambda: collective(source, target), args.repeats)
    base_s, base = _time(lambda: jax.device_put(distributed.fetch(source), shardings), args.repeats)
    same = all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in
               zip(*(jax.tree.leaves(distributed.fetch(t)) for t in (ours, coll, base))))
    if distributed.is_leader():
        where = (f"{jax.process_count()} processes x {jax.local_device_count()} CPU devices, sampler "
                 f"{placement.sampler.devices.size} / trainer {placement.trainer.devices.size} devices, "
                 f"each mesh {dict(placement.trainer.shape)}")
        print(f"# {args.model}: {nbytes / 1e6:.1f} MB of parameters; {where}")
        print(f"ours ({placement.transfer.method}: each shard to its twin device): {ours_s * 1e3:.1f} ms per update, "
              f"{nbytes / ours_s / 1e9:.2f} GB/s")
        print(f"ours, collective (jitted ppermute on the combined mesh): {coll_s * 1e3:.1f} ms per update, "
              f"{nbytes / coll_s / 1e9:.2f} GB/s")
        print(f"baseline (host round trip: distributed.fetch + jax.device_put): {base_s * 1e3:.1f} ms per update, "
              f"{nbytes / base_s / 1e9:.2f} GB/s")
        print(f"ratio (baseline / ours): {base_s / ours_s:.2f}x; baseline / collective: {base_s / coll_s:.2f}x; "
              f"results equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
