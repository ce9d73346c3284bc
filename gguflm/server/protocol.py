"""Request bodies in, :class:`gguflm.LLM` arguments out; OpenAI's error bodies.

Each endpoint's fields are checked against a table of expected JSON types before anything runs,
so a wrong-typed field answers 400 with OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``) naming the field. Unknown fields are ignored,
as OpenAI-compatible servers do (clients send extensions). Defaults are llama-cpp-python's
server's, so both servers answer a bare request alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["RequestError", "error_body", "SAMPLING_FIELDS", "asked_max_tokens", "only_tool", "completion_arguments", "chat_arguments",
           "embedding_input", "stream_include_usage"]


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# -- JSON types

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool))


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "any": (lambda v: True, "anything"),
    "int": (_is_int, "an integer"),
    "number": (_is_number, "a number"),
    "bool": (lambda v: isinstance(v, bool), "a boolean"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "an array"),
    "stop": (lambda v: isinstance(v, str) or _is_str_list(v), "a string or an array of strings"),
    "prompt": (lambda v: isinstance(v, str) or _is_str_list(v) or _is_int_list(v),
               "a string, an array of strings or an array of token ids"),
    "tool_choice": (lambda v: isinstance(v, (str, dict)), "a string or an object"),
    "function_call": (lambda v: isinstance(v, (str, dict)), "a string or an object"),
    "input": (lambda v: isinstance(v, str) or _is_str_list(v), "a string or an array of strings"),
}

# fields both generation endpoints take: name -> (kind, default); defaults as llama-cpp-python's server
SAMPLING_FIELDS: dict[str, tuple[str, Any]] = {
    "model": ("str", None), "temperature": ("number", 0.8), "top_p": ("number", 0.95),
    "top_k": ("int", 40), "min_p": ("number", 0.05), "typical_p": ("number", 1.0),
    "repeat_penalty": ("number", 1.1), "presence_penalty": ("number", 0.0),
    "frequency_penalty": ("number", 0.0), "mirostat_mode": ("int", 0),
    "mirostat_tau": ("number", 5.0), "mirostat_eta": ("number", 0.1), "seed": ("int", None),
    "stop": ("stop", None), "logit_bias": ("object", None), "grammar": ("str", None),
    "stream": ("bool", False), "stream_options": ("object", None), "n": ("int", 1),
    "user": ("str", None), "n_probs": ("int", None), "lora": ("list", None),
}
COMPLETION_MAX_TOKENS = 16     # llama-cpp-python's, when a completion request gives none
_COMPLETION = {**SAMPLING_FIELDS, "prompt": ("prompt", ""), "max_tokens": ("int", None),
               "logprobs": ("int", None), "echo": ("bool", False), "suffix": ("str", None),
               "best_of": ("int", None)}
_CHAT = {**SAMPLING_FIELDS, "messages": ("list", None), "max_tokens": ("int", None),
         "max_completion_tokens": ("int", None), "logprobs": ("bool", False),
         "top_logprobs": ("int", None), "tools": ("list", None), "tool_choice": ("tool_choice", None),
         "functions": ("list", None), "function_call": ("function_call", None),
         "response_format": ("object", None)}
# sent on to the LLM under the same name
_PASSED = ("model", "temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty",
           "presence_penalty", "frequency_penalty", "mirostat_mode", "mirostat_tau",
           "mirostat_eta", "seed", "stop", "grammar")


def _read(body: Any, fields: Mapping[str, tuple[str, Any]]) -> dict[str, Any]:
    """The fields of ``body`` (a JSON object) checked against ``fields``, defaults filled in."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    values = {}
    for name, (kind, default) in fields.items():
        value = body.get(name)
        if value is None:
            values[name] = default
            continue
        check, what = _KINDS[kind]
        if not check(value):
            raise RequestError(f"'{name}' must be {what}, got {type(value).__name__}: {value!r:.80}",
                               param=name)
        values[name] = value
    return values


def _common(v: dict[str, Any]) -> dict[str, Any]:
    if v["n"] < 1:
        raise RequestError("'n' must be at least 1", param="n")
    for name in ("temperature", "top_p", "min_p", "typical_p"):
        if v[name] < 0:
            raise RequestError(f"'{name}' must be >= 0", param=name)
    if v["mirostat_mode"] not in (0, 1, 2):
        raise RequestError("'mirostat_mode' must be 0, 1 or 2", param="mirostat_mode")
    args = {name: v[name] for name in _PASSED}
    if v["logit_bias"] is not None:
        try:
            args["logit_bias"] = {int(k): float(b) for k, b in v["logit_bias"].items()}
        except (TypeError, ValueError):
            raise RequestError("'logit_bias' maps token ids to numbers", param="logit_bias") from None
    return args


