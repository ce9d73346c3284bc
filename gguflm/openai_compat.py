"""OpenAI-style dicts, shaped as llama-cpp-python builds them, beside the native API.

The native API (:meth:`gguflm.LLM.complete`, :meth:`gguflm.LLM.chat`) returns
:class:`~gguflm.generate.Completion` objects and :class:`~gguflm.generate.Chunk` streams; this
module turns them into ``text_completion`` and ``chat.completion`` dicts and chunk streams. Both
:class:`gguflm.LLM`'s llama-cpp-python API and :mod:`gguflm.server` use it, so a request answers
with the same dict whichever way it ran. :class:`PreparedRequest` is a request made ready to run
(prompt tokens, sampler chain, limits) with the function that shapes its result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gguflm.generate import Chunk, Completion, Request, TokenLogprob
from gguflm.sampling import SamplerChain

__all__ = ["PreparedRequest", "ResponseMeta", "completion_dict", "completion_chunks", "chat_dict",
           "chat_chunks", "chat_logprobs"]


@dataclass
class PreparedRequest:
    """What :meth:`gguflm.LLM.create_completion` or ``create_chat_completion`` would run.

    ``respond(result, stream)`` shapes the result of running ``tokens`` with ``chain`` and
    ``request``: a :class:`Completion` into the response dict, or (``stream=True``) an iterator of
    :class:`Chunk` into an iterator of chunk dicts.
    """

    tokens: list[int]
    chain: SamplerChain
    request: Request
    respond: Callable[[Any, bool], Any]
    id: str


class ResponseMeta:
    def __init__(self, id: str, created: int, model: str) -> None:
        self.id, self.created, self.model = id, created, model


def completion_logprobs(items: list[TokenLogprob] | None, offset: int, text_before: str
                         ) -> dict[str, list] | None:
    if items is None:
        return None
    offsets, position = [], offset + len(text_before)
    for item in items:
        offsets.append(position)
        position += len(item.text)
    top = []
    for item in items:
        alternatives = {text: lp for _, text, lp in item.top}
        alternatives[item.text] = item.logprob
        top.append(alternatives)
    return {"tokens": [i.text for i in items], "text_offset": offsets,
            "token_logprobs": [i.logprob for i in items], "top_logprobs": top}


def completion_dict(result: Completion, meta: ResponseMeta, head: str, offset: int
                     ) -> dict[str, Any]:
    return {
        "id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
        "choices": [{"text": head + result.text, "index": 0,
                     "logprobs": completion_logprobs(result.logprobs, offset, ""),
                     "finish_reason": result.finish_reason}],
        "usage": result.usage,
    }


def completion_chunk(meta: ResponseMeta, text: str, logprobs: dict | None,
                      finish_reason: str | None) -> dict[str, Any]:
    return {"id": meta.id, "object": "text_completion", "created": meta.created,
            "model": meta.model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}


def completion_chunks(chunks: Iterator[Chunk], meta: ResponseMeta, head: str, offset: int
                       ) -> Iterator[dict[str, Any]]:
    emitted = ""
    if head:
        yield completion_chunk(meta, head, None, None)
    for chunk in chunks:
        logprobs = completion_logprobs(chunk.logprobs, offset, emitted) if chunk.logprobs else None
        if chunk.text or logprobs:
            yield completion_chunk(meta, chunk.text, logprobs, None)
        emitted += chunk.text
        if chunk.finish_reason is not None:
            yield completion_chunk(meta, "", None, chunk.finish_reason)


def chat_logprobs(items: list[TokenLogprob] | None) -> dict[str, Any] | None:
    if items is None:
        return None
    content = [{"token": i.text, "bytes": None, "logprob": i.logprob,
                "top_logprobs": [{"token": text, "logprob": lp, "bytes": None}
                                 for _, text, lp in i.top]}
               for i in items]
    return {"content": content, "refusal": None}


def chat_dict(result: Completion, meta: ResponseMeta) -> dict[str, Any]:
    return {
        "id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                     "logprobs": chat_logprobs(result.logprobs),
                     "finish_reason": result.finish_reason}],
        "usage": result.usage,
    }


def chat_chunk(meta: ResponseMeta, delta: dict[str, str], logprobs: dict | None,
                finish_reason: str | None) -> dict[str, Any]:
    return {"id": meta.id, "model": meta.model, "created": meta.created,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}


def chat_chunks(chunks: Iterator[Chunk], meta: ResponseMeta) -> Iterator[dict[str, Any]]:
    yield chat_chunk(meta, {"role": "assistant"}, None, None)
    for chunk in chunks:
        if chunk.text or chunk.logprobs:
            yield chat_chunk(meta, {"content": chunk.text}, chat_logprobs(chunk.logprobs), None)
        if chunk.finish_reason is not None:
            yield chat_chunk(meta, {}, None, chunk.finish_reason)
