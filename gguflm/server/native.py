"""llama-server's own endpoints, with its request and response shapes: ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/props`` and ``/v1/rerank`` (``/health`` is in
:mod:`gguflm.server.app`).

Each function takes the checked request body and the server's :class:`gguflm.LLM` and returns
the response's JSON; bad fields raise :class:`~gguflm.server.protocol.RequestError`.
"""

from __future__ import annotations

from typing import Any

import gguflm
from gguflm.errors import TokenizeError
from gguflm.server import protocol
from gguflm.server.protocol import RequestError

__all__ = ["tokenize", "detokenize", "apply_template", "props", "rerank"]


def _mixed_tokens(llm: Any, content: Any, add_special: bool, parse_special: bool) -> list[int]:
    """llama-server's ``tokenize_mixed``: a string, or an array of strings and token ids (only a
    leading string gets the special tokens)."""
    vocab = llm.model.vocab
    if isinstance(content, str):
        return vocab.tokenize(content, add_special=add_special, parse_special=parse_special)
    if not isinstance(content, list) or not all(
            isinstance(p, str) or protocol._is_int(p) for p in content):
        raise RequestError("'content' must be a string or an array of strings and token ids",
                           param="content")
    tokens: list[int] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            tokens += vocab.tokenize(part, add_special=add_special and i == 0,
                                     parse_special=parse_special)
        else:
            tokens.append(_checked_token(llm, part, "content"))
    return tokens


def _checked_token(llm: Any, token: int, param: str) -> int:
    if not 0 <= token < llm.n_vocab():
        raise RequestError(f"token {token} is outside the vocabulary (0..{llm.n_vocab() - 1})",
                           param=param)
    return token


def _piece(piece: bytes) -> str | list[int]:
    """A token's text, or its bytes when they are not whole UTF-8 characters (llama-server's)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def tokenize(body: Any, llm: Any) -> dict[str, Any]:
    """``POST /tokenize``: ``{"tokens": [ids]}``, or ``[{"id", "piece"}]`` with ``with_pieces``."""
    protocol._read(body, {"add_special": ("bool", False), "parse_special": ("bool", True),
                          "with_pieces": ("bool", False)})
    add_special, parse_special = body.get("add_special", False), body.get("parse_special", True)
    if "content" not in body:      # llama-server: no content, no tokens
        return {"tokens": []}
    try:
        tokens = _mixed_tokens(llm, body["content"], add_special, parse_special)
    except TokenizeError as exc:
        raise RequestError(str(exc), param="content") from None
    if body.get("with_pieces"):
        vocab = llm.model.vocab
        return {"tokens": [{"id": t, "piece": _piece(vocab.token_to_piece(t, 0, True))}
                           for t in tokens]}
    return {"tokens": tokens}


def detokenize(body: Any, llm: Any) -> dict[str, Any]:
    """``POST /detokenize``: the pieces of ``tokens`` joined, special tokens rendered."""
    v = protocol._read(body, {"tokens": ("list", [])})
    if not protocol._is_int_list(v["tokens"]):
        raise RequestError("'tokens' must be an array of token ids", param="tokens")
    vocab = llm.model.vocab
    text = b"".join(vocab.token_to_piece(_checked_token(llm, t, "tokens"), 0, True)
                    for t in v["tokens"])
    return {"content": text.decode("utf-8", "replace")}


def apply_template(body: Any, llm: Any) -> dict[str, Any]:
    """``POST /apply-template``: the prompt a chat request's ``messages`` (and ``tools``) make."""
    args, _, _ = protocol.chat_arguments(body)
    variables = {} if args["tools"] is None else {"tools": args["tools"]}
    try:
        return {"prompt": llm.apply_chat_template(args["messages"], **variables)}
    except Exception as exc:     # the template refused the conversation
        raise RequestError(str(exc), param="messages") from None


def props(llm: Any, alias: str, n_slots: int, n_ctx_slot: int) -> dict[str, Any]:
    """``GET /props``: the server's settings, in llama-server's fields."""
    vocab = llm.model.vocab
    defaults = {name: default for name, (_, default) in protocol.SAMPLING_FIELDS.items()}

    def token_text(token: int | None) -> str:
        return "" if token is None else vocab.token_to_piece(token, 0, True).decode("utf-8", "replace")

    template = None if llm.embedding else llm._chat_template().source
    return {
        "default_generation_settings": {
            "params": {"seed": llm.seed if llm.seed is not None else 0xFFFFFFFF,
                       "temperature": defaults["temperature"], "top_k": defaults["top_k"],
                       "top_p": defaults["top_p"], "min_p": defaults["min_p"],
                       "typical_p": defaults["typical_p"], "repeat_last_n": llm.penalty_last_n,
                       "repeat_penalty": defaults["repeat_penalty"],
                       "presence_penalty": defaults["presence_penalty"],
                       "frequency_penalty": defaults["frequency_penalty"],
                       "mirostat": defaults["mirostat_mode"], "mirostat_tau": defaults["mirostat_tau"],
                       "mirostat_eta": defaults["mirostat_eta"], "max_tokens": -1, "n_predict": -1},
            "n_ctx": n_ctx_slot,
        },
        "total_slots": n_slots,
        "model_alias": alias,
        "model_path": llm.model_path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True,
        "chat_template": template,
        "bos_token": token_text(vocab.bos),
        "eos_token": token_text(vocab.eos),
        "build_info": f"gguflm {gguflm.__version__}",
        "is_sleeping": False,
    }


def rerank(body: Any, llm: Any, alias: str) -> dict[str, Any] | list[dict[str, Any]]:
    """``POST /v1/rerank``: each document's relevance to ``query``, best first, ``top_n`` of them
    (Jina's shape; with ``texts`` instead of ``documents``, TEI's bare list, with the texts if
    ``return_text``). Runs in a worker thread. ``llm`` pools with rank."""
    from gguflm.embedding import rerank_tokens

    v = protocol._read(body, {"query": ("str", None), "documents": ("list", None),
                              "texts": ("list", None), "top_n": ("int", None),
                              "return_text": ("bool", False), "model": ("str", None)})
    tei = v["texts"] is not None
    documents = v["texts"] if tei else v["documents"]
    if v["query"] is None:
        raise RequestError("'query' must be provided", param="query")
    if not documents or not protocol._is_str_list(documents):
        raise RequestError("'documents' must be a non-empty string array", param="documents")
    scores = llm.rerank(v["query"], documents)
    n_tokens = sum(min(len(rerank_tokens(llm.model, v["query"], d)), llm.n_batch) for d in documents)
    label = "score" if tei else "relevance_score"
    results = [{"index": i, label: score} for i, score in enumerate(scores)]
    if tei and v["return_text"]:
        for item in results:
            item["text"] = documents[item["index"]]
    results.sort(key=lambda item: -item[label])
    results = results[:v["top_n"] if v["top_n"] is not None else len(results)]
    if tei:
        return results
    return {"model": v["model"] or alias, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results}
