"""The ASGI application: OpenAI's endpoints over a :class:`~gguflm.server.scheduler.Scheduler`.

Generation requests are prepared by :class:`gguflm.LLM` (the same tokens, sampler chain and dict
shapes as ``create_completion``/``create_chat_completion``; see :mod:`gguflm.openai_compat`) in
a worker thread, then run by the scheduler in its shared batches. Streams are server-sent events
(one ``data:`` line per chunk, then ``data: [DONE]``); a client that goes away cancels its task.
Embeddings run through :meth:`gguflm.LLM.create_embedding` (of the served LLM with
``--embedding``, else of a second context on the same file), one request at a time.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gguflm.chat import ChatTemplateError
from gguflm.errors import Error
from gguflm.generate import Chunk, Completion
from gguflm.openai_compat import PreparedRequest
from gguflm.server import anthropic, metrics, native, protocol, responses, running, slots
from gguflm.server.protocol import RequestError
from gguflm.server.responses import ResponseStore
from gguflm.server.router import Router, scan_models_dir
from gguflm.server.scheduler import Scheduler
from gguflm.speculative import SlotSpeculation

log = logging.getLogger("gguflm.server")
access_log = logging.getLogger("gguflm.server.access")

__all__ = ["create_app"]

MAX_BODY_BYTES = 16 << 20   # a request body above this gets 413
_DEFAULT_SEED = 0xFFFFFFFF   # llama.cpp's LLAMA_DEFAULT_SEED: draw a random one
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})   # answered without the API key


class _Shared:
    """What every request shares: the models (one, or a :class:`Router`'s), the API keys, the
    limits and the request counts."""

    def __init__(self, router: Router, single: _Server | None, api_keys: frozenset[str],
                 shutdown_timeout: float, max_body_bytes: int) -> None:
        self.router = router
        self.single = single
        self.api_keys = api_keys
        self.shutdown_timeout = shutdown_timeout
        self.max_body_bytes = max_body_bytes
        self.http_requests: dict[tuple[str, int], int] = {}


def _slot_speculation(llm: Any, draft: dict[str, Any] | None) -> SlotSpeculation | None:
    """A proposer per slot from create_app's draft arguments (None: none asked, or a model whose
    recurrent state cannot drop a rejected draft, as llama.cpp's server does without)."""
    if not draft or draft.get("draft_model") is None:
        return None
    if llm.model.architecture.memory != "attention":
        log.warning("server: %s keeps a recurrent state; generating without a draft", Path(llm.model_path).name)
        return None
    ctx = llm.context
    return SlotSpeculation(draft["draft_model"], llm.model.vocab, ctx.n_seq_max, draft["draft_max"],
                           draft["draft_min"], draft["draft_p_min"], n_ctx=ctx.n_ctx // ctx.n_seq_max,
                           n_threads=ctx.n_threads, n_threads_batch=ctx.n_threads_batch)


class _Server:
    """One model's LLM, its scheduler (None with embeddings) and its settings."""

    def __init__(self, llm: Any, alias: str, embedding_options: dict[str, Any] | None = None,
                 max_tokens: int | None = None, slot_save_path: Path | None = None,
                 cache_reuse: int = 0, draft: dict[str, Any] | None = None) -> None:
        self.llm = llm
        self.slot_save_path = slot_save_path
        self.max_tokens = max_tokens
        # a generation server computes embeddings with a second context on the same file, made
        # on the first /v1/embeddings request
        self._embedding_options = embedding_options or {}
        self._embedder: Any = llm if llm.embedding else None
        self._embedder_lock = threading.Lock()
        self.alias = alias
        self.speculation = None if llm.embedding else _slot_speculation(llm, draft)
        try:
            self.scheduler = None if llm.embedding else Scheduler(llm, cache_reuse, self.speculation)
        except BaseException:
            if self.speculation is not None:
                self.speculation.close()
            raise
        # the LoRA scales of requests that give none (POST /lora-adapters sets them)
        self.lora_scales = list(llm.lora_scales)
        self.created = int(time.time())
        self.responses = ResponseStore()        # for previous_response_id

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        if self.speculation is not None:
            self.speculation.close()
        if self._embedder is not None and self._embedder is not self.llm:
            self._embedder.close()
        self.llm.close()

    def embedder(self, rank: bool = False) -> Any:
        """The LLM that computes embeddings, or with ``rank`` rerank scores (run in a worker
        thread: the first call loads it)."""
        from gguflm.llm import LLM
        from gguflm.pooling import PoolingType

        with self._embedder_lock:
            if self._embedder is None:
                self._embedder = LLM(self.llm.model_path, embedding=True, progress=False,
                                     **self._embedding_options)
        pooling = self._embedder.pooling_type()
        if rank and pooling != PoolingType.RANK:
            raise RequestError(f"{self.alias} does not rerank: that needs a reranking model "
                               f"served with --pooling rank", status=501, type="not_supported_error")
        if pooling == PoolingType.NONE:
            raise RequestError(f"{self.alias} pools no embeddings (its pooling type is 'none', "
                               f"one vector per token, which OpenAI's embeddings do not have): "
                               f"start the server with --pooling mean, cls or last",
                               status=501, type="not_supported_error")
        return self._embedder

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
        prepared.request.max_tokens = min(prepared.request.max_tokens, n_ctx_slot - n_prompt,
                                          self.max_tokens or n_ctx_slot)
        return prepared

    def check_limits(self, fields: dict[str, Any]) -> None:
        """Refuse a request asking for more tokens than ``--max-tokens``."""
        asked = protocol.asked_max_tokens(fields)
        if self.max_tokens is not None and asked is not None and asked[1] > self.max_tokens:
            raise RequestError(f"'{asked[0]}' is {asked[1]}; this server generates at most "
                               f"{self.max_tokens} tokens per request", param=asked[0])

    def prepare_choices(self, kind: str, args: dict[str, Any], n: int) -> list[PreparedRequest]:
        """``n`` choices of one request; with a seed, choice ``i`` samples with seed + i (as
        llama.cpp's server seeds its ``n_cmpl`` children), else each draws its own."""
        seed = args.get("seed")
        if seed is None:
            seed = self.llm.seed
        if seed is None or seed in (-1, _DEFAULT_SEED):
            return [self.prepare(kind, dict(args)) for _ in range(n)]
        return [self.prepare(kind, {**args, "seed": (seed + i) & _DEFAULT_SEED}) for i in range(n)]

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

async def _json_body(request: Request, optional: bool = False) -> Any:
    """The request's JSON body (None for an empty one when ``optional``)."""
    limit = _shared(request).max_body_bytes
    parts, size = [], 0
    async for part in request.stream():     # counted as it arrives: no unbounded buffer
        size += len(part)
        if size > limit:
            raise _body_too_large(limit)
        parts.append(part)
    raw = b"".join(parts)
    if optional and not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"could not parse the JSON body: {exc}") from None


