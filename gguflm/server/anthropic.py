"""Anthropic's Messages API (``POST /v1/messages``) as a shim over the chat completion machinery.

A request becomes a chat completion request, as llama-server converts it: ``system`` (a text or
text blocks) a system message first, ``messages`` with text, ``tool_use`` and ``tool_result``
blocks the chat messages (tool uses an assistant message's ``tool_calls``, tool results ``tool``
messages), ``tools`` (``input_schema``) OpenAI's function tools, ``stop_sequences`` the ``stop``
strings, ``max_tokens`` the limit (when absent, the slot's context or the server's
``--max-tokens``, where llama-server takes 4096); ``temperature``,
``top_p``, ``top_k`` and llama.cpp's other sampling fields pass through. So a greedy reply is the
chat completion's for the same conversation.

``tool_choice`` ``{"type": "tool", "name": N}`` (or ``"any"`` with one tool) constrains the reply
to N's input (see :mod:`gguflm.grammar.openai`): the content is then one ``tool_use`` block with
``stop_reason`` ``"tool_use"``. A reply cut by a stop sequence has ``stop_reason``
``"stop_sequence"`` and names it. Streams are Anthropic's events (``message_start`` ...
``message_stop``); errors have Anthropic's body (``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from gguflm.generate import FINISH_LENGTH, Chunk, Completion
from gguflm.server import protocol
from gguflm.server.protocol import RequestError
from gguflm.server.running import sse

__all__ = ["MessageRequest", "error_body"]

# OpenAI's error types -> Anthropic's
_ERROR_TYPES = {"invalid_request_error": "invalid_request_error",
                "not_found_error": "not_found_error", "not_supported_error": "invalid_request_error",
                "server_error": "api_error"}


def error_body(exc: RequestError) -> dict[str, Any]:
    kind = "authentication_error" if exc.status == 401 else _ERROR_TYPES.get(exc.type, "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def _text(content: Any, param: str) -> str:
    """A text, or text blocks joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in content):
        raise RequestError(f"{param} must be a string or an array of text blocks", param=param)
    return "".join(b["text"] for b in content)


