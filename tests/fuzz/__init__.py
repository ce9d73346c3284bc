"""Coverage-guided fuzzing of every entry gguflm offers to untrusted input (atheris, issue 45).

Each target is a check function ``check(data: bytes) -> None`` made once by its factory (which
loads what the target needs: vocabularies, grammars). The check turns the bytes into the entry's
input, calls the entry and asserts what must hold: the entry returns a valid result or raises a
:class:`gguflm.Error` subclass (a few documented argument errors are named per target). Anything
else escapes the check and is a finding, as are a crash, a sanitizer report, a run longer than
:data:`TIMEOUT_S` and a process past :data:`RSS_LIMIT_MB`.

``python -m tests.fuzz TARGET --runs N`` runs one target under atheris (``--replay`` replays its
seed corpus and regression inputs without atheris); ``docs/reliability.md`` gives the campaign
commands, the sanitizer build and the figures.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import resource
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS_DIR = HERE / "corpus"
REGRESSIONS_DIR = HERE / "regressions"

# what must hold for every input: no run past this, no process past that
TIMEOUT_S = 1
RSS_LIMIT_MB = 2048

Check = Callable[[bytes], None]

# target -> "module:factory" (modules of this package)
TARGETS: dict[str, str] = {
    "gguf_reader": "files:gguf_reader",
    "vocab_only": "files:vocab_only",
    "gbnf": "grammars:gbnf",
    "json_schema_py": "grammars:json_schema_py",
    "json_schema_cpp": "grammars:json_schema_cpp",
    "grammar_match": "grammars:grammar_match",
    "chat_template": "chat:chat_template",
    "tokenize_spm": "tokenizers:tokenize_spm",
    "tokenize_bpe": "tokenizers:tokenize_bpe",
    "tokenize_wpm": "tokenizers:tokenize_wpm",
    "tokenize_ugm": "tokenizers:tokenize_ugm",
    "tokenize_rwkv": "tokenizers:tokenize_rwkv",
    "detokenize": "tokenizers:detokenize",
    "quants": "quants:quants_rows",
    "server_requests": "server:server_requests",
}


# every target at once: the first byte picks one (CI's smoke run, one process for all)
ALL = "all"


@functools.cache
def make(target: str) -> Check:
    """The check function of ``target`` (made once per process)."""
    if target == ALL:
        checks = [make(name) for name in TARGETS]

        def check(data: bytes) -> None:
            if data:
                checks[data[0] % len(checks)](data[1:])

        return check
    module, factory = TARGETS[target].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), factory)()


class Hang(AssertionError):
    """One input ran longer than :data:`TIMEOUT_S`."""


@contextlib.contextmanager
def deadline(seconds: float = TIMEOUT_S) -> Iterator[None]:
    """Raise :class:`Hang` in the block after ``seconds`` (the replay's stand-in for libFuzzer's
    ``-timeout``; main thread only)."""
    def expired(signum, frame):
        raise Hang(f"one input ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def memory_cap(mb: int = RSS_LIMIT_MB) -> Iterator[None]:
    """At most ``mb`` MiB of new address space in the block (the replay's stand-in for libFuzzer's
    ``-rss_limit_mb``/``-malloc_limit_mb``: an allocation past it raises MemoryError). Linux only."""
    try:
        status = Path("/proc/self/status").read_text()
        vm_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmSize:")))
    except (OSError, StopIteration):
        yield
        return
    previous = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm_kb * 1024 + (mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (cap if previous[1] == resource.RLIM_INFINITY else min(cap, previous[1]),
                                            previous[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, previous)


def inputs(target: str, kind: str = "corpus") -> list[Path]:
    """The committed inputs of ``target``: its seed corpus, or its regression inputs."""
    folder = (CORPUS_DIR if kind == "corpus" else REGRESSIONS_DIR) / target
    return sorted(p for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []


def all_seeds() -> list[bytes]:
    """The seeds of every target in the input format of :data:`ALL`."""
    return [bytes([i]) + path.read_bytes() for i, name in enumerate(TARGETS)
            for kind in ("corpus", "regressions") for path in inputs(name, kind)]


def replay(target: str, data: bytes, seconds: float = TIMEOUT_S) -> None:
    """Run one input through ``target``'s check under the deadline and the memory cap."""
    check = make(target)
    with deadline(seconds), memory_cap():
        check(data)

