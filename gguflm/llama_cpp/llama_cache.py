"""llama-cpp-python's prompt caches (``llama_cpp.llama_cache``): saved states of a ``Llama`` keyed
by the tokens they hold. ``Llama.create_completion`` looks up the entry sharing the longest prefix
with its prompt and loads it, and saves its state after the completion; entries are dropped oldest
used first once their states pass ``capacity_bytes``.

:class:`LlamaRAMCache` keeps the states in memory; :class:`LlamaDiskCache` in a folder, one file
per state (numpy's ``.npz``, no pickles: a cache folder is not trusted to run code) with a JSON
index of the keys and their order of use. llama-cpp-python's disk cache stands on the
``diskcache`` package; this one needs nothing beyond numpy, and a hit keeps the entry (theirs
takes it out of the cache until the completion saves it again).
"""

from __future__ import annotations

import hashlib
import json
import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
import numpy as np

from gguflm.llama_cpp.state import LlamaState

__all__ = ["BaseLlamaCache", "LlamaRAMCache", "LlamaCache", "LlamaDiskCache"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _longest(keys: Sequence[tuple[int, ...]], key: tuple[int, ...]) -> tuple[int, ...] | None:
    """The first of ``keys`` sharing the longest non-empty prefix with ``key``."""
    best, best_len = None, 0
    for k in keys:
        n = common_prefix(k, key)
        if n > best_len:
            best, best_len = k, n
    return best


class BaseLlamaCache(ABC):
    """Saved states by token sequence; a lookup finds the longest shared prefix."""

    def __init__(self, capacity_bytes: int = 2 << 30):
        self.capacity_bytes = capacity_bytes

    @property
    @abstractmethod
    def cache_size(self) -> int:
        """Bytes of the states held."""

    @abstractmethod
    def __getitem__(self, key: Sequence[int]) -> LlamaState: ...

    @abstractmethod
    def __contains__(self, key: Sequence[int]) -> bool: ...

    @abstractmethod
    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None: ...


class LlamaRAMCache(BaseLlamaCache):
    """States in memory, least recently used dropped first past ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int = 2 << 30):
        super().__init__(capacity_bytes)
        self.cache_state: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(state.llama_state_size for state in self.cache_state.values())

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = _longest(list(self.cache_state), tuple(key))
        if found is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        self.cache_state.move_to_end(found)
        return self.cache_state[found]

    def __contains__(self, key: Sequence[int]) -> bool:
        return _longest(list(self.cache_state), tuple(key)) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        key = tuple(key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        while self.cache_size > self.capacity_bytes and self.cache_state:
            self.cache_state.popitem(last=False)


LlamaCache = LlamaRAMCache   # llama-cpp-python's older name


class LlamaDiskCache(BaseLlamaCache):
    """States in ``cache_dir``, least recently used dropped first past ``capacity_bytes``."""

    _INDEX = "index.json"

    def __init__(self, cache_dir: str | os.PathLike[str] = ".cache/llama_cache", capacity_bytes: int = 2 << 30):
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    # the index: [[file name, tokens], ...] least recently used first
    def _entries(self) -> list[tuple[str, tuple[int, ...]]]:
        try:
            raw = json.loads((self.cache_dir / self._INDEX).read_text())
            return [(str(name), tuple(int(t) for t in tokens)) for name, tokens in raw]
        except (OSError, ValueError, TypeError):
            return []

    def _write_entries(self, entries: list[tuple[str, tuple[int, ...]]]) -> None:
        tmp = self.cache_dir / (self._INDEX + ".tmp")
        tmp.write_text(json.dumps([[name, list(tokens)] for name, tokens in entries]))
        os.replace(tmp, self.cache_dir / self._INDEX)

    @staticmethod
    def _file_name(key: tuple[int, ...]) -> str:
        return hashlib.sha256(np.asarray(key, np.int64).tobytes()).hexdigest()[:32] + ".npz"

    @property
    def cache_size(self) -> int:
        return sum((self.cache_dir / name).stat().st_size for name, _ in self._entries()
                   if (self.cache_dir / name).exists())

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        entries = self._entries()
        found = _longest([tokens for _, tokens in entries], tuple(key))
        if found is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        name = next(n for n, tokens in entries if tokens == found)
        with np.load(self.cache_dir / name, allow_pickle=False) as saved:
            state = LlamaState(input_ids=saved["input_ids"], scores=saved["scores"], n_tokens=int(saved["n_tokens"]),
                               llama_state=saved["llama_state"].tobytes(),
                               llama_state_size=int(saved["llama_state"].size), seed=int(saved["seed"]))
        self._write_entries([e for e in entries if e[0] != name] + [(name, found)])
        return state

    def __contains__(self, key: Sequence[int]) -> bool:
        return _longest([tokens for _, tokens in self._entries()], tuple(key)) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        key = tuple(int(t) for t in key)
        name = self._file_name(key)
        tmp = self.cache_dir / (name + ".tmp.npz")
        np.savez(tmp, input_ids=np.asarray(value.input_ids), scores=np.asarray(value.scores),
                 n_tokens=np.int64(value.n_tokens), seed=np.int64(value.seed),
                 llama_state=np.frombuffer(value.llama_state, np.uint8))
        os.replace(tmp, self.cache_dir / name)
        entries = [e for e in self._entries() if e[1] != key] + [(name, key)]
        while entries and sum((self.cache_dir / n).stat().st_size for n, _ in entries) > self.capacity_bytes:
            (self.cache_dir / entries.pop(0)[0]).unlink(missing_ok=True)
        self._write_entries(entries)