def _body_too_large(limit: int) -> RequestError:
    return RequestError(f"the request body is larger than this server takes ({limit} bytes)",
                        status=413, code="request_too_large")


def _shared(request: Request) -> _Shared:
    return request.app.state.shared


def _routed(handler: Callable[[Request, _Server, Any], Any], body: bool | None = True,
            anthropic_errors: bool = False) -> Callable[[Request], Any]:
    """The route running ``handler(request, server, body)`` on the model the request names (its
    body's ``model``, else ``?model=``; any name with a single model), held for the handler's
    run. ``body`` None: the body is optional; False: not read."""
    async def route(request: Request) -> Response:
        try:
            data = await _json_body(request, optional=body is None) if body is not False else None
            name = data.get("model") if isinstance(data, dict) else None
            router = _shared(request).router
            server = await router.acquire(name or request.query_params.get("model"))
        except RequestError as exc:
            if not anthropic_errors:
                raise
            return JSONResponse(anthropic.error_body(exc), status_code=exc.status)
        try:
            return await handler(request, server, data)
        finally:
            router.release(server)
    return route


def _need_generation(server: _Server) -> Scheduler:
    if server.scheduler is None:
        raise RequestError("this server computes embeddings (--embedding): start it without "
                           "--embedding to generate text", status=501, type="not_supported_error")
    return server.scheduler


