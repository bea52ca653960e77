#!/usr/bin/env bash
# The main job on the embedded CPU default: set up (idempotent), then run the closed-loop
# OpenClaw-RL demo — gateway, store, judge with PRM actors against a rule-following PRM double,
# batches, a 2-rank trainer, live weight releases — while a scripted student drives homework
# sessions. Prints the learning curve and writes results/cpu-demo/ (plots, summary, sessions).
# Options: --w-rl N --w-opd N --sessions N --batch-size N --lr X --out DIR --eval-samples N --model DIR
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec node dist/recipes/openclawrl/demo/main.js "$@"
