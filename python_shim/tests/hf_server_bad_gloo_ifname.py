"""The real hf engine, launched the way a host with a wrong GLOO_SOCKET_IFNAME launches it: it
serves and loads weights from disk as usual, but gloo finds no such network interface, so every
`/init_weights_update_group` is refused and no distributed weight update can happen.

Named by `REEF_ENGINE_MODULE_HF` (see `reef_shim.engine_process.engine_module`) in
test/training/weight-sync-fallback.int.test.ts, so the stack's own launch path starts it.
"""

import os
import sys

from reef_shim.engines.hf_server import main

ABSENT_INTERFACE = "reef-absent0"

if __name__ == "__main__":
    # Read by gloo when the engine builds a weight group, not before: only that part of the engine breaks.
    os.environ["GLOO_SOCKET_IFNAME"] = ABSENT_INTERFACE
    sys.exit(main())
