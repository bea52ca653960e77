#!/usr/bin/env bash
# The checks that need a GPU, in one go: the GPU-marked pytest (the trainer on CUDA; the push into
# SGLang, which skips with its reason where SGLang is not installed) and the trainer throughput
# bench (bench/gpu_train.py), once per trainer dtype ($REEF_GPU_BENCH_DTYPES, default "fp32 bf16";
# each run is limited to $REEF_GPU_BENCH_BUDGET_S, default 240 s). Everything is written under
# $REEF_GPU_OUT (default .cache/gpu-check): at most 7 files.
#
#   bash scripts/gpu-check.sh                       # with the project's .venv
#   REEF_GPU_PYTHON=python3 bash scripts/gpu-check.sh   # another interpreter (torch, ray, pyzmq, pytest)
#
# Exits non-zero if the tests fail or the bench measures nothing. `npm test` does not run this: CI
# has no GPU, and there the GPU tests skip visibly.
set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${REEF_GPU_PYTHON:-.venv/bin/python}
OUT=${REEF_GPU_OUT:-.cache/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  nvidia-smi -L
  "$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no CUDA)")'
  "$PY" -c 'import ray, zmq; print("ray", ray.__version__, "pyzmq", zmq.__version__)'
} 2>&1 | tee "$OUT/env.txt"

echo "[gpu-check] pytest -m gpu"
PYTHONPATH="python_shim${PYTHONPATH:+:$PYTHONPATH}" timeout "${REEF_GPU_TEST_TIMEOUT_S:-300}" \
  "$PY" -m pytest python_shim/tests -m gpu -rs -s -v -p no:cacheprovider --junitxml="$OUT/pytest.xml" 2>&1 | tee "$OUT/pytest.log"
tests=$?

bench=0
for dtype in ${REEF_GPU_BENCH_DTYPES:-fp32 bf16}; do
  echo "[gpu-check] bench/gpu_train.py --dtype $dtype"
  timeout "${REEF_GPU_BENCH_TIMEOUT_S:-400}" "$PY" bench/gpu_train.py --dtype "$dtype" \
    --budget-s "${REEF_GPU_BENCH_BUDGET_S:-240}" --json "$OUT/gpu_train_$dtype.json" 2>&1 | tee "$OUT/bench_$dtype.log"
  rc=$?
  [ "$rc" -ne 0 ] && bench=$rc
done

echo "[gpu-check] pytest exit $tests, bench exit $bench; output in $OUT"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
