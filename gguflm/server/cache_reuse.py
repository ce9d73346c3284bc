"""``--cache-reuse N``: keep a slot's cached chunks that a new prompt repeats after a change, by
moving their KV cells to the prompt's positions, as llama.cpp's server does.

After the common prefix of the cached tokens and the prompt, the cache is scanned for runs of at
least ``N`` tokens equal to the prompt's next tokens; each such run is kept (``seq_rm`` of the
cells between, ``seq_add`` moving the run to where the prompt has it, its K re-rotated before the
next decode) and the cache tokens skipped before it are dropped. What follows the last kept token
is decoded. This is what lets a chat whose oldest turns were cut, or a prompt with an edited
middle, reuse the rest; the shifted K rows round differently from freshly decoded ones, so a
reply can differ from the one without reuse (in llama.cpp too).
"""

from __future__ import annotations

from collections.abc import Sequence

from gguflm.generate import Session

__all__ = ["can_shift", "keep_cached"]


def can_shift(session: Session) -> bool:
    """Whether the cache's positions can move: llama.cpp refuses when caches differ in size (a
    sliding-window cache smaller than the full one)."""
    return len({cache.size for cache in session.ctx.memory.caches}) == 1


def keep_cached(session: Session, prompt: Sequence[int], n_cache_reuse: int = 0) -> int:
    """Bring ``session``'s cache to a prefix of ``prompt`` it can keep (its common prefix, and
    with ``n_cache_reuse`` > 0 the matching chunks of at least that many tokens after it, moved
    into place); returns how many prompt tokens are then cached (never all: the last one is
    decoded again for its logits)."""
    if n_cache_reuse <= 0 or not can_shift(session):
        return session.keep_prefix(prompt)
    n_past = session.reusable_prefix(prompt)
    cached, seq, memory = session.tokens, session.seq_id, session.ctx.memory
    head_c = head_p = n_past
    while head_c < len(cached) and head_p < len(prompt):
        n = 0
        while (head_c + n < len(cached) and head_p + n < len(prompt)
               and cached[head_c + n] == prompt[head_p + n]):
            n += 1
        if n < n_cache_reuse:
            head_c += 1
            continue
        memory.seq_rm(seq, head_p, head_c)
        memory.seq_add(seq, head_c, head_c + n, head_p - head_c)
        n_past += n
        head_c += n
        head_p += n
    n_past = min(n_past, len(prompt) - 1)
    memory.seq_rm(seq, n_past, -1)
    session.tokens = list(prompt[:n_past])
    return n_past
