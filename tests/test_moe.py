"""Mixture-of-experts architectures, and the dense families added with them (Granite, Gemma 1,
OLMo 2, SmolLM 3, StarCoder 2, Phi 2, Command R, StableLM), against llama.cpp itself.

Tiny random models of each architecture (gpt-oss with its attention sinks, a sliding window of 6
over a 20-token prompt, biased router and experts and its clamped SwiGLU), with routers that tie
(pairs of experts with the same router row; a layer whose scores are all 0, where only the order
std::sort leaves equal scores in decides which experts run, past 16 experts by introsort's
moves), enough experts that a
20-token prompt leaves some unchosen and gives others one token (a single-token ubatch always
does), and expert matrices of the types whose products ggml's mul_mat_id computes by different
recipes: repacked Q4_0, Q4_K, IQ4_NL, MXFP4 and (AVX-512) Q2_K (GEMV for every token), K-quants
(tiled GEMM from 8 tokens, vec_dot below), Q8_0 and F16 (vec_dot; never tinyBLAS). Their logits must equal the local
llama.cpp's bit for bit at every position, at 1 and 2 threads, a token per ubatch and the whole
prompt in one. Loading checks the experts' keys and tensors with the loader's errors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import _ggml
from _llama import llama_prompt_logits, require_peer
from gguflm import Batch, Context, Model, system
from gguflm.ggml_types import GGMLType
from gguflm.hparams import HParamError, MissingKeyError
from gguflm.loader import MissingTensorError, TensorShapeError
from test_model_loading import rewrite
from test_sampling_kernels import gcc_sorts  # noqa: F401 (fixture)
from tiny_models import TinyModel, write_tiny_model

N_PROMPT = 20

# (arch, experts, used, router, expert types gate/up/down): every architecture, every router, and
# each expert recipe somewhere
CASES = [
    ("llama", 8, 2, "pairs", (GGMLType.Q4_K, GGMLType.Q4_0, GGMLType.Q6_K)),
    ("llama", 20, 2, "zero", (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q5_K)),
    ("qwen2moe", 8, 2, "zero", (GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.F16)),
    ("qwen3moe", 40, 4, "pairs", (GGMLType.Q6_K, GGMLType.Q3_K, GGMLType.Q4_0)),
    ("olmoe", 4, 1, "random", (GGMLType.Q2_K, GGMLType.F16, GGMLType.Q5_0)),
    ("granitemoe", 20, 3, "pairs", (GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.Q4_K)),
    ("granite", 0, 0, "random", (GGMLType.F16,) * 3),
    ("gpt-oss", 20, 4, "zero", (GGMLType.Q8_0, GGMLType.F16, GGMLType.Q4_K)),
    ("gpt-oss", 8, 2, "pairs", (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q8_0)),
    ("gemma", 0, 0, "random", (GGMLType.F16,) * 3),
    ("olmo2", 0, 0, "random", (GGMLType.F16,) * 3),
    ("smollm3", 0, 0, "random", (GGMLType.F16,) * 3),
    ("starcoder2", 0, 0, "random", (GGMLType.F16,) * 3),
    ("phi2", 0, 0, "random", (GGMLType.F16,) * 3),
    ("command-r", 0, 0, "random", (GGMLType.F16,) * 3),
    ("stablelm", 0, 0, "random", (GGMLType.F16,) * 3),
    ("stablelm", 0, 0, "random", (GGMLType.F16,) * 3, {"parallel": True}),   # StableLM 2 12B's block
    # dots1: DeepSeek V3's router (sigmoid, the selection bias, weights normalised then scaled) after
    # a dense layer; then softmax routing without bias, normalisation or scale
    ("dots1", 8, 2, "pairs", (GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.Q6_K),
     {"n_layer": 3, "n_dense_lead": 1, "metadata": {"expert_gating_func": 2, "expert_weights_norm": True,
                                                    "expert_weights_scale": 2.5}}),
    ("dots1", 20, 3, "zero", (GGMLType.F16, GGMLType.Q4_0, GGMLType.Q5_K),
     {"router_bias": False, "metadata": {"expert_gating_func": 1}}),
    # TQ1_0 experts, held as TQ2_0 blocks after loading (the matmul_id and one-token paths read those)
    ("qwen3moe", 8, 2, "random", (GGMLType.TQ1_0, GGMLType.TQ1_0, GGMLType.TQ1_0)),
    ("dots1", 8, 3, "random", (GGMLType.Q8_0,) * 3, {"metadata": {"expert_gating_func": 3, "expert_weights_norm": True}}),
    # the other expert types ggml-cpu repacks (Q2_K on AVX-512; IQ4_NL and MXFP4 by Q4_0's 8x8
    # recipe): mul_mat_id takes the repacked GEMV for them too. Q2_K where its outputs reach the
    # residual (olmoe-4x1's Q2_K gate cannot tell: the down projection's Q8_0 activations, with
    # their fp16 scales, round the two recipes' last-bit differences away), and n_embd 512
    # (MXFP4's power-of-two scales keep most sums exact; longer rows differ more often)
    ("olmoe", 8, 2, "random", (GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.Q2_K),
     {"n_embd": 512, "head_dim": 128, "n_ff": 512}),
]


def spec_of(arch: str, n_expert: int, n_used: int, router: str, types: tuple[GGMLType, ...],
            extra: dict | None = None) -> TinyModel:
    kinds = {"ffn_gate_exps": types[0], "ffn_up_exps": types[1], "ffn_down_exps": types[2],
             "attn_q": GGMLType.Q8_0, "attn_k": GGMLType.Q4_K, "attn_v": GGMLType.F16,
             "attn_output": GGMLType.Q5_0, "ffn_gate_inp": GGMLType.F32, "ffn_gate_shexp": GGMLType.Q4_0,
             "ffn_up_shexp": GGMLType.Q8_0, "ffn_down_shexp": GGMLType.Q6_K, "ffn_gate": GGMLType.Q4_K,
             "ffn_up": GGMLType.Q8_0, "ffn_down": GGMLType.Q6_K, "output": GGMLType.Q8_0}
    square = arch in ("qwen2moe", "olmoe", "gpt-oss", "olmo2", "starcoder2", "phi2", "command-r", "stablelm")
    shape = dict(n_embd=256, head_dim=64, n_head=4, n_head_kv=4 if arch in ("olmoe", "dots1") else 2,
                 n_ff=256, n_layer=4 if arch == "smollm3" else 2,
                 tied_output=arch in ("gemma", "command-r") or not (square or arch == "dots1"), n_expert=n_expert,
                 n_expert_used=n_used, n_ff_exp=256, n_ff_shexp=256 if arch in ("qwen2moe", "granitemoe") else 0,
                 router=router, n_swa=6, types=kinds)
    return TinyModel(arch, **{**shape, **(extra or {})})


def decode_all(path: Path, tokens: list[int], n_ubatch: int, n_threads: int) -> np.ndarray:
    with Model.load(path) as model, Context(model, n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_threads=n_threads,
                                            n_threads_batch=n_threads) as ctx:
        batch = Batch(len(tokens))
        for pos, tok in enumerate(tokens):
            batch.add(tok, pos, [0], True)
        assert ctx.decode(batch) == 0
        return ctx.get_logits().copy()


def _case_id(c: tuple) -> str:
    extra = c[5] if c[5:] else {}
    tags = ["parallel"] if extra.get("parallel") else []
    tags += [f"gating{extra['metadata']['expert_gating_func']}"] if "metadata" in extra else []
    return "-".join([f"{c[0]}-{c[1]}x{c[2]}-{c[3]}"] + tags)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_logits_equal_llama_cpp(tmp_path, case):
    require_peer()
    path = tmp_path / f"{case[0]}.gguf"
    write_tiny_model(spec_of(*case), path, np.random.default_rng(len(case[0]) + case[1]))
    tokens = [1] + [int(t) for t in np.random.default_rng(7).integers(3, 300, N_PROMPT - 1)]
    for n_ubatch in (1, N_PROMPT):
        theirs = llama_prompt_logits(path, tokens, n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_threads=2,
                                     n_threads_batch=2)
        with _ggml.same_arithmetic():
            for n_threads in (1, 2):
                ours = decode_all(path, tokens, n_ubatch, n_threads)
                same = (ours.view(np.uint32) == theirs.view(np.uint32)).all(axis=1)
                assert same.all(), (f"ubatch {n_ubatch}, {n_threads} threads: positions "
                                    f"{np.flatnonzero(~same).tolist()} differ, max |diff| "
                                    f"{np.abs(ours - theirs).max():.3g}")


@pytest.mark.parametrize("case", [CASES[0], CASES[-1], CASES[-2]], ids=_case_id)
def test_generation_steps_equal_llama_cpp_on_every_isa(tmp_path, case):
    """A token per ubatch (generation's steps: the routed experts run as one node, one parallel
    region) on each instruction set the machine has, scalar included, gives llama.cpp's logits
    bit for bit: repacked experts, K-quants and Q8_0, softmax-after-top-k gating (dots1's)."""
    require_peer()
    path = tmp_path / f"{case[0]}.gguf"
    write_tiny_model(spec_of(*case), path, np.random.default_rng(len(case[0]) + case[1]))
    tokens = [1] + [int(t) for t in np.random.default_rng(7).integers(3, 300, 7)]
    theirs = llama_prompt_logits(path, tokens, n_ctx=256, n_batch=256, n_ubatch=1, n_threads=2,
                                 n_threads_batch=2)
    for isa in system.supported_isas():
        with _ggml.same_arithmetic(), system.using(isa=isa):
            ours = decode_all(path, tokens, 1, 2)
        assert (ours.view(np.uint32) == theirs.view(np.uint32)).all(), (isa, np.abs(ours - theirs).max())


def test_command_r_plus_qk_norms_equal_llama_cpp(tmp_path):
    """Command R+ (64 layers or more, llama.cpp's sign of it) LayerNorms each head of Q and K with
    its own weights; the block is otherwise Command R's (checked above at every ubatch and thread
    count), so one whole-prompt pass on 2 threads, kept small: 64 layers of n_embd 64."""
    require_peer()
    path = tmp_path / "command-r-plus.gguf"
    types = {"attn_q": GGMLType.Q8_0, "attn_k": GGMLType.F16, "attn_v": GGMLType.Q4_0, "attn_output": GGMLType.Q5_0,
             "ffn_gate": GGMLType.Q8_0, "ffn_up": GGMLType.F16, "ffn_down": GGMLType.Q4_1}
    write_tiny_model(spec_of("command-r", 0, 0, "random", (GGMLType.F16,) * 3,
                             {"n_layer": 64, "n_embd": 64, "head_dim": 16, "n_ff": 64, "types": types}),
                     path, np.random.default_rng(5))
    tokens = [1] + [int(t) for t in np.random.default_rng(7).integers(3, 300, 9)]
    theirs = llama_prompt_logits(path, tokens, n_ctx=256, n_batch=256, n_threads=2, n_threads_batch=2)
    with _ggml.same_arithmetic():
        ours = decode_all(path, tokens, len(tokens), 2)
    assert (ours.view(np.uint32) == theirs.view(np.uint32)).all(), np.abs(ours - theirs).max()
    with Model.load(path) as model:   # per-head weights (leaving them out moves the logits by 0.24)
        assert model.layers[63].attn_q_norm.shape == (16, 4) and model.layers[0].attn_k_norm.shape == (16, 2)


def test_tied_scores_route_past_index_order(gcc_sorts, tmp_path):
    """The "zero" router's layer 0 scores every expert 0: the 20-way tie is broken where GCC's
    std::sort leaves equal elements (ggml_argsort), which for 20 experts is not index order, so
    the llama.cpp comparison above (llama-20x2-zero) checks the tie order, not just the sort."""
    order = np.zeros(20, np.int32)
    gcc_sorts.oracle_sort(np.zeros(20, np.float32).ctypes.data, 20, order.ctypes.data)
    assert sorted(order[:2]) != [0, 1]
    path = tmp_path / "tied.gguf"
    write_tiny_model(spec_of("llama", 20, 2, "zero", (GGMLType.F16,) * 3), path, np.random.default_rng(3))
    with Model.load(path) as model:
        assert not np.asarray(model.tensors["blk.0.ffn_gate_inp.weight"].data).any()


def _fixture(tmp_path: Path, arch: str = "qwen3moe") -> Path:
    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(spec_of(arch, 4, 2, "random", (GGMLType.F16,) * 3), path, np.random.default_rng(0))
    return path


def test_expert_keys_are_checked(tmp_path):
    path = _fixture(tmp_path)
    with Model.load(path) as model:
        hp = model.hparams
        assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (4, 2, 256)
        assert ("n_expert", "4") in hp.describe()
    with pytest.raises(MissingKeyError, match="qwen3moe.expert_count"):
        Model.load(rewrite(path, tmp_path / "a.gguf", drop_keys={"qwen3moe.expert_count"}))
    with pytest.raises(HParamError, match=r"expert_used_count must be 1..4 \(expert_count\), found 5"):
        Model.load(rewrite(path, tmp_path / "b.gguf", set_keys={"qwen3moe.expert_used_count": 5}))
    with pytest.raises(HParamError, match="expert_used_count must be 1..4"):
        Model.load(rewrite(path, tmp_path / "c.gguf", drop_keys={"qwen3moe.expert_used_count"}))
    with pytest.raises(HParamError, match="expert_count must be 1..1024, found 0"):
        Model.load(rewrite(path, tmp_path / "d.gguf", set_keys={"qwen3moe.expert_count": 0}))


def test_expert_tensors_are_checked(tmp_path):
    path = _fixture(tmp_path)
    with pytest.raises(MissingTensorError, match="blk.1.ffn_down_exps.weight"):
        Model.load(rewrite(path, tmp_path / "a.gguf", drop_tensors={"blk.1.ffn_down_exps.weight"}))
    # three experts' matrices where the file says four
    def three_experts(t):
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        return raw[:raw.size * 3 // 4], t.type, (256, 256, 3)
    bad = rewrite(path, tmp_path / "b.gguf", tensor_edits={"blk.0.ffn_up_exps.weight": three_experts})
    with pytest.raises(TensorShapeError, match=r"ffn_up_exps.weight.*expected \[256, 256, 4\], got \[256, 256, 3\]"):
        Model.load(bad)
    # the router's width is the expert count
    with pytest.raises(TensorShapeError, match=r"blk.0.ffn_gate_inp.weight.*expected \[256, 3\], got \[256, 4\]"):
        Model.load(rewrite(path, tmp_path / "c.gguf", set_keys={"qwen3moe.expert_count": 3}))


def test_architecture_specific_checks(tmp_path):
    # OLMoE's K norm spans n_embd: llama.cpp can only run it without GQA
    path = _fixture(tmp_path, "olmoe")
    with pytest.raises(HParamError, match="olmoe needs head_count_kv = head_count"):
        Model.load(rewrite(path, tmp_path / "a.gguf", set_keys={"olmoe.attention.head_count_kv": 2}))
    # Granite's logits are divided by a scale it must give
    path = _fixture(tmp_path, "granitemoe")
    with Model.load(path) as model:
        assert model.hparams.f_logit_scale == 0.125 and model.hparams.n_ff_shexp == 256
    with pytest.raises(MissingKeyError, match="granitemoe.logit_scale"):
        Model.load(rewrite(path, tmp_path / "b.gguf", drop_keys={"granitemoe.logit_scale"}))
    # gpt-oss: a sink per head, biases on the router and the experts
    path = _fixture(tmp_path, "gpt-oss")
    with Model.load(path) as model:
        assert model.hparams.swa_layers == (True, False) and model.hparams.n_swa == 6
    for name in ("blk.0.attn_sinks.weight", "blk.1.ffn_up_exps.bias", "blk.0.attn_output.bias"):
        with pytest.raises(MissingTensorError, match=name):
            Model.load(rewrite(path, tmp_path / "d.gguf", drop_tensors={name}))
    with pytest.raises(MissingKeyError, match="gpt-oss.attention.sliding_window"):
        Model.load(rewrite(path, tmp_path / "e.gguf", drop_keys={"gpt-oss.attention.sliding_window"}))
    # SmolLM 3's every fourth layer has no RoPE
    path = tmp_path / "smollm3.gguf"
    write_tiny_model(spec_of("smollm3", 0, 0, "random", (GGMLType.F16,) * 3), path, np.random.default_rng(0))
    with Model.load(path) as model:
        assert [model.hparams.has_rope(il) for il in range(4)] == [True, True, True, False]
    # dots1: the gating must be one build_moe_ffn runs (llama.cpp aborts without one); no GQA; the
    # selection bias is optional, the shared experts are not
    path = tmp_path / "dots1.gguf"
    write_tiny_model(spec_of("dots1", 4, 2, "random", (GGMLType.F16,) * 3,
                             {"n_dense_lead": 1, "n_ff_shexp": 512,
                              "metadata": {"expert_gating_func": 2, "expert_weights_scale": 2.5}}),
                     path, np.random.default_rng(0))
    with Model.load(path) as model:
        hp = model.hparams
        assert (hp.n_layer_dense_lead, hp.n_ff_shexp, hp.expert_gating_func) == (1, 512, 2)
        assert (hp.expert_weights_norm, hp.expert_weights_scale) == (False, 2.5)
        assert model.layers[0].ffn_gate_inp is None and model.layers[1].exp_probs_b_bias is not None
    with pytest.raises(HParamError, match=r"dots1.expert_gating_func must be one of \[1, 2, 3\].*found 0"):
        Model.load(rewrite(path, tmp_path / "f.gguf", drop_keys={"dots1.expert_gating_func"}))
    with pytest.raises(HParamError, match="dots1 needs head_count_kv = head_count"):
        Model.load(rewrite(path, tmp_path / "g.gguf", set_keys={"dots1.attention.head_count_kv": 2}))
    with pytest.raises(MissingKeyError, match="dots1.expert_shared_count"):
        Model.load(rewrite(path, tmp_path / "h.gguf", drop_keys={"dots1.expert_shared_count"}))
    with pytest.raises(MissingTensorError, match="blk.1.ffn_up_shexp.weight"):
        Model.load(rewrite(path, tmp_path / "i.gguf", drop_tensors={"blk.1.ffn_up_shexp.weight"}))
    with Model.load(rewrite(path, tmp_path / "j.gguf", drop_tensors={"blk.1.exp_probs_b.bias"})) as model:
        assert model.layers[1].exp_probs_b_bias is None
    # Qwen 2 MoE wants its own output projection, as llama.cpp does
    path = _fixture(tmp_path, "qwen2moe")
    with pytest.raises(MissingTensorError, match="output.weight"):
        Model.load(rewrite(path, tmp_path / "c.gguf", drop_tensors={"output.weight"}))
