"""OpenAI's Responses API (``POST /v1/responses``) as a shim over the chat completion machinery.

A request becomes a chat completion request, as llama-server converts it: ``instructions`` a
system message first, ``input`` (a text, or message, ``function_call`` and
``function_call_output`` items) the messages after the conversation of ``previous_response_id``
(kept in the server's memory, the most recent :data:`STORE_SIZE` responses), flat function
``tools`` OpenAI's chat tools, ``text.format`` the ``response_format``, ``max_output_tokens`` the
``max_tokens``; llama.cpp's sampling fields (``top_k``, ``min_p``, ``repeat_penalty``, ``seed``,
...) pass through. So a greedy reply is the chat completion's for the same conversation.

A ``tool_choice`` naming a function (or ``"required"`` with one function) constrains the reply to
that function's arguments (see :mod:`gguflm.grammar.openai`); the output is then a
``function_call`` item, else a ``message`` item. Streams are the Responses events
(``response.created`` ... ``response.completed``, each with its ``sequence_number``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from gguflm.generate import FINISH_LENGTH, Chunk, Completion
from gguflm.server import protocol
from gguflm.server.protocol import RequestError
from gguflm.server.running import sse

__all__ = ["ResponseStore", "ResponseRequest", "STORE_SIZE"]

STORE_SIZE = 512     # responses kept for previous_response_id and GET /v1/responses/{id}

# the Responses fields a response echoes
_ECHOED = ("instructions", "max_output_tokens", "previous_response_id", "temperature", "top_p",
           "tool_choice", "tools", "text", "metadata", "parallel_tool_calls", "store", "user")
_ECHO_DEFAULTS = {"tools": [], "tool_choice": "auto", "text": {"format": {"type": "text"}},
                  "metadata": {}, "parallel_tool_calls": True}


class ResponseStore:
    """The most recent responses: each one's conversation (as chat messages, its output last) and
    its response object."""

    def __init__(self, size: int = STORE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[list[dict], dict]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, messages: list[dict], response: dict) -> None:
        with self._lock:
            self._items[response_id] = (messages, response)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[list[dict], dict]:
        with self._lock:
            item = self._items.get(response_id)
        if item is None:
            raise RequestError(f"Previous response with id '{response_id}' not found.",
                               param="previous_response_id", status=404,
                               code="previous_response_not_found")
        return item


def _text_of(content: Any, param: str, types: tuple[str, ...]) -> str:
    """A message's content (a text, or parts of the given types) as one text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{param} must be a string or an array of content parts", param=param)
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in types or not isinstance(
                part.get("text"), str):
            raise RequestError(f"{param}: only text parts ({', '.join(types)}) are supported",
                               param=param)
        texts.append(part["text"])
    return "".join(texts)


def _input_messages(input: Any) -> list[dict[str, Any]]:
    """The chat messages of a Responses ``input``."""
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    if not isinstance(input, list):
        raise RequestError("'input' must be a string or an array of items", param="input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(input):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{param} must be an object", param=param)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"{param}.role must be user, system, developer or assistant",
                                   param=param)
            text = _text_of(item.get("content"), f"{param}.content",
                            ("output_text", "input_text") if role == "assistant" else ("input_text",))
            messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise RequestError(f"{param}: a function_call needs string call_id, name and "
                                   f"arguments", param=param)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":    # one turn, several calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"{param}: a function_call_output needs a string call_id",
                                   param=param)
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text_of(item.get("output"), f"{param}.output",
                                                 ("input_text",))})
        else:
            raise RequestError(f"{param}.type {kind!r} is not supported (message, function_call, "
                               f"function_call_output)", param=param)
    return messages


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestError("'tools' must be an array of objects", param="tools")
    chat = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise RequestError(f"tools[{i}]: only function tools with a name are supported",
                               param="tools")
        chat.append({"type": "function", "function": {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}})
    return chat or None


