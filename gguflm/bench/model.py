"""Prompt-processing and generation speed, llama-bench style: ``gguflm bench`` or
``python -m gguflm.bench model -m FILE -p 512,2048,4096 -n 128 -d 0,1024 -r 3 -t 2``.

As llama-bench: ``ppN`` decodes N random tokens (BOS first when the model adds one) from an empty
cache in ``n_batch`` chunks; ``tgN`` decodes N random tokens one at a time; with ``-d D`` (depth)
every repetition first fills the cache with D random tokens, untimed, and the test runs after them
(``pp512 @ d4096``); each test runs once to warm up, then ``-r`` times; t/s is the mean over
repetitions ± their sample standard deviation.

``--compare llama-cpp`` runs the same tests through llama-cpp-python's ``llama_decode`` on the same
file in the same process; ``--compare hf`` through Hugging Face transformers on torch (fp32, on the
CPU, ``torch.set_num_threads`` = the test's threads), the model loaded from the same GGUF file
(``from_pretrained(dir, gguf_file=...)``, which dequantizes it to fp32; ``pip install
gguflm[bench-hf]``), each step computing only the last position's logits as the others do. The
engines' repetitions take turns, and gguflm's speed is printed as a ratio of each peer's.

``--lora FILE`` / ``--lora-scaled FILE SCALE`` (llama.cpp's flags) add a ``gguflm+lora`` engine:
the same context with those adapters set, its speed printed as a ratio of gguflm's without them.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gguflm.kv_store import CACHE_TYPES
from gguflm.loader import LOAD_MODES
from gguflm.progress import ProgressBar


@dataclass
class BenchResult:
    """One test on one engine: samples in nanoseconds and tokens per second."""

    engine: str
    model: str
    model_size: int
    model_n_params: int
    n_threads: int
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str
    n_prompt: int
    n_gen: int
    n_depth: int = 0
    samples_ns: list[int] = field(default_factory=list)

    @property
    def test(self) -> str:
        name = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return f"{name} @ d{self.n_depth}" if self.n_depth else name

    @property
    def samples_ts(self) -> list[float]:
        n = self.n_prompt + self.n_gen
        return [1e9 * n / ns for ns in self.samples_ns]

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ns) > 1 else 0.0

    def record(self) -> dict[str, Any]:
        ns = self.samples_ns
        return {**asdict(self), "test": self.test,
                "avg_ns": int(statistics.fmean(ns)),
                "stddev_ns": int(statistics.stdev(ns)) if len(ns) > 1 else 0,
                "avg_ts": self.avg_ts, "stddev_ts": self.stddev_ts, "samples_ts": self.samples_ts}


# -- the engines

@dataclass
class Runner:
    """One engine with a context: ``clear`` empties its cache, ``prompt`` decodes tokens in chunks
    of n_batch after what the cache holds, ``generate`` decodes tokens one at a time after it."""

    clear: Callable[[], None]
    prompt: Callable[[list[int], int], None]
    generate: Callable[[list[int]], None]
    close: Callable[[], None]


LORA_ENGINE = "gguflm+lora"


def gguflm_runner(model: Any, args: argparse.Namespace, n_threads: int, n_ctx: int,
                  adapters: Sequence[tuple[Any, float]] = ()) -> Runner:
    from gguflm.batch import Batch
    from gguflm.context import Context

    ctx = Context(model, n_ctx=n_ctx, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                  n_threads=n_threads, n_threads_batch=n_threads, type_k=args.cache_type_k,
                  type_v=args.cache_type_v)
    if adapters:
        ctx.set_adapters_lora([a for a, _ in adapters], [s for _, s in adapters])

    def decode(batch: Batch) -> None:
        status = ctx.decode(batch)
        if status != 0:
            raise RuntimeError(f"decode failed with status {status}")

    def prompt(tokens: list[int], n_batch: int) -> None:
        for start in range(0, len(tokens), n_batch):
            decode(Batch.get_one(tokens[start:start + n_batch]))

    def generate(tokens: list[int]) -> None:
        one = Batch.get_one([0])
        for tok in tokens:
            one.token[0] = tok
            decode(one)

    return Runner(lambda: ctx.memory.seq_rm(0, -1, -1), prompt, generate, ctx.close)


def llama_cpp_runner(path: str, args: argparse.Namespace, n_threads: int, n_ctx: int) -> Runner:
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                          n_threads=n_threads, n_threads_batch=n_threads, verbose=False,
                          type_k=int(CACHE_TYPES[args.cache_type_k]),
                          type_v=int(CACHE_TYPES[args.cache_type_v]))
    ctx = llm.ctx

    def decode(tokens: list[int]) -> None:
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        status = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(array, len(tokens)))
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")

    def clear() -> None:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)

    def prompt(tokens: list[int], n_batch: int) -> None:
        for start in range(0, len(tokens), n_batch):
            decode(tokens[start:start + n_batch])
        llama_cpp.llama_synchronize(ctx)

    def generate(tokens: list[int]) -> None:
        for tok in tokens:
            decode([tok])
        llama_cpp.llama_synchronize(ctx)

    return Runner(clear, prompt, generate, llm.close)


def hf_runner(path: str, args: argparse.Namespace, n_threads: int, n_ctx: int) -> Runner:
    """transformers + torch in fp32 on the CPU, from the same GGUF file, with a DynamicCache."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    torch.set_num_threads(n_threads)
    file = Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
    model.eval()
    state: dict[str, Any] = {}
    # transformers 5 renamed the cache argument (past_key_values still works, with a warning)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def clear() -> None:
        state["cache"] = DynamicCache(config=model.config)

    def forward(tokens: list[int]) -> None:
        with torch.inference_mode():
            # only the last position's logits, as the other engines' batches ask for
            model(input_ids=torch.tensor([tokens]), use_cache=True, logits_to_keep=1, **{cache_arg: state["cache"]})

    def prompt(tokens: list[int], n_batch: int) -> None:
        torch.set_num_threads(n_threads)
        for start in range(0, len(tokens), n_batch):
            forward(tokens[start:start + n_batch])

    def generate(tokens: list[int]) -> None:
        torch.set_num_threads(n_threads)
        for tok in tokens:
            forward([tok])

    def close() -> None:
        state.clear()
        model.to("meta")  # frees the fp32 weights now rather than at the next collection

    clear()
    return Runner(clear, prompt, generate, close)


