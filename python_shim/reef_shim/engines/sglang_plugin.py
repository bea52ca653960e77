"""Reef's SGLang plugin: a bound on the weight-update group's timeout in every SGLang process.

SGLang 0.5.23 builds the group a trainer pushes weights over with `init_custom_process_group` and no
timeout (`srt/model_executor/model_runner_components/weight_updater.py:133-139`), which then takes
torch's default of 30 minutes (`srt/utils/common.py:2859-2896`). The rendezvous and every receive of
that group run on the scheduler's loop (`weight_updater.py:260-298`), so a trainer that dies
mid-push, or a rendezvous address the engine cannot reach, stopped the engine generating for up to
30 minutes; under NCCL, torch's watchdog then ended the scheduler. Nothing over HTTP sets that
timeout.

SGLang loads general plugins, found by the entry-point group `sglang.srt.plugins`, at the start of
every process, schedulers included (`srt/plugins/__init__.py:103-141`, `srt/managers/scheduler.py:6323`),
and their hooks replace a function where it is defined and in every module that imported it
(`srt/plugins/hook_registry.py:320-347`). This one fills in the timeout where none is given:
`REEF_SGLANG_WEIGHT_GROUP_TIMEOUT_S` seconds, which Reef sets to its push's own bound and a margin
(`engine_process.engine_env`), so an engine never waits on a group longer than a push may last.
Its entry point is `python_shim/sglang_plugins/reef_sglang_plugin-1.0.dist-info`, a directory that
`engine_env` puts on the path of the SGLang processes Reef launches, and of no others.
"""

from __future__ import annotations

import logging
import math
import os
from datetime import timedelta
from typing import Any

log = logging.getLogger("reef_shim.sglang_plugin")

ENV = "REEF_SGLANG_WEIGHT_GROUP_TIMEOUT_S"
TARGET = "sglang.srt.utils.common.init_custom_process_group"
# `init_custom_process_group(backend, init_method, timeout, ...)`: the third parameter.
_TIMEOUT_POSITION = 2


def weight_group_timeout_s(env: dict[str, str] | os._Environ[str] = os.environ) -> float | None:
    """The bound set for this process; None where it is unset or not a positive number of seconds
    (SGLang's own default then stands, and the plugin says so once)."""
    raw = env.get(ENV, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def bounded_timeout(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """A BEFORE hook: the call's arguments with the timeout filled in; None leaves them as given
    (a caller that chose a timeout keeps it)."""
    seconds = weight_group_timeout_s()
    if seconds is None:
        return None
    bound = timedelta(seconds=seconds)
    if len(args) > _TIMEOUT_POSITION:
        if args[_TIMEOUT_POSITION] is not None:
            return None
        args = args[:_TIMEOUT_POSITION] + (bound,) + args[_TIMEOUT_POSITION + 1:]
        return args, kwargs
    if kwargs.get("timeout") is not None:
        return None
    return args, {**kwargs, "timeout": bound}


def register() -> None:
    """The entry point SGLang calls in each of its processes."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if weight_group_timeout_s() is None:
        log.warning("%s is unset or not a positive number (%r): SGLang's weight-update groups keep torch's "
                    "30-minute default", ENV, os.environ.get(ENV))
        return
    HookRegistry.register(TARGET, bounded_timeout, HookType.BEFORE)
