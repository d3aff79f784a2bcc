"""Compiles the train step and the sampler under several meshes; reports memory and time per mesh.

python -m experiments.ablate_sharding [--model tiny] [--meshes "data=8;fsdp=8;data=2,tensor=4"]
    [--layers N] [--compile-only]
On CPU, run with XLA_FLAGS=--xla_force_host_platform_device_count=8 to get 8 devices.
`--compile-only` builds nothing but shapes (a preset's random-weight architecture, any size, e.g.
`--model qwen3-0.6b --layers 2`) and reports the compiled step's per-device memory without running it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def default_meshes(n: int, moe: bool) -> list[str]:
    """A spread of data / fsdp / tensor (/ expert) splits that fit n devices."""
    if n == 1:
        return ["data=1"]
    half = n // 2
    meshes = [f"data={n}", f"fsdp={n}", f"data=2,fsdp={half}", f"data={half},tensor=2", f"fsdp={half},tensor=2"]
    if moe:
        meshes += [f"data={half},expert=2", f"fsdp={half},expert=2"]
    return [m for m in meshes if "=0" not in m]


def _batch(spec, rows: int, length: int, seed: int = 0):
    import numpy as np

    from spade_jax.rl.collate import Sample, collate

    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(rows):
        tokens = rng.integers(3, spec.vocab_size, length).tolist()
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        samples.append(Sample(tokens, mask, (-rng.random(length)).tolist(), float(rng.normal())))
    return collate(samples, length_multiple=length)


def _mib(n: float) -> float:
    return round(n / 2**20, 1)


def state_bytes_per_device(state) -> int:
    """Bytes of the train state (params + optimizer moments) that one device holds, from its shardings."""
    import jax
    import numpy as np

    total = 0
    for leaf in jax.tree.leaves(state):
        shape = leaf.sharding.shard_shape(leaf.shape) if getattr(leaf, "sharding", None) is not None else leaf.shape
        total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
    return total


def _compiled_memory(compiled) -> dict:
    memory = compiled.memory_analysis()
    if memory is None:
        return {"train_peak_mib_per_device": None, "train_temp_mib_per_device": None}
    peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes)
    return {"train_peak_mib_per_device": _mib(peak), "train_temp_mib_per_device": _mib(memory.temp_size_in_bytes)}


def measure_compiled(model_name: str, mesh_arg: str, *, rows: int, length: int, layers: int | None) -> dict:
    """The train step of a preset's architecture compiled (never run) on the mesh, from shapes alone: per-device
    state and compiled memory of models far larger than the host could hold replicated 8 times."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from spade_jax.mesh import make_mesh, parse_mesh_arg
    from spade_jax.models.decoder import Decoder
    from spade_jax.models.presets import get_preset
    from spade_jax.models.sharding import activation_mesh
    from spade_jax.rl.config import RLConfig
    from spade_jax.rl.train import TrainState, make_train_step

    spec = get_preset(model_name)
    spec = spec if layers is None else spec.replace(num_layers=layers)
    mesh = make_mesh(parse_mesh_arg(mesh_arg))
    model = nnx.eval_shape(lambda: Decoder(spec, rngs=nnx.Rngs(0)))
    step = make_train_step(model, RLConfig(), mesh, verbose=False)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32),
                          nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
    state = jax.eval_shape(lambda p: TrainState(params=p, opt_state=step.optimizer.init(p),
                                                step=jnp.zeros((), jnp.int32), rng=rng), params)
    state = state.replace(rng=rng)
    state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, step.state_shardings)
    placed = step.place_batch(_batch(spec, rows, length))
    t0 = time.perf_counter()
    with activation_mesh(mesh):
        compiled = step.jitted.lower(state, placed).compile()
    return {"mesh": mesh_arg, "devices": mesh.size, "train_compile_s": round(time.perf_counter() - t0, 2),
            "state_mib_per_device": _mib(state_bytes_per_device(state)), **_compiled_memory(compiled)}


