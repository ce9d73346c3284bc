"""Speculative decoding (gguflm.speculative, the token loop's draft checks): the tokens are those of
generation without it, for prompt lookup and for a draft model (a requantization of the same
model), greedy and seeded, with grammars, stop strings, logprobs and streaming; the n-gram index
answers as llama-cpp-python's find_candidate_pred_tokens; a draft vocabulary that differs is
refused."""

from __future__ import annotations

import numpy as np
import pytest

import gguflm
from _derived import derived_dir
from _llama import import_peer
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
N_TOKENS = 40
REQUANT = {"smollm": "Q4_0", "gemma": "Q2_K"}


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def model(request, tmp_path_factory):
    """(name, target path, draft path): the draft is the target requantized (gguflm quantize
    --allow-requantize), made once per machine."""
    name = request.param
    path = request.getfixturevalue(f"{name}_path")
    draft = derived_dir(tmp_path_factory) / f"{path.stem}.requant-{REQUANT[name]}.gguf"
    if not draft.exists():
        part = draft.with_suffix(".part.gguf")
        assert cli_main(["quantize", "--allow-requantize", str(path), str(part), REQUANT[name]]) == 0
        part.rename(draft)
    return name, path, draft


@pytest.fixture(scope="module")
def llms(model):
    """The target without speculation, with prompt lookup and with the draft model."""
    _, path, draft = model
    made = {"plain": gguflm.LLM(path, n_ctx=512),
            "lookup": gguflm.LLM(path, n_ctx=512, draft_model=LlamaPromptLookupDecoding()),
            "draft": gguflm.LLM(path, n_ctx=512, draft_model=str(draft), draft_max=6, draft_p_min=0.3)}
    yield made
    for llm in made.values():
        llm.close()


def _same(a: gguflm.Completion, b: gguflm.Completion) -> None:
    assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)


@pytest.mark.parametrize("proposer", ["lookup", "draft"])
@pytest.mark.parametrize("seed", [None, 7], ids=["greedy", "seeded"])
def test_the_tokens_of_generation_without_speculation(llms, proposer, seed):
    sampling = {"temperature": 0.0} if seed is None else {"temperature": 0.8, "seed": seed}
    want = llms["plain"].complete(TYPO_PROMPT, max_tokens=N_TOKENS, **sampling)
    got = llms[proposer].complete(TYPO_PROMPT, max_tokens=N_TOKENS, **sampling)
    _same(want, got)
    assert got.timings.draft_n > 0   # drafts were checked, and some taken
    assert 0 < got.timings.draft_accepted <= got.timings.draft_n


@pytest.mark.parametrize("proposer", ["lookup", "draft"])
def test_grammar_stop_strings_logprobs_and_streaming_unchanged(llms, proposer):
    options = {"temperature": 0.0, "grammar": JSON_GRAMMAR, "logprobs": 2}
    want = llms["plain"].complete(JSON_PROMPT, max_tokens=N_TOKENS, **options)
    got = llms[proposer].complete(JSON_PROMPT, max_tokens=N_TOKENS, **options)
    _same(want, got)
    assert [(p.token, p.logprob, p.top) for p in got.logprobs] == \
        [(p.token, p.logprob, p.top) for p in want.logprobs]
    assert got.timings.draft_accepted > 0
    # a stop string inside a copied stretch, streamed: the same chunks
    stop = want.text[len(want.text) // 2:len(want.text) // 2 + 3]
    chunks = [[(c.text, c.token_ids, c.finish_reason) for c in llm.complete(
        JSON_PROMPT, max_tokens=N_TOKENS, stop=stop, stream=True, **options)] for llm in (llms["plain"], llms[proposer])]
    assert chunks[1] == chunks[0]
    assert chunks[0][-1][2] == "stop"


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
    assert len(spec.draft([1], 5)) == 5     # never past the room
    assert spec.draft([1], 1) == []         # shorter than draft_min: not checked
    spec.update(8, 0)                       # gained nothing: the next proposal is skipped
    assert spec.draft([1], 100) == []
    assert spec.draft([1], 100) != []
    spec.update(2, 0)                       # again: three skipped
    assert [spec.draft([1], 100) for _ in range(3)] == [[], [], []]
    assert spec.draft([1], 100) != []
    assert spec.stats.n_drafted == 22 and spec.stats.n_accepted == 7
    with pytest.raises(SpeculationError):
        Speculation(_Fixed([]), n_max=2, n_min=3)
