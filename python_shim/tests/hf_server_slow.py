"""The real hf engine with a pause of SLOW_STEP_S after every token it yields, as a large model on
a CPU takes: a request is still generating for a while after the server is told to stop.

Run as `python -m hf_server_slow` with python_shim/tests on PYTHONPATH (test_hf_server.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterator

from reef_shim.engines import hf_engine
from reef_shim.engines.hf_server import main

SLOW_STEP_S = 3.0


class SlowEngine(hf_engine.HFEngine):
    def generate(self, req: Any, should_stop: Callable[[], str | None]) -> Iterator[hf_engine.GenState]:
        for state in super().generate(req, should_stop):
            yield state
            if state.finish is None:
                time.sleep(SLOW_STEP_S)


if __name__ == "__main__":
    hf_engine.HFEngine = SlowEngine  # type: ignore[misc]  # main() looks the class up when it loads
    sys.exit(main())
