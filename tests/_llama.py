"""llama.cpp itself (through llama-cpp-python's C bindings) as a test oracle, when installed.

``LlamaVocab(path)`` loads a GGUF file vocab-only and answers with llama.cpp's own tokenize,
token_to_piece and detokenize. Tests that need it skip when ``llama_cpp`` is not importable: it is a
reference peer, not a dependency.

Tests that run llama.cpp's kernels (decode, ggml ops) call :func:`require_peer` instead: a build
that cannot compute on this machine (llama-cpp-python built natively where the CPU advertises AMX
but the OS does not grant it dies with SIGILL on a 512-token prompt) makes them skip, never crash
the run.

With ``GGUFLM_REQUIRE_PEER=1`` (set by .ci/run) every such test fails instead of skipping: there the
peer is the oracle, and a failed build must not turn its tests into skips of a green run. Every
test that needs llama-cpp-python goes through :func:`peer_missing` or :func:`import_peer`.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import NoReturn

import pytest

try:
    import llama_cpp.llama_cpp as L
except ImportError:  # pragma: no cover - depends on the environment
    L = None


# while a LlamaDecoder with heads=True decodes, llama.cpp's log lines are collected here
_captured: list[str] | None = None


def _keep_log(level: int, text: bytes, user: object) -> None:
    if _captured is not None:
        _captured.append(text.decode(errors="replace"))


@functools.cache
def _backend() -> None:
    L.llama_backend_init()
    # llama.cpp logs every load to stderr; keep the test output readable
    _backend.silence = L.llama_log_callback(_keep_log)
    L.llama_log_set(_backend.silence, ctypes.c_void_p())


PEER_REQUIRED = os.environ.get("GGUFLM_REQUIRE_PEER", "") == "1"


def peer_missing(reason: str) -> NoReturn:
    """Skip a test for want of llama-cpp-python, or with GGUFLM_REQUIRE_PEER=1 fail it."""
    if PEER_REQUIRED:
        pytest.fail(f"GGUFLM_REQUIRE_PEER=1, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_peer(name: str = "llama_cpp") -> types.ModuleType:
    """A module of llama-cpp-python (see :func:`peer_missing` when it is not installed)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        peer_missing(f"llama-cpp-python is not installed ({exc})")


def require_llama() -> None:
    if L is None:
        peer_missing("llama-cpp-python is not installed (reference peer for exactness checks)")
    _backend()


TINY_MODEL = Path(__file__).resolve().parent / "data" / "arch" / "llama.gguf"

# a 512-token prompt in one ubatch: the batch size at which llama.cpp's matmuls take their widest
# paths (AMX tiles, where built in), on a tiny model with Q8_0/Q4_K/Q4_1/Q5_0/Q6_K weights
_PROBE = """
import sys, llama_cpp
llm = llama_cpp.Llama(sys.argv[1], n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, verbose=False)
llm.eval([3 + i % 300 for i in range(512)])
"""


@functools.cache
def peer_problem() -> str | None:
    """Why llama.cpp cannot serve as the computing peer on this machine, or None.

    Probed once per session in a child process, so that a build that dies does not take the test
    run with it.
    """
    if L is None:
        return "llama-cpp-python is not installed (reference peer for exactness checks)"
    try:
        run = subprocess.run([sys.executable, "-c", _PROBE, str(TINY_MODEL)], capture_output=True, text=True,
                             timeout=300)
    except subprocess.TimeoutExpired:
        return "llama-cpp-python did not finish a 512-token prompt on a tiny model within 300 s"
    if run.returncode < 0:
        return (f"llama-cpp-python's build dies with {signal.Signals(-run.returncode).name} on a 512-token "
                "prompt on this machine (built natively for instructions the OS does not grant, such as "
                "AMX); rebuild it as .ci/run does")
    if run.returncode != 0:
        return f"llama-cpp-python fails a 512-token prompt on a tiny model: {run.stderr.strip()[-500:]}"
    return None


def require_peer() -> types.ModuleType:
    """``llama_cpp``, once it has shown that it computes here; skips the test otherwise."""
    problem = peer_problem()
    if problem is not None:
        peer_missing(problem)
    return import_peer()