PEERS: dict[str, tuple[str, Callable[..., Runner], str, str]] = {
    # --compare value: engine name, runner, module to import, how to install it
    "llama-cpp": ("llama.cpp", llama_cpp_runner, "llama_cpp", "pip install llama-cpp-python"),
    "hf": ("hf", hf_runner, "transformers", "pip install 'gguflm[bench-hf]' (transformers, torch, accelerate)"),
}


def _random_tokens(n: int, n_vocab: int, bos: int | None, rng: random.Random) -> list[int]:
    tokens = [rng.randrange(n_vocab) for _ in range(n)]
    if bos is not None and tokens:
        tokens[0] = bos
    return tokens


def _test_fn(runner: Runner, result: BenchResult, args: argparse.Namespace, n_vocab: int,
             bos: int | None, rng: random.Random) -> tuple[Callable[[], None], Callable[[], None]]:
    """The untimed setup (an empty cache, then the depth's tokens) and the timed run of
    ``result``'s test (ppN or tgN) on ``runner``, each time with fresh random tokens; BOS starts
    the depth's tokens when there are any, else the test's."""

    def setup() -> None:
        runner.clear()
        if result.n_depth:
            runner.prompt(_random_tokens(result.n_depth, n_vocab, bos, rng), args.batch_size)

    first = None if result.n_depth else bos
    if result.n_prompt:
        return setup, lambda: runner.prompt(_random_tokens(result.n_prompt, n_vocab, first, rng), args.batch_size)
    return setup, lambda: runner.generate(_random_tokens(result.n_gen, n_vocab, first, rng))


