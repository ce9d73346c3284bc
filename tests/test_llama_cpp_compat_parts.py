"""Parts of ``gguflm.llama_cpp`` checked against llama-cpp-python itself: every registered
``chat_format`` builds its prompt (stop, added_special, errors included) for any messages, the
prompt-lookup draft model proposes the same tokens, and the prompt caches find the longest prefix
and drop the least recently used past their capacity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _llama import import_peer
from gguflm.llama_cpp import llama_chat_format as ours_format
from gguflm.llama_cpp.llama_cache import LlamaDiskCache, LlamaRAMCache
from gguflm.llama_cpp.llama_speculative import LlamaPromptLookupDecoding

ROLES = ["system", "user", "assistant", "tool", "function", "User", "Assistant", "bot"]
CONTENTS = st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["", " ", "\n", "[INST]", "<s>"]),
                     st.just([{"type": "text", "text": "part"}]), st.just([]))
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": CONTENTS}), max_size=5)
# llama-cpp-python's function for each name (vicuna's is called `format`)
THEIR_FUNCTIONS = {"llama-2": "format_llama2", "llama-3": "format_llama3", "alpaca": "format_alpaca",
                   "qwen": "format_qwen", "vicuna": "format", "oasst_llama": "format_oasst_llama",
                   "baichuan-2": "format_baichuan2", "baichuan": "format_baichuan", "openbuddy": "format_openbuddy",
                   "redpajama-incite": "format_redpajama_incite", "snoozy": "format_snoozy", "phind": "format_phind",
                   "intel": "format_intel", "open-orca": "format_open_orca", "mistrallite": "format_mistrallite",
                   "zephyr": "format_zephyr", "pygmalion": "format_pygmalion", "chatml": "format_chatml",
                   "mistral-instruct": "format_mistral_instruct", "chatglm3": "format_chatglm3",
                   "openchat": "format_openchat", "saiga": "format_saiga", "gemma": "format_gemma"}


def _outcome(formatter, messages):
    try:
        r = formatter(messages=messages)
    except Exception as exc:   # the same inputs must fail the same way
        return type(exc).__name__
    return r.prompt, r.stop, r.added_special


def test_the_registered_formats_are_llama_cpp_pythons():
    theirs = import_peer("llama_cpp.llama_chat_format")
    registry = theirs.LlamaChatCompletionHandlerRegistry()._chat_handlers
    assert set(THEIR_FUNCTIONS) <= set(registry) and set(ours_format.chat_format_names()) == set(THEIR_FUNCTIONS)


@settings(max_examples=150, deadline=None)
@given(messages=MESSAGES)
def test_every_format_builds_llama_cpp_pythons_prompt(messages):
    theirs = import_peer("llama_cpp.llama_chat_format")
    for name, function in THEIR_FUNCTIONS.items():
        assert _outcome(ours_format.get_chat_format(name), messages) == \
            _outcome(getattr(theirs, function), messages), name


def test_jinja_and_tokenizer_config_formatters():
    theirs = import_peer("llama_cpp.llama_chat_format")
    template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi"}]
    ours = ours_format.Jinja2ChatFormatter(template, eos_token="</s>", bos_token="<s>", stop_token_ids=[7])
    reference = theirs.Jinja2ChatFormatter(template, eos_token="</s>", bos_token="<s>", stop_token_ids=[7])
    a, b = ours(messages=messages), reference(messages=messages)
    assert (a.prompt, a.stop, a.added_special) == (b.prompt, b.stop, b.added_special)
    assert a.stopping_criteria(np.array([1, 7]), None) and not a.stopping_criteria(np.array([7, 1]), None)
    config = {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"}
    a = ours_format.hf_tokenizer_config_to_chat_formatter(config)(messages=messages)
    b = theirs.hf_tokenizer_config_to_chat_formatter(config)(messages=messages)
    assert (a.prompt, a.stop, a.added_special) == (b.prompt, b.stop, b.added_special)
    with pytest.raises(ValueError, match="bos_token"):
        ours_format.hf_tokenizer_config_to_chat_formatter({"chat_template": template, "eos_token": "</s>"})


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 3), max_size=14), max_ngram=st.integers(0, 4), n_pred=st.integers(-1, 5))
def test_prompt_lookup_proposes_llama_cpp_pythons_tokens(ids, max_ngram, n_pred):
    theirs = import_peer("llama_cpp.llama_speculative").LlamaPromptLookupDecoding
    ids = np.array(ids, dtype=np.intc)
    a = LlamaPromptLookupDecoding.find_candidate_pred_tokens(ids, max_ngram, n_pred)
    b = theirs.find_candidate_pred_tokens(ids, max_ngram, n_pred)
    assert np.array_equal(a, b) and a.dtype == b.dtype
    assert np.array_equal(LlamaPromptLookupDecoding(max_ngram, n_pred)(ids), a)


class _State:
    """What the caches read of a state: its size, and what a disk cache writes (about 2.3 kB a file)."""

    def __init__(self, n: int, fill: int):
        self.input_ids = np.arange(n, dtype=np.intc)
        self.scores = np.zeros((1, 4), np.float32)
        self.n_tokens = n
        self.llama_state = bytes([fill]) * 1000
        self.llama_state_size = len(self.llama_state)
        self.seed = fill


@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_caches_find_the_longest_prefix_and_drop_the_least_recently_used(kind, tmp_path):
    cache = LlamaRAMCache(capacity_bytes=2500) if kind == "ram" else LlamaDiskCache(tmp_path, capacity_bytes=5500)
    cache[[1, 2, 3]] = _State(3, 1)
    cache[[1, 2, 9, 9]] = _State(4, 2)
    assert [1, 2, 3, 4] in cache and [5] not in cache
    assert cache[[1, 2, 3, 4]].seed == 1            # the longest shared prefix
    assert cache[[1, 2, 9]].seed == 2
    cache[[1, 2, 3]].seed                           # now the most recently used
    cache[[7]] = _State(1, 3)                       # over capacity: [1, 2, 9, 9] goes
    assert cache[[1, 2, 9]].seed == 1 and cache[[7]].seed == 3
    with pytest.raises(KeyError):
        cache[[8]]
    if kind == "disk":   # another process (a new object) sees the same entries, and states survive
        again = LlamaDiskCache(tmp_path)
        state = again[[7, 1]]
        assert state.seed == 3 and state.llama_state == bytes([3]) * 1000 and state.n_tokens == 1
