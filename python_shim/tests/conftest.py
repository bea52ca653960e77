import os
import sys

# Recipes (e.g. recipes/openclawrl/objective.py) import as top-level packages from the repo root.
# Appended, not prepended, so the root's folders can never shadow an installed module.
_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
