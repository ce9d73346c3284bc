"""The server's request parsing, endpoint by endpoint, without a socket: the JSON body as the
server reads it, then the parser of the endpoint, then what the server builds from the fields
before the model runs (response-format and tool grammars, stream options).

Must hold: RequestError (the server's 4xx; the HTTP layer's own class) or parsed arguments;
anything else, a :class:`gguflm.Error` included, would reach the client as a 500. The grammar
step runs inside the server's preparation, which answers ValueError, TypeError and
:class:`gguflm.Error` with a 400, so they are allowed there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from gguflm.errors import Error
from gguflm.grammar.openai import forced_tool, response_format_grammar
from gguflm.server import anthropic, native, protocol, responses
from gguflm.server.protocol import RequestError

from . import Check
from .grammars import match_vocab


def _llm() -> Any:
    """What the native endpoints read of an LLM: its vocabulary and size."""
    vocab = match_vocab()
    return SimpleNamespace(model=SimpleNamespace(vocab=vocab), n_vocab=lambda: vocab.n_tokens)


def _chat(args: dict[str, Any], fields: dict[str, Any]) -> None:
    protocol.stream_include_usage(fields)
    protocol.asked_max_tokens(fields)
    try:
        response_format_grammar(args["response_format"])
        forced_tool(args["tools"], args["tool_choice"], args["functions"], args["function_call"])
    except (ValueError, TypeError, Error):
        pass


def server_requests() -> Check:
    """Input: the endpoint (first byte), then the request body."""
    llm = _llm()
    store = responses.ResponseStore()

    def completions(body: Any) -> None:
        _, _, fields = protocol.completion_arguments(body)
        protocol.stream_include_usage(fields)
        protocol.asked_max_tokens(fields)

    def chat(body: Any) -> None:
        args, _, fields = protocol.chat_arguments(body)
        _chat(args, fields)

    def responses_api(body: Any) -> None:
        args, _, fields = protocol.chat_arguments(responses.ResponseRequest(body, store, "m").chat)
        _chat(args, fields)

    def messages(body: Any) -> None:
        call = anthropic.MessageRequest(body, "m", llm.model.vocab)
        args, _, fields = protocol.chat_arguments(call.chat)
        _chat(args, fields)

    endpoints: list[Callable[[Any], Any]] = [
        completions, chat, responses_api, messages, protocol.embedding_input,
        lambda body: native.tokenize(body, llm), lambda body: native.detokenize(body, llm)]

    def check(data: bytes) -> None:
        if not data:
            return
        endpoint = endpoints[data[0] % len(endpoints)]
        try:
            try:
                body = json.loads(data[1:])
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:   # as the server reads it
                raise RequestError(f"could not parse the JSON body: {exc}") from None
            endpoint(body)
        except RequestError:
            pass

    return check
