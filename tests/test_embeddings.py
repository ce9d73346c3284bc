"""Embeddings and reranking against llama.cpp: the encoders (BERT, nomic-bert, jina-bert-v2) and
decoders with pooling, the LLM API shaped as llama-cpp-python's, the packing, ``gguflm embed``.

llama.cpp's outputs come from the committed files (``tests/data/arch/<encoder>.npz`` for the tiny
encoders, ``tests/data/reference/embeddings/`` for the real models, computed by an AVX-512 build,
whose arithmetic these tests then select) and, when llama-cpp-python is installed, from the peer
itself (in the arithmetic it was built for, which gguflm's native choice matches).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguflm
from _llama import llama_embeddings, require_peer
from conftest import GEMMA_FILE, SMOLLM_FILE, _model
from gguflm import Batch, Context, Model, system
from gguflm.embedding import normalize, pack
from gguflm.pooling import PoolingType, pooling_type
from tiny_models import ENCODER_ARCHS, N_VOCAB, tiny_encoders, write_tiny_model

DATA = Path(__file__).resolve().parent / "data"
ARCH_DIR = DATA / "arch"
MINILM = DATA / "models" / "all-MiniLM-L6-v2-Q8_0.gguf"
REFERENCE = DATA / "reference" / "embeddings"
TEXTS = json.loads((DATA / "reference" / "embedding_texts.json").read_text(encoding="utf-8"))
POOLINGS = ("none", "mean", "cls", "last", "rank")


def bits_equal(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.all(a.view(np.uint32) == b.view(np.uint32)))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def context_embeddings(model: Model, token_lists, pooling: str, **kw) -> list[np.ndarray]:
    """The token lists decoded as one batch (sequence s at positions 0..), pooled per sequence or,
    for pooling none, each list's rows."""
    n = sum(len(t) for t in token_lists)
    with Context(model, n_ctx=max(512, n), n_batch=max(512, n), n_ubatch=max(512, n), n_seq_max=len(token_lists),
                 embeddings=True, pooling=pooling, **kw) as ctx:
        batch = Batch(n)
        for s, tokens in enumerate(token_lists):
            for i, t in enumerate(tokens):
                batch.add(int(t), i, [s], True)
        assert ctx.decode(batch) == 0
        if pooling == "none":
            rows, start, out = ctx.get_embeddings(), 0, []
            for tokens in token_lists:
                out.append(rows[start:start + len(tokens)].copy())
                start += len(tokens)
            return out
        return [ctx.get_embeddings_seq(s).copy() for s in range(len(token_lists))]


# -- tiny encoders: every pooling, llama.cpp's floats

@pytest.fixture(scope="module", params=ENCODER_ARCHS)
def encoder(request):
    ref = np.load(ARCH_DIR / f"{request.param}.npz")
    bounds = np.cumsum(ref["lengths"])[:-1]
    with Model.load(ARCH_DIR / f"{request.param}.gguf") as model:
        yield request.param, model, [t.tolist() for t in np.split(ref["tokens"], bounds)], ref


def test_tiny_encoders_equal_llama_cpp(encoder):
    """Every pooling the fixture has (rank where llama.cpp declares a classification head)."""
    arch, model, seqs, ref = encoder
    poolings = [p for p in POOLINGS if p in ref]
    assert poolings == (list(POOLINGS) if arch != "nomic-bert" else list(POOLINGS[:-1]))
    for pooling in poolings:
        with system.using(arithmetic="zen4"):
            ours = context_embeddings(model, seqs, pooling, n_threads=2)
        assert bits_equal(np.concatenate(ours) if pooling == "none" else np.stack(ours), ref[pooling]), pooling


def test_encoder_pooling_follows_the_rows(encoder):
    """mean, cls and last are the rows of pooling none, pooled; rank is one score per sequence."""
    arch, model, seqs, ref = encoder
    rows = context_embeddings(model, seqs, "none")
    for pooling, expected in (("mean", [r.mean(0) for r in rows]), ("cls", [r[0] for r in rows]),
                              ("last", [r[-1] for r in rows])):
        got = context_embeddings(model, seqs, pooling)
        np.testing.assert_allclose(np.stack(got), np.stack(expected), rtol=1e-5, atol=1e-6)
        assert bits_equal(got, expected) == (pooling != "mean")
    assert np.stack(context_embeddings(model, seqs, "rank" if arch != "nomic-bert" else "mean")).shape == \
        ((3, 1) if arch != "nomic-bert" else (3, model.hparams.n_embd))


