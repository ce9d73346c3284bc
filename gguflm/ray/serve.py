"""gguflm on Ray Serve: replicas of ``gguflm serve``'s engine behind one OpenAI-compatible endpoint.

>>> from ray import serve
>>> from gguflm.ray.serve import LLMConfig, build_openai_app
>>> config = LLMConfig(model_loading_config={"model_id": "smol", "model_source": "SmolLM2.gguf"},
...                    engine_kwargs={"parallel": 2, "n_ctx": 4096, "n_threads": 2},
...                    deployment_config={"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}})
>>> serve.run(build_openai_app({"llm_configs": [config]}))     # http://127.0.0.1:8000/v1/...

The shape is ``ray.serve.llm``'s: an ingress deployment takes every HTTP request and hands it to
the deployment of the model its body names (``model``); each model is a deployment whose
replicas each run the app of :func:`gguflm.server.create_app` (its scheduler, continuous batching
and every endpoint: chat, completions, embeddings, streams, grammars, tools, LoRA), in process,
fed through ASGI. Nothing of the server is redone here: the ingress forwards the request's
method, path, headers and body, and streams back the status, headers and body the replica's app
produced. A replica reserves ``num_cpus`` = its ``n_threads``.

Session affinity: the ingress derives a session key from each request (the ``X-Session-Id``
header, else the body's ``user``, else the conversation's start: the messages up to the first
user message, or a completion prompt's first :data:`PREFIX_CHARS` characters), and
:class:`SessionAffinityRouter` (Ray Serve's request-router API) sends every request with that
key to the same replica, the one ranking first for it by rendezvous hashing among the running
replicas. A later turn of a conversation therefore finds its KV cache (the scheduler reuses the
cached prefix); when replicas come or go only the keys of those replicas move. A replica that
refuses (``max_ongoing_requests`` reached) passes the request to the least loaded other one.

Failures: a replica that dies fails only the requests it held: one not yet answered gets 503 with
OpenAI's error body, a stream already under way ends with an OpenAI-style ``error`` event (the
``openai`` client raises :class:`openai.APIError`). Ray Serve starts a replacement.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gguflm.ray.files import local_model
from gguflm.server.protocol import error_body

log = logging.getLogger("gguflm.ray")

__all__ = ["LLMConfig", "build_openai_app", "serve_cli", "SessionAffinityRouter", "session_key", "rank_replicas",
           "REPLICA_HEADER", "PREFIX_CHARS"]

REPLICA_HEADER = "x-gguflm-replica"     # the replica (its Ray actor name) that answered
SESSION_HEADER = "x-session-id"
PREFIX_CHARS = 256      # a completion prompt's characters that make its session key
_ROUTER_PATH = "gguflm.ray.serve.SessionAffinityRouter"


@dataclass
class LLMConfig:
    """One served model, in ``ray.serve.llm.LLMConfig``'s layout.

    Parameters
    ----------
    model_loading_config
        ``model_id`` (the name requests give as ``model``) and ``model_source`` (a path every node
        reads, or a URI fetched once per node: :func:`gguflm.ray.files.local_model`).
    engine_kwargs
        :func:`gguflm.server.create_app` arguments of each replica (``parallel``, ``n_ctx``,
        ``n_threads``, ``embedding``, ``lora``...). ``n_threads`` (default 1) is also the
        replica's ``num_cpus``.
    deployment_config
        Ray Serve deployment options: ``num_replicas`` or ``autoscaling_config``
        (``min_replicas``, ``max_replicas``, ``target_ongoing_requests``, delays...),
        ``max_ongoing_requests`` (default ``2 * parallel``), ``ray_actor_options``...
    cache_dir
        Where a fetched model goes on each node (None: :func:`gguflm.ray.files.default_cache_dir`).
    """

    model_loading_config: dict[str, Any]
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    deployment_config: dict[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None

    @property
    def model_id(self) -> str:
        loading = self.model_loading_config
        return loading.get("model_id") or Path(str(loading["model_source"])).name.removesuffix(".gguf")

    @classmethod
    def of(cls, value: LLMConfig | Mapping[str, Any]) -> LLMConfig:
        """A config as given, or from a dict (a ``serve run`` YAML file's)."""
        if isinstance(value, LLMConfig):
            return value
        return cls(**dict(value))

    @property
    def threads(self) -> int:
        return int(self.engine_kwargs.get("n_threads") or 1)

    def deployment_options(self) -> dict[str, Any]:
        """The options of this model's Ray Serve deployment."""
        parallel = int(self.engine_kwargs.get("parallel", 4))
        options = dict(self.deployment_config)
        actor = {"num_cpus": self.threads, **options.pop("ray_actor_options", {})}
        options.setdefault("max_ongoing_requests", 2 * parallel)
        if "autoscaling_config" in options:
            options["autoscaling_config"] = {"target_ongoing_requests": parallel,
                                             **options["autoscaling_config"]}
        options.setdefault("request_router_config", {"request_router_class": _ROUTER_PATH})
        return {"name": f"gguflm-{self.model_id}", "ray_actor_options": actor, **options}


# -- session affinity

def session_key(body: Any, headers: Mapping[str, str]) -> str | None:
    """The key that keeps a conversation on one replica (see the module docstring); None when
    the request has none (embeddings, ...)."""
    given = headers.get(SESSION_HEADER)
    if given:
        return "session:" + given
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("user"), str) and body["user"]:
        return "user:" + body["user"]
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        start = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                     len(messages) - 1)
        return "chat:" + json.dumps(messages[:start + 1], sort_keys=True, default=str)
    prompt = body.get("prompt") if "messages" not in body else None
    if isinstance(prompt, str) and prompt:
        return "prompt:" + prompt[:PREFIX_CHARS]
    return None


