"""Perplexity by llama-perplexity's method (``tools/perplexity/perplexity.cpp``).

The whole text is tokenized with ``add_special`` and cut into chunks of ``n_ctx`` tokens (at most
``len(tokens) // n_ctx`` chunks; at least two are needed). Each chunk is decoded from an empty cache
with its first token replaced by BOS when the model adds BOS, and only the second half is scored:
the logits at positions ``n_ctx/2 .. n_ctx-2`` predict tokens ``n_ctx/2+1 .. n_ctx-1``. PPL is
``exp(mean NLL)``; its ± is ``PPL * sqrt((mean(NLL²) - mean(NLL)²) / (count - 1))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gguflm.batch import Batch
from gguflm.context import Context
from gguflm.errors import Error
from gguflm.model import Model


@dataclass
class PerplexityResult:
    """``ppl`` ± ``ppl_error`` over ``n_scored`` tokens; ``running`` holds the PPL after each
    chunk, as llama-perplexity prints ``[1]…,[2]…``."""

    ppl: float
    ppl_error: float
    n_ctx: int
    n_chunks: int
    n_tokens: int
    n_scored: int
    running: list[float] = field(default_factory=list)


def chunk_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target under its row of logits, as llama.cpp computes it:
    float max, float ``exp(l - max)`` summed in double."""
    peak = logits.max(axis=1)
    sums = np.exp(logits - peak[:, None]).sum(axis=1, dtype=np.float64)
    picked = logits[np.arange(len(targets)), targets]
    return peak.astype(np.float64) + np.log(sums) - picked.astype(np.float64)


def perplexity(model: Model, text: str, *, n_ctx: int = 512, n_batch: int = 2048,
               n_chunks: int | None = None, n_threads: int | None = None,
               n_threads_batch: int | None = None,
               on_chunk: Callable[[int, int, float], object] | None = None) -> PerplexityResult:
    """Perplexity of ``model`` on ``text``.

    Parameters
    ----------
    model
        A loaded model.
    text
        The text to score.
    n_ctx
        Tokens per chunk.
    n_batch
        Tokens per decode call (capped at ``n_ctx``).
    n_chunks
        Score at most this many chunks (None: all).
    n_threads, n_threads_batch
        As for :class:`gguflm.Context`.
    on_chunk
        Called after each chunk with (chunks done, chunks total, running PPL).

    Raises
    ------
    ValueError
        The text has fewer than ``2 * n_ctx`` tokens, or the arguments are out of range.
    gguflm.Error
        The model adds EOS to every text (llama-perplexity refuses those too), or decode failed.
    """
    if n_ctx < 4 or n_ctx % 2:
        raise ValueError(f"n_ctx must be an even number >= 4, got {n_ctx}")
    if n_chunks is not None and n_chunks < 1:
        raise ValueError(f"n_chunks must be >= 1 or None, got {n_chunks}")
    vocab = model.vocab
    if vocab.add_eos:
        raise Error(f"{model.path.name}: the vocabulary adds EOS to every text, which "
                    f"perplexity does not support (llama.cpp refuses it as well)")
    tokens = np.asarray(vocab.tokenize(text, add_special=True, parse_special=False), np.int32)
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a "
                         f"context of {n_ctx}; the text tokenizes to only {len(tokens)}")
    total = len(tokens) // n_ctx if n_chunks is None else min(n_chunks, len(tokens) // n_ctx)
    n_batch = min(n_batch, n_ctx)
    first = n_ctx // 2
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(512, n_batch),
                  n_threads=n_threads, n_threads_batch=n_threads_batch)
    nll = nll2 = 0.0
    count = 0
    running = []
    try:
        for i in range(total):
            chunk = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
            if vocab.add_bos and vocab.bos is not None:
                chunk[0] = vocab.bos
            logits = _chunk_logits(ctx, chunk, n_batch, first)    # [n_ctx - first, n_vocab]
            values = chunk_nll(logits[:-1], chunk[first + 1:])
            nll += float(values.sum())
            nll2 += float((values * values).sum())
            count += len(values)
            running.append(math.exp(nll / count))
            if on_chunk is not None:
                on_chunk(i + 1, total, running[-1])
    finally:
        ctx.close()
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    error = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else float("nan")
    return PerplexityResult(ppl, error, n_ctx, total, len(tokens), count, running)


def _chunk_logits(ctx: Context, chunk: np.ndarray, n_batch: int, first: int) -> np.ndarray:
    """Decode one chunk from an empty cache; logits of positions ``first ..`` in order."""
    ctx.memory.seq_rm(0, -1, -1)
    rows = []
    for start in range(0, len(chunk), n_batch):
        part = chunk[start:start + n_batch]
        batch = Batch(len(part))
        batch.token[:len(part)] = part
        batch.pos[:len(part)] = np.arange(start, start + len(part))
        batch.n_seq_id[:len(part)] = 1
        batch.seq_id[:len(part), 0] = 0
        batch.logits[:len(part)] = batch.pos[:len(part)] >= first
        batch.n_tokens = len(part)
        status = ctx.decode(batch)
        if status != 0:
            raise Error(f"decode failed with status {status} while scoring perplexity")
        out = ctx.get_logits()
        if out is not None and len(out):
            rows.append(out.copy())
    return np.concatenate(rows)
