"""T5 against llama.cpp: ``t5encoder`` embeddings (decoded, as ``Llama.embed`` runs it, and encoded
with ``llama_encode``) and the ``t5`` encoder-decoder's logits at every decoder position, bit for
bit, on tiny random models (mixed weight types); relative position buckets past max_distance;
greedy generation; the errors of a decode before any encode."""

from __future__ import annotations

import numpy as np
import pytest

import gguflm

from _llama import TINY_MODEL, llama_embeddings, require_peer
from gguflm._ext.plan import Plan
from gguflm.batch import Batch
from gguflm.context import Context
from gguflm.errors import EncoderError
from gguflm.ggml_types import GGMLType
from gguflm.model import Model
from test_embeddings import bits_equal, context_embeddings
from tiny_models import N_VOCAB, write_tiny_t5

TYPES = {"attn_q": GGMLType.Q8_0, "ffn_up": GGMLType.Q4_1, "attn_o": GGMLType.Q5_0}
ENC = [5, 17, 99, 4, 250, 31, 2, 77, 140]
DEC = [0, 44, 12, 7, 300, 8, 61]


@pytest.fixture(scope="module", params=[(True, False), (False, True)], ids=["geglu", "relu-rel_b-every-layer"])
def t5_paths(request, tmp_path_factory):
    """A t5encoder and a t5 file: FLAN-T5's gated feed-forward with bucket biases in the first
    layer only, or T5's ReLU one with biases in every layer."""
    gated, every = request.param
    d = tmp_path_factory.mktemp("t5")
    paths = {}
    for arch in ("t5encoder", "t5"):
        paths[arch] = d / f"{arch}.gguf"
        write_tiny_t5(paths[arch], np.random.default_rng(11), arch=arch, gated=gated, rel_b_every_layer=every,
                      types=TYPES)
    return paths


def batch_of(tokens: list[int], start: int = 0, seq: int = 0) -> Batch:
    b = Batch(len(tokens))
    for i, t in enumerate(tokens):
        b.add(int(t), start + i, [seq], True)
    return b


# -- llama.cpp through llama-cpp-python's low-level bindings

def _llama(path, n_threads: int, n_ubatch: int = 512, **kw):
    llama_cpp = require_peer()
    return llama_cpp.Llama(str(path), n_ctx=512, n_batch=512, n_ubatch=n_ubatch, n_threads=n_threads,
                           n_threads_batch=n_threads, verbose=False, **kw)


def _fill(llm, tokens: list[int], start: int = 0) -> None:
    llm._batch.reset()
    b = llm._batch.batch
    for j, tok in enumerate(tokens):
        b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = tok, start + j, 1, True
        b.seq_id[j][0] = 0
    b.n_tokens = len(tokens)


def llama_encoded(path, tokens: list[int], n_threads: int) -> np.ndarray:
    """llama_encode's rows (pooling none) of ``tokens``."""
    import llama_cpp.llama_cpp as L

    llm = _llama(path, n_threads, embedding=True, pooling_type=0)
    try:
        _fill(llm, tokens)
        llm._ctx.encode(llm._batch)
        n = len(tokens) * llm.n_embd()
        return np.ctypeslib.as_array(L.llama_get_embeddings(llm._ctx.ctx), shape=(n,)).reshape(len(tokens), -1).copy()
    finally:
        llm.close()


def llama_decoder_logits(path, enc: list[int], dec: list[int], step: int, n_threads: int,
                         n_ubatch: int = 512) -> np.ndarray:
    """llama.cpp's decoder logits at every position of ``dec`` after encoding ``enc``, the decoder
    tokens decoded ``step`` at a time."""
    import llama_cpp.llama_cpp as L

    llm = _llama(path, n_threads, n_ubatch, logits_all=True)
    try:
        _fill(llm, enc)
        llm._ctx.encode(llm._batch)
        rows = []
        for i in range(0, len(dec), step):
            _fill(llm, dec[i:i + step], i)
            llm._ctx.decode(llm._batch)
            n = len(dec[i:i + step])
            rows.append(np.ctypeslib.as_array(L.llama_get_logits(llm._ctx.ctx), shape=(n * N_VOCAB,))
                        .reshape(n, N_VOCAB).copy())
        return np.concatenate(rows)
    finally:
        llm.close()


def ours_decoder_logits(model: Model, enc: list[int], dec: list[int], step: int, n_threads: int,
                        n_ubatch: int = 512) -> np.ndarray:
    with Context(model, n_ctx=512, n_batch=512, n_ubatch=n_ubatch, n_threads=n_threads) as ctx:
        assert ctx.encode(batch_of(enc)) == 0
        rows = []
        for i in range(0, len(dec), step):
            assert ctx.decode(batch_of(dec[i:i + step], i)) == 0
            rows.append(ctx.get_logits().copy())
        return np.concatenate(rows)


