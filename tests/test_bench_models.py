"""The benchmark model generator (gguflm/bench/models.py): its shape table's parameter counts
against the architectures' formulas, and scaled-down variants of each shape, quantized by
gguflm's quantizer, giving llama.cpp's logits (through llama-cpp-python) bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from _llama import LlamaDecoder, import_peer
from gguflm import Context, Model
from gguflm.bench.models import SHAPES, Shape, n_params, tensor_shapes, write
from _memory_pair import decode_entries

import_peer("llama_cpp")

N_VOCAB = 49152   # SmolLM2's, whose tokenizer the files carry


def _mamba2_params(k: dict, n_vocab: int) -> int:
    """Mamba-2: embedding (tied), final norm; per layer a norm, the input projection to z, x B C
    and dt, the convolution with its bias, dt bias, A and D per head, the grouped norm and the
    output projection."""
    e, d_inner, d_state, n_head = k["embedding_length"], k["ssm.inner_size"], k["ssm.state_size"], k["ssm.time_step_rank"]
    conv_dim = d_inner + 2 * k["ssm.group_count"] * d_state
    layer = e + e * (d_inner + conv_dim + n_head) + (k["ssm.conv_kernel"] + 1) * conv_dim + 3 * n_head \
        + d_inner + d_inner * e
    return n_vocab * e + e + k["block_count"] * layer


def _qwen35_params(k: dict, n_vocab: int) -> int:
    """Qwen3.5: embedding (tied), final norm; per layer two norms and the SwiGLU; a delta-net
    layer's QKV, gate, conv, dt bias, A, beta, alpha, head norm and output; an attention layer's
    Q (with its gate), K, V, output and Q/K norms."""
    e, f, L = k["embedding_length"], k["feed_forward_length"], k["block_count"]
    key_dim, value_dim = k["ssm.state_size"] * k["ssm.group_count"], k["ssm.inner_size"]
    n_v, hd = k["ssm.time_step_rank"], k["attention.key_length"]
    n_q, n_kv = k["attention.head_count"] * hd, k["attention.head_count_kv"] * hd
    conv_dim = 2 * key_dim + value_dim
    delta = e * conv_dim + e * value_dim + k["ssm.conv_kernel"] * conv_dim + 2 * n_v + 2 * e * n_v \
        + k["ssm.state_size"] + value_dim * e
    attention = e * 2 * n_q + 2 * e * n_kv + n_q * e + 2 * hd
    n_attention = L // k["full_attention_interval"]
    return n_vocab * e + e + L * (2 * e + 3 * e * f) + (L - n_attention) * delta + n_attention * attention


FORMULAS = {"mamba2": _mamba2_params, "qwen35": _qwen35_params}

# each shape scaled down: few layers, narrow, rows still whole Q4_K blocks
SMALL = {
    "mamba2-0.5b": {"embedding_length": 256, "block_count": 2, "ssm.inner_size": 512, "ssm.time_step_rank": 8,
                    "ssm.state_size": 32},
    "qwen35-0.8b": {"embedding_length": 256, "block_count": 4, "feed_forward_length": 512, "ssm.inner_size": 256,
                    "ssm.state_size": 64, "ssm.time_step_rank": 4, "ssm.group_count": 2,
                    "attention.key_length": 64, "attention.value_length": 64, "rope.dimension_count": 16,
                    "rope.dimension_sections": (3, 3, 2, 0)},
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_parameter_counts_follow_the_formula(name: str) -> None:
    shape = SHAPES[name]
    assert n_params(shape, N_VOCAB) == FORMULAS[shape.arch](dict(shape.keys), N_VOCAB)
    small = shape.with_keys(**SMALL[name])
    assert n_params(small, 320) == FORMULAS[shape.arch](dict(small.keys), 320)
    assert 0.4e9 < n_params(shape, N_VOCAB) < 0.7e9   # "~0.5B weights" with SmolLM2's vocabulary


def test_shape_table_covers_the_small_variants() -> None:
    assert set(SMALL) == set(SHAPES)


@pytest.fixture(scope="module", params=list(SHAPES))
def small_model(request, tmp_path_factory, smollm_path) -> tuple[Shape, object]:
    shape = SHAPES[request.param].with_keys(**SMALL[request.param])
    path = tmp_path_factory.mktemp("bench_models") / f"{request.param}.gguf"
    write(shape, path, "Q4_K_M", vocab_file=smollm_path, nthread=2)
    return shape, path


def test_small_variant_is_the_shape_quantized(small_model) -> None:
    shape, path = small_model
    with Model.load(path) as model:
        assert model.arch == shape.arch and model.file_type == "Q4_K - Medium"
        assert model.n_params == n_params(shape, model.vocab.n_tokens)
        assert set(model.tensors) >= set(tensor_shapes(shape, model.vocab.n_tokens))


def test_small_variant_equals_llama(small_model) -> None:
    """A real prompt through SmolLM2's tokenizer, then 4 steps: every position's logits equal
    llama.cpp's, finite."""
    _, path = small_model
    with Model.load(path) as model, Context(model, n_ctx=128, n_batch=64, n_ubatch=64, n_threads=2,
                                            n_threads_batch=2) as ctx:
        tokens = model.vocab.tokenize("The quick brown fox jumps over the lazy dog, twice.")
        tokens += [100, 2000, 30000, 49000]
        n = len(tokens) - 4
        got = np.concatenate([decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(tokens[:n])])]
                             + [decode_entries(ctx, [(t, n + k, 0, True)]) for k, t in enumerate(tokens[n:])])
    ref = LlamaDecoder(path, n_ctx=128, n_threads=2, n_batch=64)
    try:
        want = np.concatenate([ref.decode(tokens[:n], 0)] + [ref.decode([t], n + k) for k, t in enumerate(tokens[n:])])
    finally:
        ref.close()
    assert len(tokens) > 10 and np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)
