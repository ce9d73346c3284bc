"""llama.cpp's GBNF parser and matcher as a test oracle (tests/llama_grammar_oracle.cpp).

:class:`LlamaGrammarOracle` builds the oracle once per session with g++ against llama-cpp-python's
libllama.so and talks to it over pipes. Each request is answered before the next is sent; a
request that kills or hangs llama.cpp is reported as ``CRASHED`` and the oracle restarts, so the
caller can still check gguflm on that input.
"""

from __future__ import annotations

import functools
import resource
import select
import shutil
import subprocess
from pathlib import Path

import pytest

from _llama import L, peer_missing

HERE = Path(__file__).resolve().parent
CRASHED = "crashed"


def _field(data: bytes) -> bytes:
    return str(len(data)).encode() + b"\n" + data


def split_pieces(text: bytes) -> list[tuple[int, bytes]]:
    """test-grammar-integration.cpp's ``parse_tokens``: ``\\xff`` + 4 big-endian bytes is a token
    id (piece ``<[id]>``), other bytes are UTF-8 code points (an invalid byte is U+FFFD)."""
    out: list[tuple[int, bytes]] = []
    i = 0
    while i < len(text):
        b = text[i]
        if b == 0xFF and i + 5 <= len(text):
            token = int.from_bytes(text[i + 1:i + 5], "big")
            out.append((token, b"<[%d]>" % token))
            i += 5
            continue
        n = 1 if b < 0x80 else 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 0
        chunk = text[i:i + n] if n else b""
        try:
            if not chunk or len(chunk) < n:
                raise UnicodeDecodeError("utf-8", text, i, i + 1, "invalid")
            out.append((0, chunk.decode("utf-8").encode("utf-8")))
            i += n
        except UnicodeDecodeError:
            out.append((0, "\ufffd".encode()))
            i += 1
    return out


def token_text(token: int) -> bytes:
    """test-grammar-integration.cpp's ``token(id)``."""
    return b"\xff" + token.to_bytes(4, "big")


