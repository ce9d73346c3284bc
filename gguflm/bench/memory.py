"""Load time and memory: ``python -m gguflm.bench memory -m FILE [-c N_CTX] [--compare llama-cpp]``.

Each engine runs in a fresh child process (so that one engine's pages never count in the other's
figures), its runs taking turns with the other engine's: load the model and create a context of
``-c`` cells (timed: "load+ctx"), read the resident set size, decode a ``-p``-token prompt and
``-n`` tokens one by one from an empty cache (``gguflm bench``'s pp and tg runs), and read it
again, with the peak. For llama.cpp, llama-cpp-python's ``Llama(path, n_ctx=...)`` is the first part.
Resident memory counts the file pages a memory-mapped model has touched, as ``top`` does. Linux
only (``/proc/self/statm``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

_MB = 1 << 20


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _MB


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _MB  # Linux gives KiB


def _child(engine: str, path: str, n_ctx: int, n_prompt: int, n_gen: int, n_threads: int) -> dict[str, Any]:
    """One engine's figures, measured in this (fresh) process, the engine built and driven as
    ``gguflm bench`` builds and drives it."""
    import numpy as np

    from gguflm.bench.model import gguflm_runner, llama_cpp_runner

    if engine == "gguflm":
        from gguflm import Model
    else:
        import llama_cpp  # noqa: F401  (imported before the clock starts, as gguflm is)
    base = _rss_mb()  # the interpreter with numpy and the engine imported
    settings = argparse.Namespace(batch_size=max(n_prompt, 1), ubatch_size=512, cache_type_k="f16",
                                  cache_type_v="f16")
    tokens = [int(t) for t in np.random.default_rng(1).integers(100, 1000, n_prompt + n_gen)]
    start = time.perf_counter()
    if engine == "gguflm":
        runner = gguflm_runner(Model.load(path), settings, n_threads, n_ctx)
    else:
        runner = llama_cpp_runner(path, settings, n_threads, n_ctx)
    load_ms = 1e3 * (time.perf_counter() - start)
    loaded = _rss_mb()
    if n_prompt:
        runner.prompt(tokens[:n_prompt], settings.batch_size)
    runner.generate(tokens[n_prompt:])
    figures = {"engine": engine, "load_ctx_ms": load_ms, "rss_start_mb": base, "rss_loaded_mb": loaded,
               "rss_run_mb": _rss_mb(), "rss_peak_mb": _peak_rss_mb()}
    runner.close()
    return figures


def measure(engine: str, path: str, n_ctx: int, n_prompt: int, n_gen: int, n_threads: int) -> dict[str, Any]:
    """Run :func:`_child` for ``engine`` in a new interpreter and return its figures."""
    code = (f"import json, sys; from gguflm.bench.memory import _child; "
            f"print(json.dumps(_child({engine!r}, {path!r}, {n_ctx}, {n_prompt}, {n_gen}, {n_threads})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{engine} child failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median load time over the runs; memory figures from the last run (they do not vary)."""
    return {**runs[-1], "load_ctx_ms": statistics.median(r["load_ctx_ms"] for r in runs), "runs": len(runs)}


def main(argv: list[str]) -> int:
    from gguflm.default_model import resolve_model_path
    from gguflm.threads import resolve_n_threads

    parser = argparse.ArgumentParser(prog="python -m gguflm.bench memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    parser.add_argument("-c", "--ctx-size", type=int, default=1024, help="context cells")
    parser.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens decoded after loading")
    parser.add_argument("-n", "--n-gen", type=int, default=128, help="tokens then decoded one by one")
    parser.add_argument("-r", "--repetitions", type=int, default=3, help="runs per engine (median load time)")
    parser.add_argument("-t", "--threads", type=int, default=None, help="threads (default: usable cores)")
    parser.add_argument("--compare", choices=("llama-cpp",), help="also measure llama-cpp-python")
    parser.add_argument("-o", "--output", default="md", choices=("md", "json"))
    args = parser.parse_args(argv)
    if args.repetitions < 1 or args.n_prompt < 0 or args.n_gen < 0 or args.n_prompt + args.n_gen > args.ctx_size:
        parser.error("need -r >= 1 and 0 <= -p + -n <= -c")
    path = str(resolve_model_path(args.model))
    engines = ["gguflm"] + (["llama.cpp"] if args.compare else [])
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    for _ in range(args.repetitions):
        for engine in engines:
            runs[engine].append(measure(engine, path, args.ctx_size, args.n_prompt, args.n_gen,
                                        resolve_n_threads(args.threads)))
    rows = [summarize(runs[e]) for e in engines]
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{os.path.basename(path)}: n_ctx {args.ctx_size}, then pp{args.n_prompt} + tg{args.n_gen}; "
          f"median of {args.repetitions} fresh processes")
    print("| engine | load+ctx ms | RSS imported MB | RSS loaded MB | RSS after run MB | peak RSS MB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['engine']} | {r['load_ctx_ms']:.0f} | {r['rss_start_mb']:.0f} | {r['rss_loaded_mb']:.0f} "
              f"| {r['rss_run_mb']:.0f} | {r['rss_peak_mb']:.0f} |")
    return 0
