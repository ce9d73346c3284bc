"""gguflm on Ray Data: processors for :meth:`ray.data.Dataset.map_batches` over an actor pool.

>>> import ray
>>> from gguflm.ray.data import Embed, Generate
>>> ds = ray.data.from_items([{"text": t} for t in texts])
>>> ds = ds.map_batches(Embed, fn_constructor_kwargs={"model": "all-MiniLM-L6-v2-Q8_0.gguf"},
...                     concurrency=2, num_cpus=1, batch_size=64)
>>> ds = ray.data.from_items([{"prompt": p} for p in prompts]).map_batches(
...     Generate, fn_constructor_kwargs={"model": "SmolLM2.gguf", "chat": False,
...                                      "sampling": {"max_tokens": 64, "temperature": 0}},
...     concurrency=2, num_cpus=1, batch_size=8)

Each actor loads the model once (:class:`gguflm.LLM`, the file memory-mapped, so actors of one
node share its pages; a URI is fetched once per node, :func:`gguflm.ray.files.local_model`) and
turns batches into the same results as the single-process API, row for row:
:meth:`gguflm.LLM.embed`, :meth:`gguflm.LLM.rerank`, ``create_completion`` and
``create_chat_completion``. A row that fails gets its message in the ``error`` column (None
elsewhere) and an empty result; the job goes on. Give each actor ``num_cpus`` = its
``n_threads`` (default 1).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gguflm.llm import LLM
from gguflm.ray.files import local_model

__all__ = ["Embed", "Rerank", "Generate", "ERROR_COLUMN"]

ERROR_COLUMN = "error"


def _load(model: str | os.PathLike[str], cache_dir: str | None, **options: Any) -> LLM:
    return LLM(local_model(model, cache_dir), progress=False, **{"n_threads": 1, **options})


def _plain(cell: Any) -> Any:
    """A cell as Python values: a JSON string parsed; Ray Data's numpy arrays (lists) and dicts
    (structs, their null fields dropped) made lists and dicts."""
    return json.loads(cell) if isinstance(cell, str) else _python(cell)


def _python(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_python(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _python(v) for k, v in value.items() if v is not None}
    return value.item() if isinstance(value, np.generic) else value


def _rows(batch: Mapping[str, Any], fn: Callable[[int], Any]) -> tuple[list[Any], list[str | None]]:
    """``fn(i)`` of each row, and each row's error (None: it worked)."""
    n = len(next(iter(batch.values())))
    results: list[Any] = [None] * n
    errors: list[str | None] = [None] * n
    for i in range(n):
        try:
            results[i] = fn(i)
        except Exception as exc:        # one row's failure, recorded; the job goes on
            errors[i] = f"{type(exc).__name__}: {exc}"
    return results, errors


def _vectors(rows: list[Any], width: int) -> np.ndarray:
    """Rows of floats as a [n, width] float32 array, NaN for a failed row's."""
    out = np.full((len(rows), width), np.nan, np.float32)
    for i, row in enumerate(rows):
        if row is not None:
            out[i] = row
    return out


class Embed:
    """The embedding of each row's ``column`` text, as :meth:`gguflm.LLM.embed` (``normalize``
    and ``truncate`` as there), into ``output`` (a float32 vector; NaN where the row failed).

    A vector depends on the texts decoded with it (as llama.cpp's: :mod:`gguflm.embedding`), so
    by default each row is embedded alone and equals ``llm.embed(text)`` whatever batches Ray
    makes. ``pack=True`` packs each Ray batch into decodes as ``llm.embed(batch_texts)`` does:
    about 1.7x the throughput on short texts, each vector then within ~3e-3 of the row's alone.
    ``**llm_options`` go to :class:`gguflm.LLM` (``n_threads``, ``pooling_type``, ``n_ctx``...).
    """

    def __init__(self, model: str | os.PathLike[str], *, column: str = "text", output: str = "embedding",
                 normalize: bool = False, truncate: bool = True, pack: bool = False,
                 cache_dir: str | None = None, **llm_options: Any) -> None:
        self.llm = _load(model, cache_dir, embedding=True, **llm_options)
        self.column, self.output, self.pack = column, output, pack
        self.options = {"normalize": normalize, "truncate": truncate}

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        texts = [str(t) for t in batch[self.column]]
        vectors: list[Any] = []
        if self.pack:
            try:
                vectors = self.llm.embed(texts, **self.options)
                errors: list[str | None] = [None] * len(texts)
            except Exception:       # a row fails: each alone, to find which
                vectors = []
        if not vectors:
            vectors, errors = _rows(batch, lambda i: self.llm.embed(texts[i], **self.options))
        return {**batch, self.output: _vectors(vectors, self.llm.n_embd()), ERROR_COLUMN: np.array(errors, object)}


