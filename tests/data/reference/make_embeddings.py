"""Record llama.cpp's embeddings of ``embedding_texts.json`` for the real models.

Run by hand (needs llama-cpp-python and the real models, see tests/conftest.py); the tests compare
gguflm with the committed ``embeddings/<model>.npz``: for each pooling named in ``CASES``, the
vectors ``Llama(path, embedding=True, pooling_type=P).embed(texts)`` returns (all the texts packed
as llama-cpp-python packs them: here one batch), and for pooling ``none`` every token's row read
through llama.cpp's C API (``Llama.embed`` 0.3.36 misplaces those of the second and later texts),
with ``lengths`` the texts' token counts. llama.cpp computed them in the arithmetic of its build
(AVX-512 for the committed files).

    python tests/data/reference/make_embeddings.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from _llama import llama_embeddings  # noqa: E402

from gguflm.default_model import models_dir  # noqa: E402

MINILM = HERE.parent / "models" / "all-MiniLM-L6-v2-Q8_0.gguf"
# model file → poolings, as the issue asks for them
CASES = {
    MINILM: ("mean", "cls", "last", "none"),
    models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf": ("mean", "last", "none"),
    models_dir() / "gemma-3-270m-q4_k_m.gguf": ("mean",),
}
POOLINGS = {"none": 0, "mean": 1, "cls": 2, "last": 3}


def texts() -> list[str]:
    return json.loads((HERE / "embedding_texts.json").read_text(encoding="utf-8"))


def main() -> int:
    from llama_cpp import Llama

    for path, poolings in CASES.items():
        out = {}
        for name in poolings:
            llm = Llama(str(path), embedding=True, pooling_type=POOLINGS[name], n_threads=2, n_threads_batch=2,
                        verbose=False)
            tokens = [llm.tokenize(t.encode("utf-8")) for t in texts()]
            if name == "none":
                rows = llama_embeddings(path, tokens, 0)
                out["none"], out["lengths"] = np.concatenate(rows), np.array([len(t) for t in tokens], np.int32)
            else:
                out[name] = np.array(llm.embed(texts()), np.float32)
            llm.close()
        np.savez_compressed(HERE / "embeddings" / f"{path.stem}.npz", **out)
        print(f"{path.name}: " + ", ".join(f"{k} {v.shape}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
