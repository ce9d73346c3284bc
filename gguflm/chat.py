"""Chat templates: a model's ``tokenizer.chat_template`` rendered in a sandboxed Jinja environment,
and built-in named templates like llama.cpp's ``--chat-template NAME``.

Templates follow the Hugging Face convention: the variables ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception`` (plus ``strftime_now``
and any extra keyword such as ``tools``), ``trim_blocks``/``lstrip_blocks`` on, the
``loopcontrols`` extension and a ``tojson`` filter that keeps non-ASCII text.

A template read from a GGUF file is untrusted input. It is compiled by Jinja's
``ImmutableSandboxedEnvironment``: no attribute starting with ``_`` (so no ``__class__``,
``__globals__``, ``__subclasses__``), no mutation of lists and dicts, ranges of at most 100,000
items; on top of that, string/list repetition and powers are bounded and the rendered text is
capped, so a template cannot make the process allocate without limit; a render running past
``MAX_RENDER_SECONDS`` is stopped (nested loops over large ranges would otherwise keep a request
busy for hours). A template that breaks a rule raises :class:`ChatTemplateError` and renders nothing.

The built-in templates use one more filter, ``cstrip``: ASCII-whitespace strip as llama.cpp's C++
formatter does (Python's ``trim`` also strips Unicode spaces).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gguflm.errors import Error

log = logging.getLogger(__name__)

MAX_RENDERED_CHARS = 16 << 20   # a rendered prompt longer than this is certainly an attack
MAX_REPEAT_ITEMS = 1 << 20      # 'x' * n and [..] * n may build at most this many items
MAX_POWER_EXPONENT = 1024
MAX_RENDER_SECONDS = 5.0        # real templates render a long conversation in milliseconds

# Our own templates reproducing the text of llama.cpp's named formats (src/llama-chat.cpp).
# Control strings stay in the template; bos_token is left out because the prompt gets BOS from
# the tokenizer when the model asks for it (see :func:`prompt_tokens`).
_CHATML = """\
{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}
"""

# no system role: system text is trimmed and put in front of the next non-model turn
_GEMMA = """\
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = ns.system + (message['content'] | cstrip) -%}
{%- else -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '\\n' }}
{%- if ns.system and role != 'model' -%}
{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}
{%- endif -%}
{{ (message['content'] | cstrip) + '<end_of_turn>\\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}
"""

_LLAMA3 = """\
{%- for message in messages -%}
{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
{{- (message['content'] | cstrip) + '<|eot_id|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif -%}
"""

# llama2: a turn opens with [INST] and closes after the assistant's </s>; "llama2-sys" wraps the
# system text in <<SYS>> markers, plain "llama2" writes it as a line of the first turn
_LLAMA2 = """\
{%- set ns = namespace(in_turn=true) -%}
{{ '[INST] ' }}
{%- for message in messages -%}
{%- if not ns.in_turn -%}{{ '[INST] ' }}{%- set ns.in_turn = true -%}{%- endif -%}
{%- if message['role'] == 'system' -%}
{%- if system_markers -%}{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}
{%- else -%}{{ message['content'] + '\\n' }}{%- endif -%}
{%- elif message['role'] == 'user' -%}
{{ message['content'] + ' [/INST]' }}
{%- else -%}
{{ message['content'] + '</s>' }}{%- set ns.in_turn = false -%}
{%- endif -%}
{%- endfor -%}
"""

_PHI3 = """\
{%- for message in messages -%}
{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}
"""


@dataclass(frozen=True)
class _Builtin:
    source: str
    stop: tuple[str, ...]          # end-of-turn text, in case a model writes it as plain text
    variables: tuple[tuple[str, Any], ...] = ()


BUILTIN_TEMPLATES: dict[str, _Builtin] = {
    "chatml": _Builtin(_CHATML, ("<|im_end|>",)),
    "gemma": _Builtin(_GEMMA, ("<end_of_turn>",)),
    "llama2": _Builtin(_LLAMA2, ("</s>",), (("system_markers", False),)),
    "llama2-sys": _Builtin(_LLAMA2, ("</s>",), (("system_markers", True),)),
    "llama3": _Builtin(_LLAMA3, ("<|eot_id|>",)),
    "phi3": _Builtin(_PHI3, ("<|end|>",)),
}

# llama-cpp-python's chat_format spellings of the same formats
_ALIASES = {"llama-2": "llama2", "llama-3": "llama3"}

# architectures whose chat format is not in doubt, for files that carry no template
ARCH_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma"}


class ChatTemplateError(Error, ValueError):
    """A chat template is missing, malformed, unsafe, or rejected the conversation."""


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with bounded ``*`` and ``**``."""

    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # Jinja returns an Undefined that only fails when used; fail at the attempt instead
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} "
                            f"object is unsafe")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                        and len(seq) * n > MAX_REPEAT_ITEMS:
                    raise SecurityError(f"repetition to {len(seq) * n} items is not allowed")
        elif isinstance(right, int) and abs(right) > MAX_POWER_EXPONENT \
                and isinstance(left, int) and abs(left) > 1:
            raise SecurityError(f"a power with exponent {right} is not allowed")
        return super().call_binop(context, operator, left, right)


def _deadline_tracer(deadline: float) -> Any:
    """A ``sys.settrace`` function that stops the template's code past ``deadline``: Jinja compiles
    a template to Python named ``<template>``, whose every line (a loop's every turn) checks the clock."""
    def line(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise SecurityError(f"the render ran past {MAX_RENDER_SECONDS} s")
        return line

    def call(frame: Any, event: str, arg: Any) -> Any:
        return line if frame.f_code.co_filename == "<template>" else None
    return call


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template rejected the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _cstrip(text: str) -> str:
    """Strip ASCII whitespace only, as llama.cpp's templates do (C ``isspace``)."""
    return text.strip(" \t\n\v\f\r")


def _new_environment() -> _Sandbox:
    env = _Sandbox(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                   extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters["cstrip"] = _cstrip
    return env


class ChatTemplate:
    """A compiled chat template.

    Parameters
    ----------
    source
        Jinja source (untrusted input is fine: it is compiled in the sandbox).
    bos_token, eos_token
        The model's BOS and EOS texts, offered to the template.
    name
        What to call the template in messages (a built-in name, or where it came from).
    stop
        Texts that end a reply when the model writes them as plain text.
    text_only
        Flatten list-of-parts message content to its text parts before rendering (the built-in
        templates expect strings; model templates get the messages as given).
    variables
        Extra variables every render sees.

    Raises
    ------
    ChatTemplateError
        The source is not a valid template.
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 name: str = "custom", stop: Sequence[str] = (), text_only: bool = False,
                 variables: Mapping[str, Any] | None = None) -> None:
        if not isinstance(source, str):
            raise TypeError(f"a chat template is a str, not {type(source).__name__}")
        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.stop = tuple(stop)
        self.text_only = text_only
        self._variables = dict(variables or {})
        try:
            self._template = _new_environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template {name!r} does not compile: {exc.message} "
                                    f"(line {exc.lineno})") from None

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """The prompt text for ``messages`` (each a mapping with ``role`` and ``content``).

        Raises
        ------
        TypeError, ValueError
            ``messages`` is not a list of role/content mappings.
        ChatTemplateError
            The template failed, broke a sandbox rule, or called ``raise_exception``.
        """
        msgs = _check_messages(messages, self.text_only)
        context = {
            **self._variables,
            **variables,
            "messages": msgs,
            "add_generation_prompt": bool(add_generation_prompt),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "raise_exception": _raise_exception,
            "strftime_now": _strftime_now,
        }
        parts: list[str] = []
        size = 0
        traced = sys.gettrace() is None   # a debugger's or coverage tool's tracer is left alone
        if traced:
            sys.settrace(_deadline_tracer(time.monotonic() + MAX_RENDER_SECONDS))
        try:
            for part in self._template.generate(context):
                size += len(part)
                if size > MAX_RENDERED_CHARS:
                    raise SecurityError(f"the rendered prompt exceeds {MAX_RENDERED_CHARS} "
                                        f"characters")
                parts.append(part)
        except ChatTemplateError:
            raise
        except SecurityError as exc:
            raise ChatTemplateError(f"chat template {self.name!r} broke a sandbox rule: "
                                    f"{exc}") from None
        except Exception as exc:  # anything the template's own expressions raise
            raise ChatTemplateError(f"chat template {self.name!r} failed: "
                                    f"{type(exc).__name__}: {exc}") from None
        finally:
            if traced:
                sys.settrace(None)
        return "".join(parts)

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r})"


def _check_messages(messages: Any, text_only: bool) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} mappings")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}] must be a mapping, not {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str):
            raise ValueError(f"messages[{i}] needs a str 'role'")
        msg = dict(message)
        if text_only:
            msg["content"] = message_text(message)
        out.append(msg)
    return out


def message_text(message: Mapping[str, Any]) -> str:
    """A message's content as text: a str as is, the text parts of a list joined, None as ''."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(part.get("text", "")) for part in content
                       if isinstance(part, Mapping) and part.get("type", "text") == "text")
    raise TypeError(f"message content must be a str, a list of parts or None, "
                    f"not {type(content).__name__}")


def builtin_template(name: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    """One of :data:`BUILTIN_TEMPLATES` (llama-cpp-python spellings like ``llama-2`` accepted)."""
    key = _ALIASES.get(name, name)
    builtin = BUILTIN_TEMPLATES.get(key)
    if builtin is None:
        raise ChatTemplateError(f"unknown chat template name {name!r}; built-in names: "
                                f"{', '.join(BUILTIN_TEMPLATES)}")
    return ChatTemplate(builtin.source, bos_token=bos_token, eos_token=eos_token, name=key,
                        stop=builtin.stop, text_only=True, variables=dict(builtin.variables))


def _looks_like_jinja(text: str) -> bool:
    return "{{" in text or "{%" in text


def template_for_model(model: Any, template: str | None = None) -> ChatTemplate:
    """The chat template to use with ``model``.

    Parameters
    ----------
    model
        A :class:`gguflm.Model` (its metadata, vocabulary and architecture are read).
    template
        None: the file's ``tokenizer.chat_template``, else the built-in template of the model's
        architecture family (logged), else an error. A built-in name, the name of one of the
        file's ``tokenizer.chat_template.<name>`` templates, or Jinja source text otherwise.

    Raises
    ------
    ChatTemplateError
        No template applies; the message names the model and how to pass one.
    """
    vocab = model.vocab
    bos = vocab.token_text(vocab.bos) if vocab.bos is not None else ""
    eos = vocab.token_text(vocab.eos) if vocab.eos is not None else ""
    meta = model.metadata
    if template is not None:
        if not isinstance(template, str):
            raise TypeError(f"chat_template must be a str, not {type(template).__name__}")
        named = meta.get(f"tokenizer.chat_template.{template}")
        if isinstance(named, str):
            return ChatTemplate(named, bos_token=bos, eos_token=eos,
                                name=f"tokenizer.chat_template.{template}")
        if _looks_like_jinja(template):
            return ChatTemplate(template, bos_token=bos, eos_token=eos, name="custom")
        return builtin_template(template, bos, eos)
    source = meta.get("tokenizer.chat_template")
    if isinstance(source, str) and source.strip():
        return ChatTemplate(source, bos_token=bos, eos_token=eos, name="tokenizer.chat_template")
    fallback = ARCH_TEMPLATES.get(model.arch)
    label = meta.get("general.name") or model.path.name
    if fallback is not None:
        log.info("%s has no chat template; using the built-in %r template of its architecture "
                 "(%s)", label, fallback, model.arch)
        return builtin_template(fallback, bos, eos)
    raise ChatTemplateError(
        f"model {label!r} ({model.path.name}, architecture {model.arch}) has no chat template "
        f"(no tokenizer.chat_template in the file): pass one, e.g. "
        f"LLM(..., chat_template='chatml') or `gguflm chat --chat-template chatml`; built-in "
        f"names: {', '.join(BUILTIN_TEMPLATES)}; Jinja source text is accepted too")


def prompt_tokens(vocab: Any, text: str) -> list[int]:
    """Token ids of a rendered chat prompt: control-token texts parsed as tokens, and BOS in front
    when the model asks for one and the template did not write it (so never two)."""
    ids = vocab.tokenize(text, add_special=False, parse_special=True)
    if vocab.add_bos and vocab.bos is not None and (not ids or ids[0] != vocab.bos):
        ids.insert(0, vocab.bos)
    return ids
