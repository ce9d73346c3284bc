"""Several models behind one server, picked by the request's ``model``, as llama-server's router
mode: ``--models-dir DIR`` (each ``*.gguf`` file, named without the extension) and repeated
``-m``. A model is loaded on its first request and stays; to load another past ``--models-max N``
models or ``--memory-budget`` bytes (each model's :func:`gguflm.memory.estimate_memory` for the
server's context), the least recently used idle model is unloaded first.

A model is idle when no request holds it (:meth:`Router.acquire` to :meth:`Router.release`, the
route's life) and its scheduler runs and queues nothing (a stream outlives its route). A load
that needs room waits for a model to become idle, and while it waits new requests for loaded
models wait too, so the models take turns instead of one starving the other.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from gguflm.server.protocol import RequestError

log = logging.getLogger("gguflm.server")

__all__ = ["Router", "scan_models_dir"]

UNLOADED, LOADING, LOADED = "unloaded", "loading", "loaded"
WAIT_SECONDS = 600.0
_LOAD = object()         # Router._try's answer to the caller that is to load the model     # the longest a request waits for room to load its model


def _give_back_memory() -> None:
    """Return an unloaded model's freed memory to the system: its arrays are collected, and
    glibc's malloc (which serves most of them from heaps it keeps once its mmap threshold has
    risen) trims its heaps; without it the resident size grows with every load."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):    # not glibc
        pass


