"""Speculative decoding: guess the next tokens cheaply, let the model check them in one batch.

A :class:`Speculation` drives one of the proposers for the token loop (:func:`gguflm.generate.run`):

* :class:`PromptLookup`, prompt-lookup decoding: the tokens that followed the earliest earlier
  occurrence of the last n-gram (llama-cpp-python's ``LlamaPromptLookupDecoding``, whose
  ``find_candidate_pred_tokens`` :func:`prompt_lookup` is), kept in an index that grows with the
  tokens, so a lookup costs a few dict probes, hit or miss;
* :class:`DraftModel`, a smaller model of the same vocabulary (llama.cpp's ``--model-draft``),
  whose own context follows the accepted tokens and drafts greedily while it is confident,
  over the whole vocabulary or (``head="context"``, :class:`ContextHead`) over the tokens of
  the request only;
* :class:`CallableProposer`, any ``f(input_ids) -> token ids`` (llama-cpp-python's
  ``LlamaDraftModel`` protocol);
* llama.cpp's n-gram proposers (``--spec-type ngram-simple``, ``ngram-map-k``, ...), in
  :mod:`gguflm.ngram_proposers`.

The loop samples the drafted positions in order with the request's own sampler chain and keeps
drafted tokens while they equal what it sampled (llama.cpp's
``common_sampler_sample_and_accept_n``): the chain sees exactly the rows and tokens it would
without speculation, so its random stream, grammar and penalties advance as they would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from gguflm import quants
from gguflm.errors import SpeculationError

if TYPE_CHECKING:
    from gguflm.context import Context
    from gguflm.model import Model

__all__ = ["prompt_lookup", "PromptLookup", "DraftModel", "ContextHead", "DRAFT_HEADS", "CallableProposer", "Proposer",
           "Speculation", "SpeculationError", "SlotSpeculation", "check_compatible", "speculation_for"]

# llama.cpp's common_speculative_are_compatible: vocabulary sizes may differ by this much, and
# token texts are compared from this id on
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5
# the most proposals skipped after drafts that gained nothing (see Speculation.update)
MAX_BACKOFF = 32
# a draft model's output layer: every token's logits (llama.cpp's), or the request's tokens' only
DRAFT_HEADS = ("full", "context")


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


class Proposer(Protocol):
    """What a :class:`Speculation` asks for drafts. A proposer may also have
    ``accept(n_accepted)``, told how many tokens of its last non-empty proposal the model took
    (llama.cpp's ``common_speculative_accept``)."""

    def begin(self, prompt: Sequence[int]) -> None:
        """A request starts: later ``history`` arguments extend ``prompt`` until the next begin."""

    def propose(self, history: Sequence[int], n_max: int) -> list[int]:
        """Up to ``n_max`` tokens guessed to follow ``history`` (the tokens so far)."""

    def close(self) -> None: ...


class PromptLookup:
    """Prompt-lookup decoding with :func:`prompt_lookup`'s answers, from an index of the first
    occurrence of every n-gram (n <= ``max_ngram_size``) that grows with the history.

    Parameters
    ----------
    max_ngram_size
        The longest n-gram looked up (llama-cpp-python's default 2).
    num_pred_tokens
        The most tokens proposed at once (llama-cpp-python's default 10).
    """

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        if max_ngram_size < 1 or num_pred_tokens < 1:
            raise SpeculationError(f"prompt lookup needs max_ngram_size >= 1 and num_pred_tokens >= 1, "
                                   f"got {max_ngram_size} and {num_pred_tokens}")
        self.max_ngram_size = int(max_ngram_size)
        self.num_pred_tokens = int(num_pred_tokens)
        self._ids: list[int] = []
        self._first: dict[tuple[int, ...], int] = {}   # n-gram -> where it first starts

    def spawn(self) -> PromptLookup:
        """A lookup of the same sizes with an index of its own (for another server slot)."""
        return PromptLookup(self.max_ngram_size, self.num_pred_tokens)

    def begin(self, prompt: Sequence[int]) -> None:
        self._ids, self._first = [], {}
        self._extend(prompt)

    def _extend(self, tokens: Sequence[int]) -> None:
        ids, first, sizes = self._ids, self._first, range(1, self.max_ngram_size + 1)
        for tok in tokens:
            ids.append(int(tok))
            end = len(ids)
            for size in sizes:
                if size > end:
                    break
                first.setdefault(tuple(ids[end - size:]), end - size)

    def propose(self, history: Sequence[int], n_max: int) -> list[int]:
        self._extend(history[len(self._ids):])
        ids, n = self._ids, len(self._ids)
        n_predict = min(n_max, self.num_pred_tokens)
        if n_predict < 1:
            return []
        for size in range(min(self.max_ngram_size, n - 1), 0, -1):
            start = self._first.get(tuple(ids[n - size:]))
            if start is not None and start < n - size:   # not the last n-gram itself
                return ids[start + size:min(start + size + n_predict, n)]
        return []

    def close(self) -> None:
        self._ids, self._first = [], {}


class CallableProposer:
    """Drafts from ``draft(input_ids) -> token ids`` (llama-cpp-python's ``LlamaDraftModel``
    protocol: an ``intc`` array of every token so far in, the proposal out)."""

    def __init__(self, draft: Callable[[npt.NDArray[np.intc]], Any]) -> None:
        self.draft = draft

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], n_max: int) -> list[int]:
        return [int(t) for t in np.asarray(self.draft(np.asarray(history, dtype=np.intc))).ravel()[:max(n_max, 0)]]

    def close(self) -> None:
        pass


