"""Speculative decoding (gguflm.speculative, the token loop's draft checks): the tokens are those of
generation without it, for prompt lookup and for a draft model (a requantization of the same
model), greedy and seeded, with grammars, stop strings, logprobs and streaming; the n-gram index
answers as llama-cpp-python's find_candidate_pred_tokens; a draft vocabulary that differs is
refused."""

from __future__ import annotations

import re
import subprocess
import sys

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguflm
from _derived import derived_dir
from _llama import import_peer
from gguflm import Batch, Context, Model
from tiny_models import ARCHS, MOE_ARCHS, N_VOCAB, tiny_models, write_tiny_model
from gguflm.cli import main as cli_main
from gguflm.llama_cpp.llama_speculative import LlamaPromptLookupDecoding
from gguflm.speculative import PromptLookup, Speculation, SpeculationError, prompt_lookup

# input-grounded prompts: the reply copies much of the prompt
TYPO_PROMPT = ("Fix the typos in this paragraph:\n\nThe quick brwon fox jumpd over the lazy dog. It was a "
               "sunny day and the fox was veyr happy. The dog did not care at all.\n\nCorrected paragraph:\n")
JSON_PROMPT = ('Change the age to 31 and repeat the JSON document.\n{"name": "Ada", "age": 30, "city": '
               '"London", "tags": ["math", "code"]}\nResult:\n')
JSON_GRAMMAR = r'''root ::= "{" ws pair ("," ws pair)* ws "}"
pair ::= "\"" [a-z]+ "\"" ws ":" ws value
value ::= "\"" [A-Za-z ]* "\"" | [0-9]+ | "[" ws ("\"" [a-z]* "\"" ("," ws "\"" [a-z]* "\"")*)? ws "]"
ws ::= [ ]?
'''
N_TOKENS = 32
REQUANT = {"smollm": "Q4_0", "gemma": "Q2_K"}


def _requantized(path, ftype: str, tmp_path_factory):
    """``path`` requantized to ``ftype`` (gguflm quantize --allow-requantize), made once per machine."""
    draft = derived_dir(tmp_path_factory) / f"{path.stem}.requant-{ftype}.gguf"
    if not draft.exists():
        part = draft.with_suffix(".part.gguf")
        assert cli_main(["quantize", "--allow-requantize", str(path), str(part), ftype]) == 0
        part.rename(draft)
    return draft


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def model(request, tmp_path_factory):
    """(target path, draft path): the draft is the target requantized."""
    path = request.getfixturevalue(f"{request.param}_path")
    return path, _requantized(path, REQUANT[request.param], tmp_path_factory)


@pytest.fixture(scope="module")
def llms(model):
    """The target without speculation, with prompt lookup and with the draft model."""
    path, draft = model
    made = {"plain": gguflm.LLM(path, n_ctx=512),
            "lookup": gguflm.LLM(path, n_ctx=512, draft_model=LlamaPromptLookupDecoding()),
            "draft": gguflm.LLM(path, n_ctx=512, draft_model=str(draft), draft_max=6, draft_p_min=0.3)}
    yield made
    for llm in made.values():
        llm.close()


@pytest.fixture(scope="module")
def plain(llms):
    """complete() without speculation, each request run once for both proposers' tests."""
    done: dict = {}

    def complete(prompt: str, **options):
        key = (prompt, tuple(sorted(options.items())))
        if key not in done:
            result = llms["plain"].complete(prompt, max_tokens=N_TOKENS, **options)
            done[key] = [(c.text, c.token_ids, c.finish_reason) for c in result] if options.get("stream") else result
        return done[key]
    return complete


def _same(a: gguflm.Completion, b: gguflm.Completion) -> None:
    assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)


@pytest.mark.parametrize("proposer", ["lookup", "draft"])
@pytest.mark.parametrize("seed", [None, 7], ids=["greedy", "seeded"])
def test_the_tokens_of_generation_without_speculation(llms, plain, proposer, seed):
    sampling = {"temperature": 0.0} if seed is None else {"temperature": 0.8, "seed": seed}
    want = plain(TYPO_PROMPT, **sampling)
    got = llms[proposer].complete(TYPO_PROMPT, max_tokens=N_TOKENS, **sampling)
    _same(want, got)
    assert got.timings.draft_n > 0   # drafts were checked, and some taken
    assert 0 < got.timings.draft_accepted <= got.timings.draft_n


