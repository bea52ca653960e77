#!/usr/bin/env bash
# Sets up everything (idempotent) and runs every test: vitest (TypeScript, incl. integration tests
# with real processes, Ray and torch) and pytest (the Python shim). GPU-only tests skip, visibly,
# without a GPU. Ends with one summary line: "reef: N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || { echo "reef: set-up failed"; exit 1; }

# test/gateway/browser.int.test.ts and ui.int.test.ts drive headless Chromium, and CI starts from a clean machine.
# Without one the test fails saying so; REEF_NO_BROWSER=1 skips it instead.
has_chromium() { command -v chromium || command -v chromium-browser || command -v google-chrome || command -v google-chrome-stable; } >/dev/null 2>&1
if [ "${REEF_NO_BROWSER:-}" != "1" ] && ! has_chromium; then
  echo "[test] installing chromium"
  as_root=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then as_root="sudo -n"; fi
  apt_install() { $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }
  # The package lists are refreshed only when the install needs it: it is slow, and often not.
  apt_install || { $as_root apt-get update -qq >/dev/null 2>&1 && apt_install; } \
    || echo "[test] could not install chromium (apt-get install chromium): the browser tests will fail; REEF_NO_BROWSER=1 skips them"
fi

# The power-loss tests compile a small LD_PRELOAD library (test/helpers/powercut) with the
# system's C compiler; a clean machine may have none.
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  echo "[test] installing a C compiler (gcc)"
  as_root=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then as_root="sudo -n"; fi
  { $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null 2>&1 \
    || { $as_root apt-get update -qq >/dev/null 2>&1 && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null 2>&1; }; } \
    || echo "[test] could not install gcc (apt-get install gcc libc6-dev): the power-loss tests will fail"
fi

# The agent environments' sandbox (python_shim/reef_shim/envs/sandbox.py) isolates with bubblewrap
# where it runs; without it the tests run the weaker isolations only, and say so.
if ! command -v bwrap >/dev/null 2>&1; then
  echo "[test] installing bubblewrap"
  as_root=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then as_root="sudo -n"; fi
  { $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1 \
    || { $as_root apt-get update -qq >/dev/null 2>&1 && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1; }; } \
    || echo "[test] could not install bubblewrap (apt-get install bubblewrap): the sandbox tests run without it"
fi

mkdir -p .cache/test-results
rm -f .cache/test-results/vitest.json .cache/test-results/pytest.xml

echo "[test] vitest"
npx vitest run --reporter=default --reporter=json --outputFile.json=.cache/test-results/vitest.json "$@"
ts_rc=$?

echo "[test] pytest"
PYTHONPATH=python_shim .venv/bin/python -m pytest python_shim/tests -q -rs --junitxml=.cache/test-results/pytest.xml
py_rc=$?

# The exit codes go in too: a failure that names no test (an unhandled error, pytest's exit 5 when
# it collects nothing) must not close with "0 failed".
node scripts/test-summary.mjs .cache/test-results/vitest.json .cache/test-results/pytest.xml "$ts_rc" "$py_rc"
sum_rc=$?
if [ $ts_rc -ne 0 ] || [ $py_rc -ne 0 ] || [ $sum_rc -ne 0 ]; then exit 1; fi
