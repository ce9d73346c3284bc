"""Generation that never blocks the caller: :meth:`LLM.generate_async` and :meth:`LLM.chat_async`.

A request runs on a worker thread of its own and hands back a :class:`Generation` at once. The
application reads it the way its UI toolkit likes:

- ``on_chunk(chunk)``: called on the worker thread for every streamed :class:`~gguflm.generate.Chunk`
  (marshal it to the UI thread: ``root.after(0, ...)`` in Tkinter, a queued signal in Qt);
- ``async for chunk in generation``: from an asyncio event loop (the worker wakes the loop);
- ``for chunk in generation``: from any other thread;
- ``generation.result()``: wait for the :class:`~gguflm.generate.Completion`.

``cancel()`` sets the request's own cancel token (:attr:`gguflm.generate.Request.cancel`), which
stops it within one decode step once it runs (the context's abort callback is checked between
the ubatches of a long prompt and between the layers of every step), or before it starts; it
ends with finish_reason ``"cancelled"``. The LLM still serialises requests: a second one waits
for the first on its worker thread, never on the caller's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from gguflm.generate import Chunk, Completion

log = logging.getLogger(__name__)


class Generation:
    """A request running on its own thread: ``stream`` (its chunks) is read there, and ``cancel``
    is the request's own cancel token. Create with :meth:`LLM.generate_async` or
    :meth:`LLM.chat_async`."""

    def __init__(self, stream: Iterator[Chunk], cancel: threading.Event,
                 on_chunk: Callable[[Chunk], object] | None = None,
                 on_done: Callable[[Generation], object] | None = None) -> None:
        self._stream = stream
        self._on_chunk = on_chunk
        self._on_done = on_done
        self._cancelled = cancel
        self._cond = threading.Condition()
        self._chunks: list[Chunk] = []
        self._finished = False
        self._result: Completion | None = None
        self._error: BaseException | None = None
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._thread = threading.Thread(target=self._work, name="gguflm-generation", daemon=True)
        self._thread.start()

    # -- the worker

    def _work(self) -> None:
        try:
            for chunk in self._stream:
                with self._cond:
                    self._chunks.append(chunk)
                    if chunk.completion is not None:
                        self._result = chunk.completion
                    self._cond.notify_all()
                self._wake()
                if self._on_chunk is not None:
                    self._call(self._on_chunk, chunk)
        except BaseException as exc:  # handed to whoever waits for the result
            self._error = exc
            log.debug("generation failed: %r", exc)
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()
            self._wake()
            if self._on_done is not None:
                self._call(self._on_done, self)

    def _call(self, callback: Callable[..., object], arg: object) -> None:
        try:
            callback(arg)
        except Exception:  # an application's callback must not kill the request
            log.exception("generation callback %r failed", callback)

    def _wake(self) -> None:
        with self._cond:
            wakers, self._wakers = self._wakers, []
        for loop, event in wakers:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop was closed meanwhile
                pass

    # -- the caller's side

    def cancel(self) -> None:
        """Stop the request (from any thread): within one decode step, also in a long prompt."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        """The request ended (finished, cancelled or failed)."""
        return self._finished

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the request ends; False if ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._finished, timeout)

    def result(self, timeout: float | None = None) -> Completion:
        """The completion (waiting for it); raises what the request raised, or TimeoutError."""
        if not self.wait(timeout):
            raise TimeoutError(f"the generation did not end within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    @property
    def text(self) -> str:
        """The text streamed so far."""
        with self._cond:
            return "".join(c.text for c in self._chunks)

    def __iter__(self) -> Iterator[Chunk]:
        """Every chunk, from the first, blocking between them (not for a UI thread)."""
        i = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: i < len(self._chunks) or self._finished)
                if i >= len(self._chunks):
                    break
                chunk = self._chunks[i]
            i += 1
            yield chunk
        if self._error is not None:
            raise self._error

    async def _chunks_async(self) -> AsyncIterator[Chunk]:
        loop = asyncio.get_running_loop()
        i = 0
        while True:
            event = asyncio.Event()
            with self._cond:
                ready = self._chunks[i:]
                finished = self._finished
                if not ready and not finished:
                    self._wakers.append((loop, event))
            for chunk in ready:
                i += 1
                yield chunk
            if not ready:
                if finished:
                    break
                await event.wait()
        if self._error is not None:
            raise self._error

    def __aiter__(self) -> AsyncIterator[Chunk]:
        """Every chunk, from the first, awaiting between them without blocking the event loop."""
        return self._chunks_async()

    def __repr__(self) -> str:
        state = "done" if self._finished else "cancelling" if self.cancelled else "running"
        return f"<Generation {state}, {len(self._chunks)} chunks>"