@pytest.mark.parametrize("arch", ENCODER_ARCHS)
def test_tiny_encoders_equal_the_local_llama_cpp(arch):
    """The peer on this machine, in its own build's arithmetic (gguflm's native default)."""
    require_peer()
    ref = np.load(ARCH_DIR / f"{arch}.npz")
    seqs = [t.tolist() for t in np.split(ref["tokens"], np.cumsum(ref["lengths"])[:-1])]
    with Model.load(ARCH_DIR / f"{arch}.gguf") as model:
        for pooling in ("none", "mean"):
            theirs = llama_embeddings(ARCH_DIR / f"{arch}.gguf", seqs, int(pooling_type(pooling)))
            assert bits_equal(np.concatenate(context_embeddings(model, seqs, pooling)), np.concatenate(theirs))


def test_encoders_refuse_what_needs_a_cache():
    with Model.load(ARCH_DIR / "bert.gguf") as model:
        ctx = Context(model, n_ctx=256, n_batch=64, n_ubatch=16, embeddings=True, n_seq_max=256)
        assert ctx.pooling == "mean" and ctx.memory.seq_pos_max(0) == -1      # the file's pooling_type
        batch = Batch(32)
        for i in range(32):
            batch.add(3 + i, i, [0], True)
        assert ctx.decode(batch) == -1                 # more than one ubatch: llama.cpp asserts there
        far = Batch(1)
        far.add(5, 256, [0], True)                     # past the position embeddings
        assert ctx.decode(far) == -1
        with pytest.raises(gguflm.Error, match="encoder"):
            gguflm.LLM(ARCH_DIR / "bert.gguf", progress=False)
    with pytest.raises(ValueError):
        pooling_type("max")
    assert pooling_type(None) is PoolingType.UNSPECIFIED and pooling_type(4) is pooling_type("RANK")


# -- the real models

def real_path(name: str) -> Path:
    return MINILM if name == "minilm" else _model({"smollm": SMOLLM_FILE, "gemma": GEMMA_FILE}[name])


REAL_CASES = [("minilm", "mean"), ("minilm", "cls"), ("minilm", "last"), ("minilm", "none"),
              ("smollm", "mean"), ("smollm", "last"), ("smollm", "none"), ("gemma", "mean")]


@pytest.fixture(scope="module")
def llms():
    """One embedding LLM per (model, pooling), built when first asked for."""
    made = {}

    def get(name: str, pooling: str) -> gguflm.LLM:
        if (name, pooling) not in made:
            made[name, pooling] = gguflm.LLM(real_path(name), embedding=True, pooling_type=pooling, n_ctx=512,
                                             n_threads=2, progress=False)
        return made[name, pooling]

    yield get
    for llm in made.values():
        llm.close()


def compare(ours, theirs) -> tuple[float, float, float]:
    """Minimum cosine, maximum |difference| and the fraction of bit-identical vectors."""
    a, b = np.asarray(ours, np.float32), np.asarray(theirs, np.float32)
    return float(cosines(a, b).min()), float(np.abs(a - b).max()), float(np.all(a == b, axis=-1).mean())


@pytest.mark.parametrize("name,pooling", REAL_CASES)
def test_real_models_equal_llama_cpp_reference(llms, name, pooling):
    """``LLM.embed`` of the 20 texts against what llama-cpp-python 0.3.36 (AVX-512 build) returned."""
    ref = np.load(REFERENCE / f"{real_path(name).stem}.npz")
    with system.using(arithmetic="zen4"):
        ours = llms(name, pooling).embed(TEXTS)
    if pooling == "none":
        assert [len(r) for r in ours] == ref["lengths"].tolist()
        ours = np.concatenate([np.asarray(r, np.float32) for r in ours])
    cos, diff, same = compare(ours, ref[pooling])
    print(f"\n{name} {pooling}: min cosine {cos:.9f}, max |diff| {diff:.3g}, {same:.0%} bit-identical")
    assert cos >= 0.9999 and diff <= 1e-3           # the bounds
    assert same == 1.0                               # and in fact llama.cpp's floats


@pytest.mark.parametrize("name,pooling", [("minilm", "mean"), ("minilm", "cls"), ("smollm", "last")])
def test_real_models_equal_the_local_llama_cpp(llms, name, pooling):
    """Side by side with ``Llama(path, embedding=True, pooling_type=P).embed(texts)`` here (the
    other cases against the committed outputs of the same call: the peer's Gemma 3 spends seconds
    on logits nobody reads)."""
    llama_cpp = require_peer()
    peer = llama_cpp.Llama(str(real_path(name)), embedding=True, pooling_type=int(pooling_type(pooling)),
                           n_threads=2, n_threads_batch=2, verbose=False)
    try:
        theirs = peer.embed(TEXTS)
    finally:
        peer.close()
    cos, diff, same = compare(llms(name, pooling).embed(TEXTS), theirs)
    print(f"\n{name} {pooling} vs local llama.cpp: min cosine {cos:.9f}, max |diff| {diff:.3g}, {same:.0%} identical")
    assert cos >= 0.9999 and diff <= 1e-3 and same == 1.0


