"""RoPE scaling against llama.cpp: linear and YaRN from the file's ``rope.scaling.*`` keys and from
the context's parameters (llama-cpp-python's ``rope_scaling_type``, ``rope_freq_scale``,
``yarn_*``), at prompt positions past the original context, a token per ubatch and the whole
prompt; the CLI flags and the LLM arguments that carry them."""

from __future__ import annotations

import numpy as np
import pytest

import _ggml
from _llama import require_peer
from gguflm import Batch, Context, LLM, Model
from gguflm.cli import build_parser, rope_options
from gguflm.ggml_types import GGMLType
from gguflm.rope import rope_params
from tiny_models import TinyModel, write_tiny_model

N_PROMPT = 48
YARN_FILE = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 16,
             "rope.scaling.attn_factor": 1.25}
LINEAR_FILE = {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}
# (file keys, context arguments as llama-cpp-python names them)
CASES = {
    "yarn-file": (YARN_FILE, {}),
    "linear-file": (LINEAR_FILE, {}),
    "yarn-context": ({}, {"rope_scaling_type": 2, "rope_freq_scale": 0.25, "yarn_orig_ctx": 12}),
    "yarn-context-betas": ({}, {"rope_scaling_type": 2, "rope_freq_scale": 0.5, "yarn_orig_ctx": 20,
                                "yarn_beta_fast": 16.0, "yarn_beta_slow": 2.0, "yarn_ext_factor": 0.5}),
    "linear-context": ({}, {"rope_scaling_type": 1, "rope_freq_scale": 0.3, "rope_freq_base": 5000.0}),
    "none-overrides-file": (LINEAR_FILE, {"rope_scaling_type": 0}),
}


def model_file(tmp_path, keys: dict, arch: str = "llama"):
    path = tmp_path / f"{arch}.gguf"
    spec = TinyModel(arch, n_embd=128, head_dim=32, n_head=4, n_head_kv=2, n_ff=128, metadata=keys,
                     types={"attn_q": GGMLType.Q8_0, "ffn_up": GGMLType.Q8_0})
    write_tiny_model(spec, path, np.random.default_rng(5))
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_llama_cpp(tmp_path, case, arch):
    require_peer()
    import llama_cpp
    keys, ctx_args = CASES[case]
    path = model_file(tmp_path, keys, arch)
    tokens = [1] + [int(t) for t in np.random.default_rng(2).integers(3, 300, N_PROMPT - 1)]
    for n_ubatch in (1, N_PROMPT):
        llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_threads=2,
                              verbose=False, **ctx_args)
        try:
            llm.eval(tokens)
            theirs = np.asarray(llm.scores[:N_PROMPT], dtype=np.float32)
        finally:
            llm.close()
        with _ggml.same_arithmetic(), Model.load(path) as model, \
                Context(model, n_ctx=256, n_ubatch=n_ubatch, n_threads=2, **ctx_args) as ctx:
            batch = Batch(N_PROMPT)
            for pos, tok in enumerate(tokens):
                batch.add(tok, pos, [0], True)
            assert ctx.decode(batch) == 0
            ours = ctx.get_logits()
            same = (ours.view(np.uint32) == theirs.view(np.uint32)).all(axis=1)
            assert same.all(), (n_ubatch, np.flatnonzero(~same).tolist(), np.abs(ours - theirs).max())


