"""GGUF files from strangers: the reader (header, metadata, tensor infos, tensor views), then a
full model load on top, and a vocabulary-only load.

Must hold: a :class:`gguflm.Error` (GGUFError, ModelLoadError and its subclasses) or a reader /
model whose every metadata value, tensor view and vocabulary can be read.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from gguflm import Model
from gguflm.errors import Error
from gguflm.gguf import GGUFReader

from . import Check


def _scratch_file() -> Path:
    """One file per process to hold the input (the reader takes paths), in memory when it can."""
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    folder = tempfile.mkdtemp(prefix="gguflm-fuzz-", dir=root)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return Path(folder) / "input.gguf"


def _read_all(reader: GGUFReader) -> None:
    for key, value in reader.metadata.items():
        reader.array_type(key)
        if isinstance(value, np.ndarray):
            value.sum(dtype=np.float64)
        elif isinstance(value, list):
            for item in value:
                len(item)
    for info in reader.tensors:
        assert reader.tensor(info.name) is info
        np.asarray(info.data).view(np.uint8).sum()   # every byte of the view is inside the file


def gguf_reader() -> Check:
    path = _scratch_file()

    def check(data: bytes) -> None:
        path.write_bytes(data)
        try:
            with GGUFReader(path, mode="read") as reader:
                _read_all(reader)
        except Error:
            return
        try:
            with Model.load(path, load_mode="none", check_tensors=True) as model:
                model.vocab.tokenize("Hello world", add_special=True)
        except Error:
            pass

    return check


def vocab_only() -> Check:
    path = _scratch_file()

    def check(data: bytes) -> None:
        path.write_bytes(data)
        try:
            with Model.load(path, vocab_only=True) as model:
                vocab = model.vocab
                for text in ("Hello world", "<s> \u2581x\n\n 123 \xe9\u4e2d"):
                    ids = vocab.tokenize(text, add_special=True, parse_special=True)
                    vocab.detokenize(ids, unparse_special=True)
        except Error:
            pass

    return check
