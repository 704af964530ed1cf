"""tests/torch: the PyTorch adapter's tests; skipped as a whole when torch is absent."""

import importlib.util
import sys
from pathlib import Path

# the helper modules beside these tests (torch_helpers, tiny_hf, ...) under any --import-mode
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["*.py"]
