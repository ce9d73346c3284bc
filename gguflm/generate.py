"""The token loop: prompt ingestion with KV-prefix reuse, sampling, UTF-8-safe streaming text with
stop strings, cancellation, timings.

Per generated token the loop does a constant amount of Python work outside ``decode``: one sample,
one cached piece lookup, an incremental UTF-8 decode of that piece, and a stop-string check over a
window no longer than the longest stop string. Nothing re-tokenizes or re-joins the whole text.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from gguflm.batch import Batch
from gguflm.context import Context
from gguflm.errors import Error
from gguflm.sampling import SamplerChain

# a completion's finish_reason
FINISH_STOP = "stop"              # an end-of-generation token or a stop string
FINISH_LENGTH = "length"          # max_tokens or the context is full
FINISH_CANCELLED = "cancelled"    # cancel() from another thread, or close()
FINISH_TOOL_CALLS = "tool_calls"  # the reply is the tool calls a tool_choice grammar asked for (OpenAI)

DECODE_ABORTED = 2


class Cancelled(Exception):
    """Raised inside the loop when the abort callback stopped a decode."""


@dataclass
class TokenLogprob:
    """One generated token with its log-probability under the model's raw logits, and the
    ``n`` most likely alternatives as (token id, text, logprob), best first."""

    token: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]]


@dataclass
class Timings:
    """Where a request's time went (milliseconds), like llama.cpp's perf print."""

    prompt_n: int = 0           # prompt tokens decoded for this request
    prompt_cached: int = 0      # prompt tokens whose KV entries were reused
    prompt_ms: float = 0.0
    gen_n: int = 0              # tokens generated
    gen_ms: float = 0.0         # from the first sample to the end
    draft_n: int = 0            # drafted tokens checked (speculative decoding)
    draft_accepted: int = 0     # ... of which the model took

    @property
    def prompt_per_second(self) -> float:
        return 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def gen_per_second(self) -> float:
        return 1e3 * self.gen_n / self.gen_ms if self.gen_ms > 0 else 0.0

    def line(self) -> str:
        """One line for the terminal: prompt and generation throughput."""
        return (f"prompt: {self.prompt_n} tokens in {self.prompt_ms:.1f} ms "
                f"({self.prompt_per_second:.2f} tokens/s, {self.prompt_cached} cached) | "
                f"generation: {self.gen_n} tokens in {self.gen_ms:.1f} ms "
                f"({self.gen_per_second:.2f} tokens/s)"
                + (f" | draft: {self.draft_accepted}/{self.draft_n} accepted" if self.draft_n else ""))


@dataclass
class Completion:
    """The result of one request.

    Attributes
    ----------
    text : str
        The generated text (stop strings and end-of-generation tokens not included).
    finish_reason : str
        :data:`FINISH_STOP`, :data:`FINISH_LENGTH` or :data:`FINISH_CANCELLED`.
    prompt_tokens : list[int]
        The prompt as decoded.
    token_ids : list[int]
        The generated tokens (an end-of-generation token is not included).
    logprobs : list[TokenLogprob] or None
        Per generated token, when asked for.
    timings : Timings
    """

    text: str
    finish_reason: str
    prompt_tokens: list[int]
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    timings: Timings

    @property
    def usage(self) -> dict[str, int]:
        n_prompt, n_gen = len(self.prompt_tokens), len(self.token_ids)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
                "total_tokens": n_prompt + n_gen}


@dataclass
class Chunk:
    """A piece of streamed output: whole characters only, never part of a stop string.

    ``token_ids`` are the tokens generated since the previous chunk (text may lag a token
    behind them while a character or a possible stop string is incomplete). The last chunk has
    ``finish_reason`` set and ``completion`` holding the whole result.
    """

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    completion: Completion | None = None


class TextAssembler:
    """Token bytes in, releasable text out.

    Bytes go through an incremental UTF-8 decoder, so a character split across tokens is released
    whole once its last byte arrives. With stop strings, the longest tail that could still begin
    one is held back; when a stop string completes, the text before it is released and
    :attr:`stopped` is set. Invalid bytes become U+FFFD.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Add one token's bytes; returns the text that may be shown now."""
        return self._release(self._decoder.decode(data))

    def flush(self) -> str:
        """The end of generation: everything still held (an unfinished character as U+FFFD)."""
        return self._release(self._decoder.decode(b"", final=True), final=True)

    def _release(self, text: str, final: bool = False) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return text
        pending = self._held + text
        cut = min((i for i in (pending.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return pending[:cut]
        keep = 0 if final else self._stop_prefix_length(pending)
        self._held = pending[len(pending) - keep:] if keep else ""
        return pending[:len(pending) - keep]

    def _stop_prefix_length(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        for k in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0


class Session:
    """One sequence of a context (0 unless given) and the tokens its KV cache holds.

    Parameters
    ----------
    ctx
        The context; its abort callback must report the running request's ``cancel`` token
        (:attr:`Request.cancel`).
    seq_id
        The sequence. :meth:`ingest` and :meth:`step` decode sequence 0 alone; a scheduler that
        batches several sequences uses :meth:`keep_prefix` and decodes itself.
    """

    def __init__(self, ctx: Context, seq_id: int = 0) -> None:
        self.ctx = ctx
        self.seq_id = seq_id
        self.tokens: list[int] = []
        self._one = Batch.get_one([0])   # reused for every generated token
        hp = ctx.model.hparams
        # a sliding-window cache forgets old positions: a prefix is reusable only if the window
        # before its end is still there (llama.cpp's server checks the same)
        self._n_swa = hp.n_swa if any(hp.is_swa(il) for il in range(hp.n_layer)) else 0
        model = ctx.model
        self._encoder_decoder = model.has_encoder and model.has_decoder

    def reusable_prefix(self, prompt: Sequence[int]) -> int:
        """How many leading prompt tokens can keep their cache entries (the last prompt token is
        always decoded again, for its logits)."""
        n = 0
        limit = min(len(self.tokens), len(prompt) - 1)
        cached = self.tokens
        while n < limit and cached[n] == prompt[n]:
            n += 1
        if n and self._n_swa and self.ctx.memory.seq_pos_min(self.seq_id) > max(0, n - self._n_swa):
            return 0
        return n

    def keep_prefix(self, prompt: Sequence[int]) -> int:
        """Drop the cache entries past the reusable prefix of ``prompt``; returns its length."""
        n_keep = self.reusable_prefix(prompt)
        if not self.ctx.memory.seq_rm(self.seq_id, n_keep, -1):
            # a recurrent state holds no earlier positions: only a prompt extending all of it
            # reuses it, any other starts afresh (as llama-cpp-python)
            self.reset()
            return 0
        self.tokens = list(prompt[:n_keep])
        return n_keep

    def ingest(self, prompt: Sequence[int]) -> int:
        """Bring the cache to ``prompt`` (decoding only what is not cached, in n_batch chunks) so
        the last prompt token's logits are ready. Returns the number of reused tokens.

        Raises
        ------
        Cancelled
            The cancel flag stopped a decode; the cache keeps the chunks already done.
        gguflm.Error
            The context refused the batch.
        """
        if self._encoder_decoder:
            self._encode(prompt)
            return 0
        n_keep = self.keep_prefix(prompt)
        n_batch = self.ctx.n_batch
        for start in range(n_keep, len(prompt), n_batch):
            chunk = prompt[start:start + n_batch]
            self._decode(Batch.get_one(chunk), chunk)
        return n_keep

    def _encode(self, prompt: Sequence[int]) -> None:
        """An encoder-decoder model's prompt, as llama-cli runs it: the encoder takes the prompt,
        then the decoder starts afresh from the model's decoder start token (BOS where the file
        names none), whose logits are the first to sample."""
        self.reset()
        batch = Batch(len(prompt))
        for pos, tok in enumerate(prompt):
            batch.add(int(tok), pos, (self.seq_id,), True)
        status = self.ctx.encode(batch)
        if status == DECODE_ABORTED:
            raise Cancelled()
        if status != 0:
            raise Error(f"encode failed (status {status}) for a {len(prompt)}-token prompt "
                        f"(n_ubatch = {self.ctx.n_ubatch}: the encoder takes the prompt in one ubatch)")
        start = self.ctx.model.decoder_start_token
        if start < 0:
            start = self.ctx.model.vocab.bos
        self._decode(Batch.get_one([start]), (start,))

    def step(self, token: int, draft: Sequence[int] = ()) -> None:
        """Decode one generated token (its logits become the next row to sample), and after it
        the ``draft`` tokens to check, each with its logits, in the same batch, every row
        rounded as a one-token decode's (``Context.decode``'s ``per_token``)."""
        if not draft:
            self._one.token[0] = token
            self._decode(self._one, (token,))
            return
        tokens = (token, *draft)
        batch = Batch(len(tokens))
        for pos, tok in enumerate(tokens, len(self.tokens)):
            batch.add(tok, pos, (self.seq_id,), True)
        self._decode(batch, tokens, per_token=True)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens in the cache (drop rejected drafts)."""
        if n < len(self.tokens):
            self.ctx.memory.seq_rm(self.seq_id, n, -1)
            del self.tokens[n:]

    def _decode(self, batch: Batch, tokens: Sequence[int], per_token: bool = False) -> None:
        """Decode ``batch`` (holding ``tokens``) after the cached tokens."""
        try:
            status = self.ctx.decode(batch, per_token)
        except BaseException:   # e.g. KeyboardInterrupt between layers: the cache is unknown
            self.reset()
            raise
        if status == 0:
            self.tokens.extend(tokens)
            return
        if status == DECODE_ABORTED:
            # the ubatches finished before the abort stay in the cache
            n_held = self.ctx.memory.seq_pos_max(0) + 1
            self.tokens.extend(tokens[: max(0, n_held - len(self.tokens))])
            raise Cancelled()
        n_total = len(self.tokens) + len(tokens)
        self.reset()
        reason = "no room in the KV cache" if status == 1 else f"status {status}"
        raise Error(f"decode failed ({reason}) at {n_total} tokens of a {self.ctx.n_ctx}-token "
                    f"context")

    def reset(self) -> None:
        """Forget the cache (of every sequence, when this session is sequence 0 of a context
        that has only one)."""
        if self.ctx.n_seq_max == 1:
            self.ctx.memory.clear()
        else:
            self.ctx.memory.seq_rm(self.seq_id, -1, -1)
        self.tokens = []


def token_logprobs(row: np.ndarray, token: int, n_top: int, piece: Callable[[int], str]
                   ) -> TokenLogprob:
    """Log-softmax of the raw logits ``row`` at ``token`` and its ``n_top`` best alternatives."""
    peak = float(row.max())
    lse = peak + float(np.log(np.exp(row - peak, dtype=np.float32).sum(dtype=np.float64)))
    top: list[tuple[int, str, float]] = []
    if n_top > 0:
        k = min(n_top, len(row))
        best = np.argpartition(row, len(row) - k)[len(row) - k:]
        best = best[np.argsort(-row[best], kind="stable")]
        top = [(int(t), piece(int(t)), float(row[t]) - lse) for t in best]
    return TokenLogprob(token, piece(token), float(row[token]) - lse, top)


@dataclass
class Request:
    """What to generate after a prompt (see :func:`run`), and the request's own cancel token:
    set ``cancel`` from any thread to stop it (it then ends with :data:`FINISH_CANCELLED`)."""

    max_tokens: int
    stop: Sequence[str] = ()
    n_logprobs: int | None = None
    # llama-cpp-python's hooks: f(input_ids, scores) -> new scores, and -> bool to stop
    logits_processor: Sequence[Callable[[np.ndarray, np.ndarray], np.ndarray]] = \
        field(default_factory=list)
    stopping_criteria: Sequence[Callable[[np.ndarray, np.ndarray], bool]] = \
        field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)


class TokenLoop:
    """One request's token loop, one sampled token at a time: the state :func:`run` keeps for a
    single sequence and a server's scheduler keeps per slot (sampling from the slot's row of a
    shared batch).

    :meth:`prompt_done` once the prompt is in the cache, then :meth:`next` per logits row until
    :attr:`finish` is set, then :meth:`end` for the last chunk.
    """

    def __init__(self, vocab: Any, prompt: list[int], chain: SamplerChain, request: Request
                 ) -> None:
        self.vocab = vocab
        self.prompt = prompt
        self.chain = chain
        self.request = request
        self.timings = Timings()
        self.finish: str | None = None
        self.generated: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if request.n_logprobs is not None else None
        self._assembler = TextAssembler(request.stop)
        self._since = 0                             # first token not yet reported in a chunk
        self._parts: list[str] = []                 # every piece of text released
        self._pending = ""                          # released but not yet yielded
        self._t_start = time.perf_counter()
        self._t_gen = self._t_start
        if request.max_tokens <= 0:
            self.finish = FINISH_LENGTH

    def prompt_done(self, n_cached: int) -> None:
        """The prompt is decoded (``n_cached`` of its tokens were already in the cache)."""
        self.timings.prompt_cached = n_cached
        self.timings.prompt_n = len(self.prompt) - n_cached
        self._t_gen = time.perf_counter()
        self.timings.prompt_ms = (self._t_gen - self._t_start) * 1e3

    def cancel(self) -> None:
        self.finish = FINISH_CANCELLED

    def _piece_text(self, tok: int) -> str:
        return self.vocab.token_to_piece(tok).decode("utf-8", "ignore")

    def next(self, ctx: Any, idx: int, history: Sequence[int]) -> tuple[Chunk | None, int | None]:
        """Sample from row ``idx`` of ``ctx`` (``history``: the tokens in the sequence's cache).

        Returns the chunk to report (or None) and the token to decode next (None when the
        generation ended: :attr:`finish` is set).
        """
        request = self.request
        row = raw = ctx.get_logits_ith(idx)
        if request.logits_processor:
            if self.logprobs is not None:
                raw = row.copy()                # logprobs describe the model, not the processors
            ids = np.asarray(history, dtype=np.intc)
            for processor in request.logits_processor:
                row[:] = processor(ids, row)
        token = self.chain.sample(ctx, idx)
        if self.vocab.is_eog(token):
            self.finish = FINISH_STOP
            return None, None
        self.generated.append(token)
        if self.logprobs is not None:
            self.logprobs.append(token_logprobs(raw, token, request.n_logprobs, self._piece_text))
        self._pending += self._assembler.push(self.vocab.token_to_piece(token))
        if self._assembler.stopped or any(crit(np.asarray(list(history) + [token], dtype=np.intc), row)
                                          for crit in request.stopping_criteria):
            self.finish = FINISH_STOP
            return None, None
        if len(self.generated) >= request.max_tokens:
            self.finish = FINISH_LENGTH
            return None, None
        chunk = None
        if self._pending:
            self._parts.append(self._pending)
            chunk = Chunk(self._pending, self.generated[self._since:],
                          _slice(self.logprobs, self._since))
            self._pending, self._since = "", len(self.generated)
        return chunk, token

    def end(self) -> Chunk:
        """The last chunk: what is still held, the finish reason and the whole completion."""
        if self.finish is None:
            self.finish = FINISH_LENGTH
        pending = self._pending + self._assembler.flush()
        self._pending = ""
        self._parts.append(pending)
        self.timings.gen_n = len(self.generated)
        self.timings.gen_ms = (time.perf_counter() - self._t_gen) * 1e3
        completion = Completion("".join(self._parts), self.finish, list(self.prompt),
                                self.generated, self.logprobs, self.timings)
        return Chunk(pending, self.generated[self._since:], _slice(self.logprobs, self._since),
                     self.finish, completion)


class Drafter(Protocol):
    """What the token loop asks of speculative decoding (:class:`gguflm.speculative.Speculation`)."""

    def begin(self, prompt: Sequence[int]) -> None: ...
    def draft(self, history: Sequence[int], room: int) -> list[int]: ...
    def update(self, n_drafted: int, n_accepted: int) -> None: ...


def run(session: Session, prompt: list[int], chain: SamplerChain, request: Request,
        is_open: Callable[[], bool] = lambda: True,
        speculation: Drafter | None = None) -> Iterator[Chunk]:
    """Generate after ``prompt``; yields :class:`Chunk` objects, the last with the result.

    ``is_open()`` returning False (the owner was closed while a stream was suspended) ends the
    loop as cancelled without touching the context again.

    With ``speculation``, each generated token is decoded with a draft after it in one batch;
    the rows are sampled in order while the sampled token is the drafted one (llama.cpp's
    ``common_sampler_sample_and_accept_n``), and the cache drops the drafted tokens after the
    first that differs. The batch rounds every row as a one-token decode would, and the chain
    samples the rows it would without a draft, one per token, in order: the tokens, logprobs and
    random draws are those of generation without speculation.
    """
    gen = TokenLoop(session.ctx.model.vocab, prompt, chain, request)
    n_cached = 0
    try:
        n_cached = session.ingest(prompt)
    except Cancelled:
        gen.cancel()
    gen.prompt_done(n_cached)
    if speculation is not None:
        speculation.begin(prompt)
    draft: list[int] = []   # the drafted tokens decoded after the last generated one
    while gen.finish is None:
        # row i: the logits after the token before draft[i] (the last row: after the whole draft)
        n_rows = len(draft) + 1
        n_before = len(session.tokens) - len(draft)
        token = None
        i = 0
        for i in range(n_rows):
            if request.cancel.is_set() or not is_open():
                gen.cancel()
                break
            history = session.tokens if i == n_rows - 1 else session.tokens[:n_before + i]
            chunk, token = gen.next(session.ctx, i - n_rows, history)
            if chunk is not None:
                yield chunk
            if token is None or i == n_rows - 1 or token != draft[i]:
                break
        if draft:
            if is_open():   # a closed owner's context is not touched again
                session.truncate(n_before + i)
            speculation.update(len(draft), i)
            gen.timings.draft_n += len(draft)
            gen.timings.draft_accepted += i
        if gen.finish is not None or token is None:
            break
        draft = []
        if speculation is not None:
            room = request.max_tokens - len(gen.generated) - 1
            draft = speculation.draft(session.tokens + [token], room)
        n_decoded = len(session.tokens)
        try:
            session.step(token, draft)
        except Cancelled:
            gen.cancel()
            session.truncate(n_decoded + 1)   # the drafted tokens its finished ubatches held
    yield gen.end()


def _slice(items: list | None, start: int) -> list | None:
    return None if items is None else items[start:]