class LlamaVocab:
    """llama.cpp's vocabulary of a GGUF file."""

    def __init__(self, path: str | Path):
        require_llama()
        params = L.llama_model_default_params()
        params.vocab_only = True
        self._model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_tokens = L.llama_vocab_n_tokens(self._vocab)

    def __del__(self):
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)

    def tokenize(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        n = len(data) + 16
        while True:
            out = (ctypes.c_int32 * n)()
            k = L.llama_tokenize(self._vocab, data, len(data), out, n, add_special, parse_special)
            if k >= 0:
                return list(out[:k])
            n = -k

    def token_to_piece(self, tok: int, lstrip: int = 0, special: bool = False) -> bytes:
        n = 64
        while True:
            buf = ctypes.create_string_buffer(n)
            k = L.llama_token_to_piece(self._vocab, tok, buf, n, lstrip, special)
            if k >= 0:
                return buf.raw[:k]
            n = -k

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        n = 4 * len(ids) + 64
        while True:
            buf = ctypes.create_string_buffer(n)
            k = L.llama_detokenize(self._vocab, arr, len(ids), buf, n, remove_special,
                                   unparse_special)
            if k >= 0:
                return buf.raw[:k]
            n = -k

    def special_ids(self) -> dict[str, int | None]:
        def get(fn: str) -> int | None:
            tok = getattr(L, fn)(self._vocab)
            return None if tok < 0 else tok

        return {name: get(f"llama_vocab_{name}") for name in
                ("bos", "eos", "eot", "sep", "nl", "pad", "fim_pre", "fim_suf", "fim_mid",
                 "fim_pad", "fim_rep", "fim_sep")}

    def flags(self) -> dict[str, bool]:
        return {"add_bos": L.llama_vocab_get_add_bos(self._vocab),
                "add_eos": L.llama_vocab_get_add_eos(self._vocab)}

    def eog_ids(self) -> frozenset[int]:
        return frozenset(t for t in range(self.n_tokens) if L.llama_vocab_is_eog(self._vocab, t))

    def attr(self, tok: int) -> int:
        return L.llama_vocab_get_attr(self._vocab, tok)


def llama_prompt_logits(path: str | Path, tokens: list[int], **params) -> "np.ndarray":
    """llama.cpp's logits at every position of ``tokens``, evaluated by llama-cpp-python's ``Llama``
    (``params``: n_ctx, n_batch, n_ubatch, n_threads...), float32 [n_tokens, n_vocab]."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(str(path), logits_all=True, verbose=False, **params)
    try:
        llm.eval(tokens)
        return np.asarray(llm.scores[:len(tokens)], dtype=np.float32)
    finally:
        llm.close()


def llama_embeddings(path: str | Path, token_lists: list[list[int]], pooling: int, n_ctx: int = 512,
                     n_threads: int = 2) -> list:
    """llama.cpp's embeddings of ``token_lists`` decoded as one batch, sequence ``s`` at positions
    0.., every token an output (as llama-cpp-python's ``Llama.embed`` packs a batch): per list its
    pooled vector (rank: its ``n_cls_out`` scores), or with pooling 0 its tokens' rows (read
    correctly: ``Llama.embed`` 0.3.36 misplaces those of the second and later lists)."""
    import numpy as np

    llama_cpp = require_peer()
    n = sum(len(t) for t in token_lists)
    llm = llama_cpp.Llama(str(path), embedding=True, pooling_type=pooling, n_ctx=max(n_ctx, n), n_batch=max(n_ctx, n),
                          n_ubatch=max(n_ctx, n), n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
    try:
        llm._batch.reset()
        for seq, tokens in enumerate(token_lists):
            llm._batch.add_sequence(tokens, seq, True)
        llm._ctx.decode(llm._batch)
        ctx, n_embd = llm._ctx.ctx, llm.n_embd()
        if pooling == 0:
            rows = np.ctypeslib.as_array(L.llama_get_embeddings(ctx), shape=(n * n_embd,)).reshape(n, n_embd).copy()
            out, start = [], 0
            for tokens in token_lists:
                out.append(rows[start:start + len(tokens)])
                start += len(tokens)
            return out
        width = L.llama_model_n_cls_out(llm._model.model) if pooling == 4 else n_embd
        return [np.ctypeslib.as_array(L.llama_get_embeddings_seq(ctx, seq), shape=(width,)).copy()
                for seq in range(len(token_lists))]
    finally:
        llm.close()


def llama_tensors(path: str | Path, token_lists: list[list[int]], names: list[str]) -> dict:
    """The F32 tensors of llama.cpp's graph named ``names`` (each the list of every contiguous
    node of that name, in graph order, as arrays of ggml's [ne3][ne2][ne1][ne0] shape) when it
    embeds ``token_lists`` as one batch (pooling none), caught with the scheduler's eval callback."""
    import os

    import numpy as np

    llama_cpp = require_peer()
    _backend()
    base = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    base.ggml_get_name.restype, base.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    base.ggml_nelements.restype, base.ggml_nelements.argtypes = ctypes.c_int64, [ctypes.c_void_p]
    base.ggml_get_data_f32.restype = ctypes.POINTER(ctypes.c_float)
    base.ggml_get_data_f32.argtypes = [ctypes.c_void_p]
    base.ggml_is_contiguous.restype, base.ggml_is_contiguous.argtypes = ctypes.c_bool, [ctypes.c_void_p]

    class Head(ctypes.Structure):   # the leading fields of struct ggml_tensor
        _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4)]

    found: dict = {name: [] for name in names}

    def callback(t, ask, user):
        name = base.ggml_get_name(t).decode()
        if not ask and name in found:
            head = ctypes.cast(t, ctypes.POINTER(Head)).contents
            if head.type == 0 and base.ggml_is_contiguous(t):
                n = base.ggml_nelements(t)
                data = np.ctypeslib.as_array(base.ggml_get_data_f32(t), shape=(n,)).copy()
                found[name].append(data.reshape(tuple(head.ne)[::-1]))
        return True

    cb = L.ggml_backend_sched_eval_callback(callback)
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    n = sum(len(t) for t in token_lists)
    params = L.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = max(n, 64)
    params.n_seq_max, params.kv_unified, params.embeddings, params.pooling_type = 64, True, True, 0
    params.n_threads = params.n_threads_batch = 2
    params.flash_attn_type, params.cb_eval = L.LLAMA_FLASH_ATTN_TYPE_DISABLED, cb
    ctx = L.llama_init_from_model(model, params)
    batch = L.llama_batch_init(n, 0, 1)
    try:
        k = 0
        for seq, tokens in enumerate(token_lists):
            for pos, tok in enumerate(tokens):
                batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = tok, pos, 1, True
                batch.seq_id[k][0] = seq
                k += 1
        batch.n_tokens = n
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return found
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)


