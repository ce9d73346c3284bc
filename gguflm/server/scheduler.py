"""Parallel slots and continuous batching over one context, as llama.cpp's server runs them.

The context holds ``n_slots`` sequences, by default each in its own region of the KV cache
(``kv_unified=False``, as llama.cpp's server), so a slot's cells stay in position order whatever
the other slots do. One scheduler thread loops: it hands queued tasks to free slots, then builds one batch from every
busy slot (first the single tokens of the slots that are generating, then prompt chunks of the
slots still reading their prompt, up to ``n_batch`` tokens), decodes it, and samples each slot's
next token from its row of the outputs. A request that arrives while others generate starts at
the next step; its prompt shares the batch with their tokens. Requests with other LoRA adapter
scales (a request's ``lora``, or the server's scales when it came) never share a batch, as in
llama.cpp's server: each step serves the scales of the slot that waited longest for a step, and
the context takes them (which drops its recorded passes when they change).

With separate regions and an f32 or q8_0 KV cache a request's tokens do not depend on the other
requests (attention then runs one token at a time over that token's cells, and the matmuls give
each token the same floats at any batch width). With an f16 cache a batch of several tokens
takes ggml's batched rounding of the scores (llamafile's sgemm) where a lone token takes its dot
product's, so a greedy reply may differ from the one it gets alone once two candidates are within
rounding of each other, as with llama.cpp's server. Nor does the independence hold for every
model: gemma-3-270m (Q4_K_M) gives a prompt's last token logits up to 0.70 apart when another
sequence shares its batch (llama.cpp's are the same floats as ours, alone and shared), so a
sampled reply there may depend on what shares its steps.

A slot keeps its cache after its request ends: a new task goes to the free slot whose cached
tokens share the longest prefix with its prompt (a follow-up chat turn finds its conversation), and
only the rest of the prompt is decoded. A cancelled task (its client went away) is dropped before
the next batch is built, so its slot is free within one decode step. With ``cache_reuse`` (the
server's ``--cache-reuse N``) the slot also keeps cached chunks of at least N tokens that the
prompt repeats further on, moved into place (:mod:`gguflm.server.cache_reuse`).

Other work on the context (``/slots`` and its save, restore and erase) is handed to the loop with
:meth:`Scheduler.call` and runs between two steps, once the slot it names is free.

With speculative decoding (``speculation``, llama-server's ``--model-draft`` / ``--spec-type``)
each slot has its own proposer: a generating slot's token goes into the batch with a draft after
it, every row with logits, and the slot samples its rows in order while the sampled token is
the drafted one (as :func:`gguflm.generate.run` does alone); the cache then drops the rejected
tail. Drafts of several slots are checked in one batch, in steps that read no prompt, each row
rounded as a one-token pass (``Context.decode``'s ``per_token``): with the f32 cache a slot's
tokens, greedy or seeded, are the same with and without drafts.

A request for ``n`` choices is one task with ``n - 1`` children (llama.cpp's server's ``n_cmpl``):
it waits for ``n`` free slots, the parent reads the prompt, and once its last prompt token is
decoded each child's slot gets a copy of the parent's cells (``seq_cp``) and samples its first
token from the parent's logits row, then generates on its own.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gguflm.batch import Batch
from gguflm.errors import Error
from gguflm.generate import FINISH_CANCELLED, FINISH_LENGTH, Chunk, Session, TokenLoop
from gguflm.openai_compat import PreparedRequest
from gguflm.server.cache_reuse import keep_cached
from gguflm.speculative import SlotSpeculation, Speculation

log = logging.getLogger("gguflm.server")

__all__ = ["Scheduler", "Task", "SchedulerStats"]

_task_ids = itertools.count()


class Task:
    """One request queued on (or running in) a :class:`Scheduler`.

    ``emit`` is called from the scheduler thread with each :class:`Chunk` (the last has
    ``finish_reason`` and the completion) or, if the request fails, with the exception.
    """

    def __init__(self, prepared: PreparedRequest, emit: Callable[[Chunk | BaseException], None],
                 children: list[Task] | None = None, lora: tuple[float, ...] = ()) -> None:
        self.id = next(_task_ids)
        self.prepared = prepared
        self.lora = lora     # the scale of each of the LLM's LoRA adapters
        self.emit = emit
        # more choices of the same prompt: they run in their own slots on a copy of this one's cells
        self.children = children or []
        self.cancelled = False
        self.t_queued = time.perf_counter()
        self.slot: int | None = None
        self.cancel_step: int | None = None     # decode steps done when it was cancelled
        self.freed_step: int | None = None      # decode steps done when its slot was freed


@dataclass
class SchedulerStats:
    """Counters since the scheduler started (read by ``/metrics``)."""

    requests: int = 0
    requests_cancelled: int = 0
    prompt_tokens: int = 0          # prompt tokens decoded (cached ones not counted)
    prompt_tokens_cached: int = 0   # prompt tokens whose cells a slot kept
    prompt_seconds: float = 0.0     # decode time of steps that carried prompt tokens
    generated_tokens: int = 0
    generation_seconds: float = 0.0  # decode time of steps that carried only generated tokens
    steps: int = 0
    busy_seconds: float = 0.0
    busy_slot_steps: int = 0        # busy slots summed over the steps
    n_tokens_max: int = 0           # the longest sequence a slot held (prompt and reply)
    drafted_tokens: int = 0         # drafted tokens checked (speculative decoding)
    drafted_accepted: int = 0       # ... of which the model took
    batch_tokens: list[int] = field(default_factory=list)
    # the same since the last scrape of /metrics (its throughput gauges), as llama.cpp's buckets
    window: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_WINDOW, 0))

    def take_window(self) -> dict[str, float]:
        """The window's counts, and a new window."""
        window, self.window = self.window, dict.fromkeys(_WINDOW, 0)
        return window


