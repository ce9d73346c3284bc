"""LoRA adapters and control vectors against llama.cpp's own (through llama-cpp-python's C API):
the logits of a prompt and of a greedy continuation a token at a time, bit for bit, with one
adapter, a scaled one, two stacked (in both orders), a control vector over a layer range and a
control vector with an adapter; F16 and Q8_0 adapters of rank 8 to 64 on the attention and
feed-forward matrices (and the token embedding and output where the model has its own), on both
real models and tiny ones of several architectures, at 1 and 2 threads. Bad adapters and control
vectors raise gguflm errors (and llama.cpp refuses the same adapters)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest

import _ggml
import gguflm
from _llama import require_peer
from gguflm.control_vector import ControlVectorError, load_control_vectors
from gguflm.lora import LoraAdapter, LoraAdapterError
from lora_files import ATTENTION, FFN, model_matrices, write_control_vector, write_lora
from tiny_models import TinyModel, write_tiny_model

Q8_0, F16 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16
ARCH_DIR = Path(__file__).resolve().parent / "data" / "arch"
N_CTX, N_GEN = 256, 4


class LlamaRun:
    """One llama.cpp model and context; adapters and control vectors set through the C API."""

    def __init__(self, path: Path, n_threads: int):
        self.cpp = require_peer()
        self.L = self.cpp.llama_cpp
        self.llm = self.cpp.Llama(str(path), logits_all=True, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX,
                                  n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
        self._adapters: dict[Path, object] = {}

    def adapter(self, path: Path):
        """llama_adapter_lora_init of ``path`` (None when llama.cpp refuses it)."""
        if path not in self._adapters:
            self._adapters[path] = self.L.llama_adapter_lora_init(self.llm._model.model, str(path).encode())
        return self._adapters[path]

    def run(self, loras: list[tuple[Path, float]], cvec: tuple | None, tokens: list[int]) -> np.ndarray:
        """Logits of ``tokens`` as one batch, then of N_GEN greedy tokens one at a time."""
        ctx, L = self.llm._ctx.ctx, self.L
        adapters = (L.llama_adapter_lora_p_ctypes * max(1, len(loras)))(*[self.adapter(p) for p, _ in loras])
        scales = (ctypes.c_float * max(1, len(loras)))(*[s for _, s in loras])
        assert L.llama_set_adapters_lora(ctx, adapters, len(loras), scales) == 0
        if cvec is None:
            assert L.llama_set_adapter_cvec(ctx, None, 0, 0, 0, 0) == 0
        else:
            data, n_embd, start, end = cvec
            data = np.ascontiguousarray(data, np.float32)
            assert L.llama_set_adapter_cvec(ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), len(data),
                                            n_embd, start, end) == 0
        self.llm.reset()
        self.llm.eval(tokens)
        for _ in range(N_GEN):
            self.llm.eval([int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))])
        return np.array(self.llm.scores[:self.llm.n_tokens], dtype=np.float32)   # a copy: the next run reuses scores

    def close(self) -> None:
        for adapter in self._adapters.values():
            if adapter:
                self.L.llama_adapter_lora_free(adapter)
        self.llm.close()


def ours(model: gguflm.Model, loras: list[tuple[LoraAdapter, float]], cvec: tuple | None, tokens: list[int],
         n_threads: int) -> np.ndarray:
    """gguflm's logits of what LlamaRun.run computes, in the local ggml-cpu's arithmetic."""
    with _ggml.same_arithmetic(), gguflm.Context(model, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=n_threads,
                                                 n_threads_batch=n_threads) as ctx:
        ctx.set_adapters_lora([a for a, _ in loras], [s for _, s in loras])
        if cvec is not None:
            ctx.set_adapter_cvec(*cvec)
        batch = gguflm.Batch(len(tokens))
        for pos, tok in enumerate(tokens):
            batch.add(tok, pos, [0], True)
        assert ctx.decode(batch) == 0
        rows = list(ctx.get_logits().copy())
        for pos in range(len(tokens), len(tokens) + N_GEN):
            step = gguflm.Batch(1)
            step.add(int(np.argmax(rows[-1])), pos, [0], True)
            assert ctx.decode(step) == 0
            rows.append(ctx.get_logits()[0].copy())
        return np.stack(rows)


def reference_cvec(vectors: dict[Path, float]) -> tuple[np.ndarray, int]:
    """common_control_vector_load's buffer, read with the gguf package: layer l's direction times
    its strength at [(l - 1) * n_embd, l * n_embd), summed over the files."""
    parts = []
    for path, strength in vectors.items():
        for t in gguf.GGUFReader(path).tensors:
            parts.append((int(t.name.split(".")[1]), np.asarray(t.data, np.float32) * np.float32(strength)))
    n_embd = len(parts[0][1])
    data = np.zeros(n_embd * max(layer for layer, _ in parts), np.float32)
    for layer, values in parts:
        data[(layer - 1) * n_embd:layer * n_embd] += values
    return data, n_embd


def cases(model_path: Path, out: Path, n_layer: int, n_embd: int) -> dict[str, tuple]:
    """The adapter sets of the brief by name: [(file, scale)], control-vector files {file: strength}."""
    rng = np.random.default_rng(len(str(model_path)))
    f16 = write_lora(out / "f16-r16.gguf", model_path, rng, rank=16)
    q8 = write_lora(out / "q8-r32.gguf", model_path, rng, rank=32, qtype=Q8_0)
    ffn8 = write_lora(out / "ffn-f16-r8.gguf", model_path, rng, rank=8, kinds=FFN, alpha=16.0)
    attn64 = write_lora(out / "attn-q8-r64.gguf", model_path, rng, rank=64, kinds=ATTENTION, qtype=Q8_0, alpha=0.0,
                        strength=0.2)
    layers = range(1, n_layer)
    cv1 = write_control_vector(out / "cv1.gguf", n_embd, layers, rng, size=4.0)
    cv2 = write_control_vector(out / "cv2.gguf", n_embd, layers[::2], rng, size=3.0)
    return {
        "one": ([(f16, 1.0)], None),
        "scaled": ([(q8, 0.6)], None),
        "stacked": ([(ffn8, 1.0), (attn64, -0.8)], None),
        "stacked-reversed": ([(attn64, -0.8), (ffn8, 1.0)], None),
        "cvec": ([], {cv1: 1.0}),
        "cvec+lora": ([(q8, 1.0)], {cv1: 0.8, cv2: -0.5}),
        "stacked+cvec": ([(ffn8, 1.0), (attn64, -0.8)], {cv1: 0.8, cv2: -0.5}),
    }


def compare(model_path: Path, tmp: Path, names: list[str], threads: tuple[int, ...], tokens: list[int]) -> None:
    """Every case of ``names`` at every thread count: gguflm's logits are llama.cpp's, bit for bit,
    and the adapters change them."""
    model = gguflm.Model.load(model_path)
    hp = model.hparams
    table = cases(model_path, tmp, hp.n_layer, hp.n_embd)
    adapters: dict[Path, LoraAdapter] = {}
    try:
        for n_threads in threads:
            peer = LlamaRun(model_path, n_threads)
            try:
                base = peer.run([], None, tokens)
                for name in names:
                    lora_files, cvec_files = table[name]
                    cvec = None
                    if cvec_files:
                        data, n_embd = load_control_vectors(cvec_files)
                        expected, _ = reference_cvec(cvec_files)
                        np.testing.assert_array_equal(data, expected)
                        # a range: neither the first layers nor the last where the model has enough
                        start, end = (2, hp.n_layer - 2) if hp.n_layer > 4 else (1, hp.n_layer - 1)
                        cvec = (data, n_embd, start, end)
                    theirs = peer.run(lora_files, cvec, tokens)
                    loras = [(adapters.setdefault(p, LoraAdapter.load(model, p)), s) for p, s in lora_files]
                    mine = ours(model, loras, cvec, tokens, n_threads)
                    assert not np.array_equal(theirs, base), f"{name}: the adapters change nothing"
                    same = np.all(mine.view(np.uint32) == theirs.view(np.uint32), axis=1)
                    assert same.all(), (f"{name}, {n_threads} threads: rows {np.flatnonzero(~same)} differ, "
                                        f"max |diff| {np.abs(mine - theirs).max():.3g}")
            finally:
                peer.close()
    finally:
        model.close()


PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 2]


@pytest.mark.parametrize("threads", [(2,), (1,)], ids=["2-threads", "1-thread"])
def test_real_models_equal_llama_cpp(real_model_path, tmp_path, threads):
    """Both real models, every case at 2 threads (both orders of a stack on the tiny models);
    at 1 thread all at once: an F16 and a Q8_0 adapter stacked with two control vectors."""
    names = ["one", "scaled", "stacked", "cvec", "cvec+lora"] if threads == (2,) else ["stacked+cvec"]
    compare(real_model_path, tmp_path, names, threads, PROMPT)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_tiny_architectures_equal_llama_cpp(arch, tmp_path):
    """The committed tiny models (phi3's fused QKV, gemma's post-norms and scaled embeddings)."""
    compare(ARCH_DIR / f"{arch}.gguf", tmp_path, ["stacked", "stacked-reversed", "cvec+lora"], (1, 2),
            [1, 40, 77, 300, 5, 9, 120])


def test_embedding_and_output_corrections_equal_llama_cpp(tmp_path):
    """An untied model: the token embedding's pair (flipped, rows looked up by token) and the
    output projection's, F16 and Q8_0."""
    path = tmp_path / "untied.gguf"
    write_tiny_model(TinyModel("llama", n_embd=128, head_dim=32, n_head=4, n_head_kv=2, n_ff=256, tied_output=False),
                     path, np.random.default_rng(3))
    rng = np.random.default_rng(4)
    files = [write_lora(tmp_path / f"embd-{q.name}.gguf", path, rng, rank=32, qtype=q, embeddings=True, output=True,
                        kinds=("attn_v",), strength=5.0) for q in (F16, Q8_0)]
    model = gguflm.Model.load(path)
    peer = LlamaRun(path, 2)
    try:
        tokens = [1, 40, 77, 300, 5, 9]
        base = peer.run([], None, tokens)
        for loras in ([(files[0], 1.0)], [(files[1], 0.5), (files[0], 1.0)]):
            theirs = peer.run(loras, None, tokens)
            assert not np.array_equal(theirs, base)
            mine = ours(model, [(LoraAdapter.load(model, p), s) for p, s in loras], None, tokens, 2)
            np.testing.assert_array_equal(mine.view(np.uint32), theirs.view(np.uint32))
    finally:
        peer.close()
        model.close()


