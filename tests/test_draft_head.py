"""A draft model's output layer restricted to the request's tokens (gguflm.speculative.ContextHead,
``LLM(draft_head="context")``): its logits are llama.cpp's at those tokens, and generation with it
gives the tokens of generation without speculation, greedy and seeded, on both real models."""

from __future__ import annotations

import numpy as np
import pytest

import gguflm
from _llama import import_peer, llama_prompt_logits
from gguflm import Context, Model
from gguflm.speculative import ContextHead, DraftModel, SpeculationError
from test_speculative import JSON_PROMPT, REQUANT, TYPO_PROMPT, _requantized

N_TOKENS = 24


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def model(request, tmp_path_factory):
    """(target path, draft path): the draft is the target requantized."""
    path = request.getfixturevalue(f"{request.param}_path")
    return path, _requantized(path, REQUANT[request.param], tmp_path_factory)


def test_context_head_logits_are_llama_cpps_at_the_requests_tokens(model):
    import_peer()
    _, draft = model
    m = Model.load(draft)
    try:
        prompt = m.vocab.tokenize(TYPO_PROMPT)
        head = ContextHead(m)
        head.begin(prompt[:-8])
        head.follow(prompt)   # the tokens after the prompt join the rows
        assert set(head.ids) == set(prompt) | set(m.vocab.eog_ids)
        with Context(m, n_ctx=256, embeddings=True, logits=False, pooling="none") as ctx:
            from gguflm.generate import Session
            Session(ctx).ingest(prompt)
            ours = head.logits(ctx.get_embeddings_ith(-1))
    finally:
        m.close()
    theirs = llama_prompt_logits(draft, prompt, n_ctx=256)[-1][head.ids]
    # float32 rows against llama.cpp's 8-bit quantized activations: close, not equal
    np.testing.assert_allclose(ours, theirs, atol=0.02 * float(np.abs(theirs).max()))
    assert int(np.argmax(ours)) == int(np.argmax(theirs))


@pytest.fixture(scope="module")
def llms(model):
    path, draft = model
    made = {"plain": gguflm.LLM(path, n_ctx=512),
            "head": gguflm.LLM(path, n_ctx=512, draft_model=str(draft), draft_max=4, draft_head="context")}
    yield made
    for llm in made.values():
        llm.close()


@pytest.mark.parametrize("prompt, seed", [(TYPO_PROMPT, None), (JSON_PROMPT, 7)], ids=["typos-greedy", "json-seeded"])
def test_a_context_head_draft_gives_the_tokens_without_speculation(llms, prompt, seed):
    options = {"temperature": 0.0} if seed is None else {"temperature": 0.8, "seed": seed}
    a = llms["plain"].complete(prompt, max_tokens=N_TOKENS, stop=["\n\n\n"], **options)
    b = llms["head"].complete(prompt, max_tokens=N_TOKENS, stop=["\n\n\n"], **options)
    assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)
    assert b.timings.draft_n > 0 and b.timings.draft_accepted > 0   # it did draft, and was taken


def test_an_unknown_draft_head_is_refused(smollm_path):
    with pytest.raises(SpeculationError, match="draft_head"):
        DraftModel(smollm_path, Model.load(smollm_path, vocab_only=True).vocab, n_ctx=64, head="tiny")
