"""Speculative decoding's proposers: where the next tokens are guessed from before the model
checks them in one batch.

:func:`prompt_lookup` is prompt-lookup decoding (n-gram lookup in the tokens so far), with the
semantics of llama-cpp-python's ``LlamaPromptLookupDecoding.find_candidate_pred_tokens``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["prompt_lookup"]


def prompt_lookup(ids: npt.ArrayLike, max_ngram_size: int, n_predict: int) -> np.ndarray:
    """The tokens that followed the earliest earlier occurrence of the last n tokens of ``ids``,
    at most ``n_predict`` of them, trying n = ``max_ngram_size`` down to 1; empty (``intc``) when
    no n-gram recurs or ``n_predict`` < 1."""
    ids = np.asarray(ids)
    n = ids.shape[0]
    if n_predict >= 1:
        for size in range(min(max_ngram_size, n - 1), 0, -1):
            # the windows that end before the last token: each has at least one token after it
            windows = np.lib.stride_tricks.sliding_window_view(ids[:n - 1], size)
            hits = np.flatnonzero((windows == ids[n - size:]).all(axis=1))
            if len(hits):
                start = int(hits[0]) + size
                return ids[start:min(start + n_predict, n)]
    return np.array([], dtype=np.intc)
