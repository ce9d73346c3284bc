"""Chat templates: built-in names against llama.cpp's own formatter, the model's Jinja template
against llama-cpp-python's renderer, the sandbox against hostile templates, template resolution."""

from __future__ import annotations

import ctypes
import logging
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _llama import import_peer
from gguflm.chat import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    ChatTemplateError,
    builtin_template,
    message_text,
    prompt_tokens,
    template_for_model,
)
from gguflm.model import Model

ARCH = Path(__file__).resolve().parent / "data" / "arch"

roles = st.sampled_from(["system", "user", "assistant"])
# NUL cannot cross llama.cpp's C strings, nor lone surrogates UTF-8
contents = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                   max_size=40)
conversations = st.lists(st.fixed_dictionaries({"role": roles, "content": contents}), min_size=1,
                         max_size=6)


def llama_cpp_format(name: str, messages: list[dict], add_assistant: bool) -> str:
    """llama.cpp's ``llm_chat_apply_template`` for a built-in template name."""
    llama_cpp = import_peer()
    chat = (llama_cpp.llama_chat_message * len(messages))(*[
        llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode())
        for m in messages])
    size = 1024 + 2 * sum(len(m["content"].encode()) + 64 for m in messages)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(messages), add_assistant,
                                            buf, size)
    assert 0 <= n <= size
    return buf.raw[:n].decode()


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
@settings(max_examples=40, deadline=None)
@given(messages=conversations, add_assistant=st.booleans())
def test_builtin_template_matches_llama_cpp(name, messages, add_assistant):
    ours = builtin_template(name).render(messages, add_generation_prompt=add_assistant)
    assert ours == llama_cpp_format(name, messages, add_assistant)


def test_builtin_names_and_aliases():
    assert {"chatml", "gemma", "llama2", "llama3"} <= set(BUILTIN_TEMPLATES)
    assert builtin_template("llama-2").name == "llama2"
    assert builtin_template("llama-3").name == "llama3"
    with pytest.raises(ChatTemplateError, match="unknown chat template name 'nope'.*chatml"):
        builtin_template("nope")


def test_content_parts_are_flattened_for_builtins():
    parts = [{"type": "text", "text": "Hello "}, {"type": "image_url", "image_url": {}},
             {"type": "text", "text": "there"}]
    out = builtin_template("chatml").render([{"role": "user", "content": parts}])
    assert out == "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    assert message_text({"role": "assistant", "content": None}) == ""


def test_model_template_matches_llama_cpp_python(smollm_path):
    """SmolLM2's own template, rendered by us and by llama-cpp-python's Jinja2ChatFormatter."""
    chat_format = import_peer("llama_cpp.llama_chat_format")
    model = Model.load(smollm_path, vocab_only=True)
    template = template_for_model(model)
    assert template.name == "tokenizer.chat_template"
    source = model.metadata["tokenizer.chat_template"]
    reference = chat_format.Jinja2ChatFormatter(template=source, eos_token="<|im_end|>",
                                                bos_token="<|im_start|>")
    for messages in ([{"role": "user", "content": "Hi"}],
                     [{"role": "system", "content": "Be terse."},
                      {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello."},
                      {"role": "user", "content": "2+2?"}]):
        assert template.render(messages) == reference(messages=messages).prompt
    assert template.render([{"role": "user", "content": "Hi"}]).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_prompt_tokens_parse_control_text_and_add_bos_once(smollm_path, gemma_path):
    smol = Model.load(smollm_path, vocab_only=True)
    ids = prompt_tokens(smol.vocab, "<|im_start|>user\nHi<|im_end|>\n")
    assert ids[0] == smol.vocab.token_id("<|im_start|>")
    assert smol.vocab.token_id("<|im_end|>") in ids
    gemma = Model.load(gemma_path, vocab_only=True)
    bos = gemma.vocab.bos
    text = builtin_template("gemma").render([{"role": "user", "content": "Hi"}])
    assert prompt_tokens(gemma.vocab, text)[:2] == [bos, gemma.vocab.token_id("<start_of_turn>")]
    # a template that writes <bos> itself does not get a second one
    assert prompt_tokens(gemma.vocab, "<bos>" + text).count(bos) == 1


# -- hostile templates: each must raise and do nothing

def hostile_templates(sentinel: Path) -> list[str]:
    touch = f"touch {sentinel}"
    return [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        f"{{{{ cycler.__init__.__globals__.os.system('{touch}') }}}}",
        f"{{{{ lipsum.__globals__['os'].popen('{touch}').read() }}}}",
        f"{{{{ raise_exception.__globals__['__builtins__']['open']('{sentinel}', 'w') }}}}",
        "{{ strftime_now.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ self.__init__.__globals__ }}",
        "{{ '{0.__class__.__mro__}'.format('') }}",
        "{{ messages.append({'role': 'system', 'content': 'x'}) }}",
        "{% set m = messages[0] %}{{ m.update({'role': 'x'}) }}",
        "{{ 'x' * 1000000000 }}",
        "{{ [0] * 1000000000 }}",
        "{{ 7 ** 100000000 }}",
        "{% for i in range(1000000000) %}{% endfor %}",
        "{% set s = 'x' * 1000 %}{% for i in range(100000) %}{% for j in range(100000) %}"
        "{{ s }}{% endfor %}{% endfor %}",
        "{{ raise_exception('no system messages, please') }}",
        "{% for %}",
    ]


def test_hostile_templates_raise_and_run_nothing(tmp_path):
    sentinel = tmp_path / "pwned"
    messages = [{"role": "user", "content": "hi"}]
    for source in hostile_templates(sentinel):
        with pytest.raises(ChatTemplateError):
            ChatTemplate(source, name="hostile").render(messages)
        assert not sentinel.exists(), source
    assert messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
])
def test_a_render_that_never_ends_is_stopped(monkeypatch, source):
    """Nested loops or an exponential macro (found by tests/fuzz's chat_template target) would keep
    a request busy for hours: the render stops at the deadline with the sandbox's error, and the
    next render runs untraced by it."""
    import time

    import gguflm.chat

    monkeypatch.setattr(gguflm.chat, "MAX_RENDER_SECONDS", 0.3)
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="sandbox rule: the render ran past 0.3 s"):
        ChatTemplate(source, name="endless").render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 10
    assert sys.gettrace() is None
    assert ChatTemplate("{{ messages[0].content }}").render([{"role": "user", "content": "hi"}]) == "hi"


