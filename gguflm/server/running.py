"""Running prepared requests on the scheduler for a route: the choices of one request as one task
group, waited for whole (with the client's disconnect cancelling them) or streamed as server-sent
events. Every API's routes (OpenAI chat and completions, Responses, Anthropic Messages) use it and
shape the :class:`~gguflm.generate.Completion` objects or chunk streams their own way.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gguflm.errors import Error
from gguflm.generate import Chunk, Completion
from gguflm.openai_compat import PreparedRequest
from gguflm.server.protocol import RequestError
from gguflm.server.scheduler import Scheduler, Task

log = logging.getLogger("gguflm.server")

T = TypeVar("T")

__all__ = ["Disconnected", "complete", "stream", "sse", "interleave"]


class Disconnected(Exception):
    """The client went away before the reply was ready."""


def _group(prepared: list[PreparedRequest], emits: list[Callable[[Any], None]], lora: tuple[float, ...]) -> Task:
    children = [Task(p, emit, lora=lora) for p, emit in zip(prepared[1:], emits[1:])]
    return Task(prepared[0], emits[0], children, lora)


def _submit(scheduler: Scheduler, task: Task) -> None:
    try:
        scheduler.submit(task)
    except Error as exc:       # shutting down
        raise RequestError(str(exc), status=503, type="server_error") from None


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def complete(request: Request, scheduler: Scheduler, prepared: list[PreparedRequest],
                   lora: tuple[float, ...]) -> list[Completion]:
    """Run the choices ``prepared`` (sharing the first one's prompt) to their ends, with the LoRA
    adapters at the scales ``lora``.

    Raises :class:`Disconnected` (the tasks cancelled) if the client goes away first, and the
    exception of a choice that failed.
    """
    loop = asyncio.get_running_loop()
    results: list[asyncio.Future] = [loop.create_future() for _ in prepared]

    def emitter(done: asyncio.Future) -> Callable[[Any], None]:
        def emit(item: Chunk | BaseException) -> None:
            if isinstance(item, BaseException) or item.finish_reason is not None:
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(item))
        return emit

    task = _group(prepared, [emitter(f) for f in results], lora)
    _submit(scheduler, task)
    everything = asyncio.ensure_future(asyncio.wait(results))
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({everything, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not all(f.done() for f in results):     # the client went away (or we are cancelled)
            scheduler.cancel(task)
            everything.cancel()
    if not all(f.done() for f in results):
        raise Disconnected()
    completions = []
    for f in results:
        item = f.result()
        if isinstance(item, BaseException):
            raise item
        completions.append(item.completion)
    return completions


def interleave(iterators: list[Iterator[T]]) -> Iterator[tuple[int, T]]:
    """The items of several blocking iterators (the choices' streams) as each arrives, with the
    index of its iterator; each iterator runs in its own thread (one runs in the caller's). The
    first exception raised by any of them is raised here."""
    if len(iterators) == 1:
        for item in iterators[0]:
            yield 0, item
        return
    items: queue.SimpleQueue = queue.SimpleQueue()
    done = object()

    def drain(i: int, iterator: Iterator[T]) -> None:
        try:
            for item in iterator:
                items.put((i, item))
            items.put((i, done))
        except BaseException as exc:     # handed to the consumer
            items.put((i, exc))

    for i, iterator in enumerate(iterators):
        threading.Thread(target=drain, args=(i, iterator), name="gguflm-choice", daemon=True).start()
    running = len(iterators)
    while running:
        i, item = items.get()
        if item is done:
            running -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield i, item


def sse(data: str, event: str | None = None) -> str:
    """One server-sent event."""
    return (f"event: {event}\n" if event else "") + f"data: {data}\n\n"


def stream(scheduler: Scheduler, prepared: list[PreparedRequest], lora: tuple[float, ...],
           events: Callable[[list[Iterator[Chunk]]], Iterator[str]]) -> Response:
    """Stream the choices ``prepared`` (LoRA scales ``lora``): ``events`` turns their chunk streams (one per choice,
    each ending with the chunk that holds the completion) into server-sent events (see
    :func:`sse`). It runs in a worker thread, as reading a chunk waits for the scheduler; a choice
    that fails raises from its stream."""
    queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in prepared]
    task = _group(prepared, [q.put for q in queues], lora)
    _submit(scheduler, task)

    def source(chunks: queue.SimpleQueue) -> Iterator[Chunk]:
        while True:
            item = chunks.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finish_reason is not None:
                return

    lines = events([source(q) for q in queues])

    async def body() -> AsyncIterator[str]:
        try:
            while True:
                # the wait for the scheduler happens in a worker thread; a cancel (the client went
                # away, or the shutdown deadline passed) abandons it at once, and the task's end
                # then releases that thread
                line = await anyio.to_thread.run_sync(next, lines, None, abandon_on_cancel=True)
                if line is None:
                    return
                yield line
        finally:
            scheduler.cancel(task)

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