def check_compatible(target: Any, draft: Any, draft_name: str = "the draft model") -> None:
    """Raise :class:`SpeculationError` unless vocabularies ``target`` and ``draft`` can share
    token ids, by llama.cpp's ``common_speculative_are_compatible``: the same tokenizer type, BOS
    and EOS (where added), sizes within 128 and the same token texts from id 5 on."""
    def refuse(why: str) -> None:
        raise SpeculationError(f"{draft_name} cannot draft for this model: {why}")

    if target.type != draft.type:
        refuse(f"its tokenizer is {draft.type!r}, the model's {target.type!r}")
    for what in ("bos", "eos"):
        add = f"add_{what}"
        if getattr(target, add) != getattr(draft, add) or \
                (getattr(target, add) and getattr(target, what) != getattr(draft, what)):
            refuse(f"{what.upper()} differs (added: {getattr(draft, add)} vs {getattr(target, add)}, "
                   f"id {getattr(draft, what)} vs {getattr(target, what)})")
    n_t, n_d = target.n_tokens, draft.n_tokens
    if abs(n_t - n_d) > VOCAB_MAX_SIZE_DIFFERENCE:
        refuse(f"its vocabulary has {n_d} tokens, the model's {n_t}")
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(n_t, n_d)):
        if target.token_text(i) != draft.token_text(i):
            refuse(f"token {i} is {draft.token_text(i)!r}, the model's {target.token_text(i)!r}")