def _forced(tool_choice: Any, tools: list[dict] | None) -> str | None:
    """The function a Responses ``tool_choice`` forces, if any."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    if tool_choice == "required":
        return protocol.only_tool(tools, "required", "{'type': 'function', 'name': ...}")
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(
            tool_choice.get("name"), str):
        return tool_choice["name"]
    raise RequestError("tool_choice must be 'auto', 'none', 'required' or "
                       "{'type': 'function', 'name': ...}", param="tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    raise RequestError("text.format must be {'type': 'text'}, {'type': 'json_object'} or "
                       "{'type': 'json_schema', 'name': ..., 'schema': {...}}", param="text.format")


class ResponseRequest:
    """One ``POST /v1/responses``: the chat completion body it runs as, and the shapes of its
    result."""

    def __init__(self, body: Any, store: ResponseStore, model: str) -> None:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        v = protocol._read(body, {"input": ("any", None), "instructions": ("str", None),
                                  "max_output_tokens": ("int", None), "tools": ("list", None),
                                  "previous_response_id": ("str", None), "text": ("object", None),
                                  "store": ("bool", True), "stream": ("bool", False),
                                  "metadata": ("object", None)})
        if v["input"] is None:
            raise RequestError("'input' is required", param="input")
        if v["max_output_tokens"] is not None and v["max_output_tokens"] < 1:
            raise RequestError("'max_output_tokens' must be at least 1", param="max_output_tokens")
        self.store = store
        self.fields = {k: body.get(k) for k in _ECHOED}
        self.fields["store"] = v["store"]
        self.model = body.get("model") or model
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        history = [] if v["previous_response_id"] is None else list(
            store.get(v["previous_response_id"])[0])
        self.messages = history + _input_messages(v["input"])
        tools = _chat_tools(v["tools"])
        self.forced = _forced(body.get("tool_choice"), tools)
        chat = {k: body[k] for k in protocol.SAMPLING_FIELDS if k in body}
        instructions = [] if v["instructions"] is None else [
            {"role": "system", "content": v["instructions"]}]
        chat.update(messages=instructions + self.messages, max_tokens=v["max_output_tokens"],
                    tools=tools, response_format=_response_format(v["text"]), stream=v["stream"],
                    tool_choice=None if self.forced is None else
                    {"type": "function", "function": {"name": self.forced}})
        chat.pop("n", None)
        self.chat = chat

    # -- output items

    def _item(self, text: str, item_id: str, call_id: str, status: str) -> dict[str, Any]:
        if self.forced is not None:
            return {"type": "function_call", "id": item_id, "call_id": call_id, "name": self.forced,
                    "arguments": text, "status": status}
        return {"type": "message", "id": item_id, "role": "assistant", "status": status,
                "content": [] if status == "in_progress" else [_text_part(text)]}

    def _response(self, status: str, output: list[dict], completion: Completion | None
                  ) -> dict[str, Any]:
        incomplete = completion is not None and completion.finish_reason == FINISH_LENGTH
        body = {"id": self.id, "object": "response", "created_at": self.created,
                "status": "incomplete" if incomplete else status, "model": self.model,
                "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "usage": None if completion is None else _usage(completion),
                **self.fields}
        for name, default in _ECHO_DEFAULTS.items():
            if body[name] is None:
                body[name] = default
        return body

    def _remember(self, completion: Completion, response: dict[str, Any]) -> None:
        if not self.fields["store"]:
            return
        if self.forced is not None:
            item = response["output"][0]
            reply = {"role": "assistant", "content": None, "tool_calls": [
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}}]}
        else:
            reply = {"role": "assistant", "content": completion.text}
        self.store.put(self.id, self.messages + [reply], response)

    def respond(self, completion: Completion) -> dict[str, Any]:
        """The response object of a finished request."""
        text = completion.text
        output = [] if not text and self.forced is None else [
            self._item(text, _item_id(self.forced), f"call_{uuid.uuid4().hex}", "completed")]
        response = self._response("completed", output, completion)
        self._remember(completion, response)
        return response

    def events(self, chunks: Iterator[Chunk]) -> Iterator[str]:
        """The server-sent events of a streamed request."""
        sequence = iter(range(1 << 62))

        def event(kind: str, **data: Any) -> str:
            return sse(json.dumps({"type": kind, "sequence_number": next(sequence), **data}), kind)

        item_id, call_id = _item_id(self.forced), f"call_{uuid.uuid4().hex}"
        yield event("response.created", response=self._response("in_progress", [], None))
        yield event("response.in_progress", response=self._response("in_progress", [], None))
        text, started, completion = "", False, None
        try:
            for chunk in chunks:
                if chunk.text:
                    if not started:
                        yield from self._open_item(event, item_id, call_id)
                        started = True
                    text += chunk.text
                    if self.forced is not None:
                        yield event("response.function_call_arguments.delta", item_id=item_id,
                                    output_index=0, delta=chunk.text)
                    else:
                        yield event("response.output_text.delta", item_id=item_id, output_index=0,
                                    content_index=0, delta=chunk.text, logprobs=[])
                completion = chunk.completion or completion
        except Exception as exc:     # the request failed after the stream began
            yield event("error", code="server_error", message=str(exc), param=None)
            return
        if not started and self.forced is not None:
            yield from self._open_item(event, item_id, call_id)
            started = True
        output = []
        if started:
            item = self._item(text, item_id, call_id, "completed")
            if self.forced is not None:
                yield event("response.function_call_arguments.done", item_id=item_id,
                            output_index=0, arguments=text)
            else:
                yield event("response.output_text.done", item_id=item_id, output_index=0,
                            content_index=0, text=text, logprobs=[])
                yield event("response.content_part.done", item_id=item_id, output_index=0,
                            content_index=0, part=_text_part(text))
            yield event("response.output_item.done", output_index=0, item=item)
            output.append(item)
        response = self._response("completed", output, completion)
        self._remember(completion, response)
        yield event("response.incomplete" if response["status"] == "incomplete"
                    else "response.completed", response=response)

    def _open_item(self, event: Any, item_id: str, call_id: str) -> Iterator[str]:
        yield event("response.output_item.added", output_index=0,
                    item=self._item("", item_id, call_id, "in_progress"))
        if self.forced is None:
            yield event("response.content_part.added", item_id=item_id, output_index=0,
                        content_index=0, part=_text_part(""))


def _item_id(forced: str | None) -> str:
    return ("fc_" if forced is not None else "msg_") + uuid.uuid4().hex


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(completion: Completion) -> dict[str, Any]:
    usage = completion.usage
    return {"input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": completion.timings.prompt_cached},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"]}
