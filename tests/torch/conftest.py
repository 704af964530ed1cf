"""tests/torch: the PyTorch adapter's tests; skipped as a whole when torch is absent."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["*.py"]