def scan_models_dir(directory: str | Path) -> dict[str, Path]:
    """The models of ``directory``: each ``.gguf`` file by its name without the extension."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"--models-dir {root}: not a directory")
    return {p.name[: -len(".gguf")]: p for p in sorted(root.iterdir())
            if p.is_file() and p.name.endswith(".gguf")}


@dataclass
class _Entry:
    name: str
    path: Path
    bytes_needed: int
    state: str = UNLOADED
    server: Any = None
    users: int = 0
    last_used: float = 0.0
    error: str | None = None
    waiters: list[float] = field(default_factory=list)   # arrival times of requests waiting for it
    since: float = 0.0            # while a load waits for room: when its first request arrived
    created: int = field(default_factory=lambda: int(time.time()))


class Router:
    """The models by name, each loaded by ``load(name, path)`` (a ``_Server``: ``scheduler``,
    ``close()``) when first acquired.

    Parameters
    ----------
    models
        Name to ``.gguf`` path.
    load
        Makes a model's server (in the caller's thread).
    models_max
        The most models loaded at once (None: no limit).
    memory_budget
        The most bytes the loaded models' estimates may add up to (None: no limit).
    estimate
        A model's bytes (used only with ``memory_budget``).
    """

    def __init__(self, models: dict[str, Path], load: Callable[[str, Path], Any],
                 models_max: int | None = None, memory_budget: int | None = None,
                 estimate: Callable[[Path], int] | None = None) -> None:
        if not models:
            raise ValueError("no models to serve")
        if models_max is not None and models_max < 1:
            raise ValueError(f"models_max must be >= 1, got {models_max}")
        self._load = load
        self.models_max = models_max
        self.memory_budget = memory_budget
        self._entries = {name: _Entry(name, Path(path), estimate(Path(path)) if memory_budget else 0)
                         for name, path in models.items()}
        if memory_budget is not None:
            for e in self._entries.values():
                if e.bytes_needed > memory_budget:
                    raise ValueError(f"model {e.name} needs {e.bytes_needed >> 20} MiB, more than "
                                     f"the memory budget of {memory_budget >> 20} MiB")
        self._any_name = False
        self._lock = threading.Lock()
        self._pending: list[_Entry] = []     # loads waiting for room, first come first served
        self._closed = False

    @classmethod
    def serving(cls, server: Any) -> Router:
        """A router of the one model ``server`` serves (loaded, never unloaded), whatever name a
        request gives."""
        router = cls({server.alias: Path(server.llm.model_path)}, lambda name, path: server)
        router._any_name = True
        e = router._entries[server.alias]
        e.server, e.state = server, LOADED
        return router

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: Any) -> _Entry:
        """The model named ``name``; 404 for another."""
        if self._any_name:
            return next(iter(self._entries.values()))
        found = self._entries.get(name) if isinstance(name, str) else None
        if found is None:
            raise RequestError(f"model {name!r} not found; this server has "
                               f"{', '.join(self._entries)}", param="model", status=404,
                               type="not_found_error", code="model_not_found")
        return found

    async def acquire(self, name: Any) -> Any:
        """The loaded server of model ``name``, held until :meth:`release`; waits (without
        holding a worker thread: a waiting request must not starve the streams it waits for)
        while it loads or there is no room for it."""
        e = self.entry(name)
        arrived = time.monotonic()
        with self._lock:
            e.waiters.append(arrived)
        try:
            while True:
                with self._lock:
                    ready = self._try(e, arrived)
                if ready is _LOAD:
                    # then taken by the next try: a request cancelled during the load holds nothing
                    await anyio.to_thread.run_sync(self._load_entry, e)
                elif ready is not None:
                    return ready
                else:
                    await asyncio.sleep(0.05)      # idleness is polled: a stream ends unannounced
        finally:
            with self._lock:
                e.waiters.remove(arrived)

    def _try(self, e: _Entry, arrived: float) -> Any:
        """Under the lock, for a request that ``arrived`` then: ``e``'s server (now held) if it
        is loaded and the request's turn (requests come in arrival order: one that arrived after
        a load began waiting for room waits for that load); :data:`_LOAD` (``e`` now LOADING) if
        the caller is to load it; else None: wait and try again."""
        if self._closed:
            raise RequestError("the server is shutting down", status=503, type="server_error")
        head = self._pending[0] if self._pending else None
        if e.state == LOADED and (head is None or arrived < head.since or self._room_for(head)):
            e.users += 1
            e.last_used = time.monotonic()
            return e.server
        if e.state == UNLOADED:
            if e not in self._pending:
                e.since = arrived
                self._pending.append(e)
            if self._pending[0] is e and self._make_room(e):
                self._pending.remove(e)
                e.state, e.error = LOADING, None
                return _LOAD
        if time.monotonic() > arrived + WAIT_SECONDS:
            if e in self._pending:
                self._pending.remove(e)
            raise RequestError(f"model {e.name} could not be loaded: the loaded models "
                               f"stayed busy for {WAIT_SECONDS:.0f} s", status=503,
                               type="unavailable_error")
        return None

    def _load_entry(self, e: _Entry) -> None:
        try:
            log.info("loading model %s from %s", e.name, e.path)
            server = self._load(e.name, e.path)
        except Exception as exc:
            with self._lock:
                e.state, e.error = UNLOADED, str(exc)
            raise RequestError(f"model {e.name} failed to load: {exc}", status=500,
                               type="server_error") from None
        with self._lock:
            e.server, e.state = server, LOADED
            e.last_used = time.monotonic()

    def release(self, server: Any) -> None:
        """A request that :meth:`acquire` gave ``server`` is done with it."""
        with self._lock:
            for e in self._entries.values():
                if e.server is server:
                    e.users -= 1

    def _held(self) -> list[_Entry]:
        return [e for e in self._entries.values() if e.state != UNLOADED]

    def _room_for(self, e: _Entry) -> bool:
        held = self._held()
        if self.models_max is not None and len(held) >= self.models_max:
            return False
        return (self.memory_budget is None
                or sum(h.bytes_needed for h in held) + e.bytes_needed <= self.memory_budget)

    def _make_room(self, e: _Entry) -> bool:
        """Unload idle models, least recently used first, until ``e`` fits; False if it cannot
        yet (the others are busy)."""
        while not self._room_for(e):
            idle = [h for h in self._held() if h.state == LOADED and h.users == 0
                    and not any(w < e.since for w in h.waiters)   # earlier requests go first
                    and (h.server.scheduler is None or h.server.scheduler.idle())]
            if not idle:
                return False
            victim = min(idle, key=lambda h: h.last_used)
            log.info("unloading model %s (least recently used)", victim.name)
            victim.server.close()
            victim.server, victim.state = None, UNLOADED
            _give_back_memory()
        return True

    def servers(self) -> list[Any]:
        """The loaded models' servers, most recently used first."""
        with self._lock:
            loaded = [e for e in self._entries.values() if e.state == LOADED]
            return [e.server for e in sorted(loaded, key=lambda e: -e.last_used)]

    def listing(self) -> list[dict[str, Any]]:
        """``/v1/models`` in router mode: every model with its state, in llama-server's fields."""
        with self._lock:
            entries = list(self._entries.values())
            out = []
            for e in entries:
                status: dict[str, Any] = {"value": e.state, "args": ["-m", str(e.path)]}
                if e.error is not None and e.state == UNLOADED:
                    status.update(failed=True, error=e.error)
                out.append({"id": e.name, "aliases": [], "tags": [], "object": "model",
                            "owned_by": "gguflm", "created": e.created, "status": status,
                            "architecture": {"input_modalities": ["text"],
                                             "output_modalities": ["text"]},
                            "source": "local", "can_remove": False, "path": str(e.path)})
            return out

    def cancel_all(self) -> None:
        """Cancel what every loaded model runs or queues."""
        for server in self.servers():
            if server.scheduler is not None:
                server.scheduler.cancel_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for e in self._entries.values():
                if e.server is not None:
                    e.server.close()
                    e.server, e.state = None, UNLOADED
