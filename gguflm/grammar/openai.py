"""OpenAI-style structured output for ``create_chat_completion``: ``response_format``, forced tool
calls, and the ``tool_calls`` result shapes, as llama-cpp-python 0.3.36's chat handler makes them.

- ``response_format={"type": "json_object"}``: llama.cpp's JSON grammar; with ``"schema"``: the
  schema's grammar. ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``
  (OpenAI's shape, which llama-cpp-python ignores) converts the same way.
- ``tool_choice={"type": "function", "function": {"name": N}}`` (or legacy
  ``function_call={"name": N}``): the reply is the arguments of N, constrained by its
  ``parameters`` schema, returned as ``message.tool_calls[0].function.arguments`` (JSON text) with
  ``finish_reason`` ``"tool_calls"``. ``"auto"`` and ``"none"`` constrain nothing (the template
  sees the tools, as with llama-cpp-python's generic handler).

Unlike llama-cpp-python, a schema that cannot be converted raises instead of silently falling back
to "any JSON object".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gguflm.generate import FINISH_TOOL_CALLS
from gguflm.grammar.builtin import JSON_GBNF
from gguflm.grammar.grammar import Grammar

__all__ = ["response_format_grammar", "forced_tool", "tool_call_dict", "tool_call_chunks",
           "text_logprobs_to_chat"]


def response_format_grammar(response_format: Mapping[str, Any] | None) -> Grammar | None:
    """The grammar ``response_format`` asks for (None: plain text).

    Raises
    ------
    ValueError
        An unknown response format type or a malformed one.
    gguflm.GrammarError
        The schema cannot be converted (see :mod:`gguflm.grammar.json_schema`).
    """
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise TypeError(f"response_format must be a dict, not {type(response_format).__name__}")
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ValueError("response_format type 'json_schema' needs a 'json_schema' object "
                             "with a 'schema'")
        schema = spec.get("schema")
    else:
        raise ValueError(f"unknown response_format type {kind!r} (text, json_object, "
                         f"json_schema)")
    if schema is None:
        return Grammar(JSON_GBNF)
    return Grammar.from_json_schema(schema)


def forced_tool(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any,
                functions: Sequence[Mapping[str, Any]] | None = None,
                function_call: Any = None) -> tuple[str, Grammar] | None:
    """The tool the request forces and the grammar of its arguments, or None.

    Legacy ``functions``/``function_call`` count as ``tools``/``tool_choice``, as in
    llama-cpp-python.

    Raises
    ------
    ValueError
        The forced tool is not among the tools, or ``tool_choice`` is not understood.
    """
    if functions is not None:
        tools = [{"type": "function", "function": f} for f in functions]
    if function_call is not None:
        if function_call in ("none", "auto"):
            tool_choice = function_call
        elif isinstance(function_call, Mapping) and "name" in function_call:
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    if tool_choice is None or tool_choice in ("none", "auto"):
        return None
    if tool_choice == "required":
        raise ValueError("tool_choice 'required' is not supported: name the function "
                         "({'type': 'function', 'function': {'name': ...}})")
    if not isinstance(tool_choice, Mapping) or not isinstance(tool_choice.get("function"),
                                                                Mapping):
        raise ValueError(f"tool_choice must be 'none', 'auto' or {{'type': 'function', "
                         f"'function': {{'name': ...}}}}, not {tool_choice!r}")
    if not tools:
        return None   # llama-cpp-python forces nothing without tools
    name = tool_choice["function"].get("name")
    tool = next((t for t in tools if t.get("function", {}).get("name") == name), None)
    if tool is None:
        raise ValueError(f"Tool choice '{name}' not found in tools.")
    parameters = tool["function"].get("parameters", {"type": "object", "properties": {}})
    return name, Grammar.from_json_schema(parameters)


def _call_id(tool_name: str, completion_id: str) -> str:
    return "call_" + "_0_" + tool_name + "_" + completion_id


def tool_call_dict(tool_name: str, completion_id: str, created: int, model: str, arguments: str,
                   logprobs: Any, usage: Mapping[str, int]) -> dict[str, Any]:
    """A ``chat.completion`` whose message is a call of ``tool_name`` with ``arguments``
    (``completion_id`` is the text completion's ``cmpl-...`` id, as llama-cpp-python derives
    both ids from it)."""
    return {
        "id": "chat" + completion_id, "object": "chat.completion", "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant", "content": None,
                "function_call": {"name": tool_name, "arguments": arguments},
                "tool_calls": [{"id": _call_id(tool_name, completion_id), "type": "function",
                                "function": {"name": tool_name, "arguments": arguments}}],
            },
            "logprobs": logprobs,
            "finish_reason": FINISH_TOOL_CALLS,
        }],
        "usage": dict(usage),
    }


def text_logprobs_to_chat(logprobs: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A text completion's ``logprobs`` in the chat completion's shape."""
    if logprobs is None:
        return None
    return {"content": [{"token": token, "bytes": None, "logprob": logprob,
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": None}
                                          for t, lp in top.items()]}
                        for token, logprob, top in zip(logprobs["tokens"],
                                                       logprobs["token_logprobs"],
                                                       logprobs["top_logprobs"])],
            "refusal": None}


def tool_call_chunks(tool_name: str, chunks: Iterator[Mapping[str, Any]]
                     ) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` dicts of a tool call from the text completion's chunk dicts:
    a role chunk, one ``tool_calls`` delta per text chunk (the argument text arrives in pieces),
    and a closing chunk with ``finish_reason`` ``"tool_calls"``."""
    head: dict[str, Any] | None = None
    for chunk in chunks:
        choice = chunk["choices"][0]
        call_id = _call_id(tool_name, chunk["id"])
        if head is None:
            head = {"id": "chat" + chunk["id"], "created": chunk["created"], "model": chunk["model"]}
            yield _chunk(head, {"role": "assistant", "content": None, "function_call": None,
                                "tool_calls": None}, None, None)
        yield _chunk(head, {
            "role": None, "content": None,
            "function_call": {"name": tool_name, "arguments": choice["text"]},
            "tool_calls": [{"index": 0, "id": call_id, "type": "function",
                            "function": {"name": tool_name, "arguments": choice["text"]}}],
        }, text_logprobs_to_chat(choice["logprobs"]), None)
    if head is not None:
        yield _chunk(head, {"role": None, "content": None, "function_call": None,
                            "tool_calls": None}, None, FINISH_TOOL_CALLS)


def _chunk(head: Mapping[str, Any], delta: dict[str, Any], logprobs: Any,
           finish_reason: str | None) -> dict[str, Any]:
    return {"id": head["id"], "object": "chat.completion.chunk", "created": head["created"],
            "model": head["model"],
            "choices": [{"index": 0, "finish_reason": finish_reason, "logprobs": logprobs,
                         "delta": delta}]}
