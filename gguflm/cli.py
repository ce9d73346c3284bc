"""The ``gguflm`` command: one subcommand per job, flags named like llama.cpp's tools.

Without ``-m`` every command uses the default model (Gemma 3 270M, from the ``default-model``
extra). Progress bars go to stderr, only on a terminal and never with ``--quiet``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gguflm.kv_store import CACHE_TYPES
from gguflm.ngram_proposers import NGRAM_SPEC_TYPES, add_ngram_arguments
from gguflm.progress import ProgressBar, _is_terminal
from gguflm.pooling import POOLING_NAMES



def _progress(args: argparse.Namespace) -> bool:
    """``--quiet`` turns bars off; otherwise they show when stderr is a terminal."""
    return not args.quiet and _is_terminal(sys.stderr)


def _chunk_reporter(bar: ProgressBar) -> Callable[[int, int, float], None]:
    """perplexity's and imatrix's per-chunk report: the bar on a terminal, else llama.cpp's
    ``[chunk]ppl,`` lines."""
    def on_chunk(done: int, total: int, ppl: float) -> None:
        if bar.enabled:
            bar.update(done / total, f"[{done}/{total}] {ppl:.4f}")
        else:
            print(f"[{done}]{ppl:.4f},", end="", flush=True)
    return on_chunk


class _StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record comes, not as it was when the handler was
    made (a caller such as pytest's capture may swap it between commands)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it
        pass


def _configure_logging() -> None:
    """The command's handler for the library's records: warnings and errors on stderr
    (``GGUFLM_LOG_LEVEL=INFO`` shows more). The library itself only logs."""
    value = os.environ.get("GGUFLM_LOG_LEVEL", "")
    level = value.strip().upper() or "WARNING"  # empty means unset, as for the other switches
    if not isinstance(logging.getLevelName(level), int):
        raise ValueError(f"GGUFLM_LOG_LEVEL={value!r}: not a logging level (DEBUG, INFO, WARNING, ERROR)")
    logger = logging.getLogger("gguflm")
    if any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("gguflm: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)


def _read_text(args: argparse.Namespace, what: str) -> str:
    if getattr(args, "file", None):
        return Path(args.file).read_text(encoding="utf-8")
    if args.prompt is None:
        raise ValueError(f"give the {what} with -p TEXT or -f FILE")
    return args.prompt


def _llm(args: argparse.Namespace, **extra: Any):
    from gguflm.llm import LLM

    return LLM(args.model, n_ctx=args.ctx_size, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
               n_threads=args.threads, n_threads_batch=args.threads_batch,
               type_k=args.cache_type_k, type_v=args.cache_type_v, seed=_seed(args),
               load_mode=args.load_mode, progress=_progress(args), **rope_options(args),
               **adapter_options(args), **extra)


def _seed(args: argparse.Namespace) -> int | None:
    return None if args.seed is None or args.seed < 0 else args.seed


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"temperature": args.temp, "top_k": args.top_k, "top_p": args.top_p,
            "min_p": args.min_p, "repeat_penalty": args.repeat_penalty, "seed": _seed(args),
            "grammar": _grammar(args)}


def _grammar(args: argparse.Namespace) -> Any:
    """The grammar of --grammar, --grammar-file, -j/--json-schema or -jf/--json-schema-file."""
    from gguflm.grammar import Grammar

    if args.grammar is not None:
        return Grammar.from_string(args.grammar)
    if args.grammar_file is not None:
        return Grammar.from_file(args.grammar_file)
    schema = args.json_schema
    if args.json_schema_file is not None:
        schema = Path(args.json_schema_file).read_text(encoding="utf-8")
    if schema is not None:
        return Grammar.from_json_schema(schema, converter=args.json_schema_converter)
    return None


def _max_tokens(n_predict: int) -> int | None:
    return None if n_predict < 0 else n_predict


@contextmanager
def _sigint_cancels(llm: Any) -> Iterator[None]:
    """While active, Ctrl-C cancels the running request instead of raising KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: llm.cancel())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stream(chunks: Iterator[Any]) -> Any:
    """Write streamed text to stdout as it arrives; returns the final completion."""
    completion = None
    for chunk in chunks:
        if chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        if chunk.completion is not None:
            completion = chunk.completion
    return completion


# -- subcommands

