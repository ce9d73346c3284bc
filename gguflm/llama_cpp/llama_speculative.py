"""llama-cpp-python's draft models (``llama_cpp.llama_speculative``): what proposes the tokens a
speculative step checks. :class:`LlamaPromptLookupDecoding` looks them up in the tokens so far
(:func:`gguflm.speculative.prompt_lookup`)."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import numpy.typing as npt

from gguflm.speculative import prompt_lookup

__all__ = ["LlamaDraftModel", "LlamaPromptLookupDecoding"]


class LlamaDraftModel(abc.ABC):
    """Proposes tokens to follow ``input_ids``."""

    @abc.abstractmethod
    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]: ...


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """Prompt-lookup decoding: the tokens that followed the last ``max_ngram_size`` (or fewer)
    tokens where they occurred before, at most ``num_pred_tokens``."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens

    @staticmethod
    def find_candidate_pred_tokens(input_ids: npt.NDArray[np.intc], max_ngram_size: int,
                                   num_pred_tokens: int) -> npt.NDArray[np.intc]:
        return prompt_lookup(input_ids, max_ngram_size, num_pred_tokens)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        return prompt_lookup(input_ids, self.max_ngram_size, self.num_pred_tokens)