def rank_replicas(key: str, replica_ids: Sequence[str]) -> list[str]:
    """The replicas (their unique ids) in the order ``key`` prefers them: rendezvous hashing, so
    that a key stays with its replica while others come and go."""
    def weight(replica: str) -> bytes:
        return hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest()
    return sorted(replica_ids, key=weight, reverse=True)


class SessionAffinityRouter(FIFOMixin, RequestRouter):
    """A Ray Serve request router: a request with a session key goes to the replica its key ranks
    first (:func:`rank_replicas`), the others ranked after it in case that one is full; a request
    without one to the less loaded of two random replicas (Ray Serve's default policy)."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.kwargs.get("session") if pending_request is not None else None
        if key is None or len(candidate_replicas) == 1:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        first, *rest = rank_replicas(key, list(by_id))
        return [[by_id[first]], [by_id[r] for r in rest]]


# -- the replicas

class GGUFServer:
    """One replica: :func:`gguflm.server.create_app`'s app on the model, called through ASGI."""

    def __init__(self, config: dict[str, Any]) -> None:
        import ray

        from gguflm.server import create_app

        cfg = LLMConfig.of(config)
        path = local_model(cfg.model_loading_config["model_source"], cfg.cache_dir)
        self.app = create_app(path, alias=cfg.model_id, **{**cfg.engine_kwargs, "n_threads": cfg.threads})
        self.name = ray.get_runtime_context().get_actor_name() or socket.gethostname()

    async def handle(self, http: dict[str, Any], session: str | None = None) -> AsyncIterator[Any]:
        """Run one HTTP request (``method``, ``path``, ``root_path``, ``query_string``,
        ``headers``, ``body``) on the app; yields ``(status, headers)``, then the body's parts.
        ``session`` is read by the router only. Cancelled (the client went away), the app sees
        a cancel, as under uvicorn, and frees the request's slot."""
        messages: asyncio.Queue = asyncio.Queue()
        done = object()
        body = [http["body"]]
        forever = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if body:
                return {"type": "http.request", "body": body.pop(), "more_body": False}
            await forever.wait()        # no disconnect but by cancellation
            return {"type": "http.disconnect"}

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": http["method"], "scheme": "http", "path": http["path"],
                 "raw_path": http["path"].encode(), "query_string": http["query_string"],
                 "headers": [tuple(h) for h in http["headers"]], "client": None,
                 "server": ("ray-serve", 0), "root_path": http["root_path"]}
        run = asyncio.ensure_future(self.app(scope, receive, messages.put))
        run.add_done_callback(lambda _: messages.put_nowait(done))
        try:
            while (message := await messages.get()) is not done:
                if message["type"] == "http.response.start":
                    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message["headers"]]
                    yield message["status"], headers + [(REPLICA_HEADER, self.name)]
                elif message.get("body"):
                    yield message["body"]
            run.result()
        finally:
            if not run.done():
                run.cancel()

    def __del__(self) -> None:
        app = getattr(self, "app", None)
        if app is not None:
            app.state.shared.router.close()


