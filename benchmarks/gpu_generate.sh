#!/usr/bin/env bash
# The GPU half of benchmarks/generate.py: decode tokens/s and the fraction of the HBM roofline on
# one GPU, against transformers `generate` on the same GPU in the same dtype. Random weights with
# the presets' architectures (the 98 MB GGUF need not be there; see generate.py's docstring).
# Needs CUDA JAX, PyTorch and transformers; run from the repository root:
#     OUT=results bash benchmarks/gpu_generate.sh
set -uo pipefail
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and PyTorch share the GPU
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
$PY -c "import jax, flax, torch, transformers; print('jax', jax.__version__, 'flax', flax.__version__,
'torch', torch.__version__, 'transformers', transformers.__version__, jax.devices())"
run() {
    local name=$1
    shift
    timeout 220 $PY benchmarks/generate.py --random-weights --repeats 3 "$@" 2>&1 \
        | grep -v "Loading weights" | tee "$OUT/$name.txt"
}
run smollm2_bf16 --model smollm2-135m-instruct --batches 1,16 --dtype bfloat16 --baseline-dtype bfloat16
run qwen3_1.7b_bf16 --model qwen3-1.7b --batches 1,16,64 --dtype bfloat16 --baseline-dtype bfloat16
run smollm2_f32 --model smollm2-135m-instruct --batches 1,16