class ContextHead:
    """A draft model's output layer restricted to the tokens of the request: those of the prompt,
    those generated so far and the end-of-generation tokens, their rows of the output matrix
    dequantized once and multiplied in float32. A small model's output layer can be most of its
    cost (Gemma 3 270M: 262144 rows of 640, two thirds of a token's work), and replies that copy
    their input draft from those tokens anyway; a token outside them is never drafted, which
    costs acceptance, never correctness (the target checks every draft).

    Parameters
    ----------
    model
        The draft :class:`gguflm.Model` (its ``output.weight``, the token embedding when tied).
    """

    def __init__(self, model: Model) -> None:
        w = model.tensors["output.weight"]
        self._rows = quants.from_rows16(w.data, w.kernel_type) if w.rows16 else w.data.view(np.uint8)
        self._type = w.kernel_type
        hp = model.hparams
        self._scale, self._softcap = hp.f_logit_scale, hp.f_final_logit_softcapping
        self._always = sorted(int(t) for t in model.vocab.eog_ids)
        self._w = np.empty((0, w.shape[0]), np.float32)
        self.ids: list[int] = []
        self._index: set[int] = set()
        self._n_seen = 0
        self.begin(())

    def begin(self, prompt: Sequence[int]) -> None:
        """A request starts: the rows are the prompt's tokens' and the end-of-generation ones."""
        self.ids, self._index, self._n_seen = [], set(), 0
        self.extend(self._always)
        self.extend(prompt)
        self._n_seen = len(prompt)

    def follow(self, history: Sequence[int]) -> None:
        """Add the tokens of ``history`` (the prompt and the tokens after it) not seen yet."""
        self.extend(history[self._n_seen:])
        self._n_seen = len(history)

    def extend(self, tokens: Sequence[int]) -> None:
        new = sorted({int(t) for t in tokens} - self._index)
        if not new:
            return
        n, n_new = len(self.ids), len(new)
        if n + n_new > self._w.shape[0]:   # room doubles: a reply's new tokens add rows one by one
            grown = np.empty((max(2 * self._w.shape[0], n + n_new), self._w.shape[1]), np.float32)
            grown[:n] = self._w[:n]
            self._w = grown
        self._w[n:n + n_new] = quants.get_rows(self._rows, self._type, np.asarray(new, np.int32))
        self.ids += new
        self._index.update(new)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """The logits of :attr:`ids` for the final hidden state ``hidden`` ([n_embd])."""
        out = self._w[:len(self.ids)] @ hidden
        if self._scale:
            out *= self._scale
        if self._softcap:
            out = np.tanh(out / self._softcap) * self._softcap
        return out


class DraftModel:
    """A draft model (any GGUF whose vocabulary :func:`check_compatible` accepts for the target)
    in its own context, which follows the accepted tokens: each proposal decodes only what
    changed since the last (the accepted drafts and the target's token) and then drafts greedily
    as llama.cpp's draft-simple does, the best of the top 10 while its probability among them is
    at least ``p_min``; with ``head="context"`` (:class:`ContextHead`) its context computes no
    logits, and its drafts come from the logits of the request's tokens only.

    Parameters
    ----------
    model
        A :class:`gguflm.Model` (not closed with this object) or a path (loaded and closed here).
    target_vocab
        The target model's vocabulary, checked against the draft's.
    n_ctx, n_threads, n_threads_batch
        The draft context's (``n_ctx`` as the target's, so any history fits).
    p_min
        Stop drafting at a token whose probability is below this (0 drafts ``n_max`` always).
    head
        ``"full"``: every token's logits, as llama.cpp's; ``"context"``: those of the request's
        tokens (see :class:`ContextHead`).
    """

    TOP_K = 10   # llama.cpp's draft sampler: top-k 10, probabilities among those

    def __init__(self, model: Model | str | PathLike[str], target_vocab: Any, *, n_ctx: int,
                 n_threads: int | None = None, n_threads_batch: int | None = None,
                 p_min: float = 0.75, head: str = "full") -> None:
        from gguflm.context import Context
        from gguflm.generate import Session
        from gguflm.model import Model

        if not 0.0 <= p_min <= 1.0:
            raise SpeculationError(f"draft_p_min must be in [0, 1], got {p_min}")
        if head not in DRAFT_HEADS:
            raise SpeculationError(f"draft_head must be one of {', '.join(DRAFT_HEADS)}, got {head!r}")
        self.p_min = float(p_min)
        self._own = not isinstance(model, Model)
        self.model = Model.load(model) if self._own else model
        try:
            check_compatible(target_vocab, self.model.vocab, self.model.path.name)
            restricted = head == "context"
            self.head = ContextHead(self.model) if restricted else None
            # the restricted head reads the final hidden state (llama.cpp's embeddings, unpooled)
            self.context: Context = Context(self.model, n_ctx=n_ctx, n_threads=n_threads,
                                            n_threads_batch=n_threads_batch, embeddings=restricted,
                                            logits=not restricted, pooling="none" if restricted else None)
        except BaseException:
            if self._own:
                self.model.close()
            raise
        self._session = Session(self.context)

    def begin(self, prompt: Sequence[int]) -> None:
        # the session reuses whatever prefix of each history it holds
        if self.head is not None:
            self.head.begin(prompt)

    def propose(self, history: Sequence[int], n_max: int) -> list[int]:
        session, head, out = self._session, self.head, []
        if n_max < 1:
            return out
        if head is not None:
            head.follow(history)
        session.ingest(history)
        while True:
            if head is None:
                row = self.context.get_logits_ith(-1)
            else:
                row = head.logits(self.context.get_embeddings_ith(-1))
            best = int(np.argmax(row))
            if self.p_min > 0.0:
                # softmax among the top k: p(best) = 1 / sum(exp(l - l_best)); logits more than
                # 20 below the best change it by less than 1e-7 and need no sorting
                near = row[row > row[best] - 20.0]
                if near.shape[0] > self.TOP_K:
                    near = np.partition(near, near.shape[0] - self.TOP_K)[near.shape[0] - self.TOP_K:]
                p = 1.0 / float(np.exp(near - row[best], dtype=np.float32).sum(dtype=np.float64))
                if p < self.p_min:
                    return out
            token = best if head is None else head.ids[best]
            out.append(token)
            if len(out) >= n_max:
                return out
            session.step(token)

    def close(self) -> None:
        self.context.close()
        if self._own:
            self.model.close()


