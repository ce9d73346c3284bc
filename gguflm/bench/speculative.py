"""Speculative decoding on input-grounded tasks: generation speed with and without it, the
acceptance rate, and whether the tokens are the same.

``gguflm bench --speculative -m FILE [--model-draft FILE] [--compare llama-cpp]`` (or ``python
-m gguflm.bench speculative ...``) runs three tasks whose replies copy much of their prompt
(rewrite a function with one change, fix the typos of a paragraph, edit one field of a JSON
document) greedily through the chat template, without speculation, with prompt lookup, with
each of llama.cpp's n-gram proposers named in ``--spec-type`` (``ngram-simple``, ``ngram-map-k``,
..., with llama.cpp's flags for their parameters) and (with ``--model-draft``) with a draft model,
their repetitions in turns. ``--compare llama-cpp`` adds
llama-cpp-python's ``Llama`` on the same prompt tokens, without and with its
``LlamaPromptLookupDecoding``.

Generation tokens/s: gguflm's from its own timings (first sample to end); llama-cpp-python's as
the generated tokens after the first over the time after a one-token request on the same prompt.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from gguflm.ngram_proposers import NGRAM_SPEC_TYPES, add_ngram_arguments

TASKS = {
    "function": (
        "Rewrite this Python function so that it multiplies the values instead of adding them. "
        "Change nothing else and reply with the code only.\n\n"
        "def combine(values, start=0):\n"
        "    \"\"\"Combine the values, starting from start.\"\"\"\n"
        "    total = start\n"
        "    for value in values:\n"
        "        if value is None:\n"
        "            continue\n"
        "        total = total + value\n"
        "    return total\n"),
    "typos": (
        "Fix the spelling mistakes in this paragraph and reply with the corrected paragraph only.\n\n"
        "The old lighthouse stood at the edge of the cliff for more than a hundred yaers. Every "
        "night its keeper climbed the narow stairs, lit the great lamp and watched the ships pass "
        "safely along the rocky coast. When the storms came, the light was the only thing the "
        "sailors could see, and many of them owed their lifes to it.\n"),
    "json": (
        "Change the city to \"Paris\" in this JSON document and reply with the whole document only.\n\n"
        "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"city\": \"London\", \"languages\": "
        "[\"English\", \"French\"], \"known_for\": \"the first computer program\", \"children\": 3}\n"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    parser.add_argument("-md", "--model-draft", help="also a draft model (a GGUF of the same vocabulary)")
    parser.add_argument("-n", "--n-gen", type=int, default=128, help="tokens generated per task")
    parser.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per task")
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--draft-max", type=int, default=16, help="most tokens drafted at once")
    parser.add_argument("--draft-p-min", type=float, default=0.75,
                        help="a draft model stops drafting below this probability")
    parser.add_argument("--draft-head", default="full",
                        help="a draft model's output layer, or several comma-separated (a row each): "
                             "full (every token's logits) or context (the request's tokens' only)")
    parser.add_argument("--spec-ngram-size", type=int, default=2, help="prompt lookup's longest n-gram")
    parser.add_argument("--spec-type", default="ngram",
                        help="comma-separated proposers: ngram (prompt lookup), " + ", ".join(NGRAM_SPEC_TYPES))
    add_ngram_arguments(parser)
    parser.add_argument("--compare", choices=("llama-cpp",), action="append", default=[],
                        help="llama-cpp-python without and with LlamaPromptLookupDecoding")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated: " + ", ".join(TASKS))


class _Row:
    """One engine configuration on one task: its runs' generation tokens/s and tokens."""

    def __init__(self, engine: str, task: str) -> None:
        self.engine, self.task = engine, task
        self.speeds: list[float] = []
        self.tokens: Any = None   # gguflm's token ids, llama-cpp-python's text
        self.drafted = self.accepted = 0

    def cells(self, base: _Row | None) -> list[str]:
        speed = statistics.median(self.speeds)
        ratio = f"{speed / statistics.median(base.speeds):.2f}x" if base is not None else ""
        acceptance = f"{self.accepted / self.drafted:.0%} of {self.drafted // len(self.speeds)}" if self.drafted else ""
        same = "" if base is None or base is self else ("yes" if self.tokens == base.tokens else "NO")
        return [self.task, self.engine, f"{speed:.1f}", ratio, acceptance, same]


