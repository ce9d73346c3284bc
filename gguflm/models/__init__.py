"""Architectures, one module each; a module registers its class by defining it.

An architecture declares the hyper-parameters it reads, the tensors it needs (names, shapes,
optional or duplicated) and its forward pass. Adding one is adding a file here: every module of
this package is imported before the registry is read.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from gguflm.models.base import REGISTRY, Architecture, TensorSpec, UnknownArchitectureError


@functools.cache
def _import_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")


def get_architecture(name: str) -> type[Architecture]:
    """The class registered for ``general.architecture == name``."""
    _import_all()
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownArchitectureError(f"unknown model architecture: '{name}'") from None


def architectures() -> list[str]:
    _import_all()
    return sorted(REGISTRY)


__all__ = ["Architecture", "TensorSpec", "UnknownArchitectureError", "architectures", "get_architecture"]