@dataclass
class SpeculationStats:
    """Drafted and accepted tokens, and how many batches checked drafts."""

    n_drafted: int = 0
    n_accepted: int = 0
    n_checks: int = 0

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0


class Speculation:
    """A proposer and llama.cpp's draft limits (``--draft-max``, ``--draft-min``), with the draft
    length adapting to how much of the drafts the model takes.

    Drafts are 1, 2, 4, 8, ... tokens long (a shorter proposal is cut to one of those): each
    length is a batch shape whose recorded forward pass the context keeps, where every new length
    would record another. The length starts at ``n_max``, doubles (up to ``n_max``) after a draft
    taken whole and drops to one more than the accepted part (at least ``n_min``) after one that
    was not. A draft that gained nothing
    makes the next proposals be skipped, 1, 3, 7, ... (at most 32) of them while that repeats: a
    proposer that keeps missing (prompt lookup on text that copies nothing) then costs next to
    nothing, and one that starts hitting again is back within a few tokens.

    Parameters
    ----------
    proposer
        :class:`PromptLookup`, :class:`DraftModel`, :class:`CallableProposer` or another
        :class:`Proposer`.
    n_max
        The most tokens drafted at once.
    n_min
        A shorter draft is dropped (not checked).
    """

    def __init__(self, proposer: Proposer, n_max: int = 16, n_min: int = 0) -> None:
        if n_max < 1 or n_min < 0 or n_min > n_max:
            raise SpeculationError(f"draft limits need 1 <= draft_max and 0 <= draft_min <= draft_max, "
                                   f"got draft_max={n_max}, draft_min={n_min}")
        self.proposer = proposer
        self._accept = getattr(proposer, "accept", None)
        self.n_max, self.n_min = int(n_max), int(n_min)
        self.stats = SpeculationStats()
        self._n_draft = self.n_max
        self._misses = 0       # drafts in a row that gained nothing
        self._skip = 0         # proposals still to skip

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request: its statistics start from zero."""
        self.stats = SpeculationStats()
        self._n_draft, self._misses, self._skip = self.n_max, 0, 0
        self.proposer.begin(prompt)

    def draft(self, history: Sequence[int], room: int) -> list[int]:
        """The tokens to check after ``history`` (whose last token is not decoded yet), at most
        ``room``; empty when there is nothing worth checking."""
        if self._skip:
            self._skip -= 1
            return []
        n = _pow2_floor(min(self._n_draft, room))
        if n < max(1, self.n_min):
            return []
        tokens = self.proposer.propose(history, n)[:n]
        tokens = tokens[:_pow2_floor(len(tokens))]
        return tokens if len(tokens) >= max(1, self.n_min) else []

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """The model took ``n_accepted`` of the ``n_drafted`` tokens last checked."""
        if not n_drafted:
            return
        stats = self.stats
        stats.n_drafted += n_drafted
        stats.n_accepted += n_accepted
        stats.n_checks += 1
        if self._accept is not None:
            self._accept(n_accepted)
        if n_accepted == n_drafted:
            self._n_draft = min(self.n_max, 2 * self._n_draft)
        else:
            self._n_draft = max(1, self.n_min, min(self._n_draft, n_accepted + 1))
        if n_accepted:
            self._misses = 0
        else:
            self._misses += 1
            self._skip = min(MAX_BACKOFF, 2 ** self._misses - 1)

    def close(self) -> None:
        self.proposer.close()

    def __repr__(self) -> str:
        return f"Speculation({type(self.proposer).__name__}, n_max={self.n_max}, n_min={self.n_min})"


def _pow2_floor(n: int) -> int:
    """The largest power of two <= n (0 for n < 1)."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def speculation_for(draft: Any, target_vocab: Any, n_max: int = 16, n_min: int = 0,
                    p_min: float = 0.75, **context: Any) -> Speculation:
    """The :class:`Speculation` that ``draft`` names: a :class:`Speculation` as it is; a
    :class:`Proposer` (:class:`PromptLookup`, ...) with these limits; a
    ``LlamaPromptLookupDecoding`` (gguflm's or llama-cpp-python's, recognised by its name and
    ``max_ngram_size``/``num_pred_tokens``) as a :class:`PromptLookup`; a path or a
    :class:`gguflm.Model` as a :class:`DraftModel` (``context``: its ``n_ctx`` and threads); any
    other callable as a :class:`CallableProposer`."""
    from gguflm.model import Model

    if isinstance(draft, Speculation):
        return draft
    if hasattr(draft, "propose") and hasattr(draft, "begin"):
        proposer: Any = draft
    elif type(draft).__name__ == "LlamaPromptLookupDecoding" and hasattr(draft, "max_ngram_size") \
            and hasattr(draft, "num_pred_tokens"):
        proposer = PromptLookup(draft.max_ngram_size, draft.num_pred_tokens)
    elif isinstance(draft, (str, PathLike, Model)):
        proposer = DraftModel(draft, target_vocab, p_min=p_min, **context)
    elif callable(draft):
        proposer = CallableProposer(draft)
    else:
        raise TypeError(f"draft_model must be a LlamaDraftModel, a callable, a .gguf path, a Model "
                        f"or a Speculation, not {type(draft).__name__}")
    try:
        return Speculation(proposer, n_max, n_min)
    except BaseException:
        proposer.close()
        raise


