"""Command line for models: `generate` prints one completion; `export` writes an HF directory.

User mistakes (unknown model, missing file, wrong mesh) end in one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spade_jax.models")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="complete one prompt and print only the completion")
    gen.add_argument("--model", required=True, help="preset name, HF model directory or .gguf file")
    gen.add_argument("--prompt", required=True, help="prompt text (a user message with --chat)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--system", default=None, help="system message for --chat (template default if unset)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--mesh", default=None, help="e.g. data=2,tensor=4 (product = device count)")
    exp = commands.add_parser("export", help="write the model as an HF directory (safetensors)")
    exp.add_argument("--model", required=True, help="preset name, HF model directory or .gguf file")
    exp.add_argument("--out", required=True, help="output directory")
    exp.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                     help="stored weight dtype (default: float32)")
    return parser


def _mesh(text):
    if not text:
        return None
    from spade_jax.mesh import make_mesh, parse_mesh_arg

    return make_mesh(parse_mesh_arg(text))


def _generate(args) -> None:
    from spade_jax.models.registry import load_model
    from spade_jax.sampling import Sampler, SamplingConfig

    config = SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        stop_strings=tuple(args.stop),
    )
    mesh = _mesh(args.mesh)
    model, tokenizer, _ = load_model(args.model, mesh=mesh)
    if args.chat:
        messages = [{"role": "user", "content": args.prompt}]
        if args.system is not None:
            messages.insert(0, {"role": "system", "content": args.system})
        prompt = tokenizer.encode_chat(messages)
    else:
        prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise ValueError("the prompt encodes to no tokens; pass a non-empty --prompt")
    result = Sampler(model, tokenizer, mesh=mesh).generate([prompt], config, key=args.seed)
    sys.stdout.write(result.texts[0])
    sys.stdout.write("\n")
    sys.stdout.flush()


def _export(args) -> None:
    from spade_jax.models.hf import export_hf
    from spade_jax.models.registry import load_model

    model, tokenizer, _ = load_model(args.model)
    out = export_hf(model, args.out, tokenizer=tokenizer.hf, dtype=args.dtype)
    print(out)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "generate":
            _generate(args)
        else:
            _export(args)
    except (ValueError, FileNotFoundError, NotADirectoryError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
