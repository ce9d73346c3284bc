"""Benchmarks that print figures: ``python -m gguflm.bench <name> [args]``.

Each ``gguflm/bench/<name>.py`` defines ``main(argv) -> int``; speed targets are checked by reading
these figures, never by timed assertions in tests.
"""

from __future__ import annotations

import sys
from types import ModuleType


def llama_cpp_or_none(bench: str) -> ModuleType | None:
    """llama-cpp-python, for a bench's ``--compare llama-cpp``; None, once stderr says how to
    install it, where it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        print(f"gguflm bench {bench}: --compare llama-cpp needs llama-cpp-python (pip install llama-cpp-python)",
              file=sys.stderr)
        return None
    return llama_cpp