def measure(model_name: str, mesh_arg: str, *, rows: int, length: int, new_tokens: int, steps: int) -> dict:
    import jax
    import numpy as np

    from spade_jax.mesh import make_mesh, parse_mesh_arg
    from spade_jax.models.registry import load_model
    from spade_jax.rl.config import RLConfig
    from spade_jax.rl.train import make_train_step
    from spade_jax.sampling import Sampler, SamplingConfig

    mesh = make_mesh(parse_mesh_arg(mesh_arg))
    loaded = load_model(model_name, mesh=mesh)
    step = make_train_step(loaded.model, RLConfig(), mesh, verbose=False)
    state = step.init(loaded.model)
    batch = _batch(loaded.spec, rows, length)
    placed = step.place_batch(batch)
    t0 = time.perf_counter()
    compiled = step.compile(state, placed)
    compile_s = time.perf_counter() - t0
    state_mib = _mib(state_bytes_per_device(state))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    sampler = Sampler(loaded.model, loaded.tokenizer, mesh=mesh)
    prompts = [list(map(int, row[: length // 2])) for row in np.asarray(batch.tokens_bt)[:rows]]
    config = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    t0 = time.perf_counter()
    sampler.generate(prompts, config, 0)
    sample_first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampler.generate(prompts, config, 1)
    sample_s = time.perf_counter() - t0
    return {
        "mesh": mesh_arg,
        "devices": mesh.size,
        "train_compile_s": round(compile_s, 2),
        "train_step_s": round(float(np.median(times)), 4),
        "state_mib_per_device": state_mib,
        **_compiled_memory(compiled),
        "sample_first_call_s": round(sample_first_s, 2),
        "sample_tokens_per_s": round(rows * new_tokens / sample_s, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.ablate_sharding", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="preset, HF directory or .gguf file")
    parser.add_argument("--meshes", default=None, help="';'-separated mesh specs, e.g. 'data=8;fsdp=4,tensor=2'")
    parser.add_argument("--rows", type=int, default=8, help="sequences per train batch and sampler batch")
    parser.add_argument("--length", type=int, default=128, help="tokens per training sequence")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens sampled per row")
    parser.add_argument("--steps", type=int, default=3, help="timed train steps per mesh")
    parser.add_argument("--layers", type=int, default=None, help="with --compile-only: this many decoder layers")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the train step from shapes (a preset's random architecture) and run nothing")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.layers is not None and not args.compile_only:
        parser.error("--layers needs --compile-only")

    import jax

    from spade_jax.models.presets import PRESETS

    spec = PRESETS.get(args.model)
    meshes = args.meshes.split(";") if args.meshes else default_meshes(jax.device_count(), bool(spec and spec.is_moe))
    results = []
    if args.compile_only and spec is None:
        parser.error(f"--compile-only needs a preset name, got {args.model!r}")
    layers = f", {args.layers} layers" if args.layers is not None else ""
    print(f"{jax.device_count()} {jax.devices()[0].platform} devices, model {args.model}{layers}", flush=True)
    columns = [("mesh", "mesh"), ("compile s", "train_compile_s")]
    if not args.compile_only:
        columns.append(("step s", "train_step_s"))
    columns += [("params+opt MiB/dev", "state_mib_per_device"), ("temp MiB/dev", "train_temp_mib_per_device"),
                ("peak MiB/dev", "train_peak_mib_per_device")]
    if not args.compile_only:
        columns.append(("sample tok/s", "sample_tokens_per_s"))
    print("| " + " | ".join(c[0] for c in columns) + " |\n|" + "---|" * len(columns), flush=True)
    for mesh_arg in meshes:
        try:
            if args.compile_only:
                r = measure_compiled(args.model, mesh_arg, rows=args.rows, length=args.length, layers=args.layers)
            else:
                r = measure(args.model, mesh_arg, rows=args.rows, length=args.length, new_tokens=args.new_tokens,
                            steps=args.steps)
        except ValueError as err:
            print(f"| {mesh_arg} | skipped: {str(err).splitlines()[0]} |", flush=True)
            continue
        results.append(r)
        print("| " + " | ".join(str(r[key]) for _, key in columns) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