class OpenAIIngress:
    """The HTTP entry: each request goes to the model its ``model`` names (``?model=`` for a
    GET; any name when there is one model). ``/health`` is answered here, ``/v1/models`` of
    several models by joining their replicas' answers (each checks the API key as it does)."""

    def __init__(self, model_ids: list[str], *handles: Any) -> None:
        self.handles = dict(zip(model_ids, handles))

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.removeprefix(request.scope.get("root_path", ""))
        if path in ("/health", "/v1/health"):
            return JSONResponse({"status": "ok"})
        raw = await request.body()
        # the path as the proxy gave it: under the app's route prefix (its root_path)
        http = {"method": request.method, "path": request.scope["path"],
                "root_path": request.scope.get("root_path", ""), "query_string": request.url.query.encode(),
                "headers": request.headers.raw, "body": raw}
        if path in ("/v1/models", "/models") and request.method == "GET" and len(self.handles) > 1:
            return await self._models(http)
        try:
            data = json.loads(raw) if raw.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = None         # the replica's app answers with its own 400
        name = data.get("model") if isinstance(data, dict) else request.query_params.get("model")
        if len(self.handles) == 1:
            handle = next(iter(self.handles.values()))
        elif name in self.handles:
            handle = self.handles[name]
        else:
            return JSONResponse(error_body(f"model {name!r} not found; this endpoint serves "
                                           f"{', '.join(self.handles)}", "not_found_error", "model",
                                           "model_not_found"), status_code=404)
        parts = handle.options(stream=True).handle.remote(http, session=session_key(data, request.headers))
        try:
            status, headers = await parts.__anext__()
        except Exception as exc:   # the replica died or could not be reached
            parts.cancel()
            return _replica_failed(exc)
        headers = {k: v for k, v in headers if k.lower() not in ("content-length", "transfer-encoding")}
        if headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(_stream(parts), status_code=status, headers=headers)
        try:
            content = b"".join([part async for part in parts])
        except Exception as exc:
            return _replica_failed(exc)
        return Response(content, status_code=status, headers=headers)

    async def _models(self, http: dict[str, Any]) -> Response:
        """Every model's ``/v1/models`` entry, or the first answer that is not 200 (401...)."""
        listed = []
        for handle in self.handles.values():
            try:
                (status, headers), *parts = [p async for p in handle.options(stream=True).handle.remote(http)]
            except Exception as exc:
                return _replica_failed(exc)
            content = b"".join(parts)
            if status != 200:
                return Response(content, status_code=status, media_type=dict(headers).get("content-type"))
            listed += json.loads(content)["data"]
        return JSONResponse({"object": "list", "data": listed})


def _failure(exc: BaseException) -> dict[str, Any]:
    log.warning("gguflm replica failed: %s: %s", type(exc).__name__, exc)
    return error_body(f"the replica serving this request failed ({type(exc).__name__}); "
                      f"retry the request", "server_error", None, "replica_failed")


def _replica_failed(exc: BaseException) -> Response:
    return JSONResponse(_failure(exc), status_code=503)


async def _stream(parts: Any) -> AsyncIterator[bytes]:
    """A replica's event stream; if the replica dies, one last OpenAI-style ``error`` event."""
    try:
        async for part in parts:
            yield part
    except asyncio.CancelledError:       # the client went away: so does the replica's request
        parts.cancel()
        raise
    except Exception as exc:
        yield f"data: {json.dumps(_failure(exc))}\n\n".encode()


def build_openai_app(llm_serving_args: Mapping[str, Any]) -> Any:
    """The Ray Serve application of ``llm_serving_args["llm_configs"]`` (each an
    :class:`LLMConfig` or its dict) behind one OpenAI ingress, for :func:`ray.serve.run`; also
    an import path for ``serve run gguflm.ray.serve:build_openai_app`` with the configs as
    ``args`` of a Serve config file. ``ingress_deployment_config`` (optional) holds the
    ingress's deployment options."""
    configs = [LLMConfig.of(c) for c in llm_serving_args["llm_configs"]]
    if not configs:
        raise ValueError("llm_configs is empty: give at least one model")
    ids = [c.model_id for c in configs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"model ids repeat: {ids}")
    engines = [serve.deployment(GGUFServer).options(**c.deployment_options()).bind(c.__dict__)
               for c in configs]
    ingress_options = {"name": "gguflm-ingress", "ray_actor_options": {"num_cpus": 0},
                       "max_ongoing_requests": 1000, **llm_serving_args.get("ingress_deployment_config", {})}
    return serve.deployment(OpenAIIngress).options(**ingress_options).bind(ids, *engines)


def serve_cli(models: Sequence[str], models_dir: str | None, alias: str | None, options: dict[str, Any],
              replicas: int, max_replicas: int | None, host: str, port: int) -> int:
    """``gguflm serve --ray``: each model (``-m`` files and ``--models-dir``'s) with ``replicas``
    replicas, or autoscaled up to ``max_replicas``, on the Ray cluster of ``RAY_ADDRESS`` (else a
    local one), until interrupted. ``options`` are :func:`gguflm.server.create_app`'s."""
    import ray

    from gguflm.default_model import default_model_path
    from gguflm.server.router import scan_models_dir

    if replicas < 1 or (max_replicas is not None and max_replicas < replicas):
        raise ValueError(f"--replicas {replicas} --max-replicas {max_replicas}: need 1 <= N <= M")
    paths = {Path(m).name.removesuffix(".gguf"): str(m) for m in models}
    if models_dir:
        paths.update((name, str(p)) for name, p in scan_models_dir(models_dir).items())
    if not paths:
        paths = {"default": str(default_model_path())}
    if alias is not None:
        if len(paths) > 1:
            raise ValueError("--alias names one model; with several each is named by its file")
        paths = {alias: next(iter(paths.values()))}
    scaling = ({"num_replicas": replicas} if max_replicas is None else
               {"autoscaling_config": {"min_replicas": replicas, "max_replicas": max_replicas}})
    configs = [LLMConfig({"model_id": name, "model_source": path}, dict(options), dict(scaling))
               for name, path in paths.items()]
    if not ray.is_initialized():
        ray.init()      # RAY_ADDRESS's cluster, else a local one
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(build_openai_app({"llm_configs": configs}), name="gguflm", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
    return 0