def test_minilm_ranks_paraphrases_above_unrelated_pairs(llms):
    """all-MiniLM-L6-v2's published behaviour: a sentence is nearer its paraphrase than anything else."""
    pairs = [("A man is eating food.", "A man is eating a piece of bread."),
             ("How do I reset my password?", "I forgot my password, how can I change it?"),
             ("The quick brown fox jumps over the lazy dog.", "A fast brown fox leaps over a lazy dog."),
             ("Stock markets fell sharply on Monday.", "Share prices dropped steeply at the start of the week.")]
    vectors = np.array(llms("minilm", "mean").embed([s for pair in pairs for s in pair], normalize=True))
    sim = vectors @ vectors.T
    for i in range(len(pairs)):
        a, b = 2 * i, 2 * i + 1
        others = [j for j in range(len(vectors)) if j not in (a, b)]
        assert sim[a, b] > 0.6 and sim[a, b] > sim[a, others].max() and sim[b, a] > sim[b, others].max()


# -- the LLM API, as llama-cpp-python's

def test_llm_embed_returns_llama_cpp_python_shapes(llms):
    llm = llms("minilm", "mean")
    one = llm.embed("Hello world")
    assert isinstance(one, list) and len(one) == 384 and all(isinstance(v, float) for v in one)
    many, count = llm.embed(["Hello world", "Hi"], return_count=True)
    assert many[0] == one and count == len(llm.tokenize(b"Hello world")) + len(llm.tokenize(b"Hi"))
    unit = llm.embed("Hello world", normalize=True)
    assert unit == (np.asarray(one, np.float64) / np.linalg.norm(one)).tolist()
    per_token = llms("minilm", "none").embed(["Hello world", "Hi"])
    assert [len(r) for r in per_token] == [4, 3] and len(per_token[1][0]) == 384
    response = llm.create_embedding(["Hello world", "Hi"], model="m")
    assert response == {"object": "list", "model": "m",
                        "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(many)],
                        "usage": {"prompt_tokens": count, "total_tokens": count}}
    assert llm.pooling_type() == 1 and llm.n_embd() == 384
    with pytest.raises(gguflm.Error, match="embedding=True"):
        llm.create_completion("Hello")
    with pytest.raises(ValueError, match="exceed batch size"):
        llm.embed("word " * 600, truncate=False)
    assert len(llm.embed("word " * 600)) == 384                    # truncated to the batch


def test_llm_without_embedding_cannot_embed(real_model_path):
    with gguflm.LLM(real_model_path, n_ctx=256, progress=False) as llm:
        with pytest.raises(RuntimeError, match="embedding=True"):
            llm.embed("hello")


def test_pack_follows_llama_cpp_python():
    assert list(pack([3, 4, 2, 6, 1], n_batch=8, n_seq_max=64)) == [[0, 1], [2, 3], [4]]
    assert list(pack([1, 1, 1, 1, 1], n_batch=8, n_seq_max=2)) == [[0, 1], [2, 3], [4]]
    assert list(pack([8, 8], n_batch=8, n_seq_max=4)) == [[0], [1]]
    with pytest.raises(ValueError, match="exceed batch size"):
        list(pack([9], n_batch=8, n_seq_max=4))


def test_packing_decides_the_floats_as_in_llama_cpp():
    """A text's vector depends on its batch (llama.cpp's kernels follow the batch), so embed packs
    exactly as llama-cpp-python: with a small batch, the same floats as the peer with that batch."""
    llama_cpp = require_peer()
    texts = TEXTS[:8]
    with gguflm.LLM(MINILM, embedding=True, n_batch=64, n_threads=2, progress=False) as llm:
        small = llm.embed(texts)
    with gguflm.LLM(MINILM, embedding=True, n_batch=512, n_threads=2, progress=False) as llm:
        large = llm.embed(texts)
    assert not bits_equal(small, large)
    peer = llama_cpp.Llama(str(MINILM), embedding=True, n_batch=64, n_threads=2, n_threads_batch=2, verbose=False)
    try:
        assert bits_equal(small, peer.embed(texts))
    finally:
        peer.close()


