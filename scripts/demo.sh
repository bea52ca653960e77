#!/usr/bin/env bash
# The main job on the embedded CPU default: set up (idempotent), then bring the whole stack up on
# the tiny model (Ray with logical GPUs, placement groups, hf engines, actors). Ctrl-C drains it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec node bin/reef.js up -c recipes/openclawrl/examples/cpu/serve.yaml "$@"
