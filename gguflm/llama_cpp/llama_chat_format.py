"""llama-cpp-python's chat formats (``llama_cpp.llama_chat_format``): the prompt each registered
``chat_format`` name builds from OpenAI messages, a Jinja chat template as a formatter
(:class:`Jinja2ChatFormatter`, rendered in gguflm's sandbox) and a Hugging Face
``tokenizer_config.json`` as one (:func:`hf_tokenizer_config_to_chat_formatter`).

These are llama-cpp-python's own prompt layouts, not llama.cpp's: ``chat_format="llama-2"`` here
gives llama-cpp-python's ``format_llama2`` text, where gguflm's native ``LLM(chat_template=
"llama2")`` gives llama.cpp's ``llama_chat_apply_template``'s. Most formats are one of a few
layouts (how a role, its message and the separators join) with a role map, a system text and a
stop string: :data:`FORMATS` holds them as data, and the same text comes out, quirks included
(``intel`` keeps its literal ``{system_message}``, ``open-orca`` maps no lowercase role).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gguflm.chat import ChatTemplate
from gguflm.llama_cpp import llama_types
from gguflm.llama_cpp.stopping import StoppingCriteriaList

log = logging.getLogger(__name__)

__all__ = ["ChatFormatterResponse", "ChatFormatter", "Jinja2ChatFormatter", "FORMATS", "get_chat_format",
           "hf_tokenizer_config_to_chat_formatter", "register_chat_format", "chat_format_names"]

Messages = Sequence[llama_types.ChatCompletionRequestMessage]


@dataclasses.dataclass
class ChatFormatterResponse:
    """A formatted prompt and how generation should stop for it. ``added_special``: the prompt
    already holds the special tokens (BOS), so tokenizing it must not add them."""

    prompt: str
    stop: str | list[str] | None = None
    stopping_criteria: StoppingCriteriaList | None = None
    added_special: bool = False


class ChatFormatter(Protocol):
    def __call__(self, *, messages: Messages, **kwargs: Any) -> ChatFormatterResponse: ...


class Jinja2ChatFormatter:
    """A Jinja chat template as a formatter: renders ``messages`` (and ``functions``, ``tools``...)
    with ``bos_token`` and ``eos_token``; stops at ``eos_token`` text and, when
    ``stop_token_ids`` are given, at those tokens."""

    def __init__(self, template: str, eos_token: str, bos_token: str, add_generation_prompt: bool = True,
                 stop_token_ids: Sequence[int] | None = None):
        self.template = template
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.add_generation_prompt = add_generation_prompt
        self.stop_token_ids = None if stop_token_ids is None else set(stop_token_ids)
        self._template = ChatTemplate(template, bos_token=bos_token, eos_token=eos_token, name="jinja2")

    def __call__(self, *, messages: Messages, functions: Any = None, function_call: Any = None, tools: Any = None,
                 tool_choice: Any = None, **kwargs: Any) -> ChatFormatterResponse:
        prompt = self._template.render(messages, add_generation_prompt=self.add_generation_prompt,
                                       functions=functions, function_call=function_call, tools=tools,
                                       tool_choice=tool_choice, **kwargs)
        criteria = None
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            criteria = StoppingCriteriaList([lambda tokens, logits: int(tokens[-1]) in ids])
        return ChatFormatterResponse(prompt=prompt, stop=[self.eos_token], stopping_criteria=criteria,
                                     added_special=True)


def hf_tokenizer_config_to_chat_formatter(tokenizer_config: Mapping[str, Any],
                                          add_generation_prompt: bool = True) -> ChatFormatter:
    """The ``chat_template`` of a Hugging Face ``tokenizer_config.json`` (with its ``bos_token``
    and ``eos_token``) as a formatter; as llama-cpp-python does, the generation prompt is asked
    for by appending an empty assistant message, and the reply stops at EOS or BOS text."""
    for key in ("chat_template", "bos_token", "eos_token"):
        if not isinstance(tokenizer_config.get(key), str):
            raise ValueError(f"the tokenizer config needs a str {key!r}")
    bos, eos = tokenizer_config["bos_token"], tokenizer_config["eos_token"]
    template = ChatTemplate(tokenizer_config["chat_template"], bos_token=bos, eos_token=eos, name="tokenizer_config")

    def format_tokenizer_config(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
        if add_generation_prompt:
            messages = [*messages, {"role": "assistant", "content": ""}]
        # llama-cpp-python renders with the template's own add_generation_prompt unset
        return ChatFormatterResponse(prompt=template.render(messages, add_generation_prompt=False, **kwargs),
                                     stop=[eos, bos], added_special=True)

    return format_tokenizer_config


# -- the registered formats

def _first_system(messages: Messages) -> str:
    for m in messages:
        if m["role"] == "system":
            return m["content"] or ""
    return ""


def _turns(messages: Messages, roles: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(role text, content) of the messages whose role the format knows; non-str content is None."""
    return [(roles[m["role"]], m["content"] if isinstance(m["content"], str) else None)
            for m in messages if m["role"] in roles]