_WINDOW = ("prompt_tokens", "prompt_seconds", "generated_tokens", "generation_seconds")


class _Slot:
    def __init__(self, index: int, session: Session, speculation: Speculation | None) -> None:
        self.index = index
        self.session = session          # the sequence's cached tokens
        self.speculation = speculation  # its own drafts (None: no speculative decoding)
        self.draft: list[int] = []      # drafted tokens in this step's batch, after next_token
        self.i_draft = -1               # the batch row of the first of them
        self.task: Task | None = None
        self.gen: TokenLoop | None = None
        self.n_cached = 0               # prompt tokens reused from the cache
        self.next_token: int | None = None
        self.i_batch = -1               # the batch row of this slot's logits in this step
        self.t_last = 0.0
        self.waiting_for: _Slot | None = None   # a child's parent, until the prompt is copied
        self.last_step = -1             # the decode step that last served it (whose LoRA scales go next)
        self.lora: tuple[float, ...] = ()   # the LoRA scales its cached tokens were computed with
        self.last: tuple[Task | None, TokenLoop | None] = (None, None)   # what it ran last (/slots)

    @property
    def reading_prompt(self) -> bool:
        return (self.task is not None and self.waiting_for is None
                and len(self.session.tokens) < len(self.task.prepared.tokens))


