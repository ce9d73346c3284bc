"""Embedding throughput: ``python -m gguflm.bench embed [-m FILE] [-n 1000] [-r 3] [-t 2]
[--compare llama-cpp]``.

Embeds ``-n`` short English sentences (about 20 tokens each, drawn from a fixed seed) with
``LLM(FILE, embedding=True).embed(texts)`` and prints texts per second: one warm-up call, then the
best of ``-r`` timed calls (the machine is shared, so the fastest run is the signal). With
``--compare llama-cpp`` the same list goes through llama-cpp-python's ``Llama.embed`` (same
batch size, so the same packing: llama-cpp-python's rule, which gguflm follows), the engines'
repetitions taking turns, and both engines' vectors are compared. The default model is the
MiniLM encoder the tests carry (``tests/data/models``) when run from a source tree.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from gguflm.bench.tokenizer import best_seconds

_SUBJECTS = ["The old fisherman", "A young engineer", "My neighbour's cat", "The city council",
             "Our chemistry teacher", "A small startup", "The orchestra", "Every student in the class",
             "The weather service", "A retired pilot", "The hospital staff", "Two hikers"]
_VERBS = ["repaired", "described", "painted", "discovered", "postponed", "celebrated", "measured",
          "explained", "photographed", "rebuilt", "questioned", "recommended"]
_OBJECTS = ["the broken wooden bridge", "a surprisingly quiet electric car", "the annual harvest festival",
            "an unusual pattern of migrating birds", "the new public library downtown",
            "a recipe for spicy lentil soup", "the results of the latest survey",
            "an ancient map of the northern coast", "the budget for next year's schools"]
_ENDINGS = ["before the storm arrived.", "after a long discussion on Tuesday.", "with great patience.",
            "despite the heavy rain.", "for the first time in years.", "while everyone watched closely.",
            "in front of a small crowd.", "without telling anyone about it."]


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` varied short sentences (about 20 tokens for a WordPiece or BPE vocabulary)."""
    rng = random.Random(seed)
    return [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_ENDINGS)}"
            for _ in range(n)]


def default_model() -> Path | None:
    """The MiniLM encoder shipped with the tests, when this is a source tree."""
    path = Path(__file__).resolve().parents[2] / "tests" / "data" / "models" / "all-MiniLM-L6-v2-Q8_0.gguf"
    return path if path.is_file() else None


def run(args: argparse.Namespace) -> int:
    from gguflm.llm import LLM

    path = args.model or default_model()
    if path is None:
        print("give a model with -m FILE (no tests/data/models/all-MiniLM-L6-v2-Q8_0.gguf here)", file=sys.stderr)
        return 2
    texts = sentences(args.n_texts, args.seed)
    engines: dict[str, Callable[[], list]] = {}
    ours = LLM(str(path), embedding=True, n_ctx=args.ctx_size, n_batch=args.batch_size, n_threads=args.threads,
               n_threads_batch=args.threads, pooling_type=args.pooling, progress=False)
    engines["gguflm"] = lambda: ours.embed(texts)
    n_tokens = sum(len(ours.tokenize(t.encode())) for t in texts)
    if args.compare == "llama-cpp":
        import llama_cpp

        theirs = llama_cpp.Llama(str(path), embedding=True, n_ctx=args.ctx_size, n_batch=args.batch_size,
                                 n_threads=args.threads, n_threads_batch=args.threads,
                                 pooling_type=-1 if args.pooling is None else _pooling_number(args.pooling),
                                 verbose=False)
        engines["llama.cpp"] = lambda: theirs.embed(texts)
    vectors = {name: fn() for name, fn in engines.items()}   # warm-up, and the vectors to compare
    best = {name: float("inf") for name in engines}
    for _ in range(args.repetitions):                          # the engines take turns
        for name, fn in engines.items():
            best[name] = min(best[name], best_seconds(fn, 1))
    print(f"model: {Path(path).name}, {len(texts)} texts, {n_tokens} tokens "
          f"({n_tokens / len(texts):.1f} per text), n_batch {ours.n_batch}, {args.threads} threads")
    for name, seconds in best.items():
        print(f"{name:10s} {len(texts) / seconds:9.1f} texts/s  {n_tokens / seconds:9.1f} tokens/s  "
              f"({seconds * 1e3:.0f} ms)")
    if "llama.cpp" in best:
        print(f"gguflm / llama.cpp = {best['llama.cpp'] / best['gguflm']:.2f}x")
        a, b = (np.asarray(vectors[k], np.float32) for k in ("gguflm", "llama.cpp"))
        cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        print(f"vectors: {np.mean(np.all(a == b, axis=-1)) * 100:.1f}% bit-identical, min cosine {cos.min():.7f}, "
              f"max |diff| {np.abs(a - b).max():.3g}")
    return 0


def _pooling_number(name: str) -> int:
    from gguflm.pooling import pooling_type

    return int(pooling_type(name))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="GGUF file (default: the tests' MiniLM encoder)")
    parser.add_argument("-n", "--n-texts", type=int, default=1000, help="texts to embed")
    parser.add_argument("-r", "--repetitions", type=int, default=3, help="timed runs per engine")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-c", "--ctx-size", type=int, default=512)
    parser.add_argument("-b", "--batch-size", type=int, default=512)
    parser.add_argument("--pooling", default=None, help="none, mean, cls, last, rank (default: the model's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sentence generator")
    parser.add_argument("--compare", choices=["llama-cpp"], help="also time llama-cpp-python's Llama.embed")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguflm.bench embed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
