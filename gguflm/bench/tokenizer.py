"""Tokenizer throughput: ``python -m gguflm.bench tokenizer [--repeat N] [--models DIR]``.

Tokenizes Python's own documentation text (``pydoc_data.topics``, about 0.47 MB) with each real
model's vocabulary, add_special=True and parse_special=False, and prints MB/s; beside it llama.cpp's
figure through llama-cpp-python (``Llama(path, vocab_only=True).tokenize``) when that is importable,
and whether both give the same tokens.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path

from gguflm.default_model import models_dir

MODEL_FILES = ["gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"]


def corpus() -> str:
    """Python's pydoc topics as one English text (ships with CPython, no download)."""
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` timed calls (the machine is shared, so the minimum is the signal)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def load_vocab(path: Path):
    """The model's Vocab, read through gguflm's GGUF reader."""
    from gguflm.gguf import GGUFReader
    from gguflm.vocab import Vocab

    return Vocab.from_metadata(GGUFReader(path).metadata)


def measure(path: Path, text: str, repeat: int, with_llama: bool,
            vocab_loader: Callable[[Path], object] = load_vocab) -> dict:
    """Throughput figures for one model: ours, and llama.cpp's when ``with_llama``."""
    size_mb = len(text.encode("utf-8")) / 1e6
    vocab = vocab_loader(path)
    ours = vocab.tokenize(text, add_special=True, parse_special=False)
    row = {"model": path.name, "mb": size_mb, "tokens": len(ours),
           "ours_mbs": size_mb / best_seconds(lambda: vocab.tokenize(text, True, False), repeat)}
    if with_llama:
        import llama_cpp

        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        data = text.encode("utf-8")
        theirs = llm.tokenize(data, add_bos=True, special=False)
        row["llama_mbs"] = size_mb / best_seconds(lambda: llm.tokenize(data, True, False), repeat)
        row["same_tokens"] = list(theirs) == ours
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguflm.bench tokenizer", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per tokenizer (best kept)")
    parser.add_argument("--models", type=Path, default=None, help="folder with the real models")
    args = parser.parse_args(argv)
    folder = args.models or models_dir()
    with_llama = importlib.util.find_spec("llama_cpp") is not None
    text = corpus()
    print(f"text: pydoc_data.topics, {len(text.encode('utf-8')) / 1e6:.3f} MB; "
          f"add_special=True, parse_special=False; best of {args.repeat}")
    header = f"{'model':34} {'tokens':>8} {'gguflm MB/s':>12}"
    if with_llama:
        header += f" {'llama.cpp MB/s':>15} {'ratio':>6} {'same tokens':>12}"
    print(header)
    status = 0
    for name in MODEL_FILES:
        path = folder / name
        if not path.is_file():
            print(f"{name:34} missing from {folder}")
            status = 1
            continue
        row = measure(path, text, args.repeat, with_llama)
        line = f"{name:34} {row['tokens']:8d} {row['ours_mbs']:12.2f}"
        if with_llama:
            line += (f" {row['llama_mbs']:15.2f} {row['ours_mbs'] / row['llama_mbs']:5.1f}x"
                     f" {str(row['same_tokens']):>12}")
        print(line)
    return status
