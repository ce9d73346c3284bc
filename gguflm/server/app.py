"""The ASGI application: OpenAI's endpoints over a :class:`~gguflm.server.scheduler.Scheduler`.

Generation requests are prepared by :class:`gguflm.LLM` (the same tokens, sampler chain and dict
shapes as ``create_completion``/``create_chat_completion``; see :mod:`gguflm.openai_compat`) in
a worker thread, then run by the scheduler in its shared batches. Streams are server-sent events
(one ``data:`` line per chunk, then ``data: [DONE]``); a client that goes away cancels its task.
Embeddings (``--embedding``) run through :meth:`gguflm.LLM.create_embedding`, one request at a
time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import queue
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gguflm.chat import ChatTemplateError
from gguflm.errors import Error
from gguflm.generate import Chunk
from gguflm.openai_compat import PreparedRequest
from gguflm.server import metrics, protocol
from gguflm.server.protocol import RequestError
from gguflm.server.scheduler import Scheduler, Task

log = logging.getLogger("gguflm.server")

__all__ = ["create_app"]

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})   # answered without the API key


class _Server:
    """What the routes share: the LLM, its scheduler (None with embeddings) and the settings."""

    def __init__(self, llm: Any, alias: str, api_key: str | None, shutdown_timeout: float) -> None:
        self.llm = llm
        self.shutdown_timeout = shutdown_timeout
        self.alias = alias
        self.api_key = api_key
        self.scheduler = None if llm.embedding else Scheduler(llm)
        # the LoRA scales of requests that give none (POST /lora-adapters sets them)
        self.lora_scales = list(llm.lora_scales)
        self.created = int(time.time())
        self.http_requests: dict[tuple[str, int], int] = {}

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        self.llm.close()

    def prepare(self, kind: str, args: dict[str, Any]) -> PreparedRequest:
        """Run in a worker thread: tokenize, render the template, build the sampler chain."""
        llm, scheduler = self.llm, self.scheduler
        args["model"] = args["model"] or self.alias
        try:
            prepared = (llm.prepare_completion(**args) if kind == "completion"
                        else llm.prepare_chat_completion(**args))
        except (ValueError, TypeError, Error, ChatTemplateError) as exc:
            if "exceed context window" in str(exc):      # LLM's check against the whole context
                raise self._too_long(kind, None, str(exc)) from None
            raise RequestError(str(exc)) from None
        n_prompt, n_ctx_slot = len(prepared.tokens), scheduler.n_ctx_slot
        if n_prompt >= n_ctx_slot:
            raise self._too_long(kind, n_prompt, None)
        prepared.request.max_tokens = min(prepared.request.max_tokens, n_ctx_slot - n_prompt)
        return prepared

    def lora(self, entries: Any, param: str) -> tuple[float, ...]:
        """A request's ``lora`` ([{"id", "scale"}], llama.cpp's server's): each adapter's scale,
        0 for those it does not name; the server's scales when None."""
        if entries is None:
            return tuple(self.lora_scales)
        scales = [0.0] * len(self.lora_scales)
        for entry in entries:
            ok = isinstance(entry, dict) and isinstance(entry.get("id"), int) and not isinstance(entry["id"], bool)
            if not ok or not 0 <= entry["id"] < len(scales) or not isinstance(entry.get("scale", 0.0), (int, float)):
                raise RequestError(f"{param}: each entry must be {{\"id\": an adapter id below {len(scales)}, "
                                   f"\"scale\": a number}}", param=param)
            scales[entry["id"]] = float(entry.get("scale", 0.0))
        return tuple(scales)

    def _too_long(self, kind: str, n_prompt: int | None, detail: str | None) -> RequestError:
        n_ctx_slot = self.scheduler.n_ctx_slot
        message = detail or (f"the prompt has {n_prompt} tokens; a slot's context holds "
                             f"{n_ctx_slot} (prompt and reply)")
        return RequestError(message, param="prompt" if kind == "completion" else "messages",
                            code="context_length_exceeded")


