#!/usr/bin/env bash
# The paper's personal-agent experiment: bring up the stack of serve.yaml (7 GPUs), run the 72
# homework sessions in order with the built-in agent and the simulated student, write the results
# and plots to results/, and take the stack down again (also on Ctrl-C or an error).
#
#   STUDENT=llm      (default) the Qwen3-32B student engine that serve.yaml places
#   STUDENT=scripted the rule-following student, no model (the stack starts no student engine)
#   SESSIONS=72      how many sessions
# Extra arguments go to the harness CLI (node dist/recipes/openclawrl/harness/cli.js --help).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../../.." && pwd)"
CONFIG="$HERE/serve.yaml"
STUDENT="${STUDENT:-llm}"
SESSIONS="${SESSIONS:-72}"
# Checked before anything starts: a misspelt value silently ran the scripted student.
case "$STUDENT" in
  llm) UP_ARGS=() ;;
  # The scripted student needs no engine: without the override serve.yaml still placed Qwen3-32B.
  scripted) UP_ARGS=(--cluster.student=null) ;;
  *) echo "run.sh: STUDENT must be llm or scripted, got '$STUDENT'" >&2; exit 2 ;;
esac
cd "$ROOT"

# npm packages, the Python venv and the build, each skipped when done: on a fresh clone a bare
# `npm run build` failed for want of node_modules, and `reef up` for want of .venv. --gpu: every
# engine here is SGLang, which only the GPU lock's venv has (the CPU venv fails "No module named sglang").
bash scripts/setup.sh --gpu
mkdir -p "$HERE/results"
# Batch lines of an earlier run would mix into this run's reward plot.
if [ -f "$HERE/results/prm_records.jsonl" ]; then mv "$HERE/results/prm_records.jsonl" "$HERE/results/prm_records.$(date +%s).jsonl"; fi

# The data dir of an earlier run would bring back its trainer state and releases: the sessions
# would start from trained weights, not the base model. Kept, not deleted (checkpoints).
if node bin/reef.js status -c "$CONFIG" >/dev/null 2>&1; then
  echo "run.sh: a stack of $CONFIG is still running; stop it first: node bin/reef.js down -c $CONFIG" >&2
  exit 1
fi
if [ -d "$HERE/.reef" ]; then
  OLD="$HERE/results/reef-data.$(date +%s)"
  echo "run.sh: moving the data dir of an earlier run to $OLD"
  mv "$HERE/.reef" "$OLD"
fi

node bin/reef.js up -c "$CONFIG" --detach ${UP_ARGS[@]+"${UP_ARGS[@]}"}
trap 'node bin/reef.js down -c "$CONFIG"' EXIT

# The gateway and the student engine, as the running stack reports them.
read -r GATEWAY STUDENT_URL < <(node bin/reef.js status --json -c "$CONFIG" | node -e '
  let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => {
    const st = JSON.parse(s);
    const student = (st.engines || []).find((e) => e.role === "student");
    process.stdout.write(`${st.supervisor.gateway} ${student ? student.url : "-"}\n`);
  });')

[ -n "${GATEWAY:-}" ] || { echo "run.sh: reef status did not report the gateway" >&2; exit 1; }

if [ "$STUDENT" = llm ]; then
  if [ "$STUDENT_URL" = - ]; then echo "run.sh: the stack has no student engine (cluster.student); use STUDENT=scripted" >&2; exit 1; fi
  STUDENT_ARGS=(--student llm --student-url "$STUDENT_URL")
else
  STUDENT_ARGS=(--student scripted)
fi

node dist/recipes/openclawrl/harness/cli.js -c "$CONFIG" --gateway "$GATEWAY" --sessions "$SESSIONS" "${STUDENT_ARGS[@]}" --out "$HERE" "$@"
