"""Architectures, one module each; a module registers its class by defining it.

An architecture declares the hyper-parameters it reads, the tensors it needs (names, shapes,
optional or duplicated) and its forward pass. Adding one is adding a file here and naming it in
``_MODULES``.
"""

from __future__ import annotations

import importlib

from gguflm.models.base import REGISTRY, Architecture, TensorSpec, UnknownArchitectureError

_MODULES = ("llama", "gemma2", "gemma3", "qwen2", "qwen3", "phi3")


def get_architecture(name: str) -> type[Architecture]:
    """The class registered for ``general.architecture == name``."""
    for module in _MODULES:
        importlib.import_module(f"gguflm.models.{module}")
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownArchitectureError(f"unknown model architecture: '{name}'") from None


def architectures() -> list[str]:
    for module in _MODULES:
        importlib.import_module(f"gguflm.models.{module}")
    return sorted(REGISTRY)


__all__ = ["Architecture", "TensorSpec", "UnknownArchitectureError", "architectures", "get_architecture"]