# -- helpers

async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"could not parse the JSON body: {exc}") from None


def _server(request: Request) -> _Server:
    return request.app.state.server


def _need_generation(server: _Server) -> Scheduler:
    if server.scheduler is None:
        raise RequestError("this server computes embeddings (--embedding): start it without "
                           "--embedding to generate text", status=501, type="not_supported_error")
    return server.scheduler


def _need_embedding(server: _Server) -> None:
    if not server.llm.embedding:
        raise RequestError("this server generates text: start it with --embedding for embeddings",
                           status=501, type="not_supported_error")


# -- generation

async def _generate(request: Request, kind: str, parsed: tuple[dict, bool, dict]) -> Response:
    server = _server(request)
    scheduler = _need_generation(server)
    args, stream, fields = parsed
    lora = server.lora(fields["lora"], "lora")
    prepared = await run_in_threadpool(server.prepare, kind, args)
    if stream:
        return _stream(scheduler, prepared, protocol.stream_include_usage(fields), lora)

    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def emit(item: Chunk | BaseException) -> None:
        if isinstance(item, BaseException) or item.finish_reason is not None:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(item))

    task = Task(prepared, emit, lora)
    _submit(scheduler, task)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({done, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not done.done():        # the client went away (or we are being cancelled)
            scheduler.cancel(task)
    if not done.done():
        return Response(status_code=499)
    item = done.result()
    if isinstance(item, BaseException):
        raise item
    return JSONResponse(prepared.respond(item.completion, False))


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


def _stream(scheduler: Scheduler, prepared: PreparedRequest, include_usage: bool, lora: tuple[float, ...]) -> Response:
    chunks: queue.SimpleQueue = queue.SimpleQueue()
    task = Task(prepared, chunks.put, lora)
    _submit(scheduler, task)
    lines = _sse_lines(prepared, chunks, include_usage)

    async def events() -> AsyncIterator[str]:
        try:
            while True:
                # the wait for the scheduler happens in a worker thread; a cancel (the client went
                # away, or the shutdown deadline passed) abandons it at once, and the task's end
                # then releases that thread
                line = await anyio.to_thread.run_sync(next, lines, None, abandon_on_cancel=True)
                if line is None:
                    return
                yield f"data: {line}\n\n"
        finally:
            scheduler.cancel(task)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse_lines(prepared: PreparedRequest, chunks: queue.SimpleQueue, include_usage: bool
               ) -> Iterator[str]:
    """The data lines of a stream (run in a worker thread: it waits for the scheduler)."""
    last: list[Chunk] = []

    def source() -> Iterator[Chunk]:
        while True:
            item = chunks.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finish_reason is not None:
                last.append(item)
                return

    try:
        first = None
        for shaped in prepared.respond(source(), True):
            first = first or shaped
            yield json.dumps(shaped)
        if include_usage and last and first is not None:
            usage = {key: first[key] for key in ("id", "object", "created", "model") if key in first}
            yield json.dumps({**usage, "choices": [], "usage": last[0].completion.usage})
    except Exception as exc:    # the request failed after the stream began: say so, then end
        log.warning("stream %s failed: %s", prepared.id, exc)
        yield json.dumps(protocol.error_body(str(exc), "server_error"))
        return
    yield "[DONE]"


# -- routes

async def completions(request: Request) -> Response:
    return await _generate(request, "completion", protocol.completion_arguments(await _json_body(request)))


async def chat_completions(request: Request) -> Response:
    return await _generate(request, "chat", protocol.chat_arguments(await _json_body(request)))


async def embeddings(request: Request) -> Response:
    server = _server(request)
    _need_embedding(server)
    texts, single, model, encoding = protocol.embedding_input(await _json_body(request))
    try:
        result = await run_in_threadpool(server.llm.create_embedding, texts[0] if single else texts,
                                         model or server.alias)
    except ValueError as exc:
        raise RequestError(str(exc), param="input") from None
    if encoding == "base64":    # OpenAI's: the float32 values' little-endian bytes
        for item in result["data"]:
            item["embedding"] = base64.b64encode(
                np.asarray(item["embedding"], dtype="<f4").tobytes()).decode("ascii")
    return JSONResponse(result)


async def models(request: Request) -> Response:
    server = _server(request)
    llm = server.llm
    meta = {"n_vocab": llm.n_vocab(), "n_ctx_train": llm.model.hparams.n_ctx_train,
            "n_embd": llm.n_embd(), "n_params": llm.model.n_params if hasattr(llm.model, "n_params") else None,
            "size": Path(llm.model_path).stat().st_size}
    return JSONResponse({"object": "list", "data": [
        {"id": server.alias, "object": "model", "created": server.created, "owned_by": "gguflm",
         "meta": meta}]})


async def lora_adapters(request: Request) -> Response:
    """GET: the LoRA adapters loaded at start, with the scales of requests that give none;
    POST [{"id", "scale"}]: set those scales (the adapters it does not name: 0), as llama.cpp's
    server."""
    server = _server(request)
    if request.method == "POST":
        body = await _json_body(request)
        if not isinstance(body, list):
            raise RequestError("the request body must be an array of {\"id\", \"scale\"}")
        server.lora_scales = list(server.lora(body, "body"))
        return JSONResponse({"success": True})
    return JSONResponse([{"id": i, "path": str(a.path), "scale": s}
                         for i, (a, s) in enumerate(zip(server.llm.lora_adapters, server.lora_scales))])


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def tokenize(request: Request) -> Response:
    body = await _json_body(request)
    v = protocol._read(body, {"content": ("str", None), "add_special": ("bool", False),
                              "parse_special": ("bool", True), "with_pieces": ("bool", False)})
    if v["content"] is None:
        raise RequestError("'content' is required", param="content")
    vocab = _server(request).llm.model.vocab
    tokens = vocab.tokenize(v["content"], add_special=v["add_special"], parse_special=v["parse_special"])
    if v["with_pieces"]:
        pieces = [vocab.token_to_piece(t, 0, True) for t in tokens]
        return JSONResponse({"tokens": [{"id": t, "piece": p.decode("utf-8", "replace")}
                                        for t, p in zip(tokens, pieces)]})
    return JSONResponse({"tokens": tokens})


async def detokenize(request: Request) -> Response:
    body = await _json_body(request)
    v = protocol._read(body, {"tokens": ("list", None)})
    tokens = v["tokens"]
    llm = _server(request).llm
    if tokens is None or not protocol._is_int_list(tokens):
        raise RequestError("'tokens' must be an array of token ids", param="tokens")
    bad = [t for t in tokens if not 0 <= t < llm.n_vocab()]
    if bad:
        raise RequestError(f"token {bad[0]} is outside the vocabulary (0..{llm.n_vocab() - 1})",
                           param="tokens")
    return JSONResponse({"content": llm.detokenize(tokens).decode("utf-8", "replace")})


async def metrics_text(request: Request) -> Response:
    server = _server(request)
    return PlainTextResponse(metrics.render(server.scheduler, server.http_requests),
                             media_type="text/plain; version=0.0.4")


# -- errors, API key, request counts

async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(protocol.error_body(f"{request.method} {request.url.path}: {exc.detail}", kind),
                        status_code=exc.status_code)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse(protocol.error_body(f"{type(exc).__name__}: {exc}", "server_error"),
                        status_code=500)


class _Gate:
    """ASGI middleware: the API key (``Authorization: Bearer KEY`` or ``X-Api-Key``) and the
    per-endpoint request counts of ``/metrics``."""

    def __init__(self, app: ASGIApp, server: _Server, paths: frozenset[str]) -> None:
        self.app = app
        self.server = server
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = [500]

        async def counted_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            key = self.server.api_key
            if key is not None and path not in PUBLIC_PATHS and not self._authorized(scope, key):
                response = JSONResponse(protocol.error_body(
                    "Incorrect API key provided", "invalid_request_error", None, "invalid_api_key"),
                    status_code=401)
                await response(scope, receive, counted_send)
            else:
                await self.app(scope, receive, counted_send)
        finally:   # unknown paths share one label, so that scans cannot grow the table
            label = path if path in self.paths else "(other)"
            counts = self.server.http_requests
            counts[label, status[0]] = counts.get((label, status[0]), 0) + 1

    @staticmethod
    def _authorized(scope: Scope, key: str) -> bool:
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        given = auth[7:] if auth[:7].lower() == "bearer " else headers.get(b"x-api-key", b"").decode("latin-1")
        return given == key


def create_app(model: str | PathLike[str] | Any = None, *, parallel: int = 4, n_ctx: int = 4096,
               n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None,
               n_threads_batch: int | None = None, api_key: str | None = None,
               chat_template: str | None = None, embedding: bool = False,
               alias: str | None = None, type_k: str = "f32", type_v: str = "f32",
               kv_unified: bool = False, shutdown_timeout: float = 10.0,
               **llm_kwargs: Any) -> Starlette:
    """The OpenAI-compatible ASGI app, ready for any ASGI server (``uvicorn.run(app)``).

    Parameters
    ----------
    model
        A ``.gguf`` path (None: the default model), or a :class:`gguflm.LLM` to serve as it is
        (its ``n_seq_max`` is the number of slots).
    parallel
        Slots: requests generated at the same time, in one batch per step.
    n_ctx
        The whole context, shared equally by the slots (each holds ``n_ctx / parallel`` tokens
        of prompt and reply), as llama.cpp's server.
    api_key
        Required as ``Authorization: Bearer KEY`` on every endpoint but ``/health``.
    embedding
        Serve ``/v1/embeddings`` (the model loaded for embeddings) instead of generation.
    type_k, type_v
        KV cache types. f32 by default (llama.cpp's server: f16): with f32 (or q8_0) a token's
        attention rounds the same whether it shares a step with other slots' tokens or not, so
        a reply does not depend on what the other slots do; with f16, as in ggml, a step of
        several tokens takes the batched rounding (see :mod:`gguflm.server.scheduler`).
        ``"f16"`` halves the cache's memory.
    kv_unified
        False (llama.cpp's server's default): each slot has its own ``n_ctx / parallel`` cells
        of the KV cache, kept in position order, so a slot's results do not depend on what
        the other slots hold. True: one cache shared by all slots.
    alias
        The model id shown by ``/v1/models`` and in responses (default: the file name).
    shutdown_timeout
        On shutdown (SIGTERM, SIGINT), requests in flight get this long to finish, then are
        cancelled (:func:`gguflm.server.serve` gives it to uvicorn).
    **llm_kwargs
        More :class:`gguflm.LLM` arguments (``type_k``, ``seed``, ``pooling_type``, ...).
    """
    from gguflm.llm import LLM

    if isinstance(model, LLM):
        llm = model
    else:
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        extra = ({"embedding": True} if embedding
                 else {"n_seq_max": parallel, "kv_unified": kv_unified})
        llm = LLM(model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
                  n_threads_batch=n_threads_batch, chat_template=chat_template, progress=False,
                  type_k=type_k, type_v=type_v, **extra, **llm_kwargs)
    server = _Server(llm, alias or Path(llm.model_path).name, api_key, shutdown_timeout)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        server.close()

    routes = [
        Route("/health", health), Route("/v1/health", health),
        Route("/v1/models", models), Route("/models", models),
        Route("/lora-adapters", lora_adapters, methods=["GET", "POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/embeddings", embeddings, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/metrics", metrics_text),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        RequestError: _request_error, HTTPException: _http_error, Exception: _server_error})
    app.state.server = server
    app.add_middleware(_Gate, server=server, paths=frozenset(r.path for r in routes))
    return app
