"""Embeddings and reranking over a context: many texts packed into multi-sequence decodes, one
pooled vector (or per-token rows, or rank scores) per text.

Packing follows llama-cpp-python's ``Llama.embed`` and llama.cpp's ``llama-embedding``, in order:
a text becomes sequence ``s`` of the current batch (positions from 0, every token an output) until
the next text would take the batch past ``n_batch`` tokens or ``n_seq_max`` sequences; then the
batch is decoded on an empty cache and a new one begins. llama.cpp's vectors depend on this
packing (its kernels change with the batch width, and a text's lanes with its place in the batch),
so it is the one gguflm uses.

``LLM.embed``, ``LLM.create_embedding``, ``LLM.rerank`` and ``gguflm embed`` are built on
:func:`embed_tokens`; :func:`normalize` is llama.cpp's ``common_embd_normalize`` and
:func:`normalize_like_llama_cpp_python` the one ``Llama.embed(normalize=True)`` applies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gguflm.batch import Batch
from gguflm.errors import Error
from gguflm.pooling import PoolingType

if TYPE_CHECKING:
    from gguflm.context import Context
    from gguflm.model import Model
    from gguflm.vocab import Vocab

# llama_max_parallel_sequences(): the sequences llama.cpp lets one batch hold
MAX_PARALLEL_SEQUENCES = 256


def max_sequences(model: Model) -> int:
    """How many sequences one batch may hold on this model: llama.cpp's 256 for encoders (no cache
    cells to mark); 64 where a KV cache marks them (gguflm keeps a cell's sequences in 64 bits,
    llama-cpp-python allows 256)."""
    from gguflm.context import MAX_SEQ, MAX_SEQ_NO_CACHE

    return MAX_SEQ_NO_CACHE if not model.architecture.kv_cache else MAX_SEQ


def pack(lengths: Sequence[int], n_batch: int, n_seq_max: int) -> Iterator[list[int]]:
    """The indices of the texts each decode holds, in order (llama-cpp-python's rule)."""
    group: list[int] = []
    n_tokens = 0
    for i, n in enumerate(lengths):
        if n > n_batch:
            raise ValueError(f"Requested tokens ({n}) exceed batch size of {n_batch}")
        if group and (n_tokens + n > n_batch or len(group) >= n_seq_max):
            yield group
            group, n_tokens = [], 0
        group.append(i)
        n_tokens += n
    if group:
        yield group


def _sequences_batch(token_lists: Sequence[Sequence[int]]) -> Batch:
    """Token list ``s`` as sequence ``s`` at positions 0.., every token an output."""
    lengths = [len(t) for t in token_lists]
    batch = Batch(sum(lengths))
    batch.n_tokens = batch.n_tokens_max
    batch.token[:] = np.concatenate([np.asarray(t, np.int64) for t in token_lists])
    batch.pos[:] = np.concatenate([np.arange(n, dtype=np.int32) for n in lengths])
    batch.seq_id[:, 0] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    batch.n_seq_id[:] = 1
    batch.logits[:] = 1
    return batch


def embed_tokens(ctx: Context, token_lists: Sequence[Sequence[int]], n_batch: int,
                 n_seq_max: int) -> list[np.ndarray]:
    """Decode ``token_lists`` packed as :func:`pack` says, each batch on an empty cache, and
    return per list its pooled vector ([n_embd]; [n_cls_out] scores for rank pooling), or with
    pooling ``none`` its tokens' rows ([n_tokens, n_embd]).

    Raises
    ------
    gguflm.Error
        A decode failed (the status is in the message); ValueError if a list is empty or
        longer than ``n_batch``.
    """
    if not ctx.embeddings:
        raise Error("the context does not compute embeddings (create it with embeddings=True)")
    if any(len(tokens) == 0 for tokens in token_lists):
        raise ValueError("cannot embed an empty token list")
    results: list[np.ndarray] = []
    try:
        for group in pack([len(t) for t in token_lists], n_batch, n_seq_max):
            ctx.memory.clear()
            status = ctx.decode(_sequences_batch([token_lists[i] for i in group]))
            if status != 0:
                raise Error(f"decode failed with status {status}")
            if ctx.pooling_type is PoolingType.NONE:
                rows = ctx.get_embeddings()
                start = 0
                for i in group:
                    results.append(rows[start:start + len(token_lists[i])].copy())
                    start += len(token_lists[i])
            else:
                results += [ctx.get_embeddings_seq(seq) for seq in range(len(group))]
    finally:
        ctx.memory.clear()
    return results


def normalize(v: np.ndarray, embd_norm: int = 2) -> np.ndarray:
    """llama.cpp's ``common_embd_normalize``: -1 none, 0 max-abs scaled to int16 range, 1 taxicab,
    2 euclidean, p > 2 the p-norm. The norm is summed in double, the scale applied in float."""
    x = np.asarray(v, np.float32)
    if embd_norm == -1:
        total = 1.0
    elif embd_norm == 0:
        total = float(np.abs(x).max(initial=0.0)) / 32760.0
    elif embd_norm == 2:
        total = 0.0
        for value in (x * x).tolist():   # float products, double sum, in order (as llama.cpp)
            total += value
        total = float(np.sqrt(total))
    else:
        total = 0.0
        for value in np.abs(x).astype(np.float64).tolist():
            total += value ** embd_norm
        total = total ** (1.0 / embd_norm)
    scale = np.float32(1.0 / total if total > 0.0 else 0.0)
    return x * scale


def normalize_like_llama_cpp_python(v: np.ndarray) -> list[float]:
    """``llama_cpp._internals.normalize_embedding``: divided by numpy's float64 norm, as floats."""
    values = np.asarray(v, np.float32).astype(np.float64)
    norm = float(np.linalg.norm(values))
    return values.tolist() if norm == 0.0 else (values / norm).tolist()


def rerank_tokens(model: Model, query: str, document: str) -> list[int]:
    """One query-document pair as llama.cpp's server formats it for a reranker: the model's
    ``tokenizer.chat_template.rerank`` with ``{query}`` and ``{document}`` filled in (special
    tokens parsed), else [BOS] query [EOS] [SEP] document [EOS], each token present only when the
    vocabulary adds it (EOS falls back to SEP)."""
    template = model.meta.get("tokenizer.chat_template.rerank")
    vocab: Vocab = model.vocab
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return vocab.tokenize(text, add_special=False, parse_special=True)
    eos = vocab.eos if vocab.eos is not None else vocab.sep
    tokens: list[int] = []
    if vocab.add_bos and vocab.bos is not None:
        tokens.append(vocab.bos)
    tokens += vocab.tokenize(query, add_special=False, parse_special=False)
    if vocab.add_eos and eos is not None:
        tokens.append(eos)
    if vocab.add_sep and vocab.sep is not None:
        tokens.append(vocab.sep)
    tokens += vocab.tokenize(document, add_special=False, parse_special=False)
    if vocab.add_eos and eos is not None:
        tokens.append(eos)
    return tokens


def embedding_response(embeddings: Sequence[Any], model_name: str, n_tokens: int) -> dict[str, Any]:
    """llama-cpp-python's ``CreateEmbeddingResponse`` dict."""
    return {
        "object": "list",
        "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeddings)],
        "model": model_name,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


# -- gguflm embed: llama.cpp's llama-embedding

@dataclass
class EmbeddingRun:
    """What ``gguflm embed`` computed: the prompts, and per prompt (per token with pooling
    ``none``) its normalised embedding, or its rank scores."""

    prompts: list[str]
    vectors: np.ndarray              # float32 [n, n_embd], or [n, n_cls_out] for rank pooling
    pooling: PoolingType
    labels: list[str]                # the classifier's output labels (rank pooling)


def embed_prompts(ctx: Context, prompts: Sequence[str], n_batch: int, cls_separator: str = "\t",
                  embd_normalize: int = 2) -> EmbeddingRun:
    """llama-embedding's work on ``ctx``: each prompt tokenized with special tokens added and
    parsed (with rank pooling, a prompt holding ``cls_separator`` is a query and its documents,
    joined by the model's rerank template or its EOS and SEP texts), packed into batches of
    ``n_batch`` tokens and the context's sequences, then normalised (:func:`normalize`; rank scores
    stay as they are: llama-embedding would read past them)."""
    model, vocab = ctx.model, ctx.model.vocab
    rank = ctx.pooling_type is PoolingType.RANK
    template = model.meta.get("tokenizer.chat_template.rerank")
    joint = (vocab.token_text(vocab.eos) if vocab.add_eos and vocab.eos is not None else "") + \
            (vocab.token_text(vocab.sep) if vocab.add_sep and vocab.sep is not None else "")
    inputs = []
    for prompt in prompts:
        if rank and cls_separator in prompt:
            pairs = prompt.split(cls_separator)
            if template is not None:
                prompt = template.replace("{query}", pairs[0]).replace("{document}", pairs[1])
            else:
                prompt = joint.join(pairs)
        tokens = vocab.tokenize(prompt, add_special=True, parse_special=True)
        if len(tokens) > n_batch:
            raise ValueError(f"number of tokens in input line ({len(tokens)}) exceeds batch size ({n_batch}), "
                             f"increase batch size and re-run")
        inputs.append(tokens)
    results = embed_tokens(ctx, inputs, n_batch, ctx.n_seq_max)
    if ctx.pooling_type is PoolingType.NONE:
        rows = [normalize(row, embd_normalize) for r in results for row in r]
    else:
        rows = [r if rank else normalize(r, embd_normalize) for r in results]
    labels = [str(x) for x in model.metadata.get(f"{model.arch}.classifier.output_labels", [])]
    width = len(rows[0]) if rows else 0
    return EmbeddingRun(list(prompts), np.array(rows, np.float32).reshape(len(rows), width), ctx.pooling_type,
                        labels)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """llama.cpp's ``common_embd_similarity_cos``: float products summed in double."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    total = norm_a = norm_b = 0.0
    for ab, aa, bb in zip((a * b).tolist(), (a * a).tolist(), (b * b).tolist()):
        total += ab
        norm_a += aa
        norm_b += bb
    if norm_a == 0.0 or norm_b == 0.0:
        return 1.0 if norm_a == 0.0 and norm_b == 0.0 else 0.0
    return float(np.float32(total / (np.sqrt(norm_a) * np.sqrt(norm_b))))


def render(run: EmbeddingRun, output_format: str = "", embd_normalize: int = 2) -> str:
    """llama-embedding's standard output for ``run``: the summary (``output_format`` "") or
    ``json``, ``json+`` (with the cosine similarity matrix), ``array`` or ``raw``."""
    emb, n_prompts = run.vectors, len(run.prompts)
    n, width = emb.shape
    value = "{:1.0f}" if embd_normalize == 0 else "{:1.7f}"
    cell = "{:6.0f} " if embd_normalize == 0 else "{:9.6f} "
    out = []
    if output_format == "":
        out.append("\n")
        if run.pooling is PoolingType.NONE:
            for j in range(n):
                head = "".join(cell.format(v) for v in emb[j, :min(3, width)].tolist())
                tail = "".join(cell.format(v) for v in emb[j, width - 3:].tolist())
                out.append(f"embedding {j}: {head} ... {tail}\n")
        elif run.pooling is PoolingType.RANK:
            for j in range(n):
                for i in range(width):
                    label = run.labels[i] if i < len(run.labels) and run.labels[i] else str(i)
                    out.append(f"rerank score {j}: {emb[j, 0]:8.3f}\n" if width == 1 else
                               f"rerank score {j}: {emb[j, i]:8.3f} [{label}]\n")
        else:
            for j in range(n_prompts):
                shown = emb[j, :min(16, width)] if n_prompts > 1 else emb[j]
                out.append(f"embedding {j}: " + "".join(cell.format(v) for v in shown.tolist()) + "\n")
            if n_prompts > 1:
                out.append("\ncosine similarity matrix:\n\n")
                out.append("".join(f"{p[:6]:>6.6} " for p in run.prompts) + "\n")
                for i in range(n_prompts):
                    out.append("".join(f"{cosine_similarity(emb[i], emb[j]):6.2f} " for j in range(n_prompts)))
                    out.append(f"{run.prompts[i][:10]}\n")
    if output_format in ("json", "json+", "array"):
        vectors = ["[" + ",".join(value.format(v) for v in emb[j].tolist()) + "]" for j in range(n)]
        if output_format == "array":
            out.append("[" + ",".join(vectors) + "]\n")
        else:
            items = [f'    {{\n      "object": "embedding",\n      "index": {j},\n      "embedding": {v}\n    }}'
                     for j, v in enumerate(vectors)]
            out.append('{\n  "object": "list",\n  "data": [\n' + ",\n".join(items) + "\n  ]")
            if output_format == "json+" and n_prompts > 1:
                rows = ["    [" + ", ".join(f"{cosine_similarity(emb[i], emb[j]):6.2f}" for j in range(n)) + " ]"
                        for i in range(n)]
                out.append(',\n  "cosineSimilarity": [\n' + ",\n".join(rows) + "\n  ]")
            out.append("\n}\n")
    elif output_format == "raw":
        for j in range(n):
            out.append(" ".join(value.format(v) for v in emb[j].tolist()) + "\n")
    out.append("\n")
    return "".join(out)