def _cmd_info(args: argparse.Namespace) -> int:
    from gguflm.system import system_info

    print(json.dumps(system_info(), indent=2))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from gguflm.default_model import resolve_model_path
    from gguflm.inspect import inspect_report

    path = resolve_model_path(args.file or args.model, _progress(args))
    sys.stdout.write(inspect_report(path, max_items=args.items))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    prompt = _read_text(args, "prompt")
    with _llm(args, **_speculative(args)) as llm:
        cache = Path(args.prompt_cache) if args.prompt_cache else None
        if cache is not None and cache.exists():
            n = llm.session_load(cache)
            print(f"prompt cache {cache}: {n} tokens", file=sys.stderr)
        if args.display_prompt:
            sys.stdout.write(prompt)
            sys.stdout.flush()
        with _sigint_cancels(llm):
            completion = _stream(llm.complete(prompt, max_tokens=_max_tokens(args.n_predict),
                                              stop=args.reverse_prompt, stream=True,
                                              **_sampling(args)))
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(f"[{completion.finish_reason}] {completion.timings.line()}", file=sys.stderr)
        if cache is not None and not args.prompt_cache_ro:
            # llama-cli keeps the prompt, or with --prompt-cache-all the reply too
            llm.session_save(cache, None if args.prompt_cache_all else len(completion.prompt_tokens))
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    if args.gui:
        from gguflm.apps.chat_gui import main as gui_main

        return gui_main(args.model)
    from gguflm.generate import FINISH_CANCELLED

    template = args.chat_template
    if args.chat_template_file:
        template = Path(args.chat_template_file).read_text(encoding="utf-8")
    with _llm(args, chat_template=template) as llm:
        # fail before the first prompt when the model has no template
        llm.apply_chat_template([{"role": "user", "content": "hi"}])
        messages: list[dict[str, str]] = []
        if args.system_prompt:
            messages.append({"role": "system", "content": args.system_prompt})
        print(f"chatting with {Path(llm.model_path).name}: /exit or Ctrl-D quits, "
              f"Ctrl-C stops a reply", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                print()
                break
            except KeyboardInterrupt:
                print("\n(/exit or Ctrl-D quits)", file=sys.stderr)
                continue
            if line.strip() == "/exit":
                break
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line})
            with _sigint_cancels(llm):
                completion = _stream(llm.chat(messages, max_tokens=_max_tokens(args.n_predict),
                                              stream=True, **_sampling(args)))
            sys.stdout.write("\n")
            if completion.finish_reason == FINISH_CANCELLED:
                sys.stdout.write("[reply stopped]\n")
            sys.stdout.flush()
            messages.append({"role": "assistant", "content": completion.text})
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from gguflm.bench.model import run

    return run(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from gguflm.server import create_app, serve
        from gguflm.server.app import MAX_BODY_BYTES
    except ImportError as exc:
        raise ValueError(str(exc)) from None

    several = bool(args.models_dir) or len(args.model or ()) > 1
    model = None if several or not args.model else args.model[0]
    options = dict(parallel=args.parallel, n_ctx=args.ctx_size,
                   n_batch=args.batch_size, n_ubatch=args.ubatch_size, n_threads=args.threads,
                   n_threads_batch=args.threads_batch, api_key=_api_keys(args),
                   chat_template=_chat_template_arg(args), embedding=args.embedding,
                   kv_unified=args.kv_unified, type_k=args.cache_type_k,
                   type_v=args.cache_type_v, seed=_seed(args), load_mode=args.load_mode,
                   shutdown_timeout=args.shutdown_timeout, pooling_type=args.pooling,
                   max_body_bytes=args.max_body_bytes or MAX_BODY_BYTES, max_tokens=args.max_tokens,
                   **adapter_options(args), **_speculative(args),
                   slot_save_path=args.slot_save_path, cache_reuse=args.cache_reuse,
                   cors_origins=[o for o in (args.cors_origins or "").split(",") if o] or None)
    if args.ray:
        try:
            from gguflm.ray.serve import serve_cli
        except ImportError as exc:
            raise ValueError(str(exc)) from None
        return serve_cli(args.model or [], args.models_dir, args.alias, options, args.replicas,
                         args.max_replicas, args.host, args.port)
    app = create_app(model, models=args.model if several else None, models_dir=args.models_dir,
                     models_max=args.models_max, memory_budget=_size(args.memory_budget),
                     alias=args.alias, **options)
    serve(app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info")
    return 0


def _size(text: str | None) -> int | None:
    """Bytes of ``512M``, ``2G``, ``1.5GiB`` or a plain number."""
    if text is None:
        return None
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        return int(float(t[: len(t) - len(unit)]) * units[unit])
    except ValueError:
        raise ValueError(f"not a size: {text!r} (give bytes, or a number with K, M, G or T)") from None


def _api_keys(args: argparse.Namespace) -> list[str]:
    """--api-key (comma-separated) and --api-key-file (one per line), as llama-server reads them."""
    keys = [k for k in (args.api_key or "").split(",") if k]
    if args.api_key_file:
        keys += [line.strip() for line in Path(args.api_key_file).read_text().splitlines() if line.strip()]
    return keys


def _chat_template_arg(args: argparse.Namespace) -> str | None:
    if args.chat_template_file:
        return Path(args.chat_template_file).read_text(encoding="utf-8")
    return args.chat_template


def _cmd_embed(args: argparse.Namespace) -> int:
    from gguflm.context import Context
    from gguflm.default_model import load_model
    from gguflm.embedding import embed_prompts, max_sequences, render

    text = _read_text(args, "texts")
    if args.file and text.endswith("\n"):   # as llama.cpp's -f: one trailing newline is no prompt
        text = text[:-1]
    with load_model(args.model, _progress(args), load_mode=args.load_mode) as model:
        # llama-embedding's sizes: the training context, a batch at least that large, one ubatch
        # per batch, as many sequences per batch as llama.cpp allows
        n_ctx = args.ctx_size or model.hparams.n_ctx_train
        n_batch = max(args.batch_size, n_ctx)
        with Context(model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=args.ubatch_size or n_batch,
                     n_seq_max=max_sequences(model), n_threads=args.threads, n_threads_batch=args.threads_batch,
                     type_k=args.cache_type_k, type_v=args.cache_type_v, embeddings=True,
                     pooling=args.pooling, logits=False, **rope_options(args)) as ctx:
            run = embed_prompts(ctx, text.split(args.embd_separator), n_batch, args.cls_separator,
                                args.embd_normalize)
    sys.stdout.write(render(run, args.embd_output_format, args.embd_normalize))
    return 0


def _cmd_perplexity(args: argparse.Namespace) -> int:
    from gguflm.default_model import load_model
    from gguflm.perplexity import perplexity

    text = Path(args.file).read_text(encoding="utf-8")
    model = load_model(args.model, _progress(args), load_mode=args.load_mode)
    with model, ProgressBar("perplexity", enabled=_progress(args)) as bar:
        result = perplexity(model, text, n_ctx=args.ctx_size, n_batch=args.batch_size,
                            n_chunks=args.chunks, n_threads=args.threads,
                            n_threads_batch=args.threads_batch, on_chunk=_chunk_reporter(bar))
    if bar.enabled:
        print("".join(f"[{i}]{p:.4f}," for i, p in enumerate(result.running, 1)), end="")
    print()
    print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.ppl_error:.5f}")
    print(f"({result.n_chunks} chunks of {result.n_ctx} tokens, {result.n_scored} tokens scored, "
          f"{result.n_tokens} in the text)", file=sys.stderr)
    return 0


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from gguflm.default_model import load_model

    text = _read_text(args, "text")
    with load_model(args.model, _progress(args), vocab_only=True) as model:
        vocab = model.vocab
        ids = vocab.tokenize(text, add_special=not args.no_bos,
                             parse_special=not args.no_parse_special)
        if args.ids:
            print(ids)
        else:
            for tok in ids:
                piece = vocab.token_to_piece(tok, 0, True).decode("utf-8", "replace")
                print(f"{tok:6d} -> '{piece}'")
        if args.show_count:
            print(f"Total number of tokens: {len(ids)}")
    return 0


def _kv_override(text: str) -> tuple[str, Any]:
    """``KEY=TYPE:VALUE`` (types int, float, bool, str), as llama.cpp's --override-kv."""
    key, sep, rest = text.partition("=")
    if not sep or not key or len(key) >= 128:
        raise ValueError(f"malformed KV override {text!r}: expected KEY=TYPE:VALUE")
    kind, sep, value = rest.partition(":")
    if kind == "int" and sep:
        return key, int(value)
    if kind == "float" and sep:
        return key, float(value)
    if kind == "bool" and value in ("true", "false"):
        return key, value == "true"
    if kind == "str" and sep:
        if len(value.encode()) > 127:
            raise ValueError(f"KV override {key!r}: string longer than 127 bytes")
        return key, value
    raise ValueError(f"invalid type or value in KV override {text!r} (int:, float:, bool:true|false, str:)")


def _tensor_type_option(text: str) -> tuple[str, str]:
    """``NAME=TYPE`` of --tensor-type: the name (a regex, lowercased as llama-quantize does)."""
    name, sep, qtype = text.partition("=")
    if not sep or not name or not qtype:
        raise ValueError(f"malformed tensor type {text!r}: expected NAME=TYPE")
    return name.lower(), qtype


def _cmd_quantize(args: argparse.Namespace) -> int:
    from gguflm.imatrix import read_imatrix
    from gguflm.quantize import FTYPE_NAMES, parse_ftype, quantize

    # llama-quantize's positionals: IN [OUT] TYPE [nthreads]; without OUT the file goes beside IN
    pos = list(args.positional)
    if len(pos) < 2:
        raise ValueError("usage: gguflm quantize [options] IN.gguf [OUT.gguf] TYPE [nthreads]")
    src = Path(pos.pop(0))
    try:
        parse_ftype(pos[0])
        ftype_name = pos.pop(0)
        name = next((n for n in FTYPE_NAMES if n == ftype_name.upper()), ftype_name)
        dst = src.parent / f"ggml-model-{name}.gguf"
    except ValueError:
        dst = Path(pos.pop(0))
        if not pos:
            raise ValueError("missing the file type") from None
        ftype_name = pos.pop(0)
    nthread = int(pos.pop(0)) if pos else None
    if pos:
        raise ValueError(f"unexpected arguments: {' '.join(pos)}")
    if args.include_weights and args.exclude_weights:
        raise ValueError("--include-weights and --exclude-weights cannot be used together")
    overrides = dict(_kv_override(o) for o in args.override_kv)
    prune = [int(i) for i in args.prune_layers.split(",") if i.strip()] if args.prune_layers else []
    tensor_types = [_tensor_type_option(t) for t in args.tensor_type]
    if args.tensor_type_file:
        tensor_types += [_tensor_type_option(t)
                         for t in Path(args.tensor_type_file).read_text().split()]
    weights = None
    if args.imatrix:
        from gguflm.quantize import _importance

        im = read_imatrix(args.imatrix)
        if not im.is_legacy and not im.has_metadata:
            raise ValueError(f"missing imatrix metadata in file {args.imatrix}")
        weights = _importance(im.importance(), args.include_weights, args.exclude_weights)
        if weights:  # llama-quantize records what the matrix was
            overrides["quantize.imatrix.file"] = args.imatrix[:127]
            if im.datasets:
                overrides["quantize.imatrix.dataset"] = im.datasets[0][:127]
            overrides["quantize.imatrix.entries_count"] = len(weights)
            if im.chunk_count > 0:
                overrides["quantize.imatrix.chunks_count"] = im.chunk_count
    if args.dry_run:
        from gguflm.quantize import plan

        for p in plan(src, ftype_name, imatrix=weights, allow_requantize=args.allow_requantize,
                      leave_output_tensor=args.leave_output_tensor, pure=args.pure,
                      output_tensor_type=args.output_tensor_type,
                      token_embedding_type=args.token_embedding_type, tensor_types=tensor_types,
                      kv_overrides=overrides, keep_split=args.keep_split, prune_layers=prune):
            print(f"{p.name:40s} {p.src_type.name:>7s} -> {p.dst_type.name:7s} "
                  f"{p.src_bytes / 2**20:8.2f} MiB -> {p.dst_bytes / 2**20:8.2f} MiB")
        return 0
    print(f"quantizing '{src}' to '{dst}' as {ftype_name.upper()}"
          + (f" using {nthread} threads" if nthread else ""), file=sys.stderr)
    with ProgressBar("quantize", enabled=_progress(args)) as bar:
        result = quantize(src, dst, ftype_name, imatrix=weights, nthread=nthread,
                          allow_requantize=args.allow_requantize,
                          leave_output_tensor=args.leave_output_tensor, pure=args.pure,
                          output_tensor_type=args.output_tensor_type,
                          token_embedding_type=args.token_embedding_type,
                          tensor_types=tensor_types, kv_overrides=overrides,
                          keep_split=args.keep_split, prune_layers=prune,
                          progress=lambda done, total, name: bar.update(done / total, f"[{done}/{total}] {name}"))
    if result.fallbacks:  # llama.cpp's closing warning (GGUFLM_LOG_LEVEL=INFO lists them)
        print(f"warning: {len(result.fallbacks)} of {len(result.tensors)} tensor(s) required "
              f"fallback quantization", file=sys.stderr)
    print(result.summary())
    return 0


def _cmd_imatrix(args: argparse.Namespace) -> int:
    from gguflm.default_model import load_model
    from gguflm.imatrix import compute_imatrix, write_imatrix, write_imatrix_legacy

    text = Path(args.file).read_text(encoding="utf-8")
    legacy = args.output_format == "dat" or (args.output_format is None and args.output.endswith(".dat"))
    with load_model(args.model, _progress(args)) as model, \
            ProgressBar("imatrix", enabled=_progress(args)) as bar:
        result = compute_imatrix(model, text, n_ctx=args.ctx_size, n_chunks=args.chunks,
                                 dataset=args.file, process_output=args.process_output,
                                 n_threads=args.threads, on_chunk=_chunk_reporter(bar))
    print()
    print(f"Final estimate: PPL = {result.ppl:.4f}")
    im = result.imatrix
    path = write_imatrix_legacy(args.output, im, args.file) if legacy else write_imatrix(args.output, im)
    print(f"stored {len(im.sums)} entries after {im.chunk_count} chunks of {im.chunk_size} tokens "
          f"in {path}", file=sys.stderr)
    return 0


# -- the parser

def _model_args(p: argparse.ArgumentParser, several: bool = False) -> None:
    from gguflm.loader import LOAD_MODES

    if several:
        p.add_argument("-m", "--model", action="append",
                       help="GGUF file (default: the default model, Gemma 3 270M); repeated: "
                            "serve each, by its file name without .gguf")
    else:
        p.add_argument("-m", "--model", help="GGUF file (default: the default model, Gemma 3 270M)")
    p.add_argument("--load-mode", default="auto", choices=LOAD_MODES,
                   help="how weights are bound: mmap, read (none), pinned (mlock)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _speculative_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (the same tokens, faster)")
    g.add_argument("-md", "--model-draft", metavar="FILE",
                   help="a draft model: a smaller GGUF of the same vocabulary")
    g.add_argument("--spec-type", choices=("none", "ngram", *NGRAM_SPEC_TYPES), default="none",
                   help="ngram: draft by prompt lookup (the tokens that followed the last n-gram before); "
                        "ngram-*: llama.cpp's n-gram proposers of that name")
    g.add_argument("--spec-ngram-size", type=int, default=2, metavar="N",
                   help="the longest n-gram prompt lookup matches (default: 2)")
    add_ngram_arguments(g)
    g.add_argument("--draft-max", type=int, default=16, metavar="N", help="most tokens drafted at once")
    g.add_argument("--draft-min", type=int, default=0, metavar="N", help="fewest drafted tokens worth checking")
    g.add_argument("--draft-p-min", type=float, default=0.75, metavar="P",
                   help="a draft model stops drafting below this probability")


def _speculative(args: argparse.Namespace) -> dict[str, Any]:
    """LLM's speculative-decoding arguments from --model-draft / --spec-type and the draft limits."""
    from gguflm.ngram_proposers import ngram_proposer_from_args
    from gguflm.speculative import PromptLookup

    if args.model_draft and args.spec_type != "none":
        raise SystemExit(f"gguflm: give --model-draft or --spec-type {args.spec_type}, not both")
    draft: Any = args.model_draft
    if args.spec_type == "ngram":
        draft = PromptLookup(args.spec_ngram_size, args.draft_max)
    elif args.spec_type in NGRAM_SPEC_TYPES:
        draft = ngram_proposer_from_args(args.spec_type, args)
    if draft is None:
        return {}
    return {"draft_model": draft, "draft_max": args.draft_max, "draft_min": args.draft_min,
            "draft_p_min": args.draft_p_min}


def _context_args(p: argparse.ArgumentParser, ctx_size: int, batch_size: int) -> None:
    p.add_argument("-c", "--ctx-size", type=int, default=ctx_size, help="context size in tokens")
    p.add_argument("-b", "--batch-size", type=int, default=batch_size, help="prompt chunk size")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, help="micro-batch size")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads for generation")
    p.add_argument("-tb", "--threads-batch", type=int, default=None,
                   help="threads for prompt processing (default: --threads)")
    p.add_argument("-ctk", "--cache-type-k", default="f16", choices=tuple(CACHE_TYPES))
    p.add_argument("-ctv", "--cache-type-v", default="f16", choices=tuple(CACHE_TYPES))
    # RoPE scaling, as llama.cpp's flags (unset: the file's)
    p.add_argument("--rope-scaling", choices=("none", "linear", "yarn", "longrope"), default=None,
                   help="RoPE frequency scaling method (default: the model's)")
    p.add_argument("--rope-scale", type=float, default=0.0, help="context scaling factor: freq scale 1 / N")
    p.add_argument("--rope-freq-base", type=float, default=0.0, help="RoPE base frequency (default: the model's)")
    p.add_argument("--rope-freq-scale", type=float, default=0.0, help="RoPE frequency scale (default: the model's)")
    p.add_argument("--yarn-orig-ctx", type=int, default=0, help="YaRN: the model's original context size")
    p.add_argument("--yarn-ext-factor", type=float, default=-1.0, help="YaRN: extrapolation mix (-1: by method)")
    p.add_argument("--yarn-attn-factor", type=float, default=-1.0, help="YaRN: attention magnitude scale")
    p.add_argument("--yarn-beta-slow", type=float, default=-1.0, help="YaRN: high correction dim")
    p.add_argument("--yarn-beta-fast", type=float, default=-1.0, help="YaRN: low correction dim")