class Rerank:
    """The relevance score of each row's ``document_column`` text to its ``query_column`` text
    (:meth:`gguflm.LLM.rerank`, a reranking model) into ``output`` (NaN where the row failed)."""

    def __init__(self, model: str | os.PathLike[str], *, query_column: str = "query",
                 document_column: str = "document", output: str = "score", cache_dir: str | None = None,
                 **llm_options: Any) -> None:
        self.llm = _load(model, cache_dir, embedding=True, pooling_type="rank", **llm_options)
        self.query_column, self.document_column, self.output = query_column, document_column, output

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        queries, documents = batch[self.query_column], batch[self.document_column]
        scores, errors = _rows(batch, lambda i: self.llm.rerank(str(queries[i]), [str(documents[i])])[0])
        return {**batch, self.output: np.array([np.nan if s is None else s for s in scores], np.float64),
                ERROR_COLUMN: np.array(errors, object)}


class Generate:
    """A completion of each row: with ``chat``, of its ``column`` messages (default column
    ``"messages"``: a list of ``{"role", "content"}``, or its JSON) by ``create_chat_completion``;
    else of its prompt text (default column ``"prompt"``) by ``create_completion``.

    ``sampling`` holds the job's arguments of those methods (``max_tokens``, ``temperature``,
    ``seed``, ``stop``, ``grammar`` as GBNF text, ``response_format`` with a JSON schema...); a
    row's ``sampling_column`` (a dict or its JSON; absent or null: none) overrides them for that
    row. Writes ``output`` (the text, None where the row failed), ``finish_reason`` and
    ``completion_tokens``. ``**llm_options`` go to :class:`gguflm.LLM` (``n_ctx`` default 2048,
    ``n_threads``, ``chat_template``...).
    """

    def __init__(self, model: str | os.PathLike[str], *, chat: bool = True, column: str | None = None,
                 output: str = "generated_text", sampling: Mapping[str, Any] | None = None,
                 sampling_column: str = "sampling", cache_dir: str | None = None, **llm_options: Any) -> None:
        self.llm = _load(model, cache_dir, **{"n_ctx": 2048, **llm_options})
        self.chat = chat
        self.column = column or ("messages" if chat else "prompt")
        self.output, self.sampling, self.sampling_column = output, dict(sampling or {}), sampling_column

    def _one(self, batch: dict[str, np.ndarray], i: int) -> dict[str, Any]:
        own = batch[self.sampling_column][i] if self.sampling_column in batch else None
        missing = own is None or (isinstance(own, (float, np.floating)) and np.isnan(own))    # a null cell
        arguments = {**self.sampling, **({} if missing else _plain(own))}
        if self.chat:
            result = self.llm.create_chat_completion(_plain(batch[self.column][i]), **arguments)
            text = result["choices"][0]["message"]["content"]
        else:
            result = self.llm.create_completion(str(batch[self.column][i]), **arguments)
            text = result["choices"][0]["text"]
        return {"text": text, "finish_reason": result["choices"][0]["finish_reason"],
                "completion_tokens": result["usage"]["completion_tokens"]}

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        results, errors = _rows(batch, lambda i: self._one(batch, i))
        done = [r or {} for r in results]
        return {**batch, self.output: np.array([r.get("text") for r in done], object),
                "finish_reason": np.array([r.get("finish_reason") for r in done], object),
                "completion_tokens": np.array([r.get("completion_tokens", 0) for r in done], np.int64),
                ERROR_COLUMN: np.array(errors, object)}