# The layouts: how the system text, each role and its message, and the separators join. A turn
# without content (the generation prompt) is the role alone, followed by what the layout says.
def _layout_llama2(system: str, turns: list, sep: str, sep2: str) -> str:
    out = system + sep
    for i, (role, text) in enumerate(turns):
        if system and i == 0:   # the system block is the first user turn's opening
            out += (text or "") + (sep, sep2)[i % 2]
        elif text:
            out += role + text + " " + (sep, sep2)[i % 2]
        else:
            out += role + " "
    return out


def _layout_colon(system: str, turns: list, sep: str, sep2: str | None = None, space: bool = False) -> str:
    out = system + sep
    for i, (role, text) in enumerate(turns):
        out += role + ": " + text + (sep if sep2 is None else (sep, sep2)[i % 2]) if text else \
            role + (": " if space else ":")
    return out


def _layout_plain(system: str, turns: list, sep: str) -> str:
    return system + "".join(role + text + sep if text else role for role, text in turns)


def _layout_chatml(system: str, turns: list, sep: str) -> str:
    out = system + sep + "\n" if system else ""
    return out + "".join(role + "\n" + text + sep + "\n" if text else role + "\n" for role, text in turns)


def _layout_chatglm3(system: str, turns: list, sep: str) -> str:
    return system + "".join(role + "\n " + text if text else role for role, text in turns)


@dataclasses.dataclass(frozen=True)
class _Format:
    layout: Callable[..., str]
    roles: Mapping[str, str]
    seps: tuple[str, ...]
    system: str | None = "{system}"  # the system text, {system} the first system message as str;
                                     # None: that message's content as it is
    default_system: str = ""        # used when there is none
    drop_empty_system: bool = False  # no system block at all without a system message
    generation_prompt: bool = True  # append the assistant role alone
    stop: str | None = None
    suffix: str = ""
    prompt_role: str = "assistant"  # the roles entry the generation prompt uses

    def __call__(self, messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
        found = _first_system(messages)
        if self.system is None:
            system = found if found != "" else self.default_system
        elif self.drop_empty_system and not found:
            system = ""
        else:
            system = self.system.replace("{system}", str(found or self.default_system))
        turns = _turns(messages, self.roles)
        if self.generation_prompt:
            turns.append((self.roles[self.prompt_role], None))
        return ChatFormatterResponse(prompt=self.layout(system, turns, *self.seps) + self.suffix, stop=self.stop)


_OPENBUDDY = (
    "You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.\n"
    "Always answer as helpfully and logically as possible, while being safe. Your answers should not include any "
    "harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure "
    "that your responses are socially unbiased and positive in nature.\n"
    "If a question does not make any sense, or is not factually coherent, explain why instead of answering "
    "something not correct. If you don't know the answer to a question, please don't share false information.\n"
    "You can speak fluently in many languages, for example: English, Chinese.\n"
    "You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.\n"
    "You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are "
    "based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.\n\n")
_OPEN_ORCA = (
    "You are a helpful assistant. Please answer truthfully and write out your thinking step by step to be sure you "
    "get the right answer. If you make a mistake or encounter an error in your thinking, say so out loud and "
    "attempt to correct it. If you don't know or aren't sure about something, say so clearly. You will act as a "
    "professional logician, mathematician, and physicist. You will also act as the most appropriate type of expert "
    "to answer any particular question or solve the relevant problem; state which expert type your are, if so. "
    "Also think of any particular named expert that would be ideal to answer the relevant question or solve the "
    "relevant problem; name and act as them, if appropriate.")
_VICUNA = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
           "detailed, and polite answers to the user's questions.")
