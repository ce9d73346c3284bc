"""``gguflm.llama_cpp.Llama`` side by side with ``llama_cpp.Llama`` on the same files: the names it
has, vocabulary-only loads of every tokenizer test vocabulary, the low-level loop (eval, sample,
generate), the seed chain (the same sampled text without a seed), logits processors and stopping
criteria, save/load, a draft model that changes nothing but the speed, and the prompt cache that
makes a repeated long prompt cost one token."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import pytest

import gguflm.llama_cpp as ours
from _llama import require_peer

VOCAB_DIR = Path(__file__).resolve().parent / "data" / "vocab"


def test_every_public_name_of_llama_cpp_python_exists():
    llama_cpp = require_peer()
    theirs = {n for n in dir(llama_cpp.Llama) if not n.startswith("_")}
    assert not sorted(n for n in theirs if not hasattr(ours.Llama, n))
    for name in ("LlamaGrammar", "LogitsProcessorList", "StoppingCriteriaList", "LlamaCache", "LlamaRAMCache",
                 "LlamaDiskCache", "LlamaState", "LlamaTokenizer", "LLAMA_POOLING_TYPE_MEAN",
                 "LLAMA_ROPE_SCALING_TYPE_YARN", "ChatCompletionRequestUserMessage", "CreateCompletionResponse"):
        assert hasattr(ours, name) and hasattr(llama_cpp, name), name
    assert ours.LLAMA_POOLING_TYPE_RANK == llama_cpp.LLAMA_POOLING_TYPE_RANK
    assert ours.LLAMA_ROPE_SCALING_TYPE_LONGROPE == llama_cpp.LLAMA_ROPE_SCALING_TYPE_LONGROPE


@pytest.mark.parametrize("vocab", sorted(p.name for p in VOCAB_DIR.glob("ggml-vocab-*.gguf")))
def test_vocab_only_loads_any_architecture(vocab):
    llama_cpp = require_peer()
    path = str(VOCAB_DIR / vocab)
    mine, theirs = ours.Llama(path, vocab_only=True, verbose=False), llama_cpp.Llama(path, vocab_only=True,
                                                                                    verbose=False)
    try:
        for text in (b"Hello World", b" leading space", b"caf\xc3\xa9 \xf0\x9f\x99\x82 12345", b""):
            for add_bos, special in itertools.product((True, False), repeat=2):
                tokens = mine.tokenize(text, add_bos=add_bos, special=special)
                assert tokens == theirs.tokenize(text, add_bos=add_bos, special=special), (text, add_bos, special)
                assert mine.detokenize(tokens) == theirs.detokenize(tokens)
        assert mine.metadata["general.architecture"] == theirs.metadata["general.architecture"]
        assert (mine.token_bos(), mine.token_eos()) == (theirs.token_bos(), theirs.token_eos())
        with pytest.raises(Exception, match="vocab_only"):
            mine.create_completion("x")
    finally:
        mine.close()
        theirs.close()


@pytest.fixture(scope="module")
def pair(smollm_path):
    llama_cpp = require_peer()
    kwargs = dict(n_ctx=512, n_threads=2, n_threads_batch=2, verbose=False)
    mine, theirs = ours.Llama(str(smollm_path), **kwargs), llama_cpp.Llama(str(smollm_path), **kwargs)
    yield mine, theirs
    mine.close()
    theirs.close()


def test_eval_sample_generate_and_the_seed_chain(pair):
    mine, theirs = pair
    tokens = mine.tokenize(b"The quick brown fox jumps over the lazy dog. The quick brown fox")
    for llm in pair:
        llm.reset()
        llm.eval(tokens)
    assert mine.n_tokens == theirs.n_tokens == len(tokens)
    assert mine.input_ids[:len(tokens)].tolist() == theirs.input_ids[:len(tokens)].tolist()
    assert mine.sample(temp=0.0) == theirs.sample(temp=0.0)
    greedy = [list(itertools.islice(llm.generate(tokens, temp=0.0), 8)) for llm in pair]
    assert greedy[0] == greedy[1] and mine.n_tokens == theirs.n_tokens
    for llm in pair:   # the seed chain: requests without a seed follow set_seed's
        llm.set_seed(1337)
    texts = [[llm.create_completion("Pick a colour:", max_tokens=6, temperature=1.0)["choices"][0]["text"]
              for _ in range(2)] for llm in pair]
    assert texts[0] == texts[1] and texts[0][0] != texts[0][1]


def test_processors_criteria_and_state(pair):
    mine, theirs = pair
    tokens = mine.tokenize(b"Numbers: 1, 2, 3,")
    banned = mine.tokenize(b" 4", add_bos=False)[0]

    def ban(input_ids, scores):
        scores[banned] = -np.inf
        return scores

    def stop_after(n):
        return lambda input_ids, logits: len(input_ids) >= len(tokens) + n

    out = [list(llm.generate(tokens, temp=0.0, logits_processor=ours.LogitsProcessorList([ban]),
                             stopping_criteria=ours.StoppingCriteriaList([stop_after(5)]))) for llm in pair]
    assert out[0] == out[1] and banned not in out[0] and len(out[0]) == 5
    for llm in pair:
        llm.reset()
        llm.eval(tokens)
    states = [llm.save_state() for llm in pair]
    expected = [list(itertools.islice(llm.generate(tokens, temp=0.0), 4)) for llm in pair]
    for llm, state in zip(pair, states):
        llm.reset()
        llm.eval(llm.tokenize(b"Something else entirely"))
        llm.load_state(state)
    assert mine.n_tokens == len(tokens) and mine.input_ids[:len(tokens)].tolist() == tokens
    after = [list(itertools.islice(llm.generate(tokens, temp=0.0), 4)) for llm in pair]
    assert after == expected and after[0] == after[1]


def test_a_draft_model_changes_nothing_but_the_speed(smollm_path):
    text = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
            "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n")
    outs = []
    for draft in (None, ours.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=4)):
        with ours.Llama(str(smollm_path), n_ctx=512, draft_model=draft, verbose=False) as llm:
            tokens = llm.tokenize(text.encode())
            outs.append(list(itertools.islice(llm.generate(tokens, temp=0.0), 24)))
    assert outs[0] == outs[1]


def test_a_cache_hit_decodes_one_prompt_token(smollm_path):
    """A 400-token prompt, another request that evicts it from the context, then the first prompt
    again: the RAM cache's state is loaded and only the last prompt token is decoded."""
    words = " ".join(f"item{i}" for i in range(200))
    with ours.Llama(str(smollm_path), n_ctx=1024, verbose=False) as llm:
        llm.set_cache(ours.LlamaRAMCache())
        prompt = llm.tokenize(words.encode())
        assert len(prompt) >= 400
        t0 = time.perf_counter()
        first = llm.create_completion(prompt, max_tokens=1, temperature=0.0)
        ttft_first = time.perf_counter() - t0
        llm.create_completion("An unrelated request", max_tokens=1, temperature=0.0)
        decoded = llm.context.perf()["n_p_eval"] + llm.context.perf()["n_eval"]
        t0 = time.perf_counter()
        again = llm.create_completion(prompt, max_tokens=1, temperature=0.0)
        ttft_again = time.perf_counter() - t0
        assert llm.context.perf()["n_p_eval"] + llm.context.perf()["n_eval"] - decoded == 1
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
    print(f"\n{len(prompt)}-token prompt: first {1e3 * ttft_first:.0f} ms, cache hit {1e3 * ttft_again:.0f} ms "
          f"({100 * ttft_again / ttft_first:.1f}%)")
