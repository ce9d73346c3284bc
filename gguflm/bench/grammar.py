"""``gguflm bench grammar`` (or ``python -m gguflm.bench grammar``): what a grammar costs.

Two figures, for a JSON grammar (llama.cpp's ``json.gbnf``; ``-j`` for a schema) on a model (the
default model, Gemma 3 270M with 262,144 tokens, unless ``-m``):

1. Full-mask time per token: a greedy constrained completion is generated, then its tokens are
   replayed into a fresh grammar (empty caches, as a new request meets it) and, before each
   token, the whole vocabulary is masked (``CompiledGrammar.apply`` on a full logits row).
   Median, 90th percentile, max and mean in milliseconds, and how many states were new (their
   mask computed) rather than met before (served from the cache). With ``--compare llama-cpp``,
   llama.cpp's grammar sampler (``llama_sampler_apply`` through llama-cpp-python) masks the same
   vocabulary at the same states.
2. Constrained vs unconstrained generation speed: greedy completions of up to ``-n`` tokens
   (128) for a few prompts, with and without the grammar, as tokens per second of generation
   (sampling included, prompt excluded); gguflm samples as llama.cpp's common sampler
   (sample, check one token, mask only on rejection), llama-cpp-python masks every token first.

Targets (the grammar engine's, for constrained generation): median full mask <= 1 ms on Gemma, constrained >= 90% of unconstrained.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

PROMPTS = (
    "Describe a person as a JSON object:",
    "Return the list of planets with their moons as JSON:",
    "A JSON record of a book:",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    parser.add_argument("-n", "--n-gen", type=int, default=128, help="tokens per completion")
    parser.add_argument("-r", "--repetitions", type=int, default=3,
                        help="runs of each generation test")
    parser.add_argument("-t", "--threads", type=int, default=None, help="threads")
    parser.add_argument("-j", "--json-schema", help="constrain to this JSON schema instead")
    parser.add_argument("--compare", choices=("llama-cpp",),
                        help="also time llama.cpp's grammar sampler through llama-cpp-python")
    parser.add_argument("-o", "--output", default="md", choices=("md", "json"))
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _grammar_text(args: argparse.Namespace) -> str:
    from gguflm.grammar.builtin import JSON_GBNF
    from gguflm.grammar.json_schema import json_schema_to_gbnf

    return json_schema_to_gbnf(args.json_schema) if args.json_schema else JSON_GBNF


def _summary(times_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {"median_ms": statistics.median(ordered),
            "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max_ms": ordered[-1], "mean_ms": statistics.fmean(ordered), "n": len(ordered)}


def mask_times(vocab: Any, text: str, tokens: Sequence[int]) -> dict[str, float]:
    """gguflm: full-vocabulary mask before each of ``tokens``, from a fresh grammar."""
    from gguflm.grammar import Grammar

    compiled = Grammar(text).compile(vocab)   # a new Grammar: a new matcher, empty caches
    state = compiled.initial_state()
    row = np.zeros(vocab.n_tokens, dtype=np.float32)
    times = []
    for tok in tokens:
        row[:] = 0.0
        start = time.perf_counter()
        compiled.apply(state, None, row, full_mask_from=0)
        times.append((time.perf_counter() - start) * 1e3)
        if not np.isfinite(row[tok]):
            raise RuntimeError(f"the replayed token {tok} is masked: the grammar disagrees")
        state = compiled.accept(state, tok)
    result = _summary(times)
    stats = compiled.stats()
    result["masks_computed"] = stats["masks_computed"]
    result["masks_cached"] = stats["masks_cached"]
    return result


def llama_cpp_mask_times(path: str, text: str, tokens: Sequence[int]) -> dict[str, float]:
    """llama.cpp's grammar sampler on all candidates before each of ``tokens``."""
    import llama_cpp.llama_cpp as L

    from gguflm.bench.sampling import TOKEN_DATA

    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), params)
    try:
        vocab = L.llama_model_get_vocab(model)
        n = L.llama_vocab_n_tokens(vocab)
        sampler = L.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        if not sampler:
            raise RuntimeError("llama.cpp rejects the grammar")
        buffer = np.zeros(n, dtype=TOKEN_DATA)
        ids = np.arange(n, dtype=np.int32)
        array = L.llama_token_data_array(
            data=buffer.ctypes.data_as(ctypes.POINTER(L.llama_token_data)), size=n, selected=-1,
            sorted=False)
        times = []
        for tok in tokens:
            buffer["id"] = ids
            buffer["logit"] = 0.0
            start = time.perf_counter()
            L.llama_sampler_apply(sampler, ctypes.byref(array))
            times.append((time.perf_counter() - start) * 1e3)
            L.llama_sampler_accept(sampler, tok)
        L.llama_sampler_free(sampler)
    finally:
        L.llama_model_free(model)
    return _summary(times)