def rope_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Context / LLM RoPE arguments of the flags (``--rope-scale N`` is freq scale 1 / N)."""
    freq_scale = args.rope_freq_scale or (1.0 / args.rope_scale if args.rope_scale else 0.0)
    return {"rope_scaling_type": args.rope_scaling, "rope_freq_base": args.rope_freq_base,
            "rope_freq_scale": freq_scale, "yarn_orig_ctx": args.yarn_orig_ctx,
            "yarn_ext_factor": args.yarn_ext_factor, "yarn_attn_factor": args.yarn_attn_factor,
            "yarn_beta_slow": args.yarn_beta_slow, "yarn_beta_fast": args.yarn_beta_fast}


def _adapter_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's LoRA and control-vector flags (a file flag also takes comma-separated files)."""
    p.add_argument("--lora", action="append", default=[], metavar="FILE", help="LoRA adapter at scale 1 (repeatable)")
    p.add_argument("--lora-scaled", action="append", nargs=2, default=[], metavar=("FILE", "SCALE"),
                   help="LoRA adapter at this scale (repeatable)")
    p.add_argument("--control-vector", action="append", default=[], metavar="FILE",
                   help="control vector of strength 1 (repeatable; several add up)")
    p.add_argument("--control-vector-scaled", action="append", nargs=2, default=[], metavar=("FILE", "S"),
                   help="control vector of strength S (repeatable)")
    p.add_argument("--control-vector-layer-range", nargs=2, type=int, metavar=("A", "B"),
                   help="layers the control vectors join, A to B inclusive (default: 1 to the last)")


