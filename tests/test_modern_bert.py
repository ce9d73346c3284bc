"""modern-bert against llama.cpp (llama-cpp-python): token rows, mean-pooled vectors and rank
scores of tiny random encoders, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from _llama import llama_embeddings, require_peer
from gguflm import Model
from gguflm.errors import ModelLoadError
from gguflm.gguf.constants import GGMLType
from test_embeddings import bits_equal, context_embeddings
from tiny_models import write_tiny_modern_bert

MIXED = {"attn_qkv": GGMLType.Q8_0, "ffn_down": GGMLType.Q4_0}
# three sequences longer and shorter than the window (4: two positions either way)
SEQS = [[1] + np.random.default_rng(1).integers(3, 300, n).tolist() for n in (9, 14, 2)]


@pytest.mark.parametrize(("activation", "n_swa", "first_attn_norm"),
                         [(None, 4, False), ("swiglu", 0, True), ("reglu", 6, False)])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_modern_bert_gives_llama_cpps_embeddings(tmp_path, activation, n_swa, first_attn_norm, n_threads):
    require_peer()
    path = tmp_path / "modern-bert.gguf"
    write_tiny_modern_bert(path, np.random.default_rng(7), n_swa=n_swa, activation=activation,
                           first_attn_norm=first_attn_norm, types=MIXED)
    with Model.load(path) as model:
        for pooling, code in (("none", 0), ("mean", 1)):
            ours = context_embeddings(model, SEQS, pooling, n_threads=n_threads)
            theirs = llama_embeddings(path, SEQS, code, n_threads=n_threads)
            for o, t in zip(ours, theirs):
                assert bits_equal(o, t), (pooling, activation)


@pytest.mark.parametrize("classifier_pooling", [None, 2])
def test_modern_bert_rank_scores_as_llama_cpp(tmp_path, classifier_pooling):
    """The rank head: the sequence's mean (the default) or first token, dense, GELU, LayerNorm,
    then the labels' projection."""
    require_peer()
    path = tmp_path / "modern-bert-rank.gguf"
    write_tiny_modern_bert(path, np.random.default_rng(8), pooling_type=4, classifier_pooling=classifier_pooling)
    with Model.load(path) as model:
        ours = context_embeddings(model, SEQS, "rank", n_threads=2)
    theirs = llama_embeddings(path, SEQS, 4)
    assert all(o.shape == (2,) for o in ours)
    for o, t in zip(ours, theirs):
        assert bits_equal(o, t)
    # the two pooling choices give different scores: the key is read, not ignored
    other = tmp_path / "other.gguf"
    write_tiny_modern_bert(other, np.random.default_rng(8), pooling_type=4,
                           classifier_pooling=2 if classifier_pooling is None else 1)
    with Model.load(other) as model:
        assert not bits_equal(context_embeddings(model, SEQS, "rank", n_threads=2)[0], ours[0])


def test_modern_bert_refuses_an_ungated_activation(tmp_path):
    path = tmp_path / "relu.gguf"
    write_tiny_modern_bert(path, np.random.default_rng(3), activation="relu", head=False)
    with pytest.raises(ModelLoadError, match="hidden_activation"):
        Model.load(path)