def _gen_rate(run: Any, prompts: Sequence[str], repetitions: int) -> tuple[float, int]:
    """Generated tokens per second over every prompt and repetition, and tokens per run."""
    total_tokens, total_s = 0, 0.0
    for _ in range(repetitions):
        for prompt in prompts:
            n, seconds = run(prompt)
            total_tokens += n
            total_s += seconds
    return (total_tokens / total_s if total_s else 0.0), total_tokens // max(1, repetitions)


def run(args: argparse.Namespace) -> int:
    from gguflm.bench import llama_cpp_or_none
    from gguflm.generate import FINISH_STOP
    from gguflm.grammar import Grammar
    from gguflm.llm import LLM

    text = _grammar_text(args)
    compare = args.compare == "llama-cpp"
    if compare:
        llama_cpp = llama_cpp_or_none("grammar")
        if llama_cpp is None:
            return 2
        _silence_llama_cpp(llama_cpp)
    progress = False if args.quiet else None
    llm = LLM(args.model, n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads,
              progress=progress)
    path = llm.model_path
    vocab = llm.model.vocab
    grammar = Grammar(text)
    report: dict[str, Any] = {"model": path, "n_vocab": vocab.n_tokens, "n_gen": args.n_gen}
    try:
        # the tokens a constrained completion produces, for the mask replay
        first = llm.complete(PROMPTS[0], max_tokens=args.n_gen, temperature=0, grammar=grammar)
        tokens = list(first.token_ids)
        if first.finish_reason == FINISH_STOP:   # the end-of-generation token, masked too
            tokens.append(min(vocab.eog_ids))
        report["mask"] = {"gguflm": mask_times(vocab, text, tokens)}

        def ours(prompt: str, constrained: bool) -> tuple[int, float]:
            llm.reset()
            out = llm.complete(prompt, max_tokens=args.n_gen, temperature=0,
                               grammar=grammar if constrained else None)
            return out.timings.gen_n, out.timings.gen_ms / 1e3

        rates = {"gguflm": {}}
        for constrained in (False, True):
            key = "constrained" if constrained else "unconstrained"
            rates["gguflm"][key] = _gen_rate(lambda p: ours(p, constrained), PROMPTS,
                                             args.repetitions)
    finally:
        llm.close()
    if compare:
        report["mask"]["llama.cpp"] = llama_cpp_mask_times(path, text, tokens)
        rates["llama.cpp"] = _llama_cpp_rates(path, text, args)
    report["generation"] = {engine: {k: {"tokens_per_s": v[0], "tokens_per_run": v[1]}
                                     for k, v in r.items()} for engine, r in rates.items()}
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print(markdown(report))
    return 0


_LOG_CALLBACK: Any = None


def _silence_llama_cpp(llama_cpp: Any) -> None:
    """llama.cpp logs every model load to stderr; the table is what this prints."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, user: None)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p())


def _llama_cpp_rates(path: str, text: str, args: argparse.Namespace) -> dict[str, tuple]:
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=1024, n_threads=args.threads or None,
                          n_threads_batch=args.threads or None, verbose=False)
    grammar = llama_cpp.LlamaGrammar.from_string(text, verbose=False)
    try:
        def theirs(prompt: str, constrained: bool) -> tuple[int, float]:
            llm.reset()
            llama_cpp.llama_perf_context_reset(llm.ctx)
            start = time.perf_counter()
            out = llm.create_completion(prompt, max_tokens=args.n_gen, temperature=0,
                                        grammar=grammar if constrained else None)
            seconds = time.perf_counter() - start
            prompt_s = llama_cpp.llama_perf_context(llm.ctx).t_p_eval_ms / 1e3
            return out["usage"]["completion_tokens"], seconds - prompt_s

        return {("constrained" if c else "unconstrained"):
                _gen_rate(lambda p: theirs(p, c), PROMPTS, args.repetitions)
                for c in (False, True)}
    finally:
        llm.close()


def markdown(report: dict[str, Any]) -> str:
    lines = [f"model: {report['model']} ({report['n_vocab']} tokens), JSON grammar", "",
             "| full mask per token | median ms | p90 ms | max ms | mean ms | tokens |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for engine, m in report["mask"].items():
        lines.append(f"| {engine} | {m['median_ms']:.3f} | {m['p90_ms']:.3f} | "
                     f"{m['max_ms']:.2f} | {m['mean_ms']:.3f} | {m['n']} |")
    ours = report["mask"]["gguflm"]
    lines.append("")
    lines.append(f"gguflm: {ours['masks_computed']} masks computed (new states), "
                 f"{ours['masks_cached']} from the cache")
    lines += ["", f"| generation (greedy, up to {report['n_gen']} tokens) | unconstrained t/s "
                  f"| constrained t/s | ratio | tokens per run (u / c) |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for engine, g in report["generation"].items():
        u, c = g["unconstrained"]["tokens_per_s"], g["constrained"]["tokens_per_s"]
        lines.append(f"| {engine} | {u:.1f} | {c:.1f} | {100 * c / u:.0f}% | "
                     f"{g['unconstrained']['tokens_per_run']} / "
                     f"{g['constrained']['tokens_per_run']} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguflm.bench grammar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
