#!/usr/bin/env bash
# One GPU's figures in a few minutes (benchmarks/gpu_suite.py): attention implementations against the
# einsum path on the device, Qwen3-1.7B-shaped decode at batch 16 as a share of the HBM roofline, the
# bf16 train-step MFU, and the wall time of one self-play iteration at that scale (random weights).
# Needs CUDA JAX; run from the repository root:
#     OUT=results bash benchmarks/gpu_suite.sh            # on the GPU machine
#     DRY_RUN=1 bash benchmarks/gpu_suite.sh              # tiny shapes, any device (CPU included)
set -uo pipefail
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
EXTRA=()
if [ -n "${DRY_RUN:-}" ]; then
    EXTRA+=(--dry-run)
else
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
fi
$PY -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
timeout "${TIMEOUT:-900}" $PY benchmarks/gpu_suite.py --out "$OUT" "${EXTRA[@]}" "$@" 2>&1 | tee "$OUT/gpu_suite.txt"
exit "${PIPESTATUS[0]}"