class SlotSpeculation:
    """A :class:`Speculation` for each slot of a server (llama-server's per-slot drafts), each
    proposer with state of its own: a proposer's ``spawn()`` per slot (a :class:`PromptLookup`
    index, an n-gram proposer of :mod:`gguflm.ngram_proposers` sharing what llama.cpp shares
    between slots), or a draft model's context per slot on one loaded draft model.

    Parameters
    ----------
    draft
        A proposer with ``spawn()`` (:class:`PromptLookup`, :class:`gguflm.ngram_proposers.NgramMap`,
        ...), a draft model (a ``.gguf`` path, loaded once and closed here, or a
        :class:`gguflm.Model`), a ``LlamaPromptLookupDecoding`` or a stateless callable; see
        :func:`speculation_for`.
    n_slots
        The slots.
    n_max, n_min, p_min, **context
        As :func:`speculation_for` (``context``: each draft context's ``n_ctx`` and threads).
    """

    def __init__(self, draft: Any, target_vocab: Any, n_slots: int, n_max: int = 16, n_min: int = 0,
                 p_min: float = 0.75, **context: Any) -> None:
        from gguflm.model import Model

        if isinstance(draft, Speculation) or (hasattr(draft, "propose") and not hasattr(draft, "spawn")):
            raise SpeculationError("each slot drafts on its own: give a draft model, a proposer with spawn() "
                                   f"or a callable, not a {type(draft).__name__} (one proposer's state)")
        self._model = Model.load(draft) if isinstance(draft, (str, PathLike)) else None
        self.slots: list[Speculation] = []
        try:
            for _ in range(n_slots):
                proposer = draft.spawn() if hasattr(draft, "spawn") else self._model or draft
                self.slots.append(speculation_for(proposer, target_vocab, n_max, n_min, p_min, **context))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for speculation in self.slots:
            speculation.close()
        self.slots = []
        if self._model is not None:
            self._model.close()
            self._model = None