def _measure(tests: Sequence[tuple[BenchResult, tuple[Callable[[], None], Callable[[], None]]]],
             repetitions: int, bar: ProgressBar) -> None:
    """Warm every engine's run up once, then time the repetitions in turns (engine after engine),
    so that a machine whose speed drifts slows every engine alike; only the run is timed, not
    its setup."""
    for _, (setup, once) in tests:
        setup()
        once()
    for rep in range(repetitions):
        for result, (setup, once) in tests:
            bar.update(rep / repetitions, f"{result.engine} {result.test} t={result.n_threads}")
            setup()
            start = time.perf_counter_ns()
            once()
            result.samples_ns.append(time.perf_counter_ns() - start)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, "
                                         f"got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"values must be >= 0, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench flags (named like llama-bench's)."""
    parser.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    parser.add_argument("-p", "--n-prompt", type=_int_list, default=[512],
                        help="prompt sizes to test, comma-separated (0 skips)")
    parser.add_argument("-n", "--n-gen", type=_int_list, default=[128],
                        help="generation lengths to test, comma-separated (0 skips)")
    parser.add_argument("-d", "--n-depth", type=_int_list, default=[0],
                        help="depths: tokens in the cache before each test, comma-separated")
    parser.add_argument("-r", "--repetitions", type=int, default=5, help="repetitions per test")
    parser.add_argument("-t", "--threads", type=_int_list, default=None,
                        help="thread counts, comma-separated (default: usable cores)")
    parser.add_argument("-b", "--batch-size", type=int, default=2048, help="prompt chunk size")
    parser.add_argument("-ub", "--ubatch-size", type=int, default=512, help="micro-batch size")
    parser.add_argument("-ctk", "--cache-type-k", default="f16", choices=tuple(CACHE_TYPES))
    parser.add_argument("-ctv", "--cache-type-v", default="f16", choices=tuple(CACHE_TYPES))
    parser.add_argument("-o", "--output", default="md", choices=("md", "json"))
    parser.add_argument("--compare", choices=tuple(PEERS), action="append", default=[],
                        help="also run a peer on the same file and print the ratio: llama-cpp "
                             "(llama-cpp-python) or hf (transformers + torch, fp32); may repeat")
    parser.add_argument("--load-mode", default="auto", choices=LOAD_MODES)
    parser.add_argument("--lora", action="append", default=[], metavar="FILE",
                        help=f"also time gguflm with this LoRA adapter at scale 1 (repeatable): {LORA_ENGINE}")
    parser.add_argument("--lora-scaled", action="append", nargs=2, default=[], metavar=("FILE", "SCALE"),
                        help="the same at this scale (repeatable)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random tokens")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args`` (see :func:`add_arguments`); prints the table."""
    from gguflm.default_model import load_model
    from gguflm.errors import Error
    from gguflm.lora import LoraAdapter
    from gguflm.threads import resolve_n_threads

    if args.repetitions < 1:
        print("gguflm bench: -r must be >= 1", file=sys.stderr)
        return 2
    compare = list(dict.fromkeys(args.compare))
    for peer in compare:
        _, _, module, install = PEERS[peer]
        if importlib.util.find_spec(module) is None:
            print(f"gguflm bench: --compare {peer} needs {module} ({install})", file=sys.stderr)
            return 2
    try:
        scaled = [(path, 1.0) for path in args.lora] + [(path, float(scale)) for path, scale in args.lora_scaled]
    except ValueError:
        print("gguflm bench: --lora-scaled FILE SCALE: the scale must be a number", file=sys.stderr)
        return 2
    enabled = False if args.quiet else None
    model = load_model(args.model, enabled, load_mode=args.load_mode)
    try:
        adapters = [(LoraAdapter.load(model, path), scale) for path, scale in scaled]
    except (Error, OSError) as e:
        model.close()
        print(f"gguflm bench: {e}", file=sys.stderr)
        return 2
    path = model.path
    threads = [resolve_n_threads(t or None) for t in (args.threads or [0])]
    tests = [(p, 0, d) for d in args.n_depth for p in args.n_prompt if p] + \
        [(0, n, d) for d in args.n_depth for n in args.n_gen if n]
    n_ctx = max([d + p + n for p, n, d in tests] + [256])
    engines: list[tuple[str, Callable[[int], Runner]]] = [
        ("gguflm", lambda t: gguflm_runner(model, args, t, n_ctx))]
    if adapters:
        engines.append((LORA_ENGINE, lambda t: gguflm_runner(model, args, t, n_ctx, adapters)))
    for peer in compare:
        engine, make_runner, _, _ = PEERS[peer]
        engines.append((engine, lambda t, make_runner=make_runner: make_runner(str(path), args, t, n_ctx)))
    vocab = model.vocab
    bos = vocab.bos if vocab.add_bos else None
    description = model_description(model)
    results: list[BenchResult] = []
    rng = random.Random(args.seed)
    with ProgressBar("bench", enabled=enabled) as bar:
        try:
            for n_threads in threads:
                runners: list[tuple[str, Runner]] = []
                try:
                    for engine, make in engines:
                        runners.append((engine, make(n_threads)))
                    for n_prompt, n_gen, n_depth in tests:
                        timed = []
                        for engine, runner in runners:
                            result = BenchResult(
                                engine, description, model.size_bytes, model.n_params, n_threads,
                                args.batch_size, args.ubatch_size, args.cache_type_k,
                                args.cache_type_v, n_prompt, n_gen, n_depth)
                            timed.append((result, _test_fn(runner, result, args, vocab.n_tokens, bos, rng)))
                        _measure(timed, args.repetitions, bar)
                        results.extend(result for result, _ in timed)
                finally:
                    for _, runner in runners:
                        runner.close()
        finally:
            model.close()
    if args.output == "json":
        print(json.dumps(_records(results), indent=2))
    else:
        print(markdown_table(results))
        for line in ratio_lines(results):
            print(line)
    return 0


def model_description(model: Any) -> str:
    """``arch size-label file-type``, like llama.cpp's ``llama_model_desc``."""
    label = model.metadata.get("general.size_label") or "?B"
    return f"{model.arch} {label} {model.file_type}"


def _ratios(results: Sequence[BenchResult]) -> dict[tuple[str, str, int], float]:
    """(peer engine, test, threads) -> gguflm's t/s over that peer's."""
    by_key = {(r.engine, r.test, r.n_threads): r for r in results}
    peers = [engine for engine, *_ in PEERS.values()]
    return {(peer, r.test, r.n_threads): r.avg_ts / other.avg_ts
            for r in results if r.engine == "gguflm" for peer in peers
            if (other := by_key.get((peer, r.test, r.n_threads))) is not None}


def _lora_ratios(results: Sequence[BenchResult]) -> dict[tuple[str, int], float]:
    """(test, threads) -> gguflm+lora's t/s over gguflm's."""
    base = {(r.test, r.n_threads): r for r in results if r.engine == "gguflm"}
    return {(r.test, r.n_threads): r.avg_ts / other.avg_ts for r in results
            if r.engine == LORA_ENGINE and (other := base.get((r.test, r.n_threads))) is not None}


def _records(results: Sequence[BenchResult]) -> list[dict[str, Any]]:
    ratios, lora_ratios = _ratios(results), _lora_ratios(results)
    keys = {engine: "ratio_vs_" + engine.replace(".", "_") for engine, *_ in PEERS.values()}
    records = []
    for r in results:
        record = r.record()
        if r.engine == "gguflm":
            for (peer, test, threads), ratio in ratios.items():
                if (test, threads) == (r.test, r.n_threads):
                    record[keys[peer]] = ratio
        elif r.engine == LORA_ENGINE and (r.test, r.n_threads) in lora_ratios:
            record["ratio_vs_gguflm"] = lora_ratios[r.test, r.n_threads]
        records.append(record)
    return records


def markdown_table(results: Sequence[BenchResult]) -> str:
    """llama-bench's markdown table (the backend column names the engine)."""
    header = ("model", "size", "params", "backend", "threads", "test", "t/s")
    rows = [(r.model, f"{r.model_size / 2**20:.2f} MiB", f"{r.model_n_params / 1e6:.2f} M",
             r.engine, str(r.n_threads), r.test, f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}")
            for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    right = {1, 2, 4, 5, 6}

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if i in right else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else "-" * w
                             for i, w in enumerate(widths)) + " |"
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def ratio_lines(results: Sequence[BenchResult]) -> list[str]:
    """``test t=N: gguflm / llama.cpp = 0.85x`` for every test gguflm and a peer both ran."""
    return [f"{test} t={threads}: gguflm / {peer} = {ratio:.2f}x"
            for (peer, test, threads), ratio in _ratios(results).items()] + \
        [f"{test} t={threads}: {LORA_ENGINE} / gguflm = {ratio:.2f}x"
         for (test, threads), ratio in _lora_ratios(results).items()]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguflm.bench model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