# -- the building block: attention with relative position biases, against its numpy form

def bucket_reference(p_key: int, p_query: int, n_buckets: int, bidirectional: bool) -> int:
    """llama.cpp's llama_relative_position_bucket (max_distance 128), its float logf emulated."""
    if bidirectional:
        n_buckets >>= 1
    max_exact, rp, bucket = n_buckets >> 1, p_key - p_query, 0
    if bidirectional:
        bucket, rp = (n_buckets if rp > 0 else 0), abs(rp)
    else:
        rp = max(-rp, 0)
    if rp < max_exact:
        return bucket + rp
    lg = np.float32(np.log(np.float32(rp / max_exact))) * np.float32(n_buckets - max_exact)
    large = int(np.floor(np.float32(max_exact + float(lg) / np.log(128 / max_exact))))
    return bucket + min(large, n_buckets - 1)


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_attention_with_bucket_biases_matches_its_numpy_form(causal):
    """Scores + table[bucket(key, query)][head] before the softmax (scale 1), both ways without a
    causal mask, over positions spanning every bucket (past max_distance 128)."""
    rng = np.random.default_rng(5)
    n, n_head, d, n_buckets = 37, 2, 32, 32
    pos = np.sort(rng.choice(400, n, replace=False)).astype(np.int32)
    q, k, v = (rng.standard_normal((n, n_head * d)).astype(np.float32) * 0.3 for _ in range(3))
    table = rng.standard_normal((n_buckets, n_head)).astype(np.float32)
    plan = Plan(n, 1, 1)
    plan.pos[:] = pos
    out = np.zeros((n, n_head * d), np.float32)
    plan.attention_self(q, k, v, n_head, n_head, d, d, 1.0, causal, 0.0, out, 2, rel_bias=table)
    plan.run()
    want = np.zeros_like(out, dtype=np.float64)
    seen = set()
    for h in range(n_head):
        hs = slice(h * d, (h + 1) * d)
        s = q[:, hs].astype(np.float64) @ k[:, hs].T.astype(np.float64)
        for t in range(n):
            for c in range(n):
                b = bucket_reference(int(pos[c]), int(pos[t]), n_buckets, True)
                seen.add(b)
                s[t, c] = s[t, c] + table[b, h] if not causal or c <= t else -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        want[:, hs] = (p / p.sum(1, keepdims=True)) @ v[:, hs]
    # every bucket, the saturated ones included, but the later half's first (distance 0 is earlier)
    assert seen == set(range(n_buckets)) - {n_buckets // 2}
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5)


# -- t5encoder

@pytest.mark.parametrize("n_threads", [1, 3])
def test_t5encoder_embeddings_are_llama_cpps(t5_paths, n_threads):
    """Three sequences in one batch, one past T5's max_distance (128: the last buckets): every
    token's row and the means, as llama.cpp's decode gives them (causal within the ubatch)."""
    path = t5_paths["t5encoder"]
    rng = np.random.default_rng(1)
    seqs = [rng.integers(3, 300, n).tolist() for n in (9, 140, 3)]
    with Model.load(path) as model:
        assert model.has_encoder and not model.has_decoder
        for pooling, code in (("none", 0), ("mean", 1)):
            ours = context_embeddings(model, seqs, pooling, n_threads=n_threads)
            theirs = llama_embeddings(path, seqs, code, n_threads=n_threads)
            for o, t in zip(ours, theirs):
                assert bits_equal(o, t), pooling


@pytest.mark.parametrize("n_threads", [1, 3])
def test_t5encoder_encode_is_llama_encode(t5_paths, n_threads):
    """encode attends both ways, as llama_encode; decode of the same tokens differs from it."""
    path = t5_paths["t5encoder"]
    tokens = np.random.default_rng(2).integers(3, 300, 40).tolist()
    with Model.load(path) as model, Context(model, n_ctx=512, n_ubatch=512, embeddings=True, pooling="none",
                                            n_threads=n_threads) as ctx:
        assert ctx.encode(batch_of(tokens)) == 0
        encoded = ctx.get_embeddings().copy()
        assert ctx.decode(batch_of(tokens)) == 0
        decoded = ctx.get_embeddings().copy()
    assert bits_equal(encoded, llama_encoded(path, tokens, n_threads))
    assert not np.array_equal(encoded[:-1], decoded[:-1])


# -- t5