# -- generation

async def _generate(request: Request, server: _Server, kind: str, parsed: tuple[dict, bool, dict]
                    ) -> Response:
    scheduler = _need_generation(server)
    args, stream, fields = parsed
    server.check_limits(fields)
    lora = server.lora(fields["lora"], "lora")
    n, best_of = fields["n"], fields.get("best_of") or fields["n"]
    if best_of > scheduler.n_slots:
        param = "best_of" if best_of > n else "n"
        raise RequestError(f"'{param}' is {best_of}; the server runs at most {scheduler.n_slots} "
                           f"choices at once (--parallel)", param=param)
    if stream and best_of > n:
        raise RequestError("'best_of' larger than 'n' cannot be streamed", param="best_of")
    prepared = await run_in_threadpool(server.prepare_choices, kind, args, best_of)
    if stream:
        return running.stream(scheduler, prepared, lora, lambda sources: _sse_lines(
            prepared, sources, protocol.stream_include_usage(fields)))
    logprobs = [p.request.n_logprobs is not None for p in prepared]
    if best_of > n:     # ranked by their tokens' mean log-probability
        for p in prepared:
            p.request.n_logprobs = p.request.n_logprobs or 0
    try:
        completions = await running.complete(request, scheduler, prepared, lora)
    except running.Disconnected:
        return Response(status_code=499)
    order = list(range(best_of))
    if best_of > n:
        order = sorted(order, key=lambda i: -_mean_logprob(completions[i]))[:n]
        for c, asked in zip(completions, logprobs):
            c.logprobs = c.logprobs if asked else None
    return JSONResponse(_merge([prepared[i].respond(completions[i], False) for i in order],
                               completions))


def _mean_logprob(completion: Completion) -> float:
    items = completion.logprobs or []
    return sum(i.logprob for i in items) / len(items) if items else 0.0


def _merge(bodies: list[dict[str, Any]], completions: list[Completion]) -> dict[str, Any]:
    """One response of several choices: the first's fields, each choice at its index, and the
    usage of every choice generated (``best_of``'s too), the prompt counted once."""
    body = bodies[0]
    body["choices"] = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
    if len(completions) > 1:
        body["usage"] = _usage(completions)
    return body


def _usage(completions: list[Completion]) -> dict[str, int]:
    n_prompt = len(completions[0].prompt_tokens)
    n_generated = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_generated,
            "total_tokens": n_prompt + n_generated}


