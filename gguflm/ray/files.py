"""Model files on every node of a Ray cluster: a path each node can read, or a URI fetched once
per node into a cache.

A source is a local path (a shared file system, or the file copied to each node), ``file://``,
``http(s)://``, or any URI :mod:`pyarrow.fs` reads (``s3://``, ``gs://``, ``hdfs://``...). A
remote file goes to ``<cache>/<digest of the URI>/<file name>``: the first actor of a node to
ask downloads it under a file lock, to a temporary name renamed when complete, and every other
actor of that node then maps the same file (its pages shared through the page cache).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from gguflm.errors import ModelSourceError

__all__ = ["local_model", "default_cache_dir"]

_CHUNK = 8 << 20


def default_cache_dir() -> Path:
    """``$GGUFLM_RAY_CACHE``, else ``$XDG_CACHE_HOME/gguflm/ray`` (``~/.cache/gguflm/ray``)."""
    if os.environ.get("GGUFLM_RAY_CACHE"):
        return Path(os.environ["GGUFLM_RAY_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "gguflm" / "ray"


def _node() -> str:
    return socket.gethostname()


def local_model(source: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A path on this node to the model ``source`` (see the module docstring).

    Raises
    ------
    ModelSourceError
        The path is not a readable file here, or the URI could not be fetched; the message names
        this node.
    """
    text = os.fspath(source)
    scheme = urlparse(text).scheme
    if scheme in ("", "file") or len(scheme) == 1:      # one letter: a Windows drive
        path = Path(urlparse(text).path if scheme == "file" else text).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ModelSourceError(f"model {text}: no readable file at {path} on node {_node()} "
                                   f"(give a path every node can read, or a URI to fetch)")
        return path
    name = Path(urlparse(text).path).name or "model.gguf"
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = folder / hashlib.sha256(text.encode()).hexdigest()[:16] / name
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)        # one download per node; the others wait for it
            if not target.is_file():
                partial = target.with_name(target.name + ".partial")
                _fetch(text, scheme, partial)
                os.replace(partial, target)
    except ModelSourceError:
        raise
    except Exception as exc:     # network, permissions, an unknown scheme: all say the same
        raise ModelSourceError(f"model {text}: could not fetch it into {target} on node "
                               f"{_node()}: {type(exc).__name__}: {exc}") from exc
    return target


def _fetch(uri: str, scheme: str, dest: Path) -> None:
    if scheme in ("http", "https"):
        with urllib.request.urlopen(uri, timeout=60) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, _CHUNK)
        return
    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    with fs.open_input_stream(path) as src, open(dest, "wb") as out:
        while chunk := src.read(_CHUNK):
            out.write(chunk)
