"""gguflm — run GGUF language models on the CPU from Python, the way llama.cpp does.

The pipeline, in the order data flows: :mod:`gguflm.gguf` (the container) → :mod:`gguflm.loader`
→ :class:`Model` → :class:`Context` + :class:`Batch` → ``decode`` → logits → :class:`SamplerChain`.
Heavy submodules are imported on first use so that ``import gguflm`` stays cheap.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

# gguflm never calls BLAS; the threads a BLAS library behind numpy starts would only compete with
# its OpenMP teams for the cores. When numpy is not loaded yet, ask for none (user settings win).
if "numpy" not in sys.modules:
    for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

from gguflm.errors import (Error, GGUFError, LoadCancelled, ModelLoadError, QuantizeError,
                           VocabOnlyError)
from gguflm import system
# the function, bound over the submodule's name (``from gguflm.quantize import ...`` still works)
from gguflm.quantize import quantize
from gguflm.system import system_info

__version__ = "0.1.0"

# the library logs through `logging` only and never writes to stdout or stderr itself: without a
# handler of the application's, records go nowhere (not to logging's last-resort stderr handler)
logging.getLogger("gguflm").addHandler(logging.NullHandler())

# public name -> module that defines it
_LAZY = {
    "Model": "gguflm.model",
    "Vocab": "gguflm.vocab",
    "Context": "gguflm.context",
    "Batch": "gguflm.batch",
    "SamplerChain": "gguflm.sampling",
    "LLM": "gguflm.llm",
    "Grammar": "gguflm.grammar",
    "GrammarError": "gguflm.grammar",
    "LlamaGrammar": "gguflm.grammar",
    "MemoryEstimate": "gguflm.memory",
    "estimate_memory": "gguflm.memory",
    "fit_context": "gguflm.memory",
}
_LAZY_MODULES = {"gguf", "grammar", "quants", "samplers", "testing"}

__all__ = [
    "Error",
    "GGUFError",
    "LoadCancelled",
    "ModelLoadError",
    "QuantizeError",
    "VocabOnlyError",
    "quantize",
    "system",
    "system_info",
    *_LAZY,
    *sorted(_LAZY_MODULES),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"gguflm.{name}")
    raise AttributeError(f"module 'gguflm' has no attribute {name!r}")
