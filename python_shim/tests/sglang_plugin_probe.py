"""Run in a process of its own by `test_sglang_plugin.py`, with the environment Reef launches an
engine with and SGLang 0.5.23's source on the path: builds a weight-update group as SGLang's engine
does, once before SGLang's plugins are loaded and once after (as each SGLang process loads them at
its start), and prints the timeout torch was given each time.

    python sglang_plugin_probe.py PORT PORT   prints {"before_s": …, "timeout_s": …, "early_binding_patched": …, "plugins": […]}
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points

import torch.distributed.distributed_c10d as c10d

seen: list[float] = []
helper = c10d._new_process_group_helper


def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
    seen.append(kwargs["timeout"].total_seconds())
    return helper(*args, **kwargs)


c10d._new_process_group_helper = spy
# As SGLang's weight updater does (`from sglang.srt.utils.common import init_custom_process_group`),
# before the plugins load: SGLang's hooks must reach such a binding too.
from sglang.srt.utils.common import init_custom_process_group as early  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.utils import common  # noqa: E402

common.init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{int(sys.argv[1])}", world_size=1,
                                 rank=0, group_name="reef-plugin-probe-before")
load_plugins()
common.init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{int(sys.argv[2])}", world_size=1,
                                 rank=0, group_name="reef-plugin-probe")
module = sys.modules[__name__]
print(json.dumps({"before_s": seen[0], "timeout_s": seen[1],
                  "early_binding_patched": getattr(module, "early") is common.init_custom_process_group,
                  "plugins": sorted(ep.name for ep in entry_points(group="sglang.srt.plugins"))}))