def _max_tokens(value: int | None, param: str) -> int | None:
    if value is not None and value <= 0:
        raise RequestError(f"'{param}' must be at least 1, got {value}", param=param)
    return value


def completion_arguments(body: Any) -> tuple[dict[str, Any], bool, dict[str, Any]]:
    """``POST /v1/completions``: (arguments of ``LLM.prepare_completion``, stream, the fields)."""
    v = _read(body, _COMPLETION)
    args = _common(v)
    prompt = v["prompt"]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise RequestError("only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if v["suffix"]:
        raise RequestError("'suffix' (fill-in-the-middle) is not supported", param="suffix")
    if v["best_of"] is not None and v["best_of"] < v["n"]:
        raise RequestError("'best_of' must be at least 'n'", param="best_of")
    logprobs = v["logprobs"] if v["logprobs"] is not None else v["n_probs"]
    if logprobs is not None and logprobs < 0:
        raise RequestError("'logprobs' must be >= 0", param="logprobs")
    max_tokens = _max_tokens(v["max_tokens"], "max_tokens")
    args.update(prompt=prompt, max_tokens=COMPLETION_MAX_TOKENS if max_tokens is None else max_tokens,
                logprobs=logprobs, echo=v["echo"])
    return args, v["stream"], v


def chat_arguments(body: Any) -> tuple[dict[str, Any], bool, dict[str, Any]]:
    """``POST /v1/chat/completions``: (arguments of ``LLM.prepare_chat_completion``, stream,
    the fields)."""
    v = _read(body, _CHAT)
    args = _common(v)
    if v["messages"] is None:
        raise RequestError("'messages' is required", param="messages")
    max_tokens = v["max_completion_tokens"] if v["max_completion_tokens"] is not None else v["max_tokens"]
    param = "max_completion_tokens" if v["max_completion_tokens"] is not None else "max_tokens"
    top = v["top_logprobs"] if v["top_logprobs"] is not None else v["n_probs"]
    if top is not None and top < 0:
        raise RequestError("'top_logprobs' must be >= 0", param="top_logprobs")
    args.update(messages=[_message(m, i) for i, m in enumerate(v["messages"])],
                max_tokens=_max_tokens(max_tokens, param), logprobs=v["logprobs"] or v["n_probs"] is not None,
                top_logprobs=top, tools=v["tools"], tool_choice=v["tool_choice"],
                functions=v["functions"], function_call=v["function_call"],
                response_format=v["response_format"])
    return args, v["stream"], v


def _message(message: Any, i: int) -> dict[str, Any]:
    """A chat message for the template: content parts of type text joined into one string."""
    param = f"messages[{i}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise RequestError(f"{param} must be an object with a string 'role'", param=param)
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{param}.content: only text parts are supported", param=param)
            texts.append(part["text"])
        message = {**message, "content": "".join(texts)}
    elif content is None:     # an assistant turn of tool calls: templates join strings
        message = {**message, "content": ""}
    elif not isinstance(content, str):
        raise RequestError(f"{param}.content must be a string, an array of text parts or null",
                           param=param)
    return message


def only_tool(tools: list[dict[str, Any]] | None, choice: str, named: str) -> str:
    """The tool a "call any tool" choice (Responses' ``required``, Anthropic's ``any``) forces:
    the grammar machinery forces one named function, so there must be exactly one."""
    if not tools or len(tools) != 1:
        raise RequestError(f"tool_choice {choice!r} needs exactly one tool here: name it ({named})",
                           param="tool_choice")
    return tools[0]["function"]["name"]


def asked_max_tokens(fields: Mapping[str, Any]) -> tuple[str, int] | None:
    """The field and value of the generation limit a request gave, if it gave one."""
    for name in ("max_completion_tokens", "max_tokens"):
        if fields.get(name) is not None:
            return name, fields[name]
    return None


def stream_include_usage(fields: Mapping[str, Any]) -> bool:
    options = fields.get("stream_options") or {}
    return bool(options.get("include_usage"))


def embedding_input(body: Any) -> tuple[list[str], bool, str | None, str]:
    """``POST /v1/embeddings``: (texts, whether one text was given, model, encoding format)."""
    v = _read(body, {"input": ("input", None), "model": ("str", None),
                     "encoding_format": ("str", "float"), "user": ("str", None)})
    if v["input"] is None:
        raise RequestError("'input' is required", param="input")
    if v["encoding_format"] not in ("float", "base64"):
        raise RequestError("encoding_format must be 'float' or 'base64'", param="encoding_format")
    single = isinstance(v["input"], str)
    texts = [v["input"]] if single else v["input"]
    if not texts:
        raise RequestError("'input' must not be empty", param="input")
    return texts, single, v["model"], v["encoding_format"]
