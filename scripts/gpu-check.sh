#!/usr/bin/env bash
# The one-shot GPU check (scripts/gpu_check.py): at most 8 minutes on one GPU with Python, torch,
# transformers and safetensors only. Results under $REEF_GPU_OUT (default .cache/gpu-check):
# summary.json, check.log, logs/. $REEF_GPU_PYTHON is the interpreter (default python3).
#
#   bash scripts/gpu-check.sh                    # the GPU check
#   bash scripts/gpu-check.sh --cpu --out DIR    # its harness on a CPU machine (CUDA-only steps skipped)
#
# Exits 1 when a step failed or timed out. `npm test` does not run it (its CPU mode runs in pytest).
set -u
cd "$(dirname "$0")/.."
exec "${REEF_GPU_PYTHON:-python3}" scripts/gpu_check.py "$@"
