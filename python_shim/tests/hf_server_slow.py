"""The real hf engine with a pause of SLOW_STEP_S in every forward (prefill and each batch step), as
a large model on a CPU takes: a request is still generating for a while after the server is told
to stop.

Run as `python -m hf_server_slow` with python_shim/tests on PYTHONPATH (test_hf_server.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from reef_shim.engines import hf_engine
from reef_shim.engines.hf_server import main

SLOW_STEP_S = 3.0


class SlowEngine(hf_engine.HFEngine):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        forward = self.model.forward

        def slow_forward(*a: Any, **kw: Any) -> Any:
            out = forward(*a, **kw)
            time.sleep(SLOW_STEP_S)
            return out

        self.model.forward = slow_forward  # type: ignore[method-assign]


if __name__ == "__main__":
    hf_engine.HFEngine = SlowEngine  # type: ignore[misc]  # main() looks the class up when it loads
    sys.exit(main())