@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("step", [len(DEC), 1], ids=["whole", "one-by-one"])
def test_t5_decoder_logits_are_llama_cpps(t5_paths, step, n_threads):
    """The decoder's logits at every position after encoding a prompt: the decoder tokens in one
    batch, or one per decode (generation's steps), as llama.cpp's."""
    path = t5_paths["t5"]
    with Model.load(path) as model:
        assert model.has_encoder and model.has_decoder and model.decoder_start_token == 0
        ours = ours_decoder_logits(model, ENC, DEC, step, n_threads)
    theirs = llama_decoder_logits(path, ENC, DEC, step, n_threads)
    assert bits_equal(ours, theirs)


@pytest.mark.parametrize("n_threads", [1, 3])
def test_t5_decoder_in_one_token_ubatches_is_llama_cpps(t5_paths, n_threads):
    """n_ubatch 1 (the encoder then takes one token, as llama.cpp's asserts): a decoder batch cut
    into one-token ubatches, as llama.cpp's."""
    path = t5_paths["t5"]
    with Model.load(path) as model:
        ours = ours_decoder_logits(model, ENC[:1], DEC, len(DEC), n_threads, n_ubatch=1)
    assert bits_equal(ours, llama_decoder_logits(path, ENC[:1], DEC, len(DEC), n_threads, n_ubatch=1))


def test_t5_two_sequences_attend_their_own_encodings(t5_paths):
    """Two prompts encoded in one batch, then both decoders in one batch: each decoder token
    attends over its own sequence's encoded rows, as llama.cpp's (an embedding context, the one
    llama-cpp-python gives more than one sequence)."""
    import llama_cpp.llama_cpp as L

    path, encs, decs = t5_paths["t5"], [ENC, [9, 8, 250, 3, 30]], [DEC[:4], [0, 5, 6]]

    def two(tokens_by_seq: list[list[int]]) -> Batch:
        b = Batch(sum(map(len, tokens_by_seq)))
        for seq, tokens in enumerate(tokens_by_seq):
            for i, t in enumerate(tokens):
                b.add(t, i, [seq], True)
        return b

    with Model.load(path) as model, Context(model, n_ctx=512, n_seq_max=2, embeddings=True, pooling="none",
                                            n_threads=2) as ctx:
        assert ctx.encode(two(encs)) == 0
        assert ctx.decode(two(decs)) == 0
        ours = ctx.get_logits().copy()
    llm = _llama(path, 2, embedding=True, pooling_type=0)
    try:
        for stage, runs in ((llm._ctx.encode, encs), (llm._ctx.decode, decs)):
            llm._batch.reset()
            for seq, tokens in enumerate(runs):
                llm._batch.add_sequence(tokens, seq, True)
            stage(llm._batch)
        n = sum(map(len, decs))
        theirs = np.ctypeslib.as_array(L.llama_get_logits(llm._ctx.ctx), shape=(n * N_VOCAB,)).reshape(n, N_VOCAB)
        assert bits_equal(ours, theirs)
    finally:
        llm.close()


def test_t5_relative_buckets_past_max_distance(tmp_path):
    """A 150-token decoder past a 140-token encoding: the decoder's one-way buckets beyond
    max_distance (128), every position as llama.cpp's."""
    path = tmp_path / "t5.gguf"
    write_tiny_t5(path, np.random.default_rng(4), n_layer=1, n_buckets=16, types=TYPES)
    rng = np.random.default_rng(3)
    enc, dec = rng.integers(3, 300, 140).tolist(), [0] + rng.integers(3, 300, 149).tolist()
    with Model.load(path) as model:
        ours = ours_decoder_logits(model, enc, dec, len(dec), 2)
    assert bits_equal(ours, llama_decoder_logits(path, enc, dec, len(dec), 2))


def test_t5_greedy_generation_is_llama_cpps(t5_paths):
    """Greedy decoding from the decoder start token, one token per step, picks llama.cpp's tokens:
    in a Context, and through LLM.complete (which encodes the prompt and starts the decoder, as
    llama-cli does)."""
    import llama_cpp.llama_cpp as L

    path, n_new = t5_paths["t5"], 12
    with Model.load(path) as model, Context(model, n_ctx=512, n_threads=2) as ctx:
        assert ctx.encode(batch_of(ENC)) == 0
        ours = [model.decoder_start_token]
        for i in range(n_new):
            assert ctx.decode(batch_of(ours[-1:], i)) == 0
            ours.append(int(np.argmax(ctx.get_logits_ith(-1))))
    with gguflm.LLM(path, n_ctx=512, n_threads=2, progress=False) as llm:
        completion = llm.complete(ENC, max_tokens=n_new, temperature=0.0)
        eog = llm.model.vocab.eog_ids
    llm = _llama(path, 2)
    try:
        _fill(llm, ENC)
        llm._ctx.encode(llm._batch)
        theirs = [L.llama_model_decoder_start_token(llm._model.model)]
        for i in range(n_new):
            _fill(llm, theirs[-1:], i)
            llm._ctx.decode(llm._batch)
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(N_VOCAB,))
            theirs.append(int(np.argmax(row)))
    finally:
        llm.close()
    assert ours == theirs
    n = len(completion.token_ids)   # up to an end-of-generation token
    assert completion.token_ids == theirs[1:1 + n] and (n == n_new or theirs[1 + n] in eog)


