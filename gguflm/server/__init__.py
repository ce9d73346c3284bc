"""``gguflm serve``: an OpenAI-compatible HTTP server with parallel slots and continuous batching.

>>> from gguflm.server import create_app
>>> app = create_app("model.gguf", parallel=4, n_ctx=4096)     # any ASGI server runs it
>>> import uvicorn; uvicorn.run(app, port=8080)

Needs the ``server`` extra (``pip install "gguflm[server]"``: Starlette and uvicorn).
:mod:`gguflm.server.scheduler` batches the slots, :mod:`gguflm.server.app` is the ASGI app,
:mod:`gguflm.server.protocol` checks request bodies, :mod:`gguflm.server.metrics` writes
``/metrics``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "serve"]


try:
    from gguflm.server.app import create_app
except ImportError as exc:  # the server extra is missing
    raise ImportError(f'gguflm.server needs the server extra: pip install "gguflm[server]" ({exc})'
                      ) from exc


def serve(app: Any, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info") -> None:
    """Run ``app`` (from :func:`create_app`) with uvicorn until SIGINT/SIGTERM; requests in flight
    get the app's ``shutdown_timeout`` to finish, then are cancelled (their slots freed). The
    server's log (``gguflm.server``, its access lines included) goes to stderr at ``log_level``,
    in place of uvicorn's access log."""
    import asyncio
    import logging

    import uvicorn

    server_log = logging.getLogger("gguflm.server")
    if not server_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        server_log.addHandler(handler)
        server_log.setLevel(log_level.upper())
        server_log.propagate = False     # not twice through gguflm's own handler
    timeout = app.state.shared.shutdown_timeout

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            # shortly before uvicorn's deadline cuts the connections, the requests still running
            # are cancelled: each stream then ends with its last event and [DONE]
            handle = asyncio.get_running_loop().call_later(
                max(0.0, timeout - min(1.0, timeout / 2)), app.state.shared.router.cancel_all)
            try:
                await super().shutdown(sockets)
            finally:
                handle.cancel()

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=timeout)
    Server(config).run()
