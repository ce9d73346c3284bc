"""llama-server's own endpoints on `gguflm serve` (`/tokenize`, `/detokenize`, `/apply-template`,
`/props`, `/health`) in its shapes, against llama.cpp's vocabulary, and `/v1/embeddings` from a
generation server when the model pools."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
openai = pytest.importorskip("openai")

from _llama import LlamaVocab, require_peer  # noqa: E402
from gguflm import LLM  # noqa: E402
from gguflm.server import create_app  # noqa: E402
from test_server import KEY, MESSAGES, THREADS, Served  # noqa: E402

TEXT = "Hello <|im_start|> wörld ✓"


@pytest.fixture(scope="module")
def served(smollm_path) -> Iterator[Served]:
    s = Served(create_app(smollm_path, parallel=2, n_ctx=1024, api_key=KEY, n_threads=THREADS,
                          pooling_type="mean"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def vocab(smollm_path) -> LlamaVocab:
    return LlamaVocab(smollm_path)


def test_tokenize_as_llama_server(served, vocab):
    for add_special in (False, True):
        for parse_special in (False, True):
            status, body = served.json("POST", "/tokenize", {"content": TEXT, "add_special": add_special,
                                                            "parse_special": parse_special})
            assert status == 200
            assert body["tokens"] == vocab.tokenize(TEXT.encode(), add_special, parse_special)
    # an array mixes texts and ids; only a leading text gets the special tokens
    mixed = ["Hi", 42, " there"]
    status, body = served.json("POST", "/tokenize", {"content": mixed, "add_special": True})
    assert body["tokens"] == (vocab.tokenize(b"Hi", True, True) + [42]
                              + vocab.tokenize(b" there", False, True))
    status, body = served.json("POST", "/tokenize", {"content": TEXT, "with_pieces": True})
    ids = vocab.tokenize(TEXT.encode(), False, True)
    assert [t["id"] for t in body["tokens"]] == ids
    for item, tok in zip(body["tokens"], ids):
        piece = vocab.token_to_piece(tok, 0, True)
        try:
            assert item["piece"] == piece.decode("utf-8")
        except UnicodeDecodeError:           # part of a character: its bytes
            assert item["piece"] == list(piece)
    assert any(isinstance(t["piece"], list) for t in body["tokens"])   # the ✓ is split
    assert served.json("POST", "/tokenize", {}) == (200, {"tokens": []})


def test_detokenize_joins_the_pieces_with_special_tokens(served, vocab):
    ids = vocab.tokenize(TEXT.encode(), True, True)
    status, body = served.json("POST", "/detokenize", {"tokens": ids})
    expected = b"".join(vocab.token_to_piece(t, 0, True) for t in ids).decode("utf-8", "replace")
    assert (status, body) == (200, {"content": expected})
    assert served.json("POST", "/detokenize", {}) == (200, {"content": ""})


def test_apply_template_is_the_chat_prompt(served):
    client = served.client()
    status, body = served.json("POST", "/apply-template", {"messages": MESSAGES})
    assert status == 200 and set(body) == {"prompt"}
    llm = served.app.state.server.llm
    assert body["prompt"] == llm.apply_chat_template(MESSAGES)
    reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1)
    status, tokens = served.json("POST", "/tokenize", {"content": body["prompt"], "add_special": True})
    assert len(tokens["tokens"]) == reply.usage.prompt_tokens
    status, error = served.json("POST", "/apply-template", {"messages": "hi"})
    assert status == 400 and error["error"]["param"] == "messages"


def test_props_and_health(served, smollm_path, vocab):
    assert served.json("GET", "/health", key=None) == (200, {"status": "ok"})
    status, props = served.json("GET", "/props")
    assert status == 200
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 512
    assert props["model_path"] == str(smollm_path)
    llama_cpp = require_peer()
    ref = llama_cpp.Llama(str(smollm_path), vocab_only=True, verbose=False)
    try:
        assert props["chat_template"] == ref.metadata["tokenizer.chat_template"]
        assert props["bos_token"] == vocab.token_to_piece(ref.token_bos(), 0, True).decode()
        assert props["eos_token"] == vocab.token_to_piece(ref.token_eos(), 0, True).decode()
    finally:
        ref.close()
    assert served.json("GET", "/props", key=None)[0] == 401


def test_embeddings_from_the_generation_server(served, smollm_path):
    texts = ["A man is eating.", "A cat sleeps."]
    reply = served.client().embeddings.create(model="m", input=texts)
    with LLM(smollm_path, embedding=True, pooling_type="mean", n_ctx=512, progress=False,
             n_threads=THREADS) as llm:
        ours = llm.create_embedding(texts)
    assert [d.embedding for d in reply.data] == [d["embedding"] for d in ours["data"]]
    llama_cpp = require_peer()
    ref = llama_cpp.Llama(str(smollm_path), embedding=True, n_ctx=512, verbose=False, n_threads=THREADS, n_threads_batch=THREADS,
                          pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    try:
        theirs = ref.create_embedding(texts)
    finally:
        ref.close()
    for mine, their in zip(reply.data, theirs["data"]):
        np.testing.assert_allclose(mine.embedding, their["embedding"], rtol=1e-4, atol=1e-4)
    # the server still generates
    assert served.client().completions.create(model="m", prompt="Hi", max_tokens=2).usage.completion_tokens


def test_embeddings_need_a_pooling_model(smollm_path):
    s = Served(create_app(smollm_path, parallel=1, n_ctx=256, n_threads=THREADS))
    try:
        status, error = s.json("POST", "/v1/embeddings", {"input": "hi"}, key=None)
        assert status == 501 and "pooling" in error["error"]["message"]
    finally:
        s.close()


def test_rerank_as_llama_server():
    reranker = Path(__file__).resolve().parent / "data" / "arch" / "jina-bert-v2.gguf"
    query, docs = "query text", ["alpha beta", "gamma", "delta epsilon zeta"]
    with LLM(reranker, embedding=True, pooling_type="rank", n_ctx=256, progress=False) as llm:
        scores = llm.rerank(query, docs)
        from gguflm.embedding import rerank_tokens

        n_tokens = sum(len(rerank_tokens(llm.model, query, d)) for d in docs)
    best = sorted(range(3), key=lambda i: -scores[i])
    s = Served(create_app(reranker, embedding=True, pooling_type="rank", n_ctx=256, n_threads=THREADS))
    try:
        status, body = s.json("POST", "/v1/rerank", {"query": query, "documents": docs, "top_n": 2}, key=None)
        assert status == 200 and body["usage"]["prompt_tokens"] == n_tokens
        assert body["results"] == [{"index": i, "relevance_score": scores[i]} for i in best[:2]]
        status, body = s.json("POST", "/rerank", {"query": query, "texts": docs, "return_text": True}, key=None)
        assert body == [{"index": i, "score": scores[i], "text": docs[i]} for i in best]
        status, error = s.json("POST", "/v1/rerank", {"query": query, "documents": []}, key=None)
        assert status == 400 and error["error"]["param"] == "documents"
    finally:
        s.close()


def test_rerank_needs_a_reranker(served):
    status, error = served.json("POST", "/v1/rerank", {"query": "q", "documents": ["d"]})
    assert status == 501 and "--pooling rank" in error["error"]["message"]