def _sse_lines(prepared: list[PreparedRequest], sources: list[Iterator[Chunk]], include_usage: bool
               ) -> Iterator[str]:
    """The events of an OpenAI stream: the choices' chunks as they come (each naming its
    choice), then the usage if asked, then ``[DONE]``."""
    completions: list[Completion] = []

    def kept(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        for chunk in chunks:
            if chunk.completion is not None:
                completions.append(chunk.completion)
            yield chunk

    first = None
    try:
        shaped_streams = [p.respond(kept(chunks), True) for p, chunks in zip(prepared, sources)]
        for i, shaped in running.interleave(shaped_streams):
            if first is None:
                first = shaped
            shaped["id"] = first["id"]
            for choice in shaped["choices"]:
                choice["index"] = i
            yield running.sse(json.dumps(shaped))
        if include_usage and len(completions) == len(prepared) and first is not None:
            head = {key: first[key] for key in ("id", "object", "created", "model") if key in first}
            yield running.sse(json.dumps({**head, "choices": [], "usage": _usage(completions)}))
    except Exception as exc:    # the request failed after the stream began: say so, then end
        log.warning("stream %s failed: %s", prepared[0].id, exc)
        yield running.sse(json.dumps(protocol.error_body(str(exc), "server_error")))
        return
    yield running.sse("[DONE]")


# -- routes

async def completions(request: Request, server: _Server, body: Any) -> Response:
    return await _generate(request, server, "completion", protocol.completion_arguments(body))


async def chat_completions(request: Request, server: _Server, body: Any) -> Response:
    return await _generate(request, server, "chat", protocol.chat_arguments(body))


async def responses_create(request: Request, server: _Server, body: Any) -> Response:
    scheduler = _need_generation(server)
    call = responses.ResponseRequest(body, server.responses, server.alias)
    args, stream, fields = protocol.chat_arguments(call.chat)
    server.check_limits(fields)
    prepared = await run_in_threadpool(server.prepare_choices, "chat", args, 1)
    if stream:
        return running.stream(scheduler, prepared, server.lora(None, "lora"),
                              lambda sources: call.events(sources[0]))
    try:
        completions = await running.complete(request, scheduler, prepared, server.lora(None, "lora"))
    except running.Disconnected:
        return Response(status_code=499)
    return JSONResponse(call.respond(completions[0]))


async def responses_get(request: Request, server: _Server, body: Any) -> Response:
    return JSONResponse(server.responses.get(request.path_params["response_id"])[1])


def _message_request(server: _Server, body: Any) -> tuple[anthropic.MessageRequest, dict, bool]:
    _need_generation(server)
    call = anthropic.MessageRequest(body, server.alias, server.llm.model.vocab)
    args, stream, fields = protocol.chat_arguments(call.chat)
    server.check_limits(fields)
    return call, args, stream


async def messages(request: Request, server: _Server, body: Any) -> Response:
    scheduler = server.scheduler
    try:
        call, args, stream = _message_request(server, body)
        prepared = await run_in_threadpool(server.prepare_choices, "chat", args, 1)
    except RequestError as exc:
        return JSONResponse(anthropic.error_body(exc), status_code=exc.status)
    if stream:
        n_prompt = len(prepared[0].tokens)
        return running.stream(scheduler, prepared, server.lora(None, "lora"),
                              lambda sources: call.events(sources[0], n_prompt))
    try:
        completions = await running.complete(request, scheduler, prepared, server.lora(None, "lora"))
    except running.Disconnected:
        return Response(status_code=499)
    except RequestError as exc:
        return JSONResponse(anthropic.error_body(exc), status_code=exc.status)
    return JSONResponse(call.respond(completions[0]))


# each API's request body -> the chat completion body it runs as
_AS_CHAT: dict[str, Callable[[Any, _Server], Any]] = {
    "chat": lambda body, server: body,
    "responses": lambda body, server: responses.ResponseRequest(body, server.responses, server.alias).chat,
    "anthropic": lambda body, server: anthropic.MessageRequest(body, server.alias,
                                                               server.llm.model.vocab).chat,
}


def _input_tokens(api: str) -> Callable[[Request], Any]:
    """The route counting the prompt tokens of ``api``'s request (llama-server's
    ``/input_tokens`` and ``count_tokens``)."""
    async def count(request: Request, server: _Server, body: Any) -> Response:
        try:
            _need_generation(server)
            args, _, _ = protocol.chat_arguments(_AS_CHAT[api](body, server))
            prepared = await run_in_threadpool(server.prepare, "chat", args)
        except RequestError as exc:
            if api != "anthropic":
                raise
            return JSONResponse(anthropic.error_body(exc), status_code=exc.status)
        counted = {"input_tokens": len(prepared.tokens)}
        return JSONResponse(counted if api == "anthropic"
                            else {"object": "response.input_tokens", **counted})
    return _routed(count, anthropic_errors=api == "anthropic")


async def embeddings(request: Request, server: _Server, body: Any) -> Response:
    texts, single, model, encoding = protocol.embedding_input(body)
    embedder = await run_in_threadpool(server.embedder)
    try:
        result = await run_in_threadpool(embedder.create_embedding, texts[0] if single else texts,
                                         model or server.alias)
    except ValueError as exc:
        raise RequestError(str(exc), param="input") from None
    if encoding == "base64":    # OpenAI's: the float32 values' little-endian bytes
        for item in result["data"]:
            item["embedding"] = base64.b64encode(
                np.asarray(item["embedding"], dtype="<f4").tobytes()).decode("ascii")
    return JSONResponse(result)


async def rerank(request: Request, server: _Server, body: Any) -> Response:
    embedder = await run_in_threadpool(server.embedder, True)
    return JSONResponse(await run_in_threadpool(native.rerank, body, embedder, server.alias))


async def models_list(request: Request) -> Response:
    shared = _shared(request)
    if shared.single is None:
        return JSONResponse({"object": "list", "data": shared.router.listing()})
    server = shared.single
    llm = server.llm
    meta = {"n_vocab": llm.n_vocab(), "n_ctx_train": llm.model.hparams.n_ctx_train,
            "n_embd": llm.n_embd(), "n_params": llm.model.n_params if hasattr(llm.model, "n_params") else None,
            "size": Path(llm.model_path).stat().st_size}
    return JSONResponse({"object": "list", "data": [
        {"id": server.alias, "object": "model", "created": server.created, "owned_by": "gguflm",
         "meta": meta}]})


async def lora_adapters(request: Request, server: _Server, body: Any) -> Response:
    """GET: the LoRA adapters loaded at start, with the scales of requests that give none;
    POST [{"id", "scale"}]: set those scales (the adapters it does not name: 0), as llama.cpp's
    server."""
    if request.method == "POST":
        if not isinstance(body, list):
            raise RequestError("the request body must be an array of {\"id\", \"scale\"}")
        server.lora_scales = list(server.lora(body, "body"))
        return JSONResponse({"success": True})
    return JSONResponse([{"id": i, "path": str(a.path), "scale": s}
                         for i, (a, s) in enumerate(zip(server.llm.lora_adapters, server.lora_scales))])


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def tokenize(request: Request, server: _Server, body: Any) -> Response:
    return JSONResponse(native.tokenize(body, server.llm))


async def detokenize(request: Request, server: _Server, body: Any) -> Response:
    return JSONResponse(native.detokenize(body, server.llm))


async def apply_template(request: Request, server: _Server, body: Any) -> Response:
    _need_generation(server)
    return JSONResponse(await run_in_threadpool(native.apply_template, body, server.llm))


async def props(request: Request, server: _Server, body: Any) -> Response:
    scheduler = server.scheduler
    n_slots, n_ctx_slot = ((scheduler.n_slots, scheduler.n_ctx_slot) if scheduler is not None
                           else (1, server.llm.n_ctx()))
    return JSONResponse(native.props(server.llm, server.alias, n_slots, n_ctx_slot))


async def slots_list(request: Request, server: _Server, body: Any) -> Response:
    scheduler = _need_generation(server)
    vocab = server.llm.model.vocab

    def states(_: Any) -> list[dict[str, Any]]:
        return [slots.slot_json(s, scheduler.n_ctx_slot, vocab) for s in scheduler.slot_states()]

    listed = await _scheduled(scheduler, states)
    if request.query_params.get("fail_on_no_slot") and all(s["is_processing"] for s in listed):
        raise RequestError("no slot available", status=503, type="unavailable_error")
    return JSONResponse(listed)


async def slot_action(request: Request, server: _Server, body: Any) -> Response:
    scheduler = _need_generation(server)
    if server.slot_save_path is None:
        raise RequestError("This server does not support slots action. Start it with "
                           "--slot-save-path", status=501, type="not_supported_error")
    try:
        index = int(request.path_params["id_slot"])
    except ValueError:
        index = -1
    if not 0 <= index < scheduler.n_slots:
        raise RequestError("Invalid slot ID", param="id_slot")
    action = slots.ACTIONS.get(request.query_params.get("action", ""))
    if action is None:
        raise RequestError("Invalid action: give action=save, restore or erase", param="action")
    return JSONResponse(await _scheduled(
        scheduler, lambda slot: action(scheduler, slot, server.slot_save_path, body), index))


async def _scheduled(scheduler: Scheduler, fn: Callable[[Any], Any], slot: int | None = None) -> Any:
    """``fn`` run by the scheduler between two steps (see :meth:`Scheduler.call`)."""
    try:
        future = scheduler.call(fn, slot)
    except Error as exc:       # shutting down
        raise RequestError(str(exc), status=503, type="server_error") from None
    return await asyncio.wrap_future(future)


async def metrics_text(request: Request) -> Response:
    """llama-server's metrics of the model named by ``?model=`` (else the one used last) and the
    HTTP counts of the whole server."""
    shared = _shared(request)
    name = request.query_params.get("model")
    if shared.single is not None or name:
        server = await shared.router.acquire(name)
        shared.router.release(server)
    else:
        loaded = shared.router.servers()
        server = loaded[0] if loaded else None
    scheduler = server.scheduler if server is not None else None
    return PlainTextResponse(metrics.render(scheduler, shared.http_requests),
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
    """ASGI middleware: the API key (``Authorization: Bearer KEY`` or ``X-Api-Key``), the body
    size a ``Content-Length`` announces, the per-endpoint request counts of ``/metrics``, and one
    access log line per request (``gguflm.server.access`` at INFO, when the response ends: its
    fields as ``key=value`` in the message and as the record's ``access`` dict)."""

    def __init__(self, app: ASGIApp, shared: _Shared, paths: frozenset[str]) -> None:
        self.app = app
        self.shared = shared
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = [500]
        sent = [0]
        t0 = time.perf_counter()

        async def counted_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                sent[0] += len(message.get("body", b""))
            await send(message)

        try:
            keys = self.shared.api_keys
            error = None
            if keys and path not in PUBLIC_PATHS and not self._authorized(scope, keys):
                error = RequestError("Incorrect API key provided", status=401,
                                     code="invalid_api_key")
            elif int(dict(scope["headers"]).get(b"content-length", b"0") or 0) > \
                    self.shared.max_body_bytes:     # refused before it is read
                error = _body_too_large(self.shared.max_body_bytes)
            if error is not None:
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, counted_send)
            else:
                await self.app(scope, receive, counted_send)
        finally:   # unknown paths share one label, so that scans cannot grow the table
            label = path if path in self.paths else "(other)"
            counts = self.shared.http_requests
            counts[label, status[0]] = counts.get((label, status[0]), 0) + 1
            if access_log.isEnabledFor(logging.INFO):
                client = scope.get("client")
                fields = {"method": scope["method"], "path": path, "status": status[0],
                          "ms": round((time.perf_counter() - t0) * 1e3, 1), "bytes": sent[0],
                          "client": f"{client[0]}:{client[1]}" if client else "-"}
                access_log.info(" ".join(f"{k}={v}" for k, v in fields.items()),
                                extra={"access": fields})

    @staticmethod
    def _authorized(scope: Scope, keys: frozenset[str]) -> bool:
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"")
        given = auth[7:] if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        return any(hmac.compare_digest(given, key.encode()) for key in keys)