def _gguflm_runs(args: argparse.Namespace, prompts: dict[str, list[int]]) -> list[tuple[str, Callable[[str], Any]]]:
    """(engine label, run(task) -> (tokens/s, token ids, drafted, accepted)) per gguflm setting."""
    from gguflm.llm import LLM
    from gguflm.ngram_proposers import ngram_proposer_from_args
    from gguflm.speculative import PromptLookup

    settings: list[tuple[str, Any]] = [("gguflm", None)]
    for spec_type in (t for t in args.spec_type.split(",") if t):
        if spec_type == "ngram":
            settings.append(("gguflm + lookup", PromptLookup(args.spec_ngram_size, args.draft_max)))
        else:
            settings.append((f"gguflm + {spec_type}", ngram_proposer_from_args(spec_type, args)))
    heads = [h for h in args.draft_head.split(",") if h]
    if args.model_draft:
        settings += [(f"gguflm + draft model{'' if h == 'full' else ', ' + h + ' head'}", (args.model_draft, h))
                     for h in heads]
    runs = []
    for label, draft in settings:
        draft, head = draft if isinstance(draft, tuple) else (draft, "full")
        llm = LLM(args.model, n_ctx=1024, n_threads=args.threads, draft_model=draft, draft_max=args.draft_max,
                  draft_p_min=args.draft_p_min, draft_head=head)

        def run(task: str, llm: LLM = llm) -> tuple[float, list[int], int, int]:
            llm.reset()
            c = llm.complete(prompts[task], max_tokens=args.n_gen, temperature=0.0)
            return c.timings.gen_per_second, c.token_ids, c.timings.draft_n, c.timings.draft_accepted

        run.close = llm.close   # type: ignore[attr-defined]
        runs.append((label, run))
    return runs


def _llama_cpp_runs(args: argparse.Namespace, path: str, prompts: dict[str, list[int]]
                    ) -> list[tuple[str, Callable[[str], Any]]]:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    runs = []
    for label, draft in (("llama-cpp-python", None),
                         ("llama-cpp-python + lookup", LlamaPromptLookupDecoding(args.spec_ngram_size, 10))):
        llm = llama_cpp.Llama(path, n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads,
                              draft_model=draft, verbose=False)

        def run(task: str, llm: Any = llm) -> tuple[float, list[int], int, int]:
            llm.reset()
            start = time.perf_counter()
            llm.create_completion(prompts[task], max_tokens=1, temperature=0.0)
            first = time.perf_counter() - start
            llm.reset()
            start = time.perf_counter()
            out = llm.create_completion(prompts[task], max_tokens=args.n_gen, temperature=0.0)
            total = time.perf_counter() - start
            n = out["usage"]["completion_tokens"]
            return (n - 1) / max(total - first, 1e-9), out["choices"][0]["text"], 0, 0

        run.close = llm.close   # type: ignore[attr-defined]
        runs.append((label, run))
    return runs


def run(args: argparse.Namespace) -> int:
    """Run the benchmark of ``args`` (see :func:`add_arguments`); prints the table."""
    from gguflm.chat import prompt_tokens, template_for_model
    from gguflm.default_model import load_model

    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS] + \
        [t for t in args.spec_type.split(",") if t and t != "ngram" and t not in NGRAM_SPEC_TYPES]
    if unknown or args.repetitions < 1:
        print(f"gguflm bench --speculative: unknown tasks or spec types {unknown}" if unknown else "-r must be >= 1",
              file=sys.stderr)
        return 2
    model = load_model(args.model, False)
    args.model = path = str(model.path)
    template = template_for_model(model, None)
    prompts = {t: prompt_tokens(model.vocab, template.render([{"role": "user", "content": TASKS[t]}],
                                                               add_generation_prompt=True)) for t in tasks}
    model.close()
    runs = _gguflm_runs(args, prompts)
    if "llama-cpp" in args.compare:
        runs += _llama_cpp_runs(args, path, prompts)
    rows = {(label, t): _Row(label, t) for label, _ in runs for t in tasks}
    try:
        for _ in range(args.repetitions):
            for t in tasks:
                for label, fn in runs:     # the engines in turns
                    speed, tokens, drafted, accepted = fn(t)
                    row = rows[label, t]
                    row.speeds.append(speed)
                    row.tokens = row.tokens or tokens
                    row.drafted += drafted
                    row.accepted += accepted
    finally:
        for _, fn in runs:
            fn.close()
    print(f"{path}: greedy, {args.n_gen} tokens, median of {args.repetitions}; "
          f"ratio and same tokens against the engine without speculation")
    print("| task | engine | gen t/s | ratio | accepted (of drafted per run) | same tokens |")
    print("| --- | --- | ---: | ---: | ---: | :---: |")
    for t in tasks:
        for label, _ in runs:
            base = rows["llama-cpp-python" if label.startswith("llama") else "gguflm", t]
            print("| " + " | ".join(rows[label, t].cells(base)) + " |")
    return 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguflm.bench speculative", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
