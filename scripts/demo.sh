#!/usr/bin/env bash
# The main job on the embedded CPU default: set up (idempotent), then run the quick arm of the
# real-model experiment (`--full`: the experiment's own arm) — SmolLM2-135M-Instruct behind the gateway, the store, the judge with PRM actors against
# a rule-following PRM double, batches, the trainer, live weight releases — while a scripted
# student brings homework sessions; held-out first replies are measured before and after.
# Writes results/smollm2/<arm>-seed<n>-quick/ (<arm>-seed<n>/ with --full: summary.json, plots, replies).
# `--ablation` first runs the whole table instead (control, RL, OPD and both over 3 seeds).
# Options (README.md, docs/experiment.md): unknown ones are refused with the list of known ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--ablation" ]; then
  shift
  exec node dist/recipes/openclawrl/demo/ablation-main.js "$@"
fi
exec node dist/recipes/openclawrl/demo/main.js "$@"
