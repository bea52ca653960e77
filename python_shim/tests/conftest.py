import os
import sys

# Recipes (e.g. recipes/openclawrl/objective.py) import as top-level packages from the repo root.
# Appended, not prepended, so the root's folders can never shadow an installed module.
_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped (visibly, with the reason) without one")


def pytest_collection_modifyitems(config, items):
    import pytest

    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="GPU test: no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
