"""Ray Data batch inference: texts embedded and prompts completed by :mod:`gguflm.ray.data` over
an actor pool of 1 and of N actors on a local Ray, against the single-process API.

    python -m gguflm.bench ray_batch --embed-model all-MiniLM-L6-v2-Q8_0.gguf \\
        --model SmolLM2-135M-Instruct.Q4_1.gguf --texts 5000 --completions 200

Prints rows per second of each run and checks that every row of the N-actor run equals the
single-process API's (``LLM.embed(text)``, ``LLM.create_completion(prompt, ...)``, greedy).
Each actor runs one thread and reserves one CPU.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

WORDS = ("river stone cloud lamp orchard violin harbor pepper meadow engine lantern quartz "
         "window garden letter silver morning market candle forest").split()


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 24)))) for _ in range(n)]


def _run(ray: Any, processor: Any, rows: list[dict[str, Any]], kwargs: dict[str, Any], actors: int,
         batch_size: int) -> tuple[list[dict[str, Any]], float]:
    t0 = time.perf_counter()
    out = ray.data.from_items(rows).map_batches(processor, fn_constructor_kwargs=kwargs, concurrency=actors,
                                                num_cpus=1, batch_size=batch_size).take_all()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gguflm bench ray_batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--embed-model", required=True, help="an embedding GGUF (all-MiniLM-L6-v2)")
    p.add_argument("--model", required=True, help="a generation GGUF (SmolLM2-135M-Instruct)")
    p.add_argument("--texts", type=int, default=5000)
    p.add_argument("--completions", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--actors", type=int, default=2, help="the pool to compare with one actor")
    args = p.parse_args(argv)

    import ray

    from gguflm import LLM
    from gguflm.ray.data import Embed, Generate

    texts = _texts(args.texts, 1)
    prompts = [f"Write about {t}:" for t in _texts(args.completions, 2)]
    sampling = {"max_tokens": args.max_tokens, "temperature": 0.0}

    t0 = time.perf_counter()
    embedder = LLM(args.embed_model, embedding=True, n_threads=1, progress=False)
    want_vectors = [embedder.embed(t) for t in texts]
    t_embed_api = time.perf_counter() - t0
    t0 = time.perf_counter()
    llm = LLM(args.model, n_ctx=2048, n_threads=1, progress=False)
    want_texts = [llm.create_completion(q, **sampling)["choices"][0]["text"] for q in prompts]
    t_gen_api = time.perf_counter() - t0
    print(f"single process, 1 thread: {len(texts) / t_embed_api:.1f} texts/s embedded, "
          f"{len(prompts) / t_gen_api:.2f} completions/s")

    ray.init(num_cpus=args.actors, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    figures = {}
    try:
        for actors in sorted({1, args.actors}):
            rows, t_embed = _run(ray, Embed, [{"text": t} for t in texts], {"model": args.embed_model},
                                 actors, 100)
            done, t_gen = _run(ray, Generate, [{"prompt": q} for q in prompts],
                               {"model": args.model, "chat": False, "sampling": sampling}, actors, 10)
            figures[actors] = (len(texts) / t_embed, len(prompts) / t_gen)
            print(f"ray data, {actors} actor(s): {figures[actors][0]:.1f} texts/s embedded, "
                  f"{figures[actors][1]:.2f} completions/s (actor start and model load included)")
        vectors = {r["text"]: r["embedding"] for r in rows}
        generated = {r["prompt"]: r["generated_text"] for r in done}
    finally:
        ray.shutdown()
    same_vectors = all(np.array_equal(vectors[t], np.asarray(v, np.float32)) for t, v in zip(texts, want_vectors))
    same_texts = all(generated[q] == w for q, w in zip(prompts, want_texts))
    one, many = figures[1], figures[args.actors]
    print(f"{args.actors} actors / 1 actor: {many[0] / one[0]:.2f}x embedding, {many[1] / one[1]:.2f}x generation")
    print(f"rows equal to the single-process API: embeddings {same_vectors}, completions {same_texts}")
    return 0 if same_vectors and same_texts else 1
