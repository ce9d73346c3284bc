"""PyInstaller support: an application that imports gguflm freezes with its compiled extensions,
every submodule (architectures and lazy imports are found at run time, which PyInstaller's
analysis cannot see) and its package data; the default model's package is included when it is
installed. Registered through the ``pyinstaller40`` entry point, so nothing is needed in the
application's spec file."""

from __future__ import annotations

import os


def get_hook_dirs() -> list[str]:
    """The folder holding ``hook-gguflm.py`` (PyInstaller's ``hook-dirs`` entry point)."""
    return [os.path.dirname(__file__)]
