"""llama-cpp-python's high-level API on gguflm: code written for ``llama_cpp`` runs after
``import gguflm.llama_cpp as llama_cpp``.

``Llama`` (gguflm's :class:`~gguflm.LLM` with llama-cpp-python's low-level methods: ``eval``,
``sample``, ``generate``, ``save_state``/``load_state``, prompt caches), ``LlamaGrammar``, the
logits processors and stopping criteria, the prompt caches, the chat formats
(:mod:`.llama_chat_format`), the draft models (:mod:`.llama_speculative`), the OpenAI-shaped
TypedDicts (:mod:`.llama_types`) and llama.cpp's enum values that ``Llama`` takes. llama.cpp's C API
(``llama_cpp.llama_*`` functions, ``llama_cpp._internals``) is not part of it (docs/compat.md).
"""

from __future__ import annotations

from gguflm.grammar import LlamaGrammar
from gguflm.llama_cpp import llama_cache, llama_chat_format, llama_speculative, llama_types, stopping
from gguflm.llama_cpp.llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache
from gguflm.llama_cpp.llama_types import *  # noqa: F401,F403 - llama_cpp re-exports its types
from gguflm.llama_cpp.stopping import (LogitsProcessor, LogitsProcessorList, MinTokensLogitsProcessor,
                                       StoppingCriteria, StoppingCriteriaList)

__version__ = "0.3.36"   # the llama-cpp-python release whose API this follows
