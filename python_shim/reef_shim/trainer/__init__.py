"""The trainer group: N rank actors in `reef-trainer` training the policy with the OpenClaw-RL
objective (docs/training.md). `group.TrainerGroup` is what the shim's bridge handlers call; torch is
imported only once a trainer is started, so the shim itself stays quick to start."""

from .group import TrainerGroup

__all__ = ["TrainerGroup"]