def test_t5_reencoding_replaces_the_encoder_output(t5_paths):
    """A second encode (of another length) is what the decoder attends to next: the same logits
    as a fresh context that encoded it alone."""
    with Model.load(t5_paths["t5"]) as model:
        with Context(model, n_ctx=512, n_threads=2) as ctx:
            assert ctx.encode(batch_of(ENC)) == 0
            assert ctx.decode(batch_of(DEC[:3])) == 0
            assert ctx.encode(batch_of(ENC[:4])) == 0
            ctx.memory.clear()
            assert ctx.decode(batch_of(DEC)) == 0
            again = ctx.get_logits().copy()
        assert bits_equal(again, ours_decoder_logits(model, ENC[:4], DEC, len(DEC), 2))


def test_decode_before_encode_and_encode_without_encoder_are_errors(t5_paths):
    """llama.cpp aborts on a decode before any encode (and llama-cpp-python's Llama.eval of a t5
    does that): here an EncoderError, from the shim's eval too."""
    import gguflm.llama_cpp as shim

    with Model.load(t5_paths["t5"]) as model, Context(model, n_ctx=256) as ctx:
        with pytest.raises(EncoderError, match="call encode first"):
            ctx.decode(batch_of(DEC))
        assert ctx.encode(Batch(1)) == -1     # no tokens: llama_encode's -1
    llm = shim.Llama(str(t5_paths["t5"]), n_ctx=256, verbose=False)
    try:
        with pytest.raises(EncoderError):
            llm.eval(DEC)
    finally:
        llm.close()
    with Model.load(TINY_MODEL) as model, Context(model, n_ctx=256) as ctx:
        assert not model.has_encoder and model.decoder_start_token == -1
        with pytest.raises(EncoderError, match="no encoder"):
            ctx.encode(batch_of([1, 2, 3]))


def test_cli_runs_an_encoder_decoder_model(tmp_path):
    """``gguflm run -m t5.gguf -p ...`` encodes the prompt and generates with the decoder, as
    llama-cli does: the text LLM.complete gives."""
    import subprocess
    import sys

    path = tmp_path / "t5.gguf"
    write_tiny_t5(path, np.random.default_rng(11), types=TYPES)
    with gguflm.LLM(path, n_ctx=256, n_threads=2, progress=False) as llm:
        completion = llm.complete("hello world", max_tokens=6, temperature=0.0)
        want = completion.text
    assert completion.token_ids   # the decoder generated something to compare
    run = subprocess.run([sys.executable, "-m", "gguflm.cli", "run", "-m", str(path), "-p", "hello world", "-n", "6",
                          "--temp", "0", "-c", "256", "-t", "2", "--no-display-prompt"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip("\n") == want


def test_encode_of_an_encoder_without_cache_is_its_decode():
    """llama_encode of a BERT is what its decode runs (llama.cpp's decode calls encode for a
    model without memory)."""
    path = TINY_MODEL.parent / "bert.gguf"
    with Model.load(path) as model, Context(model, n_ctx=256, embeddings=True, pooling="none") as ctx:
        assert ctx.encode(batch_of([1, 7, 9, 30])) == 0
        encoded = ctx.get_embeddings().copy()
        assert ctx.decode(batch_of([1, 7, 9, 30])) == 0
        assert bits_equal(encoded, ctx.get_embeddings())


def test_llama_cpp_shim_embeds_with_a_t5encoder(t5_paths):
    """gguflm.llama_cpp.Llama(embedding=True).embed of texts on a t5encoder: llama-cpp-python's
    vectors (its decode of the encoder, mean pooling), bit for bit."""
    import gguflm.llama_cpp as shim

    llama_cpp = require_peer()
    path, texts = str(t5_paths["t5encoder"]), ["hello world", "a longer text to embed here"]
    kw = dict(embedding=True, pooling_type=1, n_ctx=256, n_threads=2, n_threads_batch=2, verbose=False)
    ours = shim.Llama(path, **kw)
    theirs = llama_cpp.Llama(path, **kw)
    try:
        assert bits_equal(np.array(ours.embed(texts)), np.array(theirs.embed(texts)))
    finally:
        ours.close()
        theirs.close()
