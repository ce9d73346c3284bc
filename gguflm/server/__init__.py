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
    get the app's ``shutdown_timeout`` to finish, then are cancelled (their slots freed)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=app.state.shared.shutdown_timeout)