class LlamaDecoder:
    """llama.cpp's decode through the C API, for what llama-cpp-python's ``Llama`` does not expose:
    tokens of any sequences at explicit positions, the memory's sequence operations, and (with
    ``heads=True``) where each decode started looking for cells: the head of each stream that
    llama.cpp's KV cache logs under LLAMA_KV_CACHE_DEBUG. Cache types are ggml type ids (0: f32,
    1: f16, 8: q8_0)."""

    def __init__(self, path: str | Path, n_ctx: int = 256, type_k: int = 1, type_v: int = 1,
                 n_threads: int = 2, n_seq_max: int = 1, kv_unified: bool = True, n_batch: int | None = None,
                 heads: bool = False, n_ubatch: int | None = None):
        import os

        require_peer()
        _backend()
        self._model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
        if not self._model:   # llama.cpp refused the file: a NULL pointer would crash the calls below
            raise RuntimeError(f"llama.cpp could not load {path}")
        params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch or n_ctx
        params.n_ubatch = n_ubatch or params.n_batch
        params.n_threads = params.n_threads_batch = n_threads
        params.type_k, params.type_v = type_k, type_v
        params.n_seq_max, params.kv_unified = n_seq_max, kv_unified
        params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        previous = os.environ.get("LLAMA_KV_CACHE_DEBUG")
        os.environ["LLAMA_KV_CACHE_DEBUG"] = "1" if heads else "0"   # read when the cache is made
        try:
            self._ctx = L.llama_init_from_model(self._model, params)
        finally:
            if previous is None:
                del os.environ["LLAMA_KV_CACHE_DEBUG"]
            else:
                os.environ["LLAMA_KV_CACHE_DEBUG"] = previous
        if not self._ctx:
            L.llama_model_free(self._model)
            raise RuntimeError(f"llama.cpp could not make a context for {path}")
        self._mem = L.llama_get_memory(self._ctx)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self._model))
        self.heads: list[dict[int, int]] = []   # per decode with heads=True: stream -> head before it

    def decode(self, tokens: list[int], start: int):
        """Logits [len(tokens), n_vocab] of ``tokens`` of sequence 0 at positions start, start + 1, ..."""
        return self.decode_batch([(tok, start + k, 0, True) for k, tok in enumerate(tokens)])

    def decode_batch(self, entries: list[tuple[int, int, int, bool]]):
        """Decode one batch of (token, position, sequence, output) entries; the logits of the
        outputs [n_outputs, n_vocab], in batch order."""
        import re

        import numpy as np

        global _captured
        batch = L.llama_batch_init(len(entries), 0, 1)
        _captured = []
        try:
            for k, (tok, pos, seq, out) in enumerate(entries):
                batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = tok, pos, 1, out
                batch.seq_id[k][0] = seq
            batch.n_tokens = len(entries)
            status = L.llama_decode(self._ctx, batch)
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status}")
            found = re.findall(r"find_slot: stream\[(\d+)\], n = +\d+, used = +\d+, head = +(\d+)", "".join(_captured))
            if found:
                self.heads.append({int(s): int(h) for s, h in found})
            rows = [k for k, e in enumerate(entries) if e[3]]
            return np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, k), shape=(self.n_vocab,))
                             for k in rows]).copy()
        finally:
            _captured = None
            L.llama_batch_free(batch)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        L.llama_memory_seq_add(self._mem, seq, p0, p1, delta)

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        return L.llama_memory_seq_rm(self._mem, seq, p0, p1)

    def seq_keep(self, seq: int) -> None:
        L.llama_memory_seq_keep(self._mem, seq)

    def seq_pos_min(self, seq: int) -> int:
        return L.llama_memory_seq_pos_min(self._mem, seq)

    def seq_pos_max(self, seq: int) -> int:
        return L.llama_memory_seq_pos_max(self._mem, seq)

    def close(self) -> None:
        L.llama_free(self._ctx)
        L.llama_model_free(self._model)
