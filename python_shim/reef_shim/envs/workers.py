"""Environment workers: a plain class that runs episodes, usable as a Ray actor to run many at once.

`EnvWorker` runs one episode at a time (its environment holds one sandbox); N actors run N
episodes in parallel, on one machine or across a cluster's nodes, since each actor makes its
sandboxes on the node it was placed on. The gateway's address must then be one every node
reaches. Ray is not imported here: the caller passes its `ray` module (`env_worker_actor`), as
`ray_driver` keeps `import ray` off the shim's start-up path.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from .agent import run_episode
from .base import Environment
from .sandbox import Limits, bwrap_works, default_isolation
from .terminal import TerminalEnv
from .toolcall import ToolCallEnv

ENV_KINDS = ("terminal", "toolcall")


def make_env(kind: str, options: dict[str, Any] | None = None) -> Environment:
    """An environment by name. `options` for terminal: `isolation` and `limits` (Limits' fields)."""
    opts = dict(options or {})
    if kind == "terminal":
        limits = Limits(**opts.pop("limits", {}))
        env: Environment = TerminalEnv(limits=limits, isolation=opts.pop("isolation", "auto"))
    elif kind == "toolcall":
        env = ToolCallEnv()
    else:
        raise ValueError(f"env must be one of {', '.join(ENV_KINDS)}, got {kind!r}")
    if opts:
        raise ValueError(f"env options for {kind}: unknown key(s) {', '.join(sorted(opts))}")
    return env


@dataclass(frozen=True)
class EpisodeSpec:
    """One rollout: which task, and the session and group tags its requests carry."""

    env: str
    task: str
    session: str
    group: str | None
    max_steps: int = 8
    # False for a measuring run: the outcome is checked but not filed, so it trains nothing.
    report: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"env": self.env, "task": self.task, "session": self.session, "group": self.group, "max_steps": self.max_steps,
                "report": self.report}


def rollout_specs(tasks: list[tuple[str, str]], n: int, run_id: str, max_steps: int = 8,
                  measure: bool = False) -> list[EpisodeSpec]:
    """`n` rollouts of each (env, task): one group per task, one session per rollout.

    `run_id` keeps tags of one run apart from another's (a session tag must not be reused).
    `measure`: no group tag and no outcome report, so the episodes are measured, never trained as
    agent steps (an evaluation before and after training)."""
    if n < 1:
        raise ValueError(f"rollouts per task must be at least 1, got {n}")
    specs = []
    for env, task in tasks:
        group = f"{run_id}-{env}-{task}"
        specs += [EpisodeSpec(env, task, f"{group}-r{i}", None if measure else group, max_steps, report=not measure)
                  for i in range(n)]
    return specs


class EnvWorker:
    """Runs episodes against one gateway. As a Ray actor, `run` calls queue; one runs at a time."""

    def __init__(self, name: str, base_url: str, model: str, headers: dict[str, str] | None = None,
                 env_options: dict[str, dict[str, Any]] | None = None, sampling: dict[str, Any] | None = None,
                 timeout_s: float = 120.0) -> None:
        self.name = name
        self.base_url = base_url
        self.model = model
        self.headers = dict(headers or {})
        self.env_options = dict(env_options or {})
        unknown = set(self.env_options) - set(ENV_KINDS)
        if unknown:
            raise ValueError(f"env_options: unknown env(s) {', '.join(sorted(unknown))}")
        self.sampling = sampling
        self.timeout_s = timeout_s
        self.episodes = 0

    def describe(self) -> dict[str, Any]:
        """Where this worker runs and which sandbox isolation its host gives."""
        return {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                "isolation": default_isolation(), "bwrap": bwrap_works(), "episodes": self.episodes}

    def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        s = EpisodeSpec(**spec)
        env = make_env(s.env, self.env_options.get(s.env))
        try:
            result = run_episode(self.base_url, self.model, env, s.task, session=s.session, group=s.group,
                                 headers=self.headers, max_steps=s.max_steps, timeout_s=self.timeout_s,
                                 sampling=self.sampling, report=s.report)
        finally:
            env.close()
        self.episodes += 1
        out = result.to_json()
        out["worker"] = self.name
        return out


def env_worker_actor(ray: Any, num_cpus: float = 0.25) -> Any:
    """`EnvWorker` as a Ray actor class. A fraction of a CPU each: an episode mostly waits on the
    gateway, so 8 workers fit a 2-core machine; a sandboxed command's CPU is bounded by its limits."""
    return ray.remote(num_cpus=num_cpus)(EnvWorker)


def run_parallel(ray: Any, specs: list[EpisodeSpec], workers: list[Any]) -> list[dict[str, Any]]:
    """Runs every spec on the given actors, each actor one episode at a time; results in spec order."""
    if not workers:
        raise ValueError("run_parallel needs at least one worker")
    pool = ray.util.ActorPool(workers)
    return list(pool.map(lambda actor, spec: actor.run.remote(spec.to_json()), specs))
