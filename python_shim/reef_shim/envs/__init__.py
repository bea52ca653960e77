"""Agent environments: a sandboxed terminal and a tool-call set, an agent loop, and Ray workers.

- `sandbox`: a throwaway directory and limited, isolated runs of shell commands in it.
- `terminal`, `toolcall`: the environments (tasks, tools, checkers), both `base.Environment`.
- `agent`: one episode through the gateway's OpenAI chat API, its outcome filed as a report.
- `workers`: `EnvWorker`, which runs episodes, as a Ray actor for many in parallel.

See docs/agents-envs.md.
"""
