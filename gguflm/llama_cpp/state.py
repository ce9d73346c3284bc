"""llama-cpp-python's ``LlamaState``: what ``Llama.save_state`` returns and ``load_state`` and the
prompt caches take."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["LlamaState"]


class LlamaState:
    """The tokens a ``Llama`` holds (``input_ids[:n_tokens]``), their logits rows (``scores``), the
    context's memory as bytes (``llama_state``, :meth:`gguflm.Context.state_save`'s) and the seed."""

    def __init__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single], n_tokens: int,
                 llama_state: bytes, llama_state_size: int, seed: int):
        self.input_ids = input_ids
        self.scores = scores
        self.n_tokens = n_tokens
        self.llama_state = llama_state
        self.llama_state_size = llama_state_size
        self.seed = seed