def create_app(model: str | PathLike[str] | Any = None, *, parallel: int = 4, n_ctx: int = 4096,
               n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None,
               n_threads_batch: int | None = None, api_key: str | Sequence[str] | None = None,
               chat_template: str | None = None, embedding: bool = False,
               alias: str | None = None, type_k: str = "f32", type_v: str = "f32",
               kv_unified: bool = False, shutdown_timeout: float = 10.0,
               pooling_type: str | int | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               max_tokens: int | None = None, slot_save_path: str | PathLike[str] | None = None,
               cache_reuse: int = 0, models: Sequence[str | PathLike[str]] | None = None,
               models_dir: str | PathLike[str] | None = None, models_max: int | None = None,
               memory_budget: int | None = None, cors_origins: Sequence[str] | None = None,
               draft_model: Any = None, draft_max: int = 16, draft_min: int = 0, draft_p_min: float = 0.75,
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
        Required as ``Authorization: Bearer KEY`` (or ``X-Api-Key: KEY``, Anthropic's) on every
        endpoint but ``/health``; several keys: any of them.
    embedding
        Serve ``/v1/embeddings`` only (the model loaded for embeddings, as an encoder needs).
        Without it a generation server also answers ``/v1/embeddings``, from a second context
        on the same file loaded on first use, when the model pools (its own pooling type or
        ``pooling_type`` is not ``"none"``).
    pooling_type
        The embeddings' pooling (``"mean"``, ``"cls"``, ``"last"``, ...; None: the model's).
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
    max_body_bytes
        Larger request bodies are refused with 413 (by their Content-Length before they are
        read, else as they arrive).
    max_tokens
        The most tokens a request may generate: a request asking for more gets 400, one asking
        for nothing stops there (None: the slot's context is the limit).
    models, models_dir
        Serve several models instead of ``model`` (llama-server's router mode): these files and
        each ``.gguf`` file of ``models_dir``, named by their file names without ``.gguf``; a
        request's ``model`` picks one (an unknown name gets 404), loaded on first use, and the
        least recently used idle one is unloaded to stay within ``models_max`` models and
        ``memory_budget`` bytes (by :func:`gguflm.memory.estimate_memory` for this context).
        ``GET`` endpoints take ``?model=``. See :mod:`gguflm.server.router`.
    slot_save_path
        The directory ``POST /slots/{id}?action=save|restore`` writes and reads (created if
        missing; None: slot actions are refused with 501), as llama-server's
        ``--slot-save-path``.
    cache_reuse
        Reuse cached chunks of at least this many tokens that a new prompt repeats after a
        change, by shifting their KV cells (llama-server's ``--cache-reuse``; 0: only the common
        prefix is reused).
    cors_origins
        Browser origins allowed to call the server (CORS, ``["*"]``: any; None: no CORS
        headers, as by default). Preflight ``OPTIONS`` requests are answered without the API key.
    draft_model, draft_max, draft_min, draft_p_min
        Speculative decoding in every slot (llama-server's ``--model-draft``, ``--spec-type
        ngram``, ``--draft-max``, ``--draft-min``, ``--draft-p-min``): a draft model (a ``.gguf``
        path, loaded once, a context of its own per slot) or a
        :class:`gguflm.speculative.PromptLookup` (an index of its own per slot); see
        :class:`gguflm.speculative.SlotSpeculation`. One model only.
    shutdown_timeout
        On shutdown (SIGTERM, SIGINT), requests in flight get this long to finish, then are
        cancelled (:func:`gguflm.server.serve` gives it to uvicorn).
    **llm_kwargs
        More :class:`gguflm.LLM` arguments (``type_k``, ``seed``, ``pooling_type``, ...).
    """
    from gguflm.llm import LLM
    from gguflm.memory import estimate_memory

    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
    if cache_reuse < 0:
        raise ValueError(f"cache_reuse must be >= 0, got {cache_reuse}")
    save_dir = None
    if slot_save_path is not None:
        save_dir = Path(slot_save_path)
        save_dir.mkdir(parents=True, exist_ok=True)

    def serving(llm: Any, name: str) -> _Server:
        embedding_options = None if llm.embedding else {
            "n_ctx": llm.n_ctx() // llm.context.n_seq_max, "n_batch": n_batch, "n_ubatch": n_ubatch,
            "n_threads": n_threads, "n_threads_batch": n_threads_batch, "pooling_type": pooling_type}
        return _Server(llm, name, embedding_options, max_tokens, save_dir, cache_reuse, draft)

    def load(path: str | PathLike[str] | None) -> Any:
        extra = ({"embedding": True, "pooling_type": pooling_type} if embedding
                 else {"n_seq_max": parallel, "kv_unified": kv_unified})
        return LLM(path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
                   n_threads_batch=n_threads_batch, chat_template=chat_template, progress=False,
                   type_k=type_k, type_v=type_v, **extra, **llm_kwargs)

    draft = {"draft_model": draft_model, "draft_max": draft_max, "draft_min": draft_min, "draft_p_min": draft_p_min}
    routed: dict[str, Path] = dict(scan_models_dir(models_dir)) if models_dir is not None else {}
    for path in models or ():
        routed[Path(path).name.removesuffix(".gguf")] = Path(path)
    if routed:
        if model is not None:
            raise ValueError("give either one model or models / models_dir")
        if draft_model is not None:
            raise ValueError("a draft model (speculative decoding) serves one model, not models / models_dir")

        def estimate(path: Path) -> int:
            return estimate_memory(path, n_ctx, type_k, type_v, n_seq_max=parallel, n_ubatch=n_ubatch,
                                   n_batch=n_batch, kv_unified=kv_unified).total

        router = Router(routed, lambda name, path: serving(load(path), name), models_max,
                        memory_budget, estimate)
        single = None
    else:
        llm = model if isinstance(model, LLM) else load(model)
        single = serving(llm, alias or Path(llm.model_path).name)
        router = Router.serving(single)
    keys = frozenset([api_key] if isinstance(api_key, str) else api_key or ())
    shared = _Shared(router, single, keys, shutdown_timeout, max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        router.close()

    routes = [
        Route("/health", health), Route("/v1/health", health),
        Route("/v1/models", models_list), Route("/models", models_list),
        Route("/lora-adapters", _routed(lora_adapters, body=None), methods=["GET", "POST"]),
        Route("/v1/completions", _routed(completions), methods=["POST"]),
        Route("/completions", _routed(completions), methods=["POST"]),
        Route("/v1/chat/completions", _routed(chat_completions), methods=["POST"]),
        Route("/chat/completions", _routed(chat_completions), methods=["POST"]),
        Route("/v1/responses", _routed(responses_create), methods=["POST"]),
        Route("/responses", _routed(responses_create), methods=["POST"]),
        Route("/v1/responses/{response_id}", _routed(responses_get, body=False)),
        Route("/v1/messages", _routed(messages, anthropic_errors=True), methods=["POST"]),
        Route("/v1/messages/count_tokens", _input_tokens("anthropic"), methods=["POST"]),
        *(Route(f"{prefix}/{api_path}/input_tokens", _input_tokens(api), methods=["POST"])
          for prefix in ("/v1", "") for api, api_path in (("chat", "chat/completions"),
                                                          ("responses", "responses"))),
        Route("/v1/embeddings", _routed(embeddings), methods=["POST"]),
        Route("/embeddings", _routed(embeddings), methods=["POST"]),
        *(Route(path, _routed(rerank), methods=["POST"])
          for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")),
        Route("/tokenize", _routed(tokenize), methods=["POST"]),
        Route("/apply-template", _routed(apply_template), methods=["POST"]),
        Route("/props", _routed(props, body=False)),
        Route("/detokenize", _routed(detokenize), methods=["POST"]),
        Route("/metrics", metrics_text),
        Route("/slots", _routed(slots_list, body=False)),
        Route("/slots/{id_slot}", _routed(slot_action, body=None), methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        RequestError: _request_error, HTTPException: _http_error, Exception: _server_error})
    app.state.shared = shared
    app.state.server = single       # the one model's (None with several)
    app.add_middleware(_Gate, shared=shared, paths=frozenset(r.path for r in routes))
    if cors_origins:    # outside the gate: a preflight carries no API key
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"], max_age=600)
    return app