_SNOOZY = ("The prompt below is a question to answer, a task to complete, or a conversation to respond to; decide "
           "which and write an appropriate response.")


def _ua(user: str, assistant: str) -> dict[str, str]:
    return {"user": user, "assistant": assistant}


def _colon_two(system: str, turns: list, sep: str, sep2: str) -> str:
    return _layout_colon(system, turns, sep, sep2)


def _colon_space(system: str, turns: list, sep: str) -> str:
    return _layout_colon(system, turns, sep, space=True)


FORMATS: dict[str, Callable[..., ChatFormatterResponse]] = {
    "llama-2": _Format(_layout_llama2, _ua("<s>[INST]", "[/INST]"), (" ", "</s>"),
                       system="[INST] <<SYS>>\n{system}\n<</SYS>>", drop_empty_system=True,
                       generation_prompt=False, suffix="[/INST]"),
    "llama-3": _Format(_layout_plain, {"system": "<|start_header_id|>system<|end_header_id|>\n\n",
                                       **_ua("<|start_header_id|>user<|end_header_id|>\n\n",
                                             "<|start_header_id|>assistant<|end_header_id|>\n\n")},
                       ("<|eot_id|>",), system="", stop="<|eot_id|>"),
    "alpaca": _Format(_colon_two, _ua("### Instruction", "### Response"), ("\n\n", "</s>"), system=None,
                      generation_prompt=False),
    "qwen": _Format(_layout_chatml, _ua("<|im_start|>user", "<|im_start|>assistant"), ("<|im_end|>",),
                    system="<|im_start|>system\n{system}", default_system="You are a helpful assistant.",
                    stop="<|endoftext|>"),
    "vicuna": _Format(_colon_two, _ua("USER", "ASSISTANT"), (" ", "</s>"), system=_VICUNA),
    "oasst_llama": _Format(_layout_plain, _ua("<|prompter|>", "<|assistant|>"), ("</s>",),
                           system="[INST] <<SYS>>\n{system}\n<</SYS>>\n\n"),
    "baichuan-2": _Format(_layout_plain, _ua("<reserved_106>", "<reserved_107>"), ("",)),
    "baichuan": _Format(_layout_plain, _ua("<reserved_102>", "<reserved_103>"), ("",)),
    "openbuddy": _Format(_layout_colon, _ua("User", "Assistant"), ("\n",), system=_OPENBUDDY),
    "redpajama-incite": _Format(_layout_colon, _ua("<human>", "<bot>"), ("\n",), system=None, stop="<human>"),
    "snoozy": _Format(_layout_colon, _ua("### Prompt", "### Response"), ("\n",), system=None, default_system=_SNOOZY,
                      stop="###"),
    "phind": _Format(_layout_colon, _ua("### User Message", "### Assistant"), ("\n\n",),
                     system="### System Prompt\nYou are an intelligent programming assistant."),
    "intel": _Format(_layout_colon, _ua("### User:", "### Assistant:"), ("\n",),
                     system="### System:\n{system_message}"),
    "open-orca": _Format(_colon_space, {"User": "User", "Assistant": "Assistant"}, ("<|end_of_turn|>\n",),
                         system=_OPEN_ORCA, stop="User", prompt_role="Assistant"),
    "mistrallite": _Format(_layout_plain, _ua("<|prompter|>", "</s>\n<|assistant|>"), (" ",),
                           system="<|system|>{system}</s>"),
    "zephyr": _Format(_layout_chatml, _ua("<|user|>\n", "<|assistant|>\n"), ("</s>",),
                      system="<|system|>\n{system}", stop="</s>"),
    "pygmalion": _Format(_layout_chatml, _ua("<|user|>", "<|model|>"), ("\n",), system="<|system|>{system}",
                         stop="\n"),
    "chatml": _Format(_layout_chatml, _ua("<|im_start|>user", "<|im_start|>assistant"), ("<|im_end|>",),
                      system="<|im_start|>system\n{system}", stop="<|im_end|>"),
    "chatglm3": _Format(_layout_chatglm3, _ua("<|user|>", "<|assistant|>"), ("</s>",),
                        system="<|system|>\n{system}", stop="</s>"),
    "openchat": _Format(_layout_chatml, _ua("GPT4 Correct User: ", "<|end_of_turn|>GPT4 Correct Assistant: "),
                        ("<|end_of_turn|>",), system="{system}<|end_of_turn|>", stop="<|end_of_turn|>"),
    "gemma": _Format(_layout_plain, _ua("<start_of_turn>user\n", "<start_of_turn>model\n"), ("<end_of_turn>\n",),
                     system="", stop="<end_of_turn>\n"),
}