def test_mixture_of_experts_router_and_shared_expert_equal_llama_cpp(tmp_path):
    """Qwen 2 MoE: pairs on the router (build_moe_ffn's build_lora_mm, which keeps a generation
    step off the fused single-token path) and the shared expert; expert tensors are refused."""
    path = tmp_path / "moe.gguf"
    write_tiny_model(TinyModel("qwen2moe", n_embd=128, head_dim=32, n_head=4, n_head_kv=2, n_expert=4,
                               n_expert_used=2, n_ff_exp=64, n_ff_shexp=96, tied_output=False),
                     path, np.random.default_rng(5))
    rng = np.random.default_rng(6)
    lora = write_lora(tmp_path / "moe-lora.gguf", path, rng, rank=32, qtype=Q8_0, strength=4.0,
                      kinds=ATTENTION + ("ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))
    model = gguflm.Model.load(path)
    peer = LlamaRun(path, 2)
    try:
        tokens = [1, 40, 77, 300, 5, 9]
        theirs = peer.run([(lora, 0.9)], None, tokens)
        assert not np.array_equal(theirs, peer.run([], None, tokens))
        mine = ours(model, [(LoraAdapter.load(model, lora), 0.9)], None, tokens, 2)
        np.testing.assert_array_equal(mine.view(np.uint32), theirs.view(np.uint32))
        experts = write_lora(tmp_path / "experts.gguf", path, rng, kinds=("ffn_up_exps",))
        with pytest.raises(LoraAdapterError, match="expert tensors"):
            LoraAdapter.load(model, experts)
    finally:
        peer.close()
        model.close()


# -- the API


def test_adapters_are_shared_and_set_cheaply(tmp_path):
    """One adapter, two contexts; setting, changing and clearing adapters on a context leaves
    the model as it was and the other context alone."""
    path = ARCH_DIR / "llama.gguf"
    lora = write_lora(tmp_path / "a.gguf", path, np.random.default_rng(0), rank=8)
    tokens = [1, 40, 77, 300]
    with gguflm.Model.load(path) as model:
        adapter = LoraAdapter.load(model, lora)
        assert adapter.nbytes == sum(p.a.data.nbytes + p.b.data.nbytes for p in adapter.pairs.values())
        plain = ours(model, [], None, tokens, 1)
        with_lora = ours(model, [(adapter, 1.0)], None, tokens, 1)
        assert not np.array_equal(plain, with_lora)
        np.testing.assert_array_equal(ours(model, [(adapter, 1.0)], None, tokens, 1), with_lora)
        np.testing.assert_array_equal(ours(model, [(adapter, 0.0)], None, tokens, 1), plain)  # scale 0: left out
        ctx = gguflm.Context(model, n_ctx=N_CTX)
        ctx.set_adapters_lora([adapter], [1.0])
        ctx.set_adapters_lora([], [])
        assert ctx.lora_order == []
        with pytest.raises(ValueError, match="scales"):
            ctx.set_adapters_lora([adapter], [])
        with gguflm.Model.load(path) as other:
            with pytest.raises(ValueError, match="another model"):
                gguflm.Context(other, n_ctx=N_CTX).set_adapters_lora([adapter], [1.0])
        with pytest.raises(ValueError, match="n_embd"):
            ctx.set_adapter_cvec(np.zeros(8, np.float32), 8, 1, 1)


# -- bad files


def _truncated(src: Path, dst: Path) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[:len(data) - 100])
    return dst


def test_bad_adapters_raise(tmp_path):
    """What llama.cpp refuses, gguflm refuses with a LoraAdapterError naming the problem."""
    path = ARCH_DIR / "llama.gguf"
    rng = np.random.default_rng(0)
    _, tensors = model_matrices(path)
    n_embd = tensors["token_embd.weight"][0]
    good = write_lora(tmp_path / "good.gguf", path, rng)
    bad = {
        "architecture": write_lora(tmp_path / "arch.gguf", path, rng, arch="qwen2"),
        "wrong shape": write_lora(tmp_path / "shape.gguf", path, rng, rank=16,
                                  shapes={"blk.0.attn_q.weight.lora_a": (16, n_embd + 32)}),
        "not transposed": write_lora(tmp_path / "rank.gguf", path, rng, rank=16,
                                     shapes={"blk.1.ffn_up.weight.lora_b": (tensors["blk.1.ffn_up.weight"][1], 8)}),
        "not in the base model": write_lora(tmp_path / "missing.gguf", path, rng, layers=[0],
                                            extra=["blk.7.attn_q.weight.lora_a", "blk.7.attn_q.weight.lora_b"]),
        "lacks its lora_b": write_lora(tmp_path / "half.gguf", path, rng, kinds=(),
                                       extra=["blk.0.attn_q.weight.lora_a"]),
        "unexpected suffix": write_lora(tmp_path / "suffix.gguf", path, rng, extra=["blk.0.attn_q.weight"]),
        "general.type": write_control_vector(tmp_path / "cv.gguf", n_embd, [1], rng),
        "cannot read": _truncated(good, tmp_path / "truncated.gguf"),
    }
    bad_names = {"not in the base model": "blk.7.attn_q.weight"}
    peer = LlamaRun(path, 1)
    try:
        assert peer.adapter(good)
        with gguflm.Model.load(path) as model:
            LoraAdapter.load(model, good)
            for what, file in bad.items():
                with pytest.raises(LoraAdapterError, match=bad_names.get(what, what)):
                    LoraAdapter.load(model, file)
                assert not peer.adapter(file), f"llama.cpp loads the adapter with a bad {what}"
            with pytest.raises(LoraAdapterError, match="cannot read"):
                LoraAdapter.load(model, tmp_path / "absent.gguf")
    finally:
        peer.close()
    # llama.cpp would abort on it in the graph: an embedding pair on a tied output
    embd = write_lora(tmp_path / "embd.gguf", path, rng, kinds=(), embeddings=True)
    with gguflm.Model.load(path) as model, pytest.raises(LoraAdapterError, match="tied output"):
        LoraAdapter.load(model, embd)


def test_bad_control_vectors_raise(tmp_path):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(tmp_path / "f16.gguf", "controlvector")
    w.add_tensor("direction.1", np.ones(8, np.float16))
    zero = gguf.GGUFWriter(tmp_path / "zero.gguf", "controlvector")
    zero.add_tensor("direction.0", np.ones(8, np.float32))
    for writer in (w, zero):
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    a = write_control_vector(tmp_path / "a.gguf", 8, [1, 2], rng)
    b = write_control_vector(tmp_path / "b.gguf", 16, [1], rng)
    for files, what in (({tmp_path / "f16.gguf": 1.0}, "F32"), ({tmp_path / "zero.gguf": 1.0}, "layer from 1"),
                        ({a: 1.0, b: 1.0}, "files before it"), ({}, "no control vector"),
                        ({_truncated(a, tmp_path / "t.gguf"): 1.0}, "cannot read")):
        with pytest.raises(ControlVectorError, match=what):
            load_control_vectors(files)
