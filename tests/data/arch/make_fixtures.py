"""Write tiny random models of every architecture and record llama.cpp's logits for them.

Run by hand (needs llama-cpp-python: ``pip install llama-cpp-python``); the tests use the committed
outputs: ``<arch>.gguf`` (the model, written by tests/tiny_models.py) and ``<arch>.npz``
(``tokens``, and ``logits`` for every position as llama.cpp computed them in one batch). For the
encoders the ``.npz`` holds ``tokens`` and ``lengths`` (three sequences decoded as one batch, as
``Llama.embed`` packs them) and llama.cpp's embeddings of them with each pooling: ``none`` (every
token's row), ``mean``, ``cls``, ``last`` and, with a classification head, ``rank``. llama.cpp
computed them in the arithmetic of the build it was (AVX-512 for the committed files).

    python tests/data/arch/make_fixtures.py [decoders|encoders]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from _llama import llama_embeddings, llama_tensors  # noqa: E402
from tiny_models import N_VOCAB, TinyModel, write_tiny_model  # noqa: E402

from gguflm.ggml_types import GGMLType  # noqa: E402

N_TOKENS = 48

# small, but with GQA, K-quant-sized rows (multiples of 256) and every weight type the real models use
MATRIX_TYPES = {
    "attn_q": GGMLType.Q8_0, "attn_k": GGMLType.Q5_0, "attn_v": GGMLType.F16,
    "attn_output": GGMLType.Q4_K, "ffn_gate": GGMLType.Q4_1, "ffn_up": GGMLType.Q5_0,
    "ffn_down": GGMLType.Q6_K, "attn_qkv": GGMLType.Q8_0, "token_embd": GGMLType.Q8_0,
}


def fixture(arch: str) -> TinyModel:
    # gemma3: five window layers, one global
    return TinyModel(arch, n_layer=6 if arch == "gemma3" else 2, types=MATRIX_TYPES)


def llama_cpp_logits(path: Path, tokens: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(str(path), n_ctx=256, n_batch=256, logits_all=True, verbose=False, n_threads=2)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


# types whose matmuls gguflm computes as llama.cpp does, to the bit, at these shapes
ENCODER_TYPES = {**MATRIX_TYPES, "attn_v": GGMLType.Q4_0, "cls": GGMLType.Q8_0, "cls_output": GGMLType.Q8_0}
ENCODER_LENGTHS = (7, 19, 30)     # 56 tokens: not a whole number of vectors, so ggml's tails run
POOLINGS = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


def encoder_fixture(arch: str) -> TinyModel:
    # BERT with 32-wide heads (all of a K·q dot in the AVX-512 build's scalar tail) and a
    # classification head; nomic-bert with two KV heads for four; jina-bert-v2 with 12 heads (as
    # jina-embeddings-v2-base: its last four ALiBi slopes are not powers of two, so that how ggml
    # adds them shows) and its one-score head
    shape = {"bert": dict(n_embd=256, head_dim=32, n_head=8, n_head_kv=8),
             "nomic-bert": dict(n_embd=256, head_dim=64, n_head=4, n_head_kv=2),
             "jina-bert-v2": dict(n_embd=384, head_dim=32, n_head=12, n_head_kv=12)}[arch]
    # a K-quant needs rows of 256: jina's 384-wide attention output takes Q8_0
    types = {**ENCODER_TYPES, "attn_output": GGMLType.Q8_0} if arch == "jina-bert-v2" else ENCODER_TYPES
    return TinyModel(arch, n_ff=512, n_layer=2, classifier=arch != "nomic-bert", pooling_type=1, types=types, **shape)


def first_attention(path: Path, seqs: list[list[int]]) -> dict[str, np.ndarray]:
    """Layer 0's attention as llama.cpp ran it: the Q, K, V it took ([n_tokens, heads * head_dim];
    Q and K after their norms or RoPE) and its output (``attn_q``, ``attn_k``, ``attn_v``,
    ``attn_out``), for the attention kernel's own test."""
    t = llama_tensors(path, seqs, ["Qcur-0", "Kcur-0", "Vcur-0", "v_cont-0", "kqv_out-0"])
    n = sum(len(s) for s in seqs)
    v = t["Vcur-0"][-1] if t["Vcur-0"] else t["v_cont-0"][0][0].transpose(2, 0, 1)   # [head][dim][token] back
    return {"attn_q": t["Qcur-0"][-1].reshape(n, -1), "attn_k": t["Kcur-0"][-1].reshape(n, -1),
            "attn_v": np.ascontiguousarray(v.reshape(n, -1)), "attn_out": t["kqv_out-0"][0].reshape(n, -1)}


def encoders() -> None:
    for i, arch in enumerate(("bert", "nomic-bert", "jina-bert-v2")):
        rng = np.random.default_rng(2000 + i)
        spec = encoder_fixture(arch)
        path = HERE / f"{arch}.gguf"
        write_tiny_model(spec, path, rng)
        seqs = [[1] + [int(t) for t in rng.integers(3, N_VOCAB - 1, n - 1)] for n in ENCODER_LENGTHS]
        out = {"tokens": np.array(sum(seqs, []), np.int32), "lengths": np.array(ENCODER_LENGTHS, np.int32)}
        for name, pooling in POOLINGS.items():
            if name == "rank" and not spec.classifier:
                continue
            vectors = llama_embeddings(path, seqs, pooling)
            out[name] = np.concatenate(vectors) if name == "none" else np.stack(vectors)
        out.update(first_attention(path, seqs))
        np.savez_compressed(HERE / f"{arch}.npz", **out)
        print(f"{arch}: {path.stat().st_size} bytes, " + ", ".join(f"{k} {v.shape}" for k, v in out.items()))


def decoders() -> None:
    for i, arch in enumerate(("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")):
        rng = np.random.default_rng(1000 + i)
        path = HERE / f"{arch}.gguf"
        write_tiny_model(fixture(arch), path, rng)
        tokens = [1] + [int(t) for t in rng.integers(3, N_VOCAB - 1, N_TOKENS - 1)]
        logits = llama_cpp_logits(path, tokens)
        np.savez_compressed(HERE / f"{arch}.npz", tokens=np.array(tokens, np.int32), logits=logits)
        print(f"{arch}: {path.stat().st_size} bytes, logits {logits.shape}, "
              f"range [{logits.min():.2f}, {logits.max():.2f}]")


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "all"
    if which in ("all", "decoders"):
        decoders()
    if which in ("all", "encoders"):
        encoders()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