@pytest.mark.parametrize("proposer", ["lookup", "draft"])
def test_grammar_stop_strings_logprobs_and_streaming_unchanged(llms, plain, proposer):
    options = {"temperature": 0.0, "grammar": JSON_GRAMMAR, "logprobs": 2}
    want = plain(JSON_PROMPT, **options)
    got = llms[proposer].complete(JSON_PROMPT, max_tokens=N_TOKENS, **options)
    _same(want, got)
    assert [(p.token, p.logprob, p.top) for p in got.logprobs] == \
        [(p.token, p.logprob, p.top) for p in want.logprobs]
    assert got.timings.draft_accepted > 0
    # a stop string inside a copied stretch, streamed: the same chunks
    stop = want.text[len(want.text) // 2:len(want.text) // 2 + 3]
    expected = plain(JSON_PROMPT, stop=stop, stream=True, **options)
    chunks = [(c.text, c.token_ids, c.finish_reason) for c in llms[proposer].complete(
        JSON_PROMPT, max_tokens=N_TOKENS, stop=stop, stream=True, **options)]
    assert chunks == expected
    assert expected[-1][2] == "stop"


def _one_token_and_per_token_logits(model: Model, tokens: list[int], n_prompt: int, type_k: str,
                                    n_threads: int) -> tuple[np.ndarray, np.ndarray]:
    """The logits of tokens[n_prompt:] decoded one at a time, and in one per_token batch."""
    ctx = Context(model, n_ctx=256, n_threads=n_threads, type_k=type_k, type_v=type_k)
    try:
        assert ctx.decode(Batch.get_one(tokens[:n_prompt])) == 0
        single = []
        for tok in tokens[n_prompt:]:
            assert ctx.decode(Batch.get_one([tok])) == 0
            single.append(ctx.get_logits_ith(-1).copy())
        ctx.memory.seq_rm(0, n_prompt, -1)
        batch = Batch(len(tokens) - n_prompt)
        for pos, tok in enumerate(tokens[n_prompt:], n_prompt):
            batch.add(tok, pos, [0], True)
        assert ctx.decode(batch, per_token=True) == 0
        return np.stack(single), ctx.get_logits().copy()
    finally:
        ctx.close()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=tiny_models(tuple(a for a in ARCHS if a not in MOE_ARCHS)).filter(lambda s: not s.n_expert),
       n_draft=st.integers(2, 17), type_k=st.sampled_from(("f16", "f32", "q8_0")), seed=st.integers(0, 99))
def test_a_per_token_batch_gives_one_token_logits_for_any_weight_type(spec, n_draft, type_k, seed):
    """Every weight type, cache type and draft size: the batch that checks drafts gives the bits
    of one-token decodes (the default batch takes other recipes: llama.cpp's)."""
    if type_k == "q8_0" and spec.head_dim % 32:
        type_k = "f16"   # Q8_0 blocks must tile a head
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, N_VOCAB, size=7 + n_draft).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{spec.arch}.gguf"
        write_tiny_model(spec, path, rng)
        with Model.load(path) as model:
            single, batched = _one_token_and_per_token_logits(model, tokens, 7, type_k, 2)
    assert np.array_equal(batched.view(np.uint32), single.view(np.uint32))


@pytest.mark.parametrize("n_draft", [2, 5, 9, 17])
def test_a_per_token_batch_gives_one_token_logits_on_the_real_models(model, n_draft):
    path, _ = model
    with Model.load(path) as target:
        tokens = target.vocab.tokenize(TYPO_PROMPT)[:12 + n_draft]
        single, batched = _one_token_and_per_token_logits(target, tokens, 12, "f16", 2)
    assert np.array_equal(batched.view(np.uint32), single.view(np.uint32))


def test_a_draft_model_of_another_vocabulary_is_refused(smollm_path, gemma_path):
    with pytest.raises(SpeculationError, match="cannot draft for this model"):
        gguflm.LLM(smollm_path, n_ctx=256, draft_model=str(gemma_path))