class Scheduler:
    """Runs :class:`Task` objects on the slots of ``llm``'s context (see the module docstring).

    Parameters
    ----------
    llm
        A :class:`gguflm.LLM` made with ``n_seq_max=n_slots``. The scheduler owns its context.
    cache_reuse
        The shortest cached chunk moved to reuse it after the common prefix (0: none).
    speculation
        A draft proposer per slot (None: no speculative decoding); the scheduler does not close it.
    """

    def __init__(self, llm: Any, cache_reuse: int = 0, speculation: SlotSpeculation | None = None) -> None:
        self.llm = llm
        self.cache_reuse = cache_reuse
        self.ctx = llm.context
        self.vocab = llm.model.vocab
        self.n_slots = self.ctx.n_seq_max
        self.n_ctx_slot = self.ctx.n_ctx // self.n_slots
        self.n_batch = self.ctx.n_batch
        drafts = speculation.slots if speculation is not None else [None] * self.n_slots
        self._slots = [_Slot(i, Session(self.ctx, seq_id=i), drafts[i]) for i in range(self.n_slots)]
        self.adapters = llm.lora_adapters
        self._queue: deque[Task] = deque()
        self._calls: list[tuple[int | None, Callable[[_Slot | None], Any], Future]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._batch = Batch(self.n_batch)
        self.stats = SchedulerStats()
        self.t_start = time.time()
        self._thread = threading.Thread(target=self._loop, name="gguflm-scheduler", daemon=True)
        self._thread.start()

    # -- requests

    def submit(self, task: Task) -> None:
        """Queue ``task`` (and its children); it starts as soon as enough slots are free."""
        if 1 + len(task.children) > self.n_slots:
            raise Error(f"{1 + len(task.children)} choices need as many slots; the server has "
                        f"{self.n_slots}")
        with self._cond:
            if self._stopping:
                raise Error("the server is shutting down")
            self._queue.append(task)
            self.stats.requests += 1 + len(task.children)
            self._cond.notify()

    def call(self, fn: Callable[[Any], Any], slot: int | None = None) -> Future:
        """Run ``fn`` in the scheduler's thread between two steps: ``fn(slot)`` once slot ``slot``
        is free (it gets the slot's state: ``index``, ``session``, ``task``, ``last``), else
        ``fn(None)``. The future holds its result or exception."""
        if slot is not None and not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} out of range [0, {self.n_slots})")
        future: Future = Future()
        with self._cond:
            if self._stopping:
                raise Error("the server is shutting down")
            self._calls.append((slot, fn, future))
            self._cond.notify()
        return future

    def slot_states(self) -> list[Any]:
        """The slots (for :meth:`call`'s functions, in the scheduler's thread)."""
        return list(self._slots)

    def cancel(self, task: Task) -> None:
        """Stop ``task`` and its children (from any thread): their slots are freed before the
        next batch is built."""
        with self._cond:
            for t in (task, *task.children):
                if not t.cancelled:
                    t.cancelled = True
                    t.cancel_step = self.stats.steps
            self._cond.notify()

    @property
    def slots_busy(self) -> int:
        return sum(s.task is not None for s in self._slots)

    def cancel_all(self) -> None:
        """Cancel every running and queued task (a shutdown's deadline is near): each ends as
        cancelled, its stream with its last event."""
        with self._cond:
            tasks = [s.task for s in self._slots if s.task is not None] + list(self._queue)
        for task in tasks:
            self.cancel(task)

    def idle(self) -> bool:
        """Nothing running, queued or waiting to run (a model may be unloaded)."""
        with self._cond:
            return not self._queue and not self._calls and self.slots_busy == 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def kv_cells_used(self) -> int:
        return sum(c.n_used for c in self.ctx.memory.caches)

    def kv_cells_total(self) -> int:
        return sum(c.size for c in self.ctx.memory.caches)

    def close(self, timeout: float | None = None) -> None:
        """Stop: cancel running and queued tasks and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    # -- the loop

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while (not self._stopping and not self._queue and not self._calls
                           and self.slots_busy == 0):
                        self._cond.wait()
                    if self._stopping:
                        break
                    calls = [c for c in self._calls
                             if c[0] is None or self._slots[c[0]].task is None]
                    self._calls = [c for c in self._calls if c not in calls]
                self._run(calls)
                with self._cond:
                    self._assign()
                self._drop_cancelled()
                self._step()
        except BaseException as exc:   # never die silently: fail what is running
            log.exception("scheduler failed")
            self._fail_all(exc)
            raise
        self._fail_all(None)

    def _run(self, calls: list[tuple[int | None, Callable[[Any], Any], Future]]) -> None:
        for slot, fn, future in calls:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(None if slot is None else self._slots[slot]))
                except Exception as exc:     # the caller's to report
                    future.set_exception(exc)

    def _assign(self) -> None:
        """Queued tasks to free slots: the one caching the longest prefix of the prompt, else
        the one idle longest."""
        while self._queue:
            task = self._queue[0]
            if task.cancelled:
                self._queue.popleft()
                self._finish_unstarted(task)
                continue
            free = [s for s in self._slots if s.task is None]
            if len(free) < 1 + len(task.children):
                return
            self._queue.popleft()
            prompt = task.prepared.tokens
            # a cache computed with other LoRA scales is no prefix of this prompt's (llama.cpp's
            # server clears it too)
            slot = max(free, key=lambda s: (s.session.reusable_prefix(prompt) if s.lora == task.lora else 0,
                                            -s.t_last))
            slot.n_cached = keep_cached(slot.session, prompt if slot.lora == task.lora else (), self.cache_reuse)
            self._start(slot, task)
            free.remove(slot)
            for child in task.children:     # the slots idle longest
                child_slot = min(free, key=lambda s: s.t_last)
                free.remove(child_slot)
                child_slot.session.reset()
                child_slot.waiting_for = slot
                self._start(child_slot, child)

    def _start(self, slot: _Slot, task: Task) -> None:
        slot.task, task.slot = task, slot.index
        slot.last_step = self.stats.steps
        slot.lora = task.lora
        slot.gen = TokenLoop(self.vocab, task.prepared.tokens, task.prepared.chain,
                             task.prepared.request)
        slot.next_token = None
        if slot.speculation is not None:
            slot.speculation.begin(task.prepared.tokens)

    def _drop_cancelled(self) -> None:
        for slot in self._slots:
            if slot.task is not None and slot.task.cancelled:
                slot.gen.cancel()
                self._end(slot)

    def _step(self) -> bool:
        """Build one batch from every busy slot, decode it, sample; False if there was nothing."""
        batch = self._batch
        batch.clear()
        busy = self._same_adapters([s for s in self._slots if s.task is not None])
        for slot in busy:
            slot.i_batch = -1
            slot.draft = []
            if slot.next_token is not None:
                slot.i_batch = batch.n_tokens
                batch.add(slot.next_token, len(slot.session.tokens), [slot.index], True)
        n_generated = batch.n_tokens
        # drafts after every slot's own token (so each slot has its row), in steps that read no
        # prompt: such a step rounds each row as a one-token pass (the replies are those without
        # drafts), where a prompt must round as a batch
        if not any(slot.reading_prompt for slot in busy):
            for slot in busy:
                if slot.next_token is not None and slot.speculation is not None:
                    self._add_draft(slot, batch)
        drafted = any(slot.draft for slot in busy)
        chunks: dict[int, list[int]] = {}
        for slot in busy:
            if not slot.reading_prompt:
                continue
            room = self.n_batch - batch.n_tokens
            if room <= 0:
                break
            prompt = slot.task.prepared.tokens
            start = len(slot.session.tokens)
            chunk = prompt[start:start + room]
            for j, token in enumerate(chunk):
                last = start + j == len(prompt) - 1
                if last:
                    slot.i_batch = batch.n_tokens
                batch.add(token, start + j, [slot.index], last)
            chunks[slot.index] = chunk
        if batch.n_tokens == 0:
            return False

        for slot in busy:
            slot.last_step = self.stats.steps
        t0 = time.perf_counter()
        status = self.ctx.decode(batch, per_token=drafted)
        elapsed = time.perf_counter() - t0
        stats = self.stats
        stats.steps += 1
        stats.busy_seconds += elapsed
        stats.busy_slot_steps += len(busy)
        stats.batch_tokens.append(batch.n_tokens)
        del stats.batch_tokens[:-64]
        counts = {"generated_tokens": n_generated}
        if chunks:
            counts.update(prompt_tokens=sum(len(c) for c in chunks.values()), prompt_seconds=elapsed)
        else:
            counts["generation_seconds"] = elapsed
        for name, value in counts.items():
            setattr(stats, name, getattr(stats, name) + value)
            stats.window[name] += value
        if status != 0:
            error = Error(f"decode failed (status {status}) for a batch of {batch.n_tokens} tokens")
            for slot in busy:
                if slot.i_batch >= 0 or slot.index in chunks:
                    self._fail(slot, error)
            return True

        for slot in busy:
            if slot.next_token is not None:
                slot.session.tokens.append(slot.next_token)
                slot.session.tokens.extend(slot.draft)
                slot.next_token = None
            if slot.index in chunks:
                slot.session.tokens.extend(chunks[slot.index])
                if not slot.reading_prompt:
                    slot.gen.prompt_done(slot.n_cached)
                    stats.prompt_tokens_cached += slot.n_cached
                    self._copy_to_children(slot)
            stats.n_tokens_max = max(stats.n_tokens_max, len(slot.session.tokens))
        for slot in busy:
            if slot.i_batch < 0 or slot.task is None:
                continue
            try:
                token = self._sample(slot)
            except Exception as exc:      # a sampler or grammar failure ends this request only
                self._fail(slot, exc)
                continue
            if token is None:
                self._end(slot)
            elif len(slot.session.tokens) + 1 > self.n_ctx_slot:
                slot.gen.finish = FINISH_LENGTH    # the slot's share of the context is full
                self._end(slot)
            else:
                slot.next_token = token
        return True

    def _add_draft(self, slot: _Slot, batch: Batch) -> None:
        """Draft after the slot's next token, as far as the batch, the request and the slot's
        share of the context leave room; the drafted tokens go into the batch with logits."""
        n_tokens = len(slot.session.tokens)
        room = min(self.n_batch - batch.n_tokens, self.n_ctx_slot - n_tokens - 2,
                   slot.gen.request.max_tokens - len(slot.gen.generated) - 1)
        if room < 1:
            return
        slot.draft = slot.speculation.draft(slot.session.tokens + [slot.next_token], room)
        slot.i_draft = batch.n_tokens
        for pos, token in enumerate(slot.draft, n_tokens + 1):
            batch.add(token, pos, [slot.index], True)

    def _sample(self, slot: _Slot) -> int | None:
        """Sample the slot's rows: its token's (i_batch), then each drafted token's while the
        sampled token is the drafted one. Emits what the samples make; the cache drops the
        drafted tokens after the first that differs. The next token, or None when the request
        is done."""
        draft, tokens = slot.draft, slot.session.tokens
        rows = [slot.i_batch, *range(slot.i_draft, slot.i_draft + len(draft))]
        n_before = len(tokens) - len(draft)    # through the token whose row is i_batch
        token, i = None, 0
        for i, row in enumerate(rows):
            history = tokens if i == len(draft) else tokens[:n_before + i]
            chunk, token = slot.gen.next(self.ctx, row, history)
            if chunk is not None:
                slot.task.emit(chunk)
            if token is None or i == len(draft) or token != draft[i]:
                break
        if draft:
            slot.session.truncate(n_before + i)
            slot.speculation.update(len(draft), i)
            slot.gen.timings.draft_n += len(draft)
            slot.gen.timings.draft_accepted += i
            self.stats.drafted_tokens += len(draft)
            self.stats.drafted_accepted += i
        return token

    def _copy_to_children(self, parent: _Slot) -> None:
        """The parent's prompt is in: its children's slots get its cells and its logits row."""
        for slot in self._slots:
            if slot.waiting_for is parent:
                self.ctx.memory.seq_rm(slot.index, -1, -1)
                self.ctx.memory.seq_cp(parent.index, slot.index, -1, -1)
                slot.session.tokens = list(parent.session.tokens)
                slot.n_cached = parent.n_cached
                slot.gen.prompt_done(parent.n_cached)
                slot.i_batch = parent.i_batch
                slot.waiting_for = None

    def _same_adapters(self, busy: list[_Slot]) -> list[_Slot]:
        """The busy slots whose requests use the LoRA scales of the one that waited longest for
        a step; the context takes those scales."""
        if not busy or not self.adapters:
            return busy
        lora = min(busy, key=lambda s: (s.last_step, s.index)).task.lora
        self.ctx.set_adapters_lora(self.adapters, list(lora))
        return [s for s in busy if s.task.lora == lora]

    # -- endings

    def _end(self, slot: _Slot) -> None:
        task, gen = slot.task, slot.gen
        self._release(slot)
        for child in self._waiting_on(slot):     # the prompt never finished: nor do they
            child.gen.cancel()
            self._end(child)
        if gen.finish == FINISH_CANCELLED:
            self.stats.requests_cancelled += 1
        task.freed_step = self.stats.steps
        task.emit(gen.end())

    def _fail(self, slot: _Slot, exc: BaseException) -> None:
        task = slot.task
        slot.session.reset()     # what the cache holds for it is unknown
        self._release(slot)
        for child in self._waiting_on(slot):
            self._fail(child, exc)
        task.emit(exc)

    def _waiting_on(self, parent: _Slot) -> list[_Slot]:
        return [s for s in self._slots if s.waiting_for is parent]

    def _release(self, slot: _Slot) -> None:
        slot.last = (slot.task, slot.gen)
        slot.task = slot.gen = None
        slot.waiting_for = None
        slot.next_token = None
        slot.draft = []
        slot.i_batch = -1
        slot.t_last = time.perf_counter()

    def _finish_unstarted(self, task: Task) -> None:
        for t in (task, *task.children):
            gen = TokenLoop(self.vocab, t.prepared.tokens, t.prepared.chain, t.prepared.request)
            gen.cancel()
            self.stats.requests_cancelled += 1
            t.emit(gen.end())

    def _fail_all(self, exc: BaseException | None) -> None:
        for slot in self._slots:
            if slot.task is not None:
                if exc is None:
                    slot.gen.cancel()
                    self._end(slot)
                else:
                    self._fail(slot, exc)
        with self._cond:
            queued, self._queue = list(self._queue), deque()
            calls, self._calls = self._calls, []
        for task in queued:
            self._finish_unstarted(task)
        for _, _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(Error("the server is shutting down"))
