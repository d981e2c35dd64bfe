"""pytest setup for the flashattn Python package.

Runs against the installed package (`pip install .`), or a source checkout with
PYTHONPATH=<repo>/python and FLASHATTN_LIBRARY=<build>/libflashattn.so. Outputs are poisoned with
NaN before every call (FLASHATTN_DEBUG_POISON), so an element a path forgets to write fails.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("FLASHATTN_DEBUG_POISON", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import flashattn  # noqa: F401
except ImportError:  # a source checkout without PYTHONPATH: use the repo's python/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    import flashattn  # noqa: F401

import pytest
import torch


def pytest_report_header(config):
    lib = flashattn.library_path()
    return [f"flashattn library: {lib} (backends: {', '.join(flashattn.compiled_backends())})",
            f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