def adapter_options(args: argparse.Namespace) -> dict[str, Any]:
    """The LLM adapter arguments of the flags (:func:`_adapter_args`)."""
    def scaled(files: list[str], pairs: list[list[str]], flag: str) -> dict[str, float]:
        out = {path: 1.0 for item in files for path in item.split(",") if path}
        for path, value in pairs:
            try:
                out[path] = float(value)
            except ValueError:
                raise ValueError(f"{flag} {path} {value}: the scale must be a number") from None
        return out

    options: dict[str, Any] = {"lora_adapters": scaled(args.lora, args.lora_scaled, "--lora-scaled")}
    vectors = scaled(args.control_vector, args.control_vector_scaled, "--control-vector-scaled")
    if vectors:
        options["control_vectors"] = vectors
        options["control_vector_layer_range"] = args.control_vector_layer_range
    return options


def _sampling_args(p: argparse.ArgumentParser, n_predict: int) -> None:
    p.add_argument("-n", "--n-predict", type=int, default=n_predict,
                   help="tokens to generate (-1: until end of text or a full context)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature (0 = greedy)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("-s", "--seed", type=int, default=-1, help="sampling seed (-1: random)")
    constraint = p.add_mutually_exclusive_group()
    constraint.add_argument("--grammar", help="constrain the output to this GBNF grammar")
    constraint.add_argument("--grammar-file", help="read the GBNF grammar from a file")
    constraint.add_argument("-j", "--json-schema",
                            help="constrain the output to JSON matching this schema")
    constraint.add_argument("-jf", "--json-schema-file", help="read the JSON schema from a file")
    p.add_argument("--json-schema-converter", default="llama-cpp-python",
                   choices=("llama-cpp-python", "llama.cpp"),
                   help="whose JSON schema -> grammar conversion to use")


def _ftype_names() -> list[str]:
    from gguflm.quantize import FTYPE_NAMES

    return list(FTYPE_NAMES)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gguflm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="generate text after a prompt, streamed")
    _model_args(p)
    _context_args(p, 4096, 512)
    _adapter_args(p)
    _sampling_args(p, 128)
    p.add_argument("-p", "--prompt", help="the prompt")
    p.add_argument("-f", "--file", help="read the prompt from a file")
    p.add_argument("-r", "--reverse-prompt", action="append", default=[],
                   help="stop when this text is generated (repeatable)")
    p.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                   help="print only the generated text")
    p.add_argument("--prompt-cache", metavar="FILE",
                   help="a session file: its cached prompt is reused, and the prompt saved to it")
    p.add_argument("--prompt-cache-all", action="store_true",
                   help="save the generated text to the prompt cache too")
    p.add_argument("--prompt-cache-ro", action="store_true",
                   help="read the prompt cache but do not update it")
    _speculative_args(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("chat", help="interactive chat through the model's chat template")
    _model_args(p)
    _context_args(p, 4096, 512)
    _adapter_args(p)
    _sampling_args(p, 512)
    p.add_argument("--chat-template", help="built-in template name or Jinja source")
    p.add_argument("--chat-template-file", help="read a Jinja chat template from a file")
    p.add_argument("-sys", "--system-prompt", help="system message opening the conversation")
    p.add_argument("--gui", action="store_true",
                   help="open the reference Tkinter chat window (gguflm/apps/chat_gui.py)")
    p.set_defaults(func=_cmd_chat)

    from gguflm.bench.__main__ import module_names as bench_modules
    from gguflm.bench.model import add_arguments as bench_arguments

    p = sub.add_parser("bench", help="prompt and generation speed, llama-bench style",
                       epilog="gguflm bench NAME [args] runs python -m gguflm.bench NAME [args]: "
                              + ", ".join(n for n in bench_modules() if n != "model"))
    bench_arguments(p)
    p.add_argument("--speculative", action="store_true",
                   help="speculative decoding on input-grounded tasks instead (gguflm bench speculative -h)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with parallel slots, llama-server style",
                       description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health, "
                                   "/tokenize, /detokenize, /apply-template, /props, /metrics, /slots, /v1/embeddings, "
                                   "/lora-adapters; "
                                   "needs the server extra: pip install \"gguflm[server]\"")
    _model_args(p, several=True)
    p.add_argument("--models-dir", metavar="DIR",
                   help="serve each .gguf file of DIR by the request's model (its name without .gguf)")
    p.add_argument("--models-max", type=int, metavar="N",
                   help="with several models: most loaded at once (least recently used unloaded)")
    p.add_argument("--memory-budget", metavar="SIZE",
                   help="with several models: most memory the loaded ones may take (estimated; e.g. 2G)")
    _context_args(p, 4096, 512)
    _adapter_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8080, help="port to listen on")
    p.add_argument("-np", "--parallel", type=int, default=4,
                   help="slots: requests generated together (each gets ctx-size / parallel tokens)")
    p.set_defaults(cache_type_k="f32", cache_type_v="f32")   # see create_app's type_k
    p.add_argument("--kv-unified", action="store_true",
                   help="one KV cache shared by the slots (default: a region per slot)")
    p.add_argument("--api-key", help="require Authorization: Bearer KEY (several: comma-separated)")
    p.add_argument("--api-key-file", help="accept the API keys of this file (one per line)")
    p.add_argument("--max-body-bytes", type=int,
                   help="larger request bodies get 413 (default: 16 MiB)")
    p.add_argument("--max-tokens", type=int,
                   help="most tokens one request may generate (more asked: 400)")
    p.add_argument("--chat-template", help="built-in template name or Jinja source")
    p.add_argument("--chat-template-file", help="read a Jinja chat template from a file")
    p.add_argument("--embedding", "--embeddings", action="store_true",
                   help="serve /v1/embeddings only (else a second context computes them)")
    p.add_argument("--pooling", choices=POOLING_NAMES,
                   help="pooling of /v1/embeddings (default: the model's)")
    p.add_argument("-a", "--alias", help="model id shown by /v1/models (default: the file name)")
    p.add_argument("-s", "--seed", type=int, default=-1, help="seed of requests that give none (-1: random)")
    p.add_argument("--cors-origins", metavar="ORIGINS",
                   help="browser origins allowed to call the server, comma-separated (*: any; default: no CORS)")
    p.add_argument("--slot-save-path", metavar="DIR",
                   help="directory of POST /slots/{id}?action=save|restore (else refused)")
    p.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                   help="reuse cached chunks of at least N tokens by shifting their KV cells (0: off)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight requests get to finish after SIGTERM before they are cancelled")
    _speculative_args(p)
    g = p.add_argument_group("on a Ray cluster (the ray extra; RAY_ADDRESS, else a local Ray)")
    g.add_argument("--ray", action="store_true",
                   help="serve replicas with Ray Serve behind one endpoint (see docs/scale-out.md)")
    g.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="replicas of each model (each reserves --threads CPUs)")
    g.add_argument("--max-replicas", type=int, metavar="M",
                   help="autoscale each model between --replicas and M replicas by ongoing requests")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("embed", help="embeddings (or rerank scores) of texts, llama-embedding style")
    _model_args(p)
    _context_args(p, 0, 2048)
    p.set_defaults(ubatch_size=None)
    p.add_argument("-p", "--prompt", help="the texts, one per line (see --embd-separator)")
    p.add_argument("-f", "--file", help="read the texts from a file")
    p.add_argument("--pooling", choices=POOLING_NAMES, help="pooling (default: the model's)")
    p.add_argument("--embd-normalize", type=int, default=2,
                   help="-1 none, 0 max absolute (int16 range), 1 taxicab, 2 euclidean, >2 p-norm")
    p.add_argument("--embd-output-format", default="", choices=("", "json", "json+", "array", "raw"),
                   help="json: OpenAI style, json+: with the cosine similarity matrix, array: [[...],...], "
                        "raw: one embedding per line (default: a summary)")
    p.add_argument("--embd-separator", default="\n", help="what separates the texts")
    p.add_argument("--cls-separator", default="\t", help="what separates query and document (rank pooling)")
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser("perplexity", help="perplexity of a text file, llama-perplexity style")
    _model_args(p)
    _context_args(p, 512, 2048)
    p.add_argument("-f", "--file", required=True, help="the text to score")
    p.add_argument("--chunks", type=int, default=None, help="score at most this many chunks")
    p.set_defaults(func=_cmd_perplexity)

    p = sub.add_parser("tokenize", help="token ids of a text")
    _model_args(p)
    p.add_argument("-p", "--prompt", help="the text")
    p.add_argument("-f", "--file", help="read the text from a file")
    p.add_argument("--ids", action="store_true", help="print only the list of ids")
    p.add_argument("--no-bos", action="store_true", help="no BOS/EOS even if the model adds them")
    p.add_argument("--no-parse-special", action="store_true",
                   help="treat control-token texts as plain text")
    p.add_argument("--show-count", action="store_true", help="print the number of tokens")
    p.set_defaults(func=_cmd_tokenize)

    p = sub.add_parser("quantize", help="quantize a GGUF model, llama-quantize style (the same bytes)",
                       usage="gguflm quantize [options] IN.gguf [OUT.gguf] TYPE [nthreads]",
                       description="TYPE: " + " ".join(_ftype_names()))
    p.add_argument("positional", nargs="+", metavar="IN [OUT] TYPE [nthreads]")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow requantizing tensors that are already quantized")
    p.add_argument("--leave-output-tensor", action="store_true", help="leave output.weight un(re)quantized")
    p.add_argument("--pure", action="store_true", help="no k-quant mixes: every tensor to the same type")
    p.add_argument("--imatrix", help="importance matrix file (GGUF or legacy .dat)")
    p.add_argument("--include-weights", action="append", default=[],
                   help="use the importance matrix for these tensor(s) only (repeatable)")
    p.add_argument("--exclude-weights", action="append", default=[],
                   help="do not use the importance matrix for these tensor(s) (repeatable)")
    p.add_argument("--output-tensor-type", help="ggml type of output.weight")
    p.add_argument("--token-embedding-type", help="ggml type of the token embeddings")
    p.add_argument("--tensor-type", action="append", default=[], metavar="NAME=TYPE",
                   help="quantize tensors matching NAME (a regex) to TYPE (repeatable)")
    p.add_argument("--tensor-type-file", help="NAME=TYPE pairs separated by spaces or newlines")
    p.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                   help="set metadata in the output (int:, float:, bool:, str:; repeatable)")
    p.add_argument("--keep-split", action="store_true", help="write the output in the input's shards")
    p.add_argument("--prune-layers", default="", metavar="L0,L1,...", help="blocks to leave out")
    p.add_argument("--dry-run", action="store_true", help="print each tensor's type and size, write nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_quantize)

    p = sub.add_parser("imatrix", help="importance matrix of a text for quantize --imatrix, llama-imatrix style")
    _model_args(p)
    p.add_argument("-f", "--file", required=True, help="the calibration text")
    p.add_argument("-o", "--output", default="imatrix.gguf", help="output file (default imatrix.gguf)")
    p.add_argument("--output-format", choices=("gguf", "dat"), default=None,
                   help="file format (default: dat for a .dat name, else gguf)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="tokens per chunk")
    p.add_argument("--chunks", type=int, default=None, help="process at most this many chunks")
    p.add_argument("--process-output", action="store_true", help="collect output.weight too")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads")
    p.set_defaults(func=_cmd_imatrix)

    p = sub.add_parser("info", help="print build and CPU facts")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("inspect", help="describe a GGUF file: header, metadata, tensors, totals")
    p.add_argument("file", nargs="?", help="GGUF file (the first part of a split model)")
    p.add_argument("-m", "--model", help="same as FILE (default: the default model)")
    p.add_argument("--items", type=int, default=5, help="items shown of each metadata array")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gguflm.errors import Error

    from gguflm.bench.__main__ import main as bench_main, module_names as bench_modules

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"] and argv[1:2] and argv[1] in bench_modules():
        return bench_main(argv[1:])
    if argv[:1] == ["bench"] and "--speculative" in argv:
        return bench_main(["speculative"] + [a for a in argv[1:] if a != "--speculative"])
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        _configure_logging()
        return func(args)
    except (Error, ValueError, OSError) as exc:
        print(f"gguflm {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
