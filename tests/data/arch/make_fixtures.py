"""Write tiny random models of every architecture and record llama.cpp's logits for them.

Run by hand (needs llama-cpp-python: ``pip install llama-cpp-python``); the tests use the committed
outputs: ``<arch>.gguf`` (the model, written with gguflm's GGUF writer) and ``<arch>.npz``
(``tokens``, and ``logits`` for every position as llama.cpp computed them in one batch).

    python tests/data/arch/make_fixtures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from gguflm import quants
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFValueType, GGUFWriter

HERE = Path(__file__).resolve().parent
N_VOCAB = 320
N_TOKENS = 48

# small, but with GQA, K-quant-sized rows (multiples of 256) and every weight type the real models use
SHAPE = dict(n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_layer=2)
MATRIX_TYPES = {
    "attn_q": GGMLType.Q8_0, "attn_k": GGMLType.Q5_0, "attn_v": GGMLType.F16,
    "attn_output": GGMLType.Q4_K, "ffn_gate": GGMLType.Q4_1, "ffn_up": GGMLType.Q5_0,
    "ffn_down": GGMLType.Q6_K, "attn_qkv": GGMLType.Q8_0, "token_embd": GGMLType.Q8_0,
}


def add_vocab(w: GGUFWriter) -> None:
    """A minimal SentencePiece vocabulary: unk, bos, eos, the 256 byte tokens, pieces, end-of-text."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581p{i}" for i in range(N_VOCAB - len(tokens) - 1)]
    tokens.append("<|endoftext|>")  # llama.cpp's vocabulary loader wants it for Phi 3
    types = [2, 3, 3] + [6] * 256 + [1] * (N_VOCAB - 260) + [3]
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.scores", np.array([0.0] * 259 + [-float(i) for i in range(N_VOCAB - 259)], np.float32))
    w.add("tokenizer.ggml.token_type", np.array(types, np.int32))
    for key, value in (("bos", 1), ("eos", 2), ("unknown", 0)):
        w.add(f"tokenizer.ggml.{key}_token_id", value, GGUFValueType.UINT32)


def add_tensor(w: GGUFWriter, rng: np.random.Generator, name: str, shape: tuple[int, ...],
               kind: str | None = None, scale: float = 0.08) -> None:
    """A random tensor: norms near 1 in F32, matrices in the type MATRIX_TYPES gives their kind."""
    n = int(np.prod(shape))
    if len(shape) == 1:
        data = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32) if kind != "bias" \
            else (0.05 * rng.standard_normal(n)).astype(np.float32)
        w.add_tensor(name, data, GGMLType.F32)
        return
    t = MATRIX_TYPES[kind]
    x = (scale * rng.standard_normal((shape[1], shape[0]))).astype(np.float32)
    if t is GGMLType.F16:
        w.add_tensor(name, x.astype(np.float16), GGMLType.F16)
    else:
        w.add_tensor(name, quants.get(t).quantize(x), t, shape=shape)


def write_model(arch: str, path: Path, rng: np.random.Generator) -> None:
    s = SHAPE
    e, hd, nh, nkv, ff = s["n_embd"], s["head_dim"], s["n_head"], s["n_head_kv"], s["n_ff"]
    n_layer = 6 if arch == "gemma3" else s["n_layer"]  # gemma3: five window layers, one global
    w = GGUFWriter(path, arch=arch)
    w.add("general.name", f"tiny-{arch}")
    for key, value in {"context_length": 256, "embedding_length": e, "block_count": n_layer,
                       "feed_forward_length": ff, "attention.head_count": nh,
                       "attention.head_count_kv": nkv, "attention.key_length": hd,
                       "attention.value_length": hd, "rope.freq_base": 10000.0}.items():
        # llama.cpp insists on UINT32 for integer hyper-parameters
        w.add(f"{arch}.{key}", value, GGUFValueType.UINT32 if isinstance(value, int) else None)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    if arch in ("gemma2", "gemma3"):
        w.add(f"{arch}.attention.sliding_window", 16, GGUFValueType.UINT32)  # shorter than the test sequence
    if arch == "gemma2":
        w.add("gemma2.attn_logit_softcapping", 50.0)
        w.add("gemma2.final_logit_softcapping", 30.0)
    add_vocab(w)

    add_tensor(w, rng, "token_embd.weight", (e, N_VOCAB), "token_embd", scale=0.5)
    add_tensor(w, rng, "output_norm.weight", (e,))
    for il in range(n_layer):
        b = f"blk.{il}"
        add_tensor(w, rng, f"{b}.attn_norm.weight", (e,))
        if arch == "phi3":
            add_tensor(w, rng, f"{b}.attn_qkv.weight", (e, nh * hd + 2 * nkv * hd), "attn_qkv")
        else:
            add_tensor(w, rng, f"{b}.attn_q.weight", (e, nh * hd), "attn_q")
            add_tensor(w, rng, f"{b}.attn_k.weight", (e, nkv * hd), "attn_k")
            add_tensor(w, rng, f"{b}.attn_v.weight", (e, nkv * hd), "attn_v")
        add_tensor(w, rng, f"{b}.attn_output.weight", (nh * hd, e), "attn_output")
        if arch == "qwen2":
            for proj, n in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd)):
                add_tensor(w, rng, f"{b}.{proj}.bias", (n,), "bias")
        if arch in ("qwen3", "gemma3"):
            add_tensor(w, rng, f"{b}.attn_q_norm.weight", (hd,))
            add_tensor(w, rng, f"{b}.attn_k_norm.weight", (hd,))
        if arch in ("gemma2", "gemma3"):
            add_tensor(w, rng, f"{b}.post_attention_norm.weight", (e,))
            add_tensor(w, rng, f"{b}.post_ffw_norm.weight", (e,))
        add_tensor(w, rng, f"{b}.ffn_norm.weight", (e,))
        if arch == "phi3":
            add_tensor(w, rng, f"{b}.ffn_up.weight", (e, 2 * ff), "ffn_up")
        else:
            add_tensor(w, rng, f"{b}.ffn_gate.weight", (e, ff), "ffn_gate")
            add_tensor(w, rng, f"{b}.ffn_up.weight", (e, ff), "ffn_up")
        add_tensor(w, rng, f"{b}.ffn_down.weight", (ff, e), "ffn_down")
    w.write()


def llama_cpp_logits(path: Path, tokens: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(str(path), n_ctx=256, n_batch=256, logits_all=True, verbose=False, n_threads=2)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def main() -> int:
    for i, arch in enumerate(("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")):
        rng = np.random.default_rng(1000 + i)
        path = HERE / f"{arch}.gguf"
        write_model(arch, path, rng)
        tokens = [1] + [int(t) for t in rng.integers(3, N_VOCAB - 1, N_TOKENS - 1)]
        logits = llama_cpp_logits(path, tokens)
        np.savez_compressed(HERE / f"{arch}.npz", tokens=np.array(tokens, np.int32), logits=logits)
        print(f"{arch}: {path.stat().st_size} bytes, logits {logits.shape}, "
              f"range [{logits.min():.2f}, {logits.max():.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