@pytest.mark.parametrize("n_ctx", [256, 512])
def test_longrope_equals_llama_cpp(tmp_path, n_ctx):
    """Phi 3's LongRoPE: the short factors while the context fits the original one, the long
    factors past it, with the file's attention factor."""
    require_peer()
    import llama_cpp
    path = tmp_path / "phi3.gguf"
    keys = {"rope.scaling.type": "longrope", "rope.scaling.attn_factor": 1.19,
            "rope.scaling.original_context_length": 256}
    write_tiny_model(TinyModel("phi3", n_embd=128, head_dim=32, n_head=4, n_head_kv=2, n_ff=128, metadata=keys,
                               rope_factors=True), path, np.random.default_rng(9))
    tokens = [1] + [int(t) for t in np.random.default_rng(4).integers(3, 300, N_PROMPT - 1)]
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=n_ctx, n_batch=256, n_threads=2, verbose=False)
    try:
        llm.eval(tokens)
        theirs = np.asarray(llm.scores[:N_PROMPT], dtype=np.float32)
    finally:
        llm.close()
    with _ggml.same_arithmetic(), Model.load(path) as model, Context(model, n_ctx=n_ctx, n_threads=2) as ctx:
        batch = Batch(N_PROMPT)
        for pos, tok in enumerate(tokens):
            batch.add(tok, pos, [0], True)
        assert ctx.decode(batch) == 0
        np.testing.assert_array_equal(ctx.get_logits().view(np.uint32), theirs.view(np.uint32))


def test_scaling_changes_the_logits(tmp_path):
    """The cases above are not vacuous: each scaling moves the logits of a later position."""
    path = model_file(tmp_path, {})
    tokens = list(range(3, 3 + N_PROMPT))
    with Model.load(path) as model:
        def last(**args) -> np.ndarray:
            with Context(model, n_ctx=256, **args) as ctx:
                ctx.decode(Batch.get_one(tokens))
                return ctx.get_logits_ith(-1).copy()
        plain = last()
        for args in ({"rope_scaling_type": "yarn", "rope_freq_scale": 0.25, "yarn_orig_ctx": 12},
                     {"rope_scaling_type": "linear", "rope_freq_scale": 0.5}):
            assert not np.array_equal(last(**args), plain), args
        # "none" never scales, whatever the frequency scale asked
        assert np.array_equal(last(rope_scaling_type="none", rope_freq_scale=0.5), plain)


def test_context_resolves_as_llama_cpp(tmp_path):
    with Model.load(model_file(tmp_path, YARN_FILE)) as model:
        hp = model.hparams
        p = rope_params(hp, None, hp.rope_freq_scale_train)
        assert (p.scaling_type, p.freq_scale, p.ext_factor, p.n_ctx_orig) == ("yarn", 0.25, 1.0, 16)
        # attn_factor * (0.1 ln 4 + 1) / (1 + 0.1 ln 4), in float32
        assert p.attn_factor == pytest.approx(1.25, abs=2e-7)
        assert rope_params(hp, "linear", 0.25).ext_factor == 0.0
        assert rope_params(hp, 0, 0.25).freq_scale == 1.0
        with pytest.raises(ValueError, match="rope scaling type"):
            rope_params(hp, "ntk", 0.25)
        with pytest.raises(ValueError, match="rope scaling type"):
            Context(model, rope_scaling_type=7)


def test_cli_flags_and_llm_arguments(tmp_path):
    args = build_parser().parse_args(["run", "-p", "x", "--rope-scaling", "yarn", "--rope-scale", "4",
                                      "--yarn-orig-ctx", "12", "--yarn-beta-fast", "16", "--rope-freq-base", "5e3"])
    options = rope_options(args)
    assert options == {"rope_scaling_type": "yarn", "rope_freq_base": 5000.0, "rope_freq_scale": 0.25,
                       "yarn_orig_ctx": 12, "yarn_ext_factor": -1.0, "yarn_attn_factor": -1.0,
                       "yarn_beta_slow": -1.0, "yarn_beta_fast": 16.0}
    llm = LLM(str(model_file(tmp_path, {})), n_ctx=256, **options)
    try:
        rope = llm.context.rope
        assert (rope.scaling_type, rope.freq_scale, rope.n_ctx_orig, rope.beta_fast) == ("yarn", 0.25, 12, 16.0)
        assert llm.context.rope_freq_base == 5000.0
    finally:
        llm.close()
