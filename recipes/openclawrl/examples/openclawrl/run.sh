#!/usr/bin/env bash
# The paper's personal-agent experiment: bring up the stack of serve.yaml (7 GPUs), run the 72
# homework sessions in order with the built-in agent and the simulated student, write the results
# and plots to results/, and take the stack down again (also on Ctrl-C or an error).
#
#   STUDENT=llm      (default) the Qwen3-32B student engine that serve.yaml places
#   STUDENT=scripted the rule-following student, no model
#   SESSIONS=72      how many sessions
# Extra arguments go to the harness CLI (node dist/recipes/openclawrl/harness/cli.js --help).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../../.." && pwd)"
CONFIG="$HERE/serve.yaml"
STUDENT="${STUDENT:-llm}"
SESSIONS="${SESSIONS:-72}"
cd "$ROOT"

npm run build --silent
mkdir -p "$HERE/results"
# Batch lines of an earlier run would mix into this run's reward plot.
if [ -f "$HERE/results/prm_records.jsonl" ]; then mv "$HERE/results/prm_records.jsonl" "$HERE/results/prm_records.$(date +%s).jsonl"; fi

node bin/reef.js up -c "$CONFIG" --detach
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