def test_the_ngram_index_answers_as_find_candidate_pred_tokens():
    theirs = import_peer("llama_cpp.llama_speculative").LlamaPromptLookupDecoding
    rng = np.random.default_rng(5)
    for trial in range(40):
        ids = rng.integers(0, 2 + trial % 6, size=int(rng.integers(1, 60))).astype(np.intc)
        max_ngram, n_pred = int(rng.integers(1, 4)), int(rng.integers(1, 8))
        index = PromptLookup(max_ngram, n_pred)
        index.begin(ids[:1].tolist())
        for n in range(1, len(ids) + 1):
            expected = theirs.find_candidate_pred_tokens(ids[:n], max_ngram, n_pred)
            assert index.propose(ids[:n].tolist(), n_pred) == expected.tolist()
            assert prompt_lookup(ids[:n], max_ngram, n_pred).tolist() == expected.tolist()


class _Fixed:
    """A proposer that always proposes the same tokens."""

    def __init__(self, tokens):
        self.tokens = tokens

    def begin(self, prompt):
        pass

    def propose(self, history, n_max):
        return self.tokens[:n_max]

    def close(self):
        pass


def test_draft_length_adapts_and_misses_back_off():
    spec = Speculation(_Fixed(list(range(8))), n_max=8, n_min=2)
    spec.begin([1])
    assert len(spec.draft([1], 100)) == 8
    spec.update(8, 3)                       # a partial draft: next one more than taken
    assert len(spec.draft([1], 100)) == 4
    spec.update(4, 4)                       # taken whole: doubles
    assert len(spec.draft([1], 100)) == 8
    assert len(spec.draft([1], 7)) == 4     # never past the room, and a power of two
    assert spec.draft([1], 1) == []         # shorter than draft_min: not checked
    spec.update(8, 0)                       # gained nothing: the next proposal is skipped
    assert spec.draft([1], 100) == []
    assert spec.draft([1], 100) != []
    spec.update(2, 0)                       # again: three skipped
    assert [spec.draft([1], 100) for _ in range(3)] == [[], [], []]
    assert spec.draft([1], 100) != []
    assert spec.stats.n_drafted == 22 and spec.stats.n_accepted == 7
    short = Speculation(_Fixed(list(range(6))), n_max=8)
    short.begin([1])
    assert short.draft([1], 100) == [0, 1, 2, 3]   # a proposal cut to a power of two
    with pytest.raises(SpeculationError):
        Speculation(_Fixed([]), n_max=2, n_min=3)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gguflm.cli", *args], capture_output=True, text=True,
                          timeout=600)


def test_run_with_prompt_lookup_and_a_draft_model(smollm_path, tmp_path_factory):
    path, draft = smollm_path, _requantized(smollm_path, REQUANT["smollm"], tmp_path_factory)
    common = ("run", "-m", str(path), "-p", TYPO_PROMPT, "-n", "24", "--temp", "0", "-t", "1", "-c", "512")
    plain = _cli(*common)
    assert plain.returncode == 0, plain.stderr
    for extra in (("--spec-type", "ngram", "--draft-max", "8"), ("--model-draft", str(draft), "--draft-p-min", "0.2")):
        done = _cli(*common, *extra)
        assert done.returncode == 0, done.stderr
        assert done.stdout == plain.stdout
        accepted, drafted = map(int, re.search(r"draft: (\d+)/(\d+) accepted", done.stderr).groups())
        assert 0 < accepted <= drafted
    both = _cli(*common, "--spec-type", "ngram", "--model-draft", str(draft))
    assert both.returncode != 0 and "not both" in both.stderr


def test_bench_speculative_prints_speeds_acceptance_and_same_tokens(smollm_path):
    done = _cli("bench", "--speculative", "-m", str(smollm_path), "-n", "12", "-r", "1", "-t", "1",
                "--tasks", "json,function")
    assert done.returncode == 0, done.stderr
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith(("| task", "| ---"))]
    assert [(r[0], r[1]) for r in rows] == [(t, e) for t in ("json", "function")
                                           for e in ("gguflm", "gguflm + lookup")]
    for task, engine, speed, ratio, accepted, same in rows:
        assert float(speed) > 0 and ratio.endswith("x")
        if engine == "gguflm + lookup":
            assert same == "yes" and accepted.endswith(tuple("0123456789"))
