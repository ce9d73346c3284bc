"""Write tiny random models of every architecture and record llama.cpp's logits for them.

Run by hand (needs llama-cpp-python: ``pip install llama-cpp-python``); the tests use the committed
outputs: ``<arch>.gguf`` (the model, written by tests/tiny_models.py) and ``<arch>.npz``
(``tokens``, and ``logits`` for every position as llama.cpp computed them in one batch).

    python tests/data/arch/make_fixtures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

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


def main() -> int:
    for i, arch in enumerate(("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")):
        rng = np.random.default_rng(1000 + i)
        path = HERE / f"{arch}.gguf"
        write_tiny_model(fixture(arch), path, rng)
        tokens = [1] + [int(t) for t in rng.integers(3, N_VOCAB - 1, N_TOKENS - 1)]
        logits = llama_cpp_logits(path, tokens)
        np.savez_compressed(HERE / f"{arch}.npz", tokens=np.array(tokens, np.int32), logits=logits)
        print(f"{arch}: {path.stat().st_size} bytes, logits {logits.shape}, "
              f"range [{logits.min():.2f}, {logits.max():.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