def test_rerank_scores_are_the_rank_pooling(encoder):
    arch, model, seqs, ref = encoder
    if arch == "nomic-bert":
        return
    llm = gguflm.LLM(ARCH_DIR / f"{arch}.gguf", embedding=True, pooling_type="rank", n_ctx=256, progress=False)
    try:
        docs = ["alpha beta", "gamma", "delta epsilon zeta"]
        scores = llm.rerank("query text", docs)
        from gguflm.embedding import embed_tokens, rerank_tokens

        pairs = [rerank_tokens(llm.model, "query text", d) for d in docs]
        vocab = llm.model.vocab
        assert pairs[0][0] == vocab.bos and pairs[0][:-1] != pairs[1][:-1]
        expected = embed_tokens(llm.context, pairs, llm.n_batch, 256)
        assert scores == [float(e[0]) for e in expected] and len(set(scores)) == 3
    finally:
        llm.close()
    with gguflm.LLM(ARCH_DIR / f"{arch}.gguf", embedding=True, pooling_type="mean", progress=False) as llm:
        with pytest.raises(ValueError, match="rank pooling"):
            llm.rerank("q", ["d"])


# -- thread counts, ISAs

def test_embeddings_are_the_same_floats_on_every_isa_and_thread_count():
    tokens = [[101, 7592, 2088, 999, 102], [101, 1996, 4248, 2829, 4419, 14523, 2058, 102]]
    with Model.load(MINILM) as model:
        first = context_embeddings(model, tokens, "mean", n_threads=1)
        for isa in system.supported_isas():
            for n_threads in (1, 2, 3):
                with system.using(isa=isa):
                    got = context_embeddings(model, tokens, "mean", n_threads=n_threads)
                assert bits_equal(got, first), (isa, n_threads)


def test_tiny_encoders_same_floats_at_every_thread_count():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(tiny_encoders(), st.lists(st.integers(1, 40), min_size=1, max_size=4), st.integers(0, 2**32 - 1),
           st.sampled_from(POOLINGS))
    def check(spec, lengths, seed, pooling):
        if pooling == "rank" and not spec.classifier:
            pooling = "cls"
        rng = np.random.default_rng(seed)
        seqs = [[1] + [int(t) for t in rng.integers(3, N_VOCAB - 1, n - 1)] for n in lengths]
        path = Path(tmp) / f"{seed}.gguf"
        write_tiny_model(spec, path, rng)
        with Model.load(path) as model:
            first = np.concatenate(context_embeddings(model, seqs, pooling, n_threads=1))
            assert np.isfinite(first).all()
            for n_threads in (2, 3):
                assert bits_equal(np.concatenate(context_embeddings(model, seqs, pooling, n_threads=n_threads)), first)

    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        check()


# -- gguflm embed

def run_cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "gguflm.cli", "embed", "-q", "-t", "2", *args], check=True,
                          capture_output=True, text=True).stdout


def test_cli_embed_outputs_llama_embedding_formats(llms):
    texts = ["A man is eating food.", "A man is riding a horse."]
    data = json.loads(run_cli("-m", str(MINILM), "-p", "\n".join(texts), "--embd-output-format", "json"))
    vectors = np.array([d["embedding"] for d in data["data"]])
    # llama-embedding's batch (the training context, 512 here) and euclidean normalisation, 7 decimals
    ours = np.array([normalize(v) for v in llms("minilm", "mean").embed(texts)])
    np.testing.assert_allclose(vectors, ours, rtol=0, atol=5e-8)
    assert [d["index"] for d in data["data"]] == [0, 1] and data["object"] == "list"
    summary = run_cli("-m", str(MINILM), "-p", "\n".join(texts))
    assert "cosine similarity matrix" in summary and summary.count("embedding ") == 2
    raw = run_cli("-m", str(MINILM), "-p", texts[0], "--embd-normalize", "-1", "--pooling", "cls",
                  "--embd-output-format", "raw")
    np.testing.assert_allclose(np.array(raw.split(), float), llms("minilm", "cls").embed(texts[0]), rtol=0, atol=5e-8)
    rank = run_cli("-m", str(ARCH_DIR / "bert.gguf"), "-p", "query\tdocument one\nquery\tdocument two",
                   "--pooling", "rank")
    assert rank.count("rerank score ") == 2


def test_bench_embed_runs():
    out = subprocess.run([sys.executable, "-m", "gguflm.bench", "embed", "-m", str(MINILM), "-n", "30", "-r", "1"],
                         check=True, capture_output=True, text=True).stdout
    assert "30 texts" in out and "texts/s" in out