def test_hostile_template_from_model_metadata_raises_through_llm(tmp_path):
    """A template arriving in the model's metadata goes through the same sandbox."""
    from gguflm.llm import LLM

    sentinel = tmp_path / "pwned"
    evil = f"{{{{ cycler.__init__.__globals__.os.system('touch {sentinel}') }}}}"
    with LLM(ARCH / "llama.gguf", n_ctx=256, n_threads=1, progress=False,
             kv_overrides={"tokenizer.chat_template": evil}) as llm:
        with pytest.raises(ChatTemplateError, match="sandbox"):
            llm.chat([{"role": "user", "content": "hi"}], max_tokens=2)
    assert not sentinel.exists()


def test_template_errors_are_clear():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% if %}")
    with pytest.raises(ChatTemplateError, match="rejected the conversation: roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render([{"role": "user"}])
    with pytest.raises(TypeError):
        builtin_template("chatml").render("hello")
    with pytest.raises(TypeError):
        builtin_template("chatml").render([("user", "hi")])
    with pytest.raises(ValueError, match="role"):
        builtin_template("chatml").render([{"content": "hi"}])
    with pytest.raises(TypeError):
        ChatTemplate(b"{{ x }}")


def test_hf_variables_and_filters():
    source = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}={{ m['content'] | tojson }};"
              "{% if loop.index == 1 %}{% continue %}{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}{{ eos_token }}{% endif %}{{ tools | length }}")
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    out = template.render([{"role": "user", "content": "héllo \"x\""}], tools=[1, 2])
    assert out == '<s>user="héllo \\"x\\"";</s>2'
    assert template.render([{"role": "user", "content": "a"}], add_generation_prompt=False,
                           tools=[]) == '<s>user="a";0'


# -- which template a model gets

def test_model_without_template_raises_naming_model():
    model = Model.load(ARCH / "llama.gguf", vocab_only=True)
    with pytest.raises(ChatTemplateError) as err:
        template_for_model(model)
    message = str(err.value)
    assert "tiny-llama" in message and "llama.gguf" in message and "chat_template" in message
    assert template_for_model(model, "chatml").name == "chatml"
    assert template_for_model(model, "{{ messages[0]['content'] }}").render(
        [{"role": "user", "content": "x"}]) == "x"


def test_gemma_family_falls_back_to_builtin_with_info_log(caplog):
    model = Model.load(ARCH / "gemma3.gguf", vocab_only=True)
    with caplog.at_level(logging.INFO, logger="gguflm"):
        template = template_for_model(model)
    assert template.name == "gemma"
    assert any("built-in 'gemma' template" in r.getMessage() for r in caplog.records)


def test_named_metadata_template_is_found():
    named = {"tokenizer.chat_template.tool_use": "TOOLS{{ messages | length }}"}
    model = Model.load(ARCH / "llama.gguf", vocab_only=True, kv_overrides=named)
    template = template_for_model(model, "tool_use")
    assert template.render([{"role": "user", "content": "x"}]) == "TOOLS1"
