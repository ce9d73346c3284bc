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

from gguflm.llama_cpp import llama_cache, llama_chat_format, llama_grammar, llama_speculative, llama_types, stopping
from gguflm.llama_cpp.llama_grammar import LlamaGrammar
from gguflm.llama_cpp.llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache
from gguflm.llama_cpp.llama_types import *  # noqa: F401,F403 - llama_cpp re-exports its types
from gguflm.llama_cpp.stopping import (LogitsProcessor, LogitsProcessorList, MinTokensLogitsProcessor,
                                       StoppingCriteria, StoppingCriteriaList)
from gguflm.llama_cpp import llama, llama_tokenizer
from gguflm.llama_cpp.llama import LLAMA_DEFAULT_SEED, Llama, LlamaState
from gguflm.llama_cpp.llama_tokenizer import BaseLlamaTokenizer, LlamaTokenizer

# llama.cpp's enum values that Llama's arguments take (llama.h)
LLAMA_POOLING_TYPE_UNSPECIFIED = -1
LLAMA_POOLING_TYPE_NONE = 0
LLAMA_POOLING_TYPE_MEAN = 1
LLAMA_POOLING_TYPE_CLS = 2
LLAMA_POOLING_TYPE_LAST = 3
LLAMA_POOLING_TYPE_RANK = 4
LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED = -1
LLAMA_ROPE_SCALING_TYPE_NONE = 0
LLAMA_ROPE_SCALING_TYPE_LINEAR = 1
LLAMA_ROPE_SCALING_TYPE_YARN = 2
LLAMA_ROPE_SCALING_TYPE_LONGROPE = 3
LLAMA_ROPE_SCALING_TYPE_MAX_VALUE = LLAMA_ROPE_SCALING_TYPE_LONGROPE

__version__ = "0.3.36"   # the llama-cpp-python release whose API this follows
