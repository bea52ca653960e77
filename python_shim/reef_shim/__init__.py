"""Reef's Python shim: the Ray driver behind the TypeScript bridge (see docs/internals.md)."""

__version__ = "0.1.0"