def _chat_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise RequestError("'messages' must be an array", param="messages")
    chat: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise RequestError(f"{param} must be an object with role 'user' or 'assistant'",
                               param=param)
        role, content = message["role"], message.get("content")
        if isinstance(content, str):
            chat.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise RequestError(f"{param}.content must be a string or an array of blocks",
                               param=param)
        texts, calls, results = [], [], []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and isinstance(block.get("id"), str) and isinstance(
                    block.get("name"), str):
                calls.append({"id": block["id"], "type": "function", "function": {
                    "name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
                result = block.get("content", "")
                results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                                "content": _text(result, f"{param}.content[{j}].content")})
            else:
                raise RequestError(f"{param}.content[{j}]: only text, tool_use and tool_result "
                                   f"blocks are supported", param=param)
        if texts or calls:
            turn: dict[str, Any] = {"role": role, "content": "".join(texts) if texts else None}
            if calls:
                turn["tool_calls"] = calls
            chat.append(turn)
        chat += results
    return chat


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        raise RequestError("'tools' must be an array of objects with a name", param="tools")
    return [{"type": "function", "function": {
        "name": t["name"], "description": t.get("description", ""),
        "parameters": t.get("input_schema", {"type": "object", "properties": {}})}}
        for t in tools] or None


def _forced(tool_choice: Any, tools: list[dict] | None) -> str | None:
    if tool_choice is None:
        return None
    kind = tool_choice.get("type") if isinstance(tool_choice, dict) else None
    if kind in ("auto", "none"):
        return None
    if kind == "any":
        return protocol.only_tool(tools, "any", "{'type': 'tool', 'name': ...}")
    if kind == "tool" and isinstance(tool_choice.get("name"), str):
        if not any(t["function"]["name"] == tool_choice["name"] for t in tools or ()):
            raise RequestError(f"tool_choice names {tool_choice['name']!r}, which is not among "
                               f"the tools", param="tool_choice")
        return tool_choice["name"]
    raise RequestError("tool_choice must be {'type': 'auto' | 'any' | 'none'} or "
                       "{'type': 'tool', 'name': ...}", param="tool_choice")


class MessageRequest:
    """One ``POST /v1/messages``: the chat completion body it runs as, and the shapes of its
    result."""

    def __init__(self, body: Any, model: str, vocab: Any) -> None:
        v = protocol._read(body, {"messages": ("list", None), "system": ("any", None),
                                  "max_tokens": ("int", None),
                                  "stop_sequences": ("stop", None), "tools": ("list", None),
                                  "tool_choice": ("object", None), "stream": ("bool", False)})
        if v["messages"] is None:
            raise RequestError("'messages' is required", param="messages")
        if v["max_tokens"] is not None and v["max_tokens"] < 1:
            raise RequestError("'max_tokens' must be at least 1", param="max_tokens")
        self.vocab = vocab
        self.model = body.get("model") or model
        self.id = f"msg_{uuid.uuid4().hex}"
        self.stops = [v["stop_sequences"]] if isinstance(v["stop_sequences"], str) else (
            v["stop_sequences"] or [])
        tools = _chat_tools(v["tools"])
        self.forced = _forced(v["tool_choice"], tools)
        system = [] if v["system"] is None else [{"role": "system",
                                                  "content": _text(v["system"], "system")}]
        chat = {k: body[k] for k in protocol.SAMPLING_FIELDS if k in body}
        chat.pop("n", None)
        chat.update(messages=system + _chat_messages(v["messages"]), max_tokens=v["max_tokens"],
                    stop=self.stops or None, tools=tools, stream=v["stream"],
                    tool_choice=None if self.forced is None else
                    {"type": "function", "function": {"name": self.forced}})
        self.chat = chat

    def _stop(self, completion: Completion) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of a finished request."""
        if completion.finish_reason == FINISH_LENGTH:
            return "max_tokens", None
        if self.forced is not None:
            return "tool_use", None
        # the tokens generated hold the stop sequence the text was cut at, if any
        generated = b"".join(self.vocab.token_to_piece(t) for t in completion.token_ids)
        rest = generated.decode("utf-8", "replace")[len(completion.text):]
        hit = next((s for s in self.stops if rest.startswith(s)), None)
        return ("end_turn", None) if hit is None else ("stop_sequence", hit)

    def _block(self, text: str) -> dict[str, Any]:
        if self.forced is not None:
            try:
                arguments = json.loads(text)
            except json.JSONDecodeError:      # cut by max_tokens
                arguments = {}
            return {"type": "tool_use", "id": self.tool_use_id, "name": self.forced,
                    "input": arguments}
        return {"type": "text", "text": text}

    @property
    def tool_use_id(self) -> str:
        return "toolu_" + self.id[len("msg_"):]

    def _usage(self, completion: Completion | None, n_prompt: int) -> dict[str, int]:
        cached = 0 if completion is None else completion.timings.prompt_cached
        return {"input_tokens": n_prompt - cached, "cache_read_input_tokens": cached,
                "output_tokens": 0 if completion is None else len(completion.token_ids)}

    def respond(self, completion: Completion) -> dict[str, Any]:
        """The message of a finished request."""
        reason, sequence = self._stop(completion)
        content = [self._block(completion.text)] if completion.text or self.forced else []
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence,
                "usage": self._usage(completion, len(completion.prompt_tokens))}

    def events(self, chunks: Iterator[Chunk], n_prompt: int) -> Iterator[str]:
        """The server-sent events of a streamed request."""
        def event(kind: str, **data: Any) -> str:
            return sse(json.dumps({"type": kind, **data}), kind)

        yield event("message_start", message={
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": self._usage(None, n_prompt)})
        started, completion = False, None
        try:
            for chunk in chunks:
                if chunk.text:
                    if not started:
                        yield self._start_block(event)
                        started = True
                    delta = ({"type": "input_json_delta", "partial_json": chunk.text}
                             if self.forced is not None else {"type": "text_delta", "text": chunk.text})
                    yield event("content_block_delta", index=0, delta=delta)
                completion = chunk.completion or completion
        except Exception as exc:     # the request failed after the stream began
            yield event("error", error={"type": "api_error", "message": str(exc)})
            return
        if not started and self.forced is not None:
            yield self._start_block(event)
            started = True
        if started:
            yield event("content_block_stop", index=0)
        reason, sequence = self._stop(completion)
        yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                    usage={"output_tokens": len(completion.token_ids)})
        yield event("message_stop")

    def _start_block(self, event: Any) -> str:
        block = ({"type": "tool_use", "id": self.tool_use_id, "name": self.forced, "input": {}}
                 if self.forced is not None else {"type": "text", "text": ""})
        return event("content_block_start", index=0, content_block=block)