class LlamaGrammarOracle:
    def __init__(self, executable: Path, timeout: float = 10.0) -> None:
        self.executable = executable
        self.timeout = timeout
        self._proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([str(self.executable)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          preexec_fn=_limit_memory)
        return self._proc

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def _request(self, payload: bytes, read) -> object:
        proc = self._start()
        try:
            proc.stdin.write(payload)
            proc.stdin.flush()
            # llama.cpp loops on some grammars ({m,n} with n < m): give up after the timeout
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
            if not ready:
                raise EOFError
            return read(proc.stdout)
        except (BrokenPipeError, EOFError, ValueError):
            self.close()
            return CRASHED

    def parse(self, grammar: bytes) -> tuple[dict[str, int], list[list[tuple[int, int]]]] | str:
        """llama.cpp's symbol table and rules, or ``"error: <llama.cpp's message>"``, or
        :data:`CRASHED`."""
        def read(out):
            head = out.readline()
            if not head:
                raise EOFError
            if head.startswith(b"ERR"):
                message = bytes.fromhex(head.split()[1].decode()) if head.split()[1] != b"-" else b""
                return "error: " + message.decode("utf-8", "replace")
            symbols: dict[str, int] = {}
            rules: list[list[tuple[int, int]]] = []
            for line in iter(out.readline, b"END\n"):
                if not line:
                    raise EOFError
                parts = line.split()
                if parts[0] == b"S":
                    name = b"" if parts[1] == b"-" else bytes.fromhex(parts[1].decode())
                    symbols[name.decode("utf-8", "surrogateescape")] = int(parts[2])
                else:
                    rules.append([tuple(int(v) for v in p.split(b":")) for p in parts[1:]])
            return symbols, rules
        return self._request(_field(b"parse") + _field(grammar), read)

    def match(self, grammar: bytes, strings: list[bytes], root: bytes = b"root"
              ) -> list[bool] | str | None:
        """Whether llama.cpp's grammar accepts each string whole, fed one code point (or
        ``token(id)``) at a time as test-grammar-integration.cpp feeds it (None: the grammar
        does not build; :data:`CRASHED`: llama.cpp died)."""
        return self.match_pieces(grammar, [split_pieces(s) for s in strings], root)

    def match_pieces(self, grammar: bytes, inputs: list[list[tuple[int, bytes]]],
                     root: bytes = b"root") -> list[bool] | str | None:
        """As :meth:`match`, each input given as (token id, piece) pairs for
        ``llama_grammar_accept_token``."""
        payload = _field(b"match") + _field(grammar) + _field(root) + _field(b"%d" % len(inputs))
        for pieces in inputs:
            payload += _field(b"%d" % len(pieces))
            for token, piece in pieces:
                payload += _field(b"%d" % token) + _field(piece)

        def read(out):
            line = out.readline()
            if not line:
                raise EOFError
            line = line.strip()
            if line == b"INIT_FAIL":
                return None
            return [] if line == b"-" else [c == ord("1") for c in line]
        return self._request(payload, read)


def _limit_memory() -> None:
    """A grammar that makes llama.cpp allocate without end should fail fast, not swap."""
    limit = 2 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@functools.cache
def _build(out_dir: str) -> Path | str:
    if L is None:
        return "llama-cpp-python is not installed (its libllama.so is the grammar oracle)"
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return "no C++ compiler (g++) to build the grammar oracle"
    lib = Path(L.__file__).resolve().parent / "lib"
    exe = Path(out_dir) / "llama_grammar_oracle"
    subprocess.run([cxx, "-std=c++17", "-O1", str(HERE / "llama_grammar_oracle.cpp"), "-o",
                    str(exe), f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}"], check=True,
                   capture_output=True)
    return exe


def oracle(tmp_path_factory) -> LlamaGrammarOracle:
    """The oracle for a session (skips when llama-cpp-python is missing)."""
    built = _build(str(tmp_path_factory.mktemp("grammar-oracle")))
    if isinstance(built, str):
        peer_missing(built)
    return LlamaGrammarOracle(built)


@functools.cache
def _llama_vocab(path: str):
    """llama.cpp's vocabulary of a GGUF file, loaded once per session (vocab only)."""
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp cannot load {path}")
    _LOADED.append(model)   # kept for the whole session, as the vocabulary points into it
    return L.llama_model_get_vocab(model)


_LOADED: list = []


class LlamaCppGrammarSampler:
    """llama.cpp's grammar sampler (``llama_sampler_init_grammar``, or the lazy one) over a
    GGUF file's vocabulary, through llama-cpp-python's C bindings, in this process."""

    def __init__(self, path: Path, grammar: str, root: str = "root", *, lazy: bool = False,
                 patterns: tuple[str, ...] = (), tokens: tuple[int, ...] = ()) -> None:
        import ctypes

        import numpy as np

        from _llama import require_llama
        from gguflm.bench.sampling import TOKEN_DATA

        require_llama()
        self._ctypes, self._np = ctypes, np
        self.vocab = _llama_vocab(str(path))
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        if lazy:
            pats = (ctypes.c_char_p * max(1, len(patterns)))(*[p.encode() for p in patterns])
            toks = (L.llama_token * max(1, len(tokens)))(*tokens)
            self.sampler = L.llama_sampler_init_grammar_lazy_patterns(
                self.vocab, grammar.encode(), root.encode(), pats, len(patterns), toks,
                len(tokens))
        else:
            self.sampler = L.llama_sampler_init_grammar(self.vocab, grammar.encode(), root.encode())
        if not self.sampler:
            raise ValueError("llama.cpp rejects the grammar")
        self._buffer = np.zeros(self.n_vocab, dtype=TOKEN_DATA)

    def close(self) -> None:
        if getattr(self, "sampler", None):
            L.llama_sampler_free(self.sampler)
            self.sampler = None

    def __del__(self) -> None:
        self.close()

    def mask(self, ids=None):
        """Which candidates survive ``llama_sampler_apply`` (all tokens, or ``ids``)."""
        np, ctypes = self._np, self._ctypes
        ids = np.arange(self.n_vocab, dtype=np.int32) if ids is None else np.asarray(ids, np.int32)
        buffer = self._buffer[:len(ids)]
        buffer["id"] = ids
        buffer["logit"] = 0.0
        array = L.llama_token_data_array(
            data=buffer.ctypes.data_as(ctypes.POINTER(L.llama_token_data)), size=len(ids),
            selected=-1, sorted=False)
        L.llama_sampler_apply(self.sampler, ctypes.byref(array))
        return buffer["logit"] != -np.inf

    def accept(self, token: int) -> None:
        L.llama_sampler_accept(self.sampler, token)