def format_mistral_instruct(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    """``[INST] user [/INST]assistant</s>...`` and a closing `` [/INST]``."""
    prompt = ""
    for m in messages:
        if m["role"] == "user" and isinstance(m["content"], str):
            prompt += "[INST] " + m["content"]
        elif m["role"] == "assistant" and m["content"] is not None:
            prompt += " [/INST]" + m["content"] + "</s>"
    return ChatFormatterResponse(prompt=prompt + " [/INST]", stop="</s>")


def format_saiga(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
    """``<s>role\\ncontent</s>`` per turn (user, system; the role name bot has no messages) and
    ``<s>bot``, stripped."""
    turns = _turns(messages, {"user": "user", "bot": "bot", "system": "system"})
    prompt = "".join(f"<s>{role}\n{text}</s>" if text else f"<s>{role}\n" for role, text in turns)
    return ChatFormatterResponse(prompt=(prompt + "<s>bot").strip())


FORMATS["mistral-instruct"] = format_mistral_instruct
FORMATS["saiga"] = format_saiga


def register_chat_format(name: str) -> Callable[[Callable[..., ChatFormatterResponse]], Callable[..., ChatFormatterResponse]]:
    """Decorator: make a formatter available as ``chat_format=name``."""
    def register(formatter: Callable[..., ChatFormatterResponse]) -> Callable[..., ChatFormatterResponse]:
        FORMATS[name] = formatter
        return formatter
    return register


def get_chat_format(name: str) -> Callable[..., ChatFormatterResponse]:
    """The formatter registered as ``name``."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown chat_format {name!r}; registered: {', '.join(sorted(FORMATS))}") from None


def chat_format_names() -> list[str]:
    return sorted(FORMATS)


# llama-cpp-python's function names for the formats
def _named(name: str) -> Callable[..., ChatFormatterResponse]:
    def formatter(messages: Messages, **kwargs: Any) -> ChatFormatterResponse:
        return FORMATS[name](messages, **kwargs)
    formatter.__name__ = "format_" + name.replace("-", "_")
    return formatter


format_llama2, format_llama3, format_alpaca, format_qwen = (_named(n) for n in ("llama-2", "llama-3", "alpaca", "qwen"))
format_oasst_llama, format_baichuan2, format_baichuan = (_named(n) for n in ("oasst_llama", "baichuan-2", "baichuan"))
format_openbuddy, format_redpajama_incite, format_snoozy = (_named(n) for n in ("openbuddy", "redpajama-incite",
                                                                               "snoozy"))
format_phind, format_intel, format_open_orca, format_mistrallite = (_named(n) for n in ("phind", "intel", "open-orca",
                                                                                       "mistrallite"))
format_zephyr, format_pygmalion, format_chatml = (_named(n) for n in ("zephyr", "pygmalion", "chatml"))
format_chatglm3, format_openchat, format_gemma = (_named(n) for n in ("chatglm3", "openchat", "gemma"))
format_vicuna = _named("vicuna")

