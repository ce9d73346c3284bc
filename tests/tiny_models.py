"""Tiny random models of every architecture gguflm runs, written with gguflm's GGUF writer.

A :class:`TinyModel` says what to write: architecture, shape, the weight type of every matrix, a
tied or separate output projection, the sliding window; for the encoders (``ENCODER_ARCHS``) the
pooling type and whether a classification head is there. :func:`write_tiny_model` writes it with
random weights; :func:`tiny_models` is the hypothesis strategy that draws decoders over the shapes
and types real files have (and the awkward ones: head dims of 8 or 80, rows too short for a K-quant
block, one KV head for eight query heads), :func:`tiny_encoders` the same for encoders.
``tests/data/arch/make_fixtures.py`` writes the committed fixtures with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from gguflm import Batch, Context, Model, quants
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFValueType, GGUFWriter

N_VOCAB = 320
ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "granite", "qwen2moe", "qwen3moe", "olmoe",
         "granitemoe", "gpt-oss", "gemma", "olmo2", "smollm3", "starcoder2", "phi2", "command-r", "stablelm",
         "dots1", "ernie4_5", "seed_oss", "glm4", "exaone4", "gpt2", "starcoder", "internlm2", "cohere2",
         "qwen", "olmo", "gptneox", "falcon", "baichuan")
# mixtures of experts: always (MOE_ARCHS), or when n_expert > 0 (llama is then Mixtral)
MOE_ARCHS = ("qwen2moe", "qwen3moe", "olmoe", "granitemoe", "gpt-oss", "dots1")
OPTIONAL_MOE_ARCHS = ("llama", "granite")
# their experts are expert_feed_forward_length wide (the others': feed_forward_length)
EXPERT_FF_ARCHS = ("qwen2moe", "qwen3moe", "gpt-oss", "dots1")
# llama.cpp wants an output.weight of their own
UNTIED_OUTPUT_ARCHS = ("internlm2", "qwen", "baichuan", "gptneox", "qwen2moe", "olmoe", "gpt-oss", "olmo2", "phi2", "stablelm", "dots1")
GRANITE_ARCHS = ("granite", "granitemoe")
# BERT's post-norm encoder; nomic-bert with RoPE, a fused QKV and SwiGLU; jina-bert-v2 with ALiBi,
# Q/K LayerNorms, a second attention LayerNorm and a GEGLU whose gate is the up projection's first half
ENCODER_ARCHS = ("bert", "nomic-bert", "jina-bert-v2")
FUSED_QKV_ARCHS = ("phi3", "nomic-bert", "phi2", "gpt2", "starcoder", "qwen", "gptneox", "falcon")
SWA_ARCHS = ("gemma2", "gemma3", "gpt-oss", "exaone4", "cohere2")   # exaone4's slides at 64 layers only
# llama.cpp reads no output.weight for them: the output projection is the token embedding
TIED_OUTPUT_ARCHS = ("gemma2", "gemma", "command-r", "cohere2")
# llama.cpp declares their Q and attention output n_embd x n_embd: n_head * head_dim = n_embd
SQUARE_ATTENTION_ARCHS = ("qwen2", "phi3", "qwen2moe", "olmoe", "olmo2", "starcoder2", "phi2", "command-r",
                          "stablelm", "exaone4", "gpt2", "starcoder", "internlm2", "cohere2", "qwen", "olmo", "gptneox", "falcon",
                          "baichuan")
# LayerNorms with biases, biased GELU feed-forward (no gate)
LAYER_NORM_ARCHS = ("starcoder2", "phi2", "gpt2", "starcoder", "gptneox")
# attention and feed-forward in parallel on one norm (no ffn_norm)
PARALLEL_ARCHS = ("phi2", "command-r", "cohere2", "falcon")

# every weight type with a dot kernel, as a matrix of a model may hold it
WEIGHT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K,
                GGMLType.Q6_K,
                # the value-table and ternary formats
                GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.TQ1_0, GGMLType.TQ2_0)

# the matrices of a layer by kind; "attn_qkv" and a double-width "ffn_up" replace Q, K, V and the
# gate in Phi 3
MATRIX_KINDS = ("token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output",
                "ffn_gate", "ffn_up", "ffn_down", "cls", "cls_output", "ffn_gate_inp", "ffn_gate_exps",
                "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
# routers: "random"; "pairs" (expert 2i+1's router row is expert 2i's: tied scores); "zero" (every
# score 0 in layer 0: all experts tie)
ROUTERS = ("random", "pairs", "zero")


@dataclass(frozen=True)
class TinyModel:
    """What to write. ``types`` maps a matrix kind (``MATRIX_KINDS``) to its default type and
    ``tensor_types`` single tensors (``"blk.1.attn_k.weight"``) to theirs, overriding it."""

    arch: str
    n_embd: int = 256
    head_dim: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 512
    n_layer: int = 2
    tied_output: bool = True
    n_swa: int = 16                     # sliding window of the architectures that have one
    pooling_type: int = -1              # encoders: {arch}.pooling_type (-1: not written)
    classifier: bool = False            # encoders: a rank pooling head (cls, cls.output)
    n_expert: int = 0                   # mixture of experts (MOE_ARCHS, or llama/granite when > 0)
    n_expert_used: int = 0
    n_ff_exp: int = 0                   # expert width (EXPERT_FF_ARCHS; else n_ff)
    n_ff_shexp: int = 0                 # shared expert (qwen2moe always: 0 = n_ff; dots1 always, a multiple
                                        # of the expert width: 0 = one expert's; granite: 0 = none)
    n_dense_lead: int = 0               # dots1: leading layers with a dense feed-forward
    router_bias: bool = True            # dots1: the selection bias exp_probs_b
    router: str = "random"              # ROUTERS
    parallel: bool = False              # stablelm: StableLM 2 12B's block (per-head Q/K norms, no FFN norm)
    metadata: dict = field(default_factory=dict)   # more {arch}.* keys (RoPE scaling, ...), without the prefix
    rope_factors: bool = False          # phi3: LongRoPE's rope_factors_long/short.weight
    types: dict[str, GGMLType] = field(default_factory=dict)
    tensor_types: dict[str, GGMLType] = field(default_factory=dict)

    @property
    def expert_ff(self) -> int:
        return (self.n_ff_exp or self.n_ff) if self.arch in EXPERT_FF_ARCHS else self.n_ff

    @property
    def shared_ff(self) -> int:
        if self.arch == "dots1":
            return self.n_ff_shexp or self.expert_ff
        return (self.n_ff_shexp or self.n_ff) if self.arch == "qwen2moe" else self.n_ff_shexp

    def has_experts(self, il: int) -> bool:
        return bool(self.n_expert) and il >= self.n_dense_lead

    def type_of(self, name: str, kind: str) -> GGMLType:
        return self.tensor_types.get(name, self.types.get(kind, GGMLType.F16))


def add_vocab(w: GGUFWriter) -> None:
    """A minimal SentencePiece vocabulary: unk, bos, eos, the 256 byte tokens, pieces, end-of-text."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581p{i}" for i in range(N_VOCAB - len(tokens) - 1)]
    tokens.append("<|endoftext|>")  # llama.cpp's vocabulary loader wants it for Phi 3
    types = [2, 3, 3] + [6] * 256 + [1] * (N_VOCAB - 260) + [3]
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.scores", np.array([0.0] * 259 + [-float(i) for i in range(N_VOCAB - 259)], np.float32))
    w.add("tokenizer.ggml.token_type", np.array(types, np.int32))
    for key, value in (("bos", 1), ("eos", 2), ("unknown", 0)):
        w.add(f"tokenizer.ggml.{key}_token_id", value, GGUFValueType.UINT32)


# ggml_quantize_requires_imatrix: these types quantize only with importance weights
NEEDS_IMATRIX = frozenset({GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S})


def quantize_weight(t: GGMLType, x: np.ndarray) -> np.ndarray:
    """``x`` [n_out, n_in] in type ``t``: gguflm's quantizer, or for the types it cannot quantize yet
    ggml's ``ggml_quantize_chunk`` through llama-cpp-python; with the mean squares of the columns
    as importance where ggml requires one."""
    imatrix = np.mean(x.astype(np.float64) ** 2, axis=0).astype(np.float32) if t in NEEDS_IMATRIX else None
    try:
        return quants.get(t).quantize(x, imatrix=imatrix)
    except ValueError as e:
        if "not implemented" not in str(e):
            raise
    import _ggml
    return _ggml.quantize_chunk(t, x, imatrix)


def write_tiny_model(spec: TinyModel, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with weights from ``rng``: norms near 1, biases near 0, matrices N(0, 0.08)
    (the token embedding N(0, 0.5)), each quantized with ggml's reference quantizer."""
    s, arch = spec, spec.arch
    w = GGUFWriter(path, arch=arch)

    def vector(name: str, n: int, bias: bool = False) -> None:
        data = 0.05 * rng.standard_normal(n) if bias else 1.0 + 0.1 * rng.standard_normal(n)
        w.add_tensor(name, data.astype(np.float32), GGMLType.F32)

    def matrix(name: str, kind: str, n_in: int, n_out: int, scale: float = 0.08, n_expert: int = 0,
               x: np.ndarray | None = None) -> None:
        """[n_out, n_in], or n_expert of them (a 3-D tensor)"""
        t = spec.type_of(name, kind)
        if x is None:
            x = (scale * rng.standard_normal((n_expert or 1, n_out, n_in))).astype(np.float32)
        x = x.reshape((n_expert, n_out, n_in) if n_expert else (n_out, n_in))
        if t is GGMLType.F16:
            w.add_tensor(name, x.astype(np.float16), GGMLType.F16)
        else:
            w.add_tensor(name, quantize_weight(t, x.reshape(-1, n_in)), t,
                         shape=(n_in, n_out, n_expert) if n_expert else (n_in, n_out))

    w.add("general.name", f"tiny-{arch}")
    e, hd, nh, nkv, ff = s.n_embd, s.head_dim, s.n_head, s.n_head_kv, s.n_ff
    for key, value in {"context_length": 256, "embedding_length": e, "block_count": s.n_layer,
                       # Qwen (1) halves the file's width
                       "feed_forward_length": 2 * ff if arch == "qwen" else ff, "attention.head_count": nh,
                       "attention.head_count_kv": nkv, "attention.key_length": hd,
                       "attention.value_length": hd, "rope.freq_base": 10000.0}.items():
        # llama.cpp insists on UINT32 for integer hyper-parameters
        w.add(f"{arch}.{key}", value, GGUFValueType.UINT32 if isinstance(value, int) else None)
    for key, value in s.metadata.items():
        integer = isinstance(value, int) and not isinstance(value, bool)
        w.add(f"{arch}.{key}", value, GGUFValueType.UINT32 if integer else None)
    if arch in ENCODER_ARCHS:
        _write_encoder(spec, w, rng, vector, matrix)
        return
    if arch in ("phi2", "stablelm", "glm4", "gptneox"):   # partial rotary, as Phi 2's 32 of 80
        w.add(f"{arch}.rope.dimension_count", hd // 2 + hd // 2 % 2, GGUFValueType.UINT32)
    if arch in ("command-r", "cohere2"):
        w.add(f"{arch}.logit_scale", 0.0625)
    if arch == "gptneox":
        w.add(f"{arch}.use_parallel_residual", s.parallel)
    if arch in LAYER_NORM_ARCHS + ("command-r", "cohere2", "stablelm", "olmo", "falcon"):
        w.add(f"{arch}.attention.layer_norm_epsilon", 1e-5)
    else:
        w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    if arch in SWA_ARCHS:
        w.add(f"{arch}.attention.sliding_window", s.n_swa, GGUFValueType.UINT32)
    if arch == "gemma2":
        w.add("gemma2.attn_logit_softcapping", 50.0)
        w.add("gemma2.final_logit_softcapping", 30.0)
    if arch in GRANITE_ARCHS:  # Granite 3's values, roughly
        w.add(f"{arch}.logit_scale", 8.0)
        w.add(f"{arch}.residual_scale", 0.22)
        w.add(f"{arch}.embedding_scale", 12.0)
        w.add(f"{arch}.attention.scale", 0.015625)
    if s.n_expert:
        w.add(f"{arch}.expert_count", s.n_expert, GGUFValueType.UINT32)
        w.add(f"{arch}.expert_used_count", s.n_expert_used, GGUFValueType.UINT32)
        if arch in EXPERT_FF_ARCHS:
            w.add(f"{arch}.expert_feed_forward_length", s.expert_ff, GGUFValueType.UINT32)
        if arch == "dots1":   # shared experts of the routed ones' width
            w.add(f"{arch}.expert_shared_count", s.shared_ff // s.expert_ff, GGUFValueType.UINT32)
            w.add(f"{arch}.leading_dense_block_count", s.n_dense_lead, GGUFValueType.UINT32)
        elif s.n_ff_shexp:
            w.add(f"{arch}.expert_shared_feed_forward_length", s.n_ff_shexp, GGUFValueType.UINT32)
    add_vocab(w)

    matrix("token_embd.weight", "token_embd", e, N_VOCAB, scale=0.5)
    if arch in ("gpt2", "starcoder"):   # learned positions, one row per position of the context
        w.add_tensor("position_embd.weight", (0.1 * rng.standard_normal((256, e))).astype(np.float32), GGMLType.F32)
    if arch != "olmo":   # its LayerNorms have no weights
        vector("output_norm.weight", e)
    if s.rope_factors:   # per-pair divisors of theta, growing with the dimension as Phi 3's
        for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            factors = 1.0 + np.sort(rng.uniform(0.0, 8.0 if "long" in name else 1.5, hd // 2))
            w.add_tensor(name, factors.astype(np.float32), GGMLType.F32)
    if arch in LAYER_NORM_ARCHS + ("stablelm", "falcon"):
        vector("output_norm.bias", e, bias=True)
    if not s.tied_output:
        matrix("output.weight", "output", e, N_VOCAB)
    if arch == "phi2":
        vector("output.bias", N_VOCAB, bias=True)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        if arch not in ("olmo2", "exaone4", "olmo"):   # norms after attention and FFN only, or weightless
            vector(f"{b}.attn_norm.weight", e)
        if arch in LAYER_NORM_ARCHS:   # biases on the norms, Q, K, V (phi2: fused), attention output
            vector(f"{b}.attn_norm.bias", e, bias=True)
            vector(f"{b}.attn_output.bias", e, bias=True)
            if arch == "starcoder2":
                for proj, n in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd)):
                    vector(f"{b}.{proj}.bias", n, bias=True)
        if arch in FUSED_QKV_ARCHS:
            matrix(f"{b}.attn_qkv.weight", "attn_qkv", e, nh * hd + 2 * nkv * hd)
            if arch not in ("phi3", "falcon"):
                vector(f"{b}.attn_qkv.bias", nh * hd + 2 * nkv * hd, bias=True)
        else:
            matrix(f"{b}.attn_q.weight", "attn_q", e, nh * hd)
            matrix(f"{b}.attn_k.weight", "attn_k", e, nkv * hd)
            matrix(f"{b}.attn_v.weight", "attn_v", e, nkv * hd)
        matrix(f"{b}.attn_output.weight", "attn_output", nh * hd, e)
        if arch in ("qwen2", "qwen2moe", "ernie4_5", "seed_oss", "glm4"):
            for proj, n in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd)):
                vector(f"{b}.{proj}.bias", n, bias=True)
        if arch == "stablelm":
            vector(f"{b}.attn_norm.bias", e, bias=True)
            for proj, n in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd)):
                vector(f"{b}.{proj}.bias", n, bias=True)
            if s.parallel:   # per-head Q/K LayerNorm weights [n_head(_kv), head_dim]
                w.add_tensor(f"{b}.attn_q_norm.weight", (1 + 0.1 * rng.standard_normal((nh, hd))).astype(np.float32), GGMLType.F32)
                w.add_tensor(f"{b}.attn_k_norm.weight", (1 + 0.1 * rng.standard_normal((nkv, hd))).astype(np.float32), GGMLType.F32)
        if arch == "command-r" and s.n_layer >= 64:   # Command R+: per-head Q/K LayerNorm weights
            w.add_tensor(f"{b}.attn_q_norm.weight", (1 + 0.1 * rng.standard_normal((nh, hd))).astype(np.float32), GGMLType.F32)
            w.add_tensor(f"{b}.attn_k_norm.weight", (1 + 0.1 * rng.standard_normal((nkv, hd))).astype(np.float32), GGMLType.F32)
        if arch in ("qwen3", "gemma3", "qwen3moe", "dots1", "exaone4"):
            vector(f"{b}.attn_q_norm.weight", hd)
            vector(f"{b}.attn_k_norm.weight", hd)
        if arch in ("olmoe", "olmo2"):
            vector(f"{b}.attn_q_norm.weight", e)
            vector(f"{b}.attn_k_norm.weight", e if arch == "olmoe" else nkv * hd)
        if arch == "olmo2":
            vector(f"{b}.post_attention_norm.weight", e)
            vector(f"{b}.post_ffw_norm.weight", e)
        if arch == "falcon":   # a biased attention norm; with GQA (Falcon-40B) a second one
            vector(f"{b}.attn_norm.bias", e, bias=True)
            if nkv > 1:
                vector(f"{b}.attn_norm_2.weight", e)
                vector(f"{b}.attn_norm_2.bias", e, bias=True)
        if arch == "ernie4_5":   # read by llama.cpp, never added
            vector(f"{b}.attn_output.bias", e, bias=True)
        if arch in ("gemma2", "gemma3", "glm4", "exaone4"):
            vector(f"{b}.post_attention_norm.weight", e)
            vector(f"{b}.post_ffw_norm.weight", e)
        if arch == "gpt-oss":   # attention biases, sinks, the norm before the experts
            for proj, n in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd), ("attn_output", e)):
                vector(f"{b}.{proj}.bias", n, bias=True)
            w.add_tensor(f"{b}.attn_sinks.weight", rng.standard_normal(nh).astype(np.float32), GGMLType.F32)
            vector(f"{b}.post_attention_norm.weight", e)
        if arch == "seed_oss":   # its norm before the feed-forward
            vector(f"{b}.post_attention_norm.weight", e)
        elif arch not in ("gpt-oss", "olmo2", "exaone4", "olmo") + PARALLEL_ARCHS and not (s.parallel and arch == "stablelm"):   # gpt-oss's experts take the post-attention norm
            vector(f"{b}.ffn_norm.weight", e)
            if arch == "stablelm":
                vector(f"{b}.ffn_norm.bias", e, bias=True)
        if s.has_experts(il):
            _write_experts(spec, il, w, rng, vector, matrix)
            continue
        if arch in LAYER_NORM_ARCHS:
            if arch not in PARALLEL_ARCHS:
                vector(f"{b}.ffn_norm.bias", e, bias=True)
            matrix(f"{b}.ffn_up.weight", "ffn_up", e, ff)
            vector(f"{b}.ffn_up.bias", ff, bias=True)
            matrix(f"{b}.ffn_down.weight", "ffn_down", ff, e)
            vector(f"{b}.ffn_down.bias", e, bias=True)
            continue
        if arch == "falcon":   # up, GELU, down; no biases
            matrix(f"{b}.ffn_up.weight", "ffn_up", e, ff)
            matrix(f"{b}.ffn_down.weight", "ffn_down", ff, e)
            continue
        if arch in ("phi3", "glm4"):
            matrix(f"{b}.ffn_up.weight", "ffn_up", e, 2 * ff)
        else:
            matrix(f"{b}.ffn_gate.weight", "ffn_gate", e, ff)
            matrix(f"{b}.ffn_up.weight", "ffn_up", e, ff)
        matrix(f"{b}.ffn_down.weight", "ffn_down", ff, e)
    w.write()


def _write_experts(spec: TinyModel, il: int, w: GGUFWriter, rng: np.random.Generator, vector, matrix) -> None:
    """The router, experts and shared expert of layer ``il``."""
    s, b, e, n = spec, f"blk.{il}", spec.n_embd, spec.n_expert
    router = (0.5 * rng.standard_normal((n, e))).astype(np.float32)
    if s.router == "pairs":
        router[1::2] = router[0:n - n % 2:2]
    elif s.router == "zero" and il == 0:
        router[:] = 0.0
    matrix(f"{b}.ffn_gate_inp.weight", "ffn_gate_inp", e, n, x=router)
    f = s.expert_ff
    if s.arch == "dots1" and s.router_bias:   # the selection bias, tied where the router rows are
        bias = 0.2 * rng.standard_normal(n)
        if s.router == "pairs":
            bias[1::2] = bias[0:n - n % 2:2]
        w.add_tensor(f"{b}.exp_probs_b.bias", bias.astype(np.float32), GGMLType.F32)
    if s.arch == "gpt-oss":   # router and expert biases (F32, one row per expert)
        bias = 0.5 * rng.standard_normal(n)
        if s.router == "pairs":
            bias[1::2] = bias[0:n - n % 2:2]
        elif s.router == "zero" and il == 0:
            bias[:] = 0.0
        w.add_tensor(f"{b}.ffn_gate_inp.bias", bias.astype(np.float32), GGMLType.F32)
        for proj, width in (("ffn_gate_exps", f), ("ffn_down_exps", e), ("ffn_up_exps", f)):
            w.add_tensor(f"{b}.{proj}.bias", (0.05 * rng.standard_normal((n, width))).astype(np.float32), GGMLType.F32)
    matrix(f"{b}.ffn_gate_exps.weight", "ffn_gate_exps", e, f, n_expert=n)
    matrix(f"{b}.ffn_down_exps.weight", "ffn_down_exps", f, e, n_expert=n)
    matrix(f"{b}.ffn_up_exps.weight", "ffn_up_exps", e, f, n_expert=n)
    if s.shared_ff:
        if s.arch == "qwen2moe":
            vector(f"{b}.ffn_gate_inp_shexp.weight", e, bias=True)
        matrix(f"{b}.ffn_gate_shexp.weight", "ffn_gate_shexp", e, s.shared_ff)
        matrix(f"{b}.ffn_down_shexp.weight", "ffn_down_shexp", s.shared_ff, e)
        matrix(f"{b}.ffn_up_shexp.weight", "ffn_up_shexp", e, s.shared_ff)


def _write_encoder(spec: TinyModel, w: GGUFWriter, rng: np.random.Generator, vector, matrix) -> None:
    """The metadata and tensors of an encoder, in the names llama.cpp's converter gives them."""
    s, arch = spec, spec.arch
    e, nh, nkv, hd, ff = s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff
    w.add(f"{arch}.attention.layer_norm_epsilon", 1e-12)
    w.add(f"{arch}.attention.causal", False)
    if s.pooling_type >= 0:
        w.add(f"{arch}.pooling_type", s.pooling_type, GGUFValueType.UINT32)
    add_vocab(w)
    w.add("tokenizer.ggml.token_type_count", 2, GGUFValueType.UINT32)

    def norm(name: str) -> None:
        vector(f"{name}.weight", e)
        vector(f"{name}.bias", e, bias=True)

    matrix("token_embd.weight", "token_embd", e, N_VOCAB, scale=0.5)
    # like the converter, token-type and position embeddings stay F32
    w.add_tensor("token_types.weight", (0.1 * rng.standard_normal((2, e))).astype(np.float32), GGMLType.F32)
    if arch == "bert":
        w.add_tensor("position_embd.weight", (0.1 * rng.standard_normal((256, e))).astype(np.float32), GGMLType.F32)
    norm("token_embd_norm")
    if s.classifier:
        n_hidden = 1 if arch == "jina-bert-v2" else e   # jina-reranker's head is one dense to a score
        matrix("cls.weight", "cls", e, n_hidden)
        vector("cls.bias", n_hidden, bias=True)
        if arch == "bert":
            matrix("cls.output.weight", "cls_output", e, 1)
            vector("cls.output.bias", 1, bias=True)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        if arch in FUSED_QKV_ARCHS:
            matrix(f"{b}.attn_qkv.weight", "attn_qkv", e, nh * hd + 2 * nkv * hd)
        else:
            for proj, n in (("attn_q", nh * hd), ("attn_k", nkv * hd), ("attn_v", nkv * hd)):
                matrix(f"{b}.{proj}.weight", proj, e, n)
                vector(f"{b}.{proj}.bias", n, bias=True)
        if arch == "jina-bert-v2":
            norm(f"{b}.attn_q_norm")
            norm(f"{b}.attn_k_norm")
        matrix(f"{b}.attn_output.weight", "attn_output", nh * hd, e)
        vector(f"{b}.attn_output.bias", e, bias=True)
        norm(f"{b}.attn_output_norm")
        if arch == "jina-bert-v2":
            norm(f"{b}.attn_norm_2")
        n_up = 2 * ff if arch == "jina-bert-v2" else ff
        matrix(f"{b}.ffn_up.weight", "ffn_up", e, n_up)
        if arch == "nomic-bert":
            matrix(f"{b}.ffn_gate.weight", "ffn_gate", e, ff)
        else:
            vector(f"{b}.ffn_up.bias", n_up, bias=True)
        matrix(f"{b}.ffn_down.weight", "ffn_down", ff, e)
        if arch != "nomic-bert":
            vector(f"{b}.ffn_down.bias", e, bias=True)
        norm(f"{b}.layer_output_norm")
    w.write()


def matrix_inputs(spec: TinyModel) -> dict[str, tuple[str, int]]:
    """Every matrix of ``spec`` by tensor name: its kind and its row length (input width)."""
    s = spec
    out = {"token_embd.weight": ("token_embd", s.n_embd)}
    if s.arch in ENCODER_ARCHS:
        if s.classifier:
            out["cls.weight"] = ("cls", s.n_embd)
            if s.arch == "bert":
                out["cls.output.weight"] = ("cls_output", s.n_embd)
        for il in range(s.n_layer):
            b = f"blk.{il}"
            kinds = ("attn_qkv", "ffn_up") if s.arch in FUSED_QKV_ARCHS else ("attn_q", "attn_k", "attn_v", "ffn_up")
            if s.arch == "nomic-bert":
                kinds += ("ffn_gate",)
            out.update({f"{b}.{kind}.weight": (kind, s.n_embd) for kind in kinds})
            out[f"{b}.attn_output.weight"] = ("attn_output", s.n_head * s.head_dim)
            out[f"{b}.ffn_down.weight"] = ("ffn_down", s.n_ff)
        return out
    if not s.tied_output:
        out["output.weight"] = ("output", s.n_embd)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        if s.arch in FUSED_QKV_ARCHS:
            kinds = ("attn_qkv", "ffn_up")
            out[f"{b}.ffn_down.weight"] = ("ffn_down", s.n_ff)
        elif s.has_experts(il):
            kinds = ("attn_q", "attn_k", "attn_v", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps")
            out[f"{b}.ffn_down_exps.weight"] = ("ffn_down_exps", s.expert_ff)
            if s.shared_ff:
                kinds += ("ffn_gate_shexp", "ffn_up_shexp")
                out[f"{b}.ffn_down_shexp.weight"] = ("ffn_down_shexp", s.shared_ff)
        else:
            kinds = ("attn_q", "attn_k", "attn_v", "ffn_up") + (() if s.arch in LAYER_NORM_ARCHS + ("glm4",) else ("ffn_gate",))
            out[f"{b}.ffn_down.weight"] = ("ffn_down", s.n_ff)
        out.update({f"{b}.{kind}.weight": (kind, s.n_embd) for kind in kinds})
        out[f"{b}.attn_output.weight"] = ("attn_output", s.n_head * s.head_dim)
    return out


def fits(t: GGMLType, n_in: int) -> bool:
    """A row of n_in values is a whole number of t's blocks."""
    return n_in % quants.get(t).block_size == 0


@st.composite
def tiny_models(draw: st.DrawFn, archs: tuple[str, ...] = ARCHS) -> TinyModel:
    """Any architecture; n_embd 32..512 (multiples of 16, most not of 64), head_dim 8..256, one
    or two KV heads shared by 1..8 query heads, 1..3 layers, tied or separate output, and every
    matrix of a type drawn from those whose block fits its rows."""
    arch = draw(st.sampled_from(archs))
    head_dim = draw(st.sampled_from((8, 16, 32, 48, 64, 80, 96, 128, 256)))
    if arch in SQUARE_ATTENTION_ARCHS:
        # a head count some KV head count (1 or 2) serves with at most 8 query heads each
        n_head = draw(st.sampled_from([h for h in range(1, 17) if 32 <= h * head_dim <= 512
                                       and (h <= 8 or (h % 2 == 0 and h // 2 <= 8))]))
        n_head_kv = draw(st.sampled_from([k for k in (1, 2) if n_head % k == 0 and n_head // k <= 8]))
        if arch in ("olmoe", "qwen"):  # OLMoE's K norm spans n_embd, Qwen's QKV is 3 x n_embd: no GQA
            n_head = n_head_kv = draw(st.sampled_from([h for h in range(1, 9) if 32 <= h * head_dim <= 512]))
        n_embd = n_head * head_dim
    else:
        n_head_kv = draw(st.integers(1, 2))
        # dots1: llama.cpp declares K and V as wide as Q (no GQA)
        n_head = n_head_kv if arch == "dots1" else n_head_kv * draw(st.integers(1, 8))
        n_embd = draw(st.integers(2, 32)) * 16
    shape = dict(arch=arch, n_embd=n_embd, head_dim=head_dim, n_head=n_head, n_head_kv=n_head_kv,
                 n_ff=draw(st.integers(2, 48)) * 16,
                 # SmolLM 3's fourth layer is the one without RoPE
                 n_layer=4 if arch == "smollm3" else draw(st.integers(1, 3)),
                 tied_output=arch in TIED_OUTPUT_ARCHS or (arch not in UNTIED_OUTPUT_ARCHS and draw(st.booleans())),
                 n_swa=draw(st.integers(2, 24)), parallel=arch in ("stablelm", "gptneox") and draw(st.booleans()))
    spec = TinyModel(**{**shape, **draw(experts(arch))})
    tensor_types = {name: draw(st.sampled_from([t for t in WEIGHT_TYPES if fits(t, n_in)]))
                    for name, (_, n_in) in matrix_inputs(spec).items()}
    return TinyModel(**{**spec.__dict__, "tensor_types": tensor_types})


@st.composite
def experts(draw: st.DrawFn, arch: str) -> dict:
    """Expert counts and widths of a MoE architecture (none, or maybe none, for the others):
    2..40 experts (past 16, std::sort's introsort decides the order of tied scores), 1..4 used,
    routers with ties."""
    if arch not in MOE_ARCHS and not (arch in OPTIONAL_MOE_ARCHS and draw(st.booleans())):
        return {}
    n_expert = draw(st.sampled_from((2, 4, 8, 8, 20, 40)))
    n_ff_exp = draw(st.integers(1, 12)) * 16
    shared = {"qwen2moe": draw(st.sampled_from((0, 64, 96))), "dots1": n_ff_exp * draw(st.integers(1, 2)),
              "granite": draw(st.sampled_from((0, 0, 64))), "granitemoe": draw(st.sampled_from((0, 0, 64)))}
    return {"n_expert": n_expert, "n_expert_used": draw(st.integers(1, min(4, n_expert))),
            # experts feed_forward_length wide get a small one
            **({"n_ff_exp": n_ff_exp} if arch in EXPERT_FF_ARCHS else {"n_ff": n_ff_exp}),
            "n_ff_shexp": shared.get(arch, 0),
            "router": draw(st.sampled_from(ROUTERS)),
            **({"n_dense_lead": draw(st.integers(0, 1)), "router_bias": draw(st.booleans()),
                "metadata": draw(dots1_routing())} if arch == "dots1" else {})}


@st.composite
def dots1_routing(draw: st.DrawFn) -> dict:
    """dots1's routing keys: gating (1 softmax, 2 sigmoid, 3 softmax of the selected), weights
    normalised or not, scaled or not."""
    keys = {"expert_gating_func": draw(st.sampled_from((1, 2, 3)))}
    if draw(st.booleans()):
        keys["expert_weights_norm"] = draw(st.booleans())
    if draw(st.booleans()):
        keys["expert_weights_scale"] = draw(st.sampled_from((1.0, 2.5, 0.75)))
    return keys


@st.composite
def tiny_encoders(draw: st.DrawFn, archs: tuple[str, ...] = ENCODER_ARCHS) -> TinyModel:
    """Any encoder: n_head * head_dim = n_embd (as llama.cpp declares Q and the output
    projection), head_dim 8..128, one KV head per query head or fewer, 1..2 layers, with or without
    a classification head, and every matrix of a type drawn from those whose block fits its rows."""
    arch = draw(st.sampled_from(archs))
    head_dim = draw(st.sampled_from((8, 16, 32, 48, 64, 128)))
    n_head = draw(st.sampled_from([h for h in range(1, 9) if 32 <= h * head_dim <= 512]))
    # jina-bert-v2's K LayerNorm spans n_embd: llama.cpp runs it without GQA only
    n_head_kv = n_head if arch == "jina-bert-v2" else draw(st.sampled_from([k for k in (1, 2, n_head) if n_head % k == 0]))
    spec = TinyModel(arch=arch, n_embd=n_head * head_dim, head_dim=head_dim, n_head=n_head, n_head_kv=n_head_kv,
                     n_ff=draw(st.integers(2, 32)) * 16, n_layer=draw(st.integers(1, 2)),
                     classifier=arch != "nomic-bert" and draw(st.booleans()))  # llama.cpp gives nomic none
    tensor_types = {name: draw(st.sampled_from([t for t in WEIGHT_TYPES if fits(t, n_in)]))
                    for name, (_, n_in) in matrix_inputs(spec).items()}
    return TinyModel(**{**spec.__dict__, "tensor_types": tensor_types})


def mixtral_bench_model() -> TinyModel:
    """The MoE benchmark's model: Mixtral-shaped (8 experts, 2 used, GQA 4:1) at n_embd 512, with
    Q4_K_M's types (Q4_K matrices, Q6_K down projections and output, F32 router)."""
    types = dict.fromkeys(MATRIX_KINDS, GGMLType.Q4_K)
    types.update(ffn_down_exps=GGMLType.Q6_K, output=GGMLType.Q6_K, attn_v=GGMLType.Q6_K,
                 ffn_gate_inp=GGMLType.F32, token_embd=GGMLType.Q8_0)
    return TinyModel("llama", n_embd=512, head_dim=64, n_head=8, n_head_kv=2, n_ff=1024, n_layer=4,
                     tied_output=False, n_expert=8, n_expert_used=2, types=types)


def type_bench_model(t: GGMLType) -> TinyModel:
    """The per-type benchmark's model: llama-shaped at n_embd 2048 (32 heads, GQA 4:1, n_ff 5632,
    4 layers: 182 M weights), every layer matrix in type ``t``, Q8_0 embeddings and output over the
    tiny vocabulary, so that the matrices of one type take the time."""
    types = dict.fromkeys(MATRIX_KINDS, t)
    types.update(token_embd=GGMLType.Q8_0, output=GGMLType.Q8_0)
    return TinyModel("llama", n_embd=2048, head_dim=64, n_head=32, n_head_kv=8, n_ff=5632, n_layer=4,
                     tied_output=False, types=types)


@dataclass(frozen=True)
class TinyMamba:
    """A Mamba model to write (:func:`write_tiny_mamba`): ``mamba`` (Mamba-1: d_inner is 2 *
    n_embd, as llama.cpp requires) or ``mamba2`` (``dt_rank`` heads of d_inner / dt_rank channels,
    ``n_group`` groups of them sharing B and C); ``types`` maps the matrices (``token_embd``,
    ``output``, ``ssm_in``, ``ssm_x``, ``ssm_dt``, ``ssm_out``) to their types (default F16),
    ``tensor_types`` single tensors."""

    arch: str = "mamba"
    n_embd: int = 64
    n_layer: int = 2
    d_state: int = 16
    d_conv: int = 4
    dt_rank: int = 4
    tied_output: bool = True
    dt_b_c_rms: bool = False
    n_group: int = 1
    types: dict[str, GGMLType] = field(default_factory=dict)
    tensor_types: dict[str, GGMLType] = field(default_factory=dict)


def _mamba2_block(f32: Any, matrix: Any, rng: np.random.Generator, b: str, e: int, d_inner: int, conv_dim: int,
                  n_head: int, d_conv: int, n_group: int) -> None:
    """Block ``b``'s Mamba-2 tensors but its output projection: one input projection to z, x B C
    and dt; the convolution; a dt bias, a decay and a skip per head (decays as a trained
    model's); the grouped norm."""
    matrix(f"{b}.ssm_in.weight", "ssm_in", e, d_inner + conv_dim + n_head)
    f32(f"{b}.ssm_conv1d.weight", 0.3 * rng.standard_normal((conv_dim, d_conv)))
    f32(f"{b}.ssm_conv1d.bias", 0.05 * rng.standard_normal(conv_dim))
    f32(f"{b}.ssm_dt.bias", rng.uniform(-4.5, -2.0, n_head))
    f32(f"{b}.ssm_a", -np.exp(rng.uniform(0.0, 2.5, (n_head, 1))))
    f32(f"{b}.ssm_d", 1.0 + 0.1 * rng.standard_normal((n_head, 1)))
    f32(f"{b}.ssm_norm.weight", 1.0 + 0.1 * rng.standard_normal((n_group, d_inner // n_group)))


def write_tiny_mamba(spec: TinyMamba, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights shaped as a trained Mamba's: A = -exp(.) (decaying
    states), dt biases putting softplus(dt) around 0.01-0.1, D near 1."""
    s, e, arch = spec, spec.n_embd, spec.arch
    d_inner = 2 * e
    conv_dim = d_inner + 2 * s.n_group * s.d_state if arch == "mamba2" else d_inner
    w = GGUFWriter(path, arch=arch)

    def f32(name: str, data: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32), GGMLType.F32)

    def matrix(name: str, kind: str, n_in: int, n_out: int, scale: float = 0.08) -> None:
        t = s.tensor_types.get(name, s.types.get(kind, GGMLType.F16))
        x = (scale * rng.standard_normal((n_out, n_in))).astype(np.float32)
        if t is GGMLType.F16:
            w.add_tensor(name, x.astype(np.float16), GGMLType.F16)
        elif t is GGMLType.F32:
            w.add_tensor(name, x, GGMLType.F32)
        else:
            w.add_tensor(name, quantize_weight(t, x), t, shape=(n_in, n_out))

    w.add("general.name", f"tiny-{arch}")
    keys = {"context_length": 256, "embedding_length": e, "block_count": s.n_layer, "feed_forward_length": 0,
            "attention.head_count": 0, "ssm.conv_kernel": s.d_conv, "ssm.inner_size": d_inner,
            "ssm.state_size": s.d_state, "ssm.time_step_rank": s.dt_rank}
    if arch == "mamba2":
        keys["ssm.group_count"] = s.n_group
    for key, value in keys.items():
        w.add(f"{arch}.{key}", value, GGUFValueType.UINT32)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if s.dt_b_c_rms:
        w.add(f"{arch}.ssm.dt_b_c_rms", True)
    add_vocab(w)
    matrix("token_embd.weight", "token_embd", e, N_VOCAB, scale=0.5)
    f32("output_norm.weight", 1.0 + 0.1 * rng.standard_normal(e))
    if not s.tied_output:
        matrix("output.weight", "output", e, N_VOCAB)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        f32(f"{b}.attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(e))
        if arch == "mamba2":   # one projection to z, x B C, dt; a decay and a skip per head
            _mamba2_block(f32, matrix, rng, b, e, d_inner, conv_dim, s.dt_rank, s.d_conv, s.n_group)
            matrix(f"{b}.ssm_out.weight", "ssm_out", d_inner, e)
            continue
        matrix(f"{b}.ssm_in.weight", "ssm_in", e, 2 * d_inner)
        f32(f"{b}.ssm_conv1d.weight", 0.3 * rng.standard_normal((d_inner, s.d_conv)))
        f32(f"{b}.ssm_conv1d.bias", 0.05 * rng.standard_normal(d_inner))
        matrix(f"{b}.ssm_x.weight", "ssm_x", d_inner, s.dt_rank + 2 * s.d_state, scale=0.2)
        matrix(f"{b}.ssm_dt.weight", "ssm_dt", s.dt_rank, d_inner, scale=0.3)
        f32(f"{b}.ssm_dt.bias", rng.uniform(-4.5, -2.0, d_inner))
        f32(f"{b}.ssm_a", -np.tile(np.arange(1, s.d_state + 1, dtype=np.float32), (d_inner, 1))
            * np.exp(0.2 * rng.standard_normal((d_inner, s.d_state))))
        f32(f"{b}.ssm_d", 1.0 + 0.1 * rng.standard_normal(d_inner))
        matrix(f"{b}.ssm_out.weight", "ssm_out", d_inner, e)
    w.write()


def prompt_logits(path, tokens, n_ubatch: int, load_mode: str = "auto") -> np.ndarray:
    """Logits of every position of a tiny model, the prompt decoded in ubatches of n_ubatch tokens."""
    with Model.load(path, load_mode=load_mode) as model, Context(model, n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_threads=2,
                                            n_threads_batch=2) as ctx:
        batch = Batch(len(tokens))
        for pos, tok in enumerate(tokens):
            batch.add(int(tok), pos, [0], True)
        assert ctx.decode(batch) == 0
        return ctx.get_logits().copy()


# -- hybrid Mamba + attention models (granitehybrid, falcon-h1, nemotron_h, jamba)

HYBRID_ARCHS = ("granitehybrid", "falcon-h1", "nemotron_h", "jamba")


@dataclass(frozen=True)
class TinyHybrid:
    """A hybrid model to write (:func:`write_tiny_hybrid`). ``layout`` has a letter per layer:
    ``M`` a Mamba block (Mamba-2; Jamba's Mamba-1), ``A`` attention, ``F`` (nemotron_h) a
    feed-forward only; Falcon-H1 runs both in every layer (its layout is all ``A``). Granite 4
    and Jamba follow every block with a feed-forward, of experts where ``n_expert`` (Jamba: in
    the layers of ``moe_layers``). ``types`` maps the matrices (``token_embd``, ``output``,
    ``ssm_in``, ``ssm_x``, ``ssm_dt``, ``ssm_out``, ``attn_q``, ... ``ffn_down``, the expert
    kinds) to their types (default F16), ``tensor_types`` single tensors."""

    arch: str
    layout: str = "MAM"
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 96
    d_state: int = 16
    d_conv: int = 4
    dt_rank: int = 4            # Mamba-2's heads, Mamba-1's dt rank
    n_group: int = 2
    tied_output: bool = True
    n_expert: int = 0
    n_expert_used: int = 0
    moe_layers: tuple[int, ...] = ()   # jamba: the layers with experts
    biases: bool = False        # optional attention-output / feed-forward biases
    drop: tuple[str, ...] = ()  # tensors left out (bad files)
    metadata: dict = field(default_factory=dict)
    types: dict[str, GGMLType] = field(default_factory=dict)
    tensor_types: dict[str, GGMLType] = field(default_factory=dict)


def write_tiny_hybrid(spec: TinyHybrid, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights (the Mamba blocks shaped as :func:`write_tiny_mamba`'s)."""
    s, arch, e = spec, spec.arch, spec.n_embd
    d_inner = 2 * e
    mamba1 = arch == "jamba"
    conv_dim = d_inner if mamba1 else d_inner + 2 * s.n_group * s.d_state
    w = GGUFWriter(path, arch=arch)
    add_tensor = w.add_tensor
    w.add_tensor = lambda name, *args, **kwargs: None if name in s.drop else add_tensor(name, *args, **kwargs)

    def f32(name: str, data: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32), GGMLType.F32)

    def matrix(name: str, kind: str, n_in: int, n_out: int, scale: float = 0.08, n_expert: int = 0) -> None:
        t = s.tensor_types.get(name, s.types.get(kind, GGMLType.F16))
        x = (scale * rng.standard_normal((n_expert or 1, n_out, n_in))).astype(np.float32)
        x = x.reshape((n_expert, n_out, n_in) if n_expert else (n_out, n_in))
        shape = (n_in, n_out, n_expert) if n_expert else (n_in, n_out)
        if t is GGMLType.F16:
            w.add_tensor(name, x.astype(np.float16), GGMLType.F16)
        elif t is GGMLType.F32:
            w.add_tensor(name, x, GGMLType.F32)
        else:
            w.add_tensor(name, quantize_weight(t, x.reshape(-1, n_in)), t, shape=shape)

    kinds = list(s.layout)
    n_layer = len(kinds)
    head_kv = np.array([s.n_head_kv if k == "A" else 0 for k in kinds], np.uint32)
    keys = {"context_length": 256, "embedding_length": e, "block_count": n_layer,
            "attention.head_count": s.n_head, "attention.key_length": s.head_dim,
            "attention.value_length": s.head_dim, "ssm.conv_kernel": s.d_conv, "ssm.inner_size": d_inner,
            "ssm.state_size": s.d_state, "ssm.time_step_rank": s.dt_rank}
    if not mamba1:
        keys["ssm.group_count"] = s.n_group
    for key, value in keys.items():
        w.add(f"{arch}.{key}", value, GGUFValueType.UINT32)
    w.add(f"{arch}.attention.head_count_kv", head_kv)
    w.add(f"{arch}.feed_forward_length",
          np.array([s.n_ff if k == "F" else 0 for k in kinds], np.uint32) if arch == "nemotron_h" else s.n_ff,
          None if arch == "nemotron_h" else GGUFValueType.UINT32)
    w.add(f"{arch}.rope.freq_base", 10000.0)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if arch == "nemotron_h":
        w.add(f"{arch}.attention.layer_norm_epsilon", 1e-5)
    if arch == "granitehybrid":   # Granite 4's values, roughly
        w.add(f"{arch}.logit_scale", 8.0)
        w.add(f"{arch}.residual_scale", 0.22)
        w.add(f"{arch}.embedding_scale", 12.0)
        w.add(f"{arch}.attention.scale", 0.0625)
    if s.n_expert:
        w.add(f"{arch}.expert_count", s.n_expert, GGUFValueType.UINT32)
        w.add(f"{arch}.expert_used_count", s.n_expert_used, GGUFValueType.UINT32)
    for key, value in s.metadata.items():
        integer = isinstance(value, int) and not isinstance(value, bool)
        w.add(f"{arch}.{key}", value, GGUFValueType.UINT32 if integer else None)
    add_vocab(w)
    matrix("token_embd.weight", "token_embd", e, N_VOCAB, scale=0.5)
    f32("output_norm.weight", 1.0 + 0.1 * rng.standard_normal(e))
    if not s.tied_output:
        matrix("output.weight", "output", e, N_VOCAB)
    nh, nkv, hd = s.n_head, s.n_head_kv, s.head_dim
    for il, kind in enumerate(kinds):
        b = f"blk.{il}"
        f32(f"{b}.attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(e))
        if kind == "M" or arch == "falcon-h1":
            if mamba1:
                matrix(f"{b}.ssm_in.weight", "ssm_in", e, 2 * d_inner)
                f32(f"{b}.ssm_conv1d.weight", 0.3 * rng.standard_normal((d_inner, s.d_conv)))
                f32(f"{b}.ssm_conv1d.bias", 0.05 * rng.standard_normal(d_inner))
                matrix(f"{b}.ssm_x.weight", "ssm_x", d_inner, s.dt_rank + 2 * s.d_state, scale=0.2)
                f32(f"{b}.ssm_dt_norm.weight", 1.0 + 0.1 * rng.standard_normal(s.dt_rank))
                matrix(f"{b}.ssm_dt.weight", "ssm_dt", s.dt_rank, d_inner, scale=0.3)
                f32(f"{b}.ssm_dt.bias", rng.uniform(-4.5, -2.0, d_inner))
                f32(f"{b}.ssm_b_norm.weight", 1.0 + 0.1 * rng.standard_normal(s.d_state))
                f32(f"{b}.ssm_c_norm.weight", 1.0 + 0.1 * rng.standard_normal(s.d_state))
                f32(f"{b}.ssm_a", -np.tile(np.arange(1, s.d_state + 1, dtype=np.float32), (d_inner, 1))
                    * np.exp(0.2 * rng.standard_normal((d_inner, s.d_state))))
                f32(f"{b}.ssm_d", 1.0 + 0.1 * rng.standard_normal(d_inner))
            else:
                _mamba2_block(f32, matrix, rng, b, e, d_inner, conv_dim, s.dt_rank, s.d_conv, s.n_group)
            matrix(f"{b}.ssm_out.weight", "ssm_out", d_inner, e)
        if kind == "A":
            matrix(f"{b}.attn_q.weight", "attn_q", e, nh * hd)
            matrix(f"{b}.attn_k.weight", "attn_k", e, nkv * hd)
            matrix(f"{b}.attn_v.weight", "attn_v", e, nkv * hd)
            matrix(f"{b}.attn_output.weight", "attn_output", nh * hd, e)
            if s.biases:
                f32(f"{b}.attn_output.bias", 0.05 * rng.standard_normal(e))
        if arch == "nemotron_h":
            if kind == "F":   # up, relu², down
                matrix(f"{b}.ffn_up.weight", "ffn_up", e, s.n_ff)
                matrix(f"{b}.ffn_down.weight", "ffn_down", s.n_ff, e)
                if s.biases:
                    f32(f"{b}.ffn_up.bias", 0.05 * rng.standard_normal(s.n_ff))
                    f32(f"{b}.ffn_down.bias", 0.05 * rng.standard_normal(e))
            continue
        # Falcon-H1's converter names its feed-forward norm without ".weight"
        f32(f"{b}.ffn_norm" if arch == "falcon-h1" else f"{b}.ffn_norm.weight", 1.0 + 0.1 * rng.standard_normal(e))
        if s.n_expert and (arch != "jamba" or il in s.moe_layers):
            n = s.n_expert
            matrix(f"{b}.ffn_gate_inp.weight", "ffn_gate_inp", e, n, scale=0.5)
            matrix(f"{b}.ffn_gate_exps.weight", "ffn_gate_exps", e, s.n_ff, n_expert=n)
            matrix(f"{b}.ffn_down_exps.weight", "ffn_down_exps", s.n_ff, e, n_expert=n)
            matrix(f"{b}.ffn_up_exps.weight", "ffn_up_exps", e, s.n_ff, n_expert=n)
            continue
        matrix(f"{b}.ffn_gate.weight", "ffn_gate", e, s.n_ff)
        matrix(f"{b}.ffn_up.weight", "ffn_up", e, s.n_ff)
        matrix(f"{b}.ffn_down.weight", "ffn_down", s.n_ff, e)
        if s.biases and arch != "jamba":
            f32(f"{b}.ffn_gate.bias", 0.05 * rng.standard_normal(s.n_ff))
            f32(f"{b}.ffn_up.bias", 0.05 * rng.standard_normal(s.n_ff))
            f32(f"{b}.ffn_down.bias", 0.05 * rng.standard_normal(e))
    w.write()


# -- multi-head latent attention and DeepSeek's routed experts (deepseek2)

# DeepSeek's routing keys, each a way build_moe_ffn routes: gating (1 softmax, 2 sigmoid, 3 softmax
# of the selected), weights normalised and scaled, experts in groups of which the best are kept
ROUTED_KEYS = ("expert_gating_func", "expert_weights_norm", "expert_weights_scale", "expert_group_count",
               "expert_group_used_count")


@dataclass(frozen=True)
class TinyMLA:
    """A model with latent attention to write (:func:`write_tiny_mla`): ``deepseek2`` (multi-head
    latent attention, ``q_lora_rank`` 0: the Lite form's one Q matrix; ``n_dense_lead`` dense
    layers, then ``n_expert`` routed experts beside ``n_shared`` shared ones) or ``minicpm3``
    (the latent expanded to full heads by ``attn_kv_b``, dense layers only; a deepseek2 file
    without ``absorbed`` has them too, as files from before llama.cpp split attn_k_b / attn_v_b); ``metadata`` more
    ``deepseek2.*`` keys (:data:`ROUTED_KEYS`, RoPE scaling); ``probs_bias`` writes the selection
    bias exp_probs_b. ``types`` maps a matrix kind (the tensor name's middle part, ``attn_k_b``)
    to its type, ``tensor_types`` single tensors (default F16)."""

    arch: str = "deepseek2"
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    q_lora_rank: int = 32
    kv_lora_rank: int = 32
    qk_nope: int = 32
    qk_rope: int = 16
    v_head: int = 16
    n_ff: int = 64
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_shared: int = 1
    n_dense_lead: int = 1
    probs_bias: bool = True
    absorbed: bool = True
    tied_output: bool = False
    metadata: dict = field(default_factory=dict)
    types: dict[str, GGMLType] = field(default_factory=dict)
    tensor_types: dict[str, GGMLType] = field(default_factory=dict)

    @property
    def full_heads(self) -> bool:
        """The cache holds full K and V heads (``attn_kv_b``) rather than the latent."""
        return self.arch == "minicpm3" or not self.absorbed

    def matrices(self) -> dict[str, int]:
        """Every matrix by tensor name: its row length (input width)."""
        s, out = self, {"token_embd.weight": self.n_embd}
        if not s.tied_output:
            out["output.weight"] = s.n_embd
        for il in range(s.n_layer):
            b = f"blk.{il}"
            if s.q_lora_rank:
                out.update({f"{b}.attn_q_a.weight": s.n_embd, f"{b}.attn_q_b.weight": s.q_lora_rank})
            else:
                out[f"{b}.attn_q.weight"] = s.n_embd
            out.update({f"{b}.attn_kv_a_mqa.weight": s.n_embd, f"{b}.attn_output.weight": s.n_head * s.v_head})
            if s.full_heads:
                out[f"{b}.attn_kv_b.weight"] = s.kv_lora_rank
            else:
                out.update({f"{b}.attn_k_b.weight": s.qk_nope, f"{b}.attn_v_b.weight": s.kv_lora_rank})
            if s.arch == "minicpm3" or il < s.n_dense_lead:
                out.update({f"{b}.ffn_gate.weight": s.n_embd, f"{b}.ffn_up.weight": s.n_embd,
                            f"{b}.ffn_down.weight": s.n_ff})
                continue
            for kind in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_gate_shexp", "ffn_up_shexp"):
                out[f"{b}.{kind}.weight"] = s.n_embd
            out[f"{b}.ffn_down_exps.weight"] = s.n_ff_exp
            out[f"{b}.ffn_down_shexp.weight"] = s.n_ff_exp * s.n_shared
        return out


class _RandomTensors:
    """Random tensors into a writer: vectors near ``center``, matrices N(0, ``scale``) (``n_stack``
    of them: experts) in the type ``tensor_types`` gives their full name, else ``types`` their
    kind (``blk.0.<kind>.weight``), else F16."""

    def __init__(self, w: GGUFWriter, rng: np.random.Generator, types: dict[str, GGMLType],
                 tensor_types: dict[str, GGMLType]) -> None:
        self.w, self.rng, self.types, self.tensor_types = w, rng, types, tensor_types

    def vector(self, name: str, n: int, scale: float = 0.1, center: float = 1.0) -> None:
        self.w.add_tensor(name, (center + scale * self.rng.standard_normal(n)).astype(np.float32), GGMLType.F32)

    def matrix(self, name: str, n_in: int, n_out: int, n_stack: int = 0, scale: float = 0.08) -> None:
        t = self.tensor_types.get(name, self.types.get(name.split(".")[-2], GGMLType.F16))
        x = (scale * self.rng.standard_normal((n_stack or 1, n_out, n_in))).astype(np.float32)
        if t is GGMLType.F16:
            self.w.add_tensor(name, x.reshape((n_stack, n_out, n_in) if n_stack else (n_out, n_in)).astype(np.float16),
                              GGMLType.F16)
        else:
            self.w.add_tensor(name, quantize_weight(t, x.reshape(-1, n_in)), t,
                              shape=(n_in, n_out, n_stack) if n_stack else (n_in, n_out))

    def header(self, arch: str, keys: dict[str, int], metadata: dict[str, object]) -> None:
        """The architecture's integer ``keys``, RoPE base 10000, RMS epsilon 1e-6, ``metadata``
        as given (ints as UINT32), and the tiny vocabulary."""
        w = self.w
        for key, value in keys.items():
            w.add(f"{arch}.{key}", value, GGUFValueType.UINT32)
        w.add(f"{arch}.rope.freq_base", 10000.0)
        w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
        for key, value in metadata.items():
            integer = isinstance(value, int) and not isinstance(value, bool)
            w.add(f"{arch}.{key}", value, GGUFValueType.UINT32 if integer else None)
        add_vocab(w)

    def embeddings(self, e: int, tied_output: bool) -> None:
        self.matrix("token_embd.weight", e, N_VOCAB, scale=0.5)
        self.vector("output_norm.weight", e)
        if not tied_output:
            self.matrix("output.weight", e, N_VOCAB)

    def routed_ffn(self, b: str, e: int, n_expert: int, n_ff_exp: int, n_ff_shared: int, probs_bias: bool) -> None:
        """Block ``b``'s router (spread rows: the experts' scores lie well apart), its expert
        bias, stacked experts, and a shared expert of ``n_ff_shared`` (0: none)."""
        self.matrix(f"{b}.ffn_gate_inp.weight", e, n_expert, scale=0.5)
        if probs_bias:
            self.vector(f"{b}.exp_probs_b.bias", n_expert, scale=0.2, center=0.0)
        self.matrix(f"{b}.ffn_gate_exps.weight", e, n_ff_exp, n_stack=n_expert)
        self.matrix(f"{b}.ffn_down_exps.weight", n_ff_exp, e, n_stack=n_expert)
        self.matrix(f"{b}.ffn_up_exps.weight", e, n_ff_exp, n_stack=n_expert)
        if n_ff_shared:
            self.matrix(f"{b}.ffn_gate_shexp.weight", e, n_ff_shared)
            self.matrix(f"{b}.ffn_down_shexp.weight", n_ff_shared, e)
            self.matrix(f"{b}.ffn_up_shexp.weight", e, n_ff_shared)


def write_tiny_mla(spec: TinyMLA, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights (as :func:`write_tiny_model`'s); the router's rows are
    spread (0.5 N(0, 1)) so that the experts' scores lie well apart."""
    s, arch, e = spec, spec.arch, spec.n_embd
    w = GGUFWriter(path, arch=arch)
    tensors = _RandomTensors(w, rng, s.types, s.tensor_types)
    vector, matrix = tensors.vector, tensors.matrix

    w.add("general.name", f"tiny-{arch}")
    keys = {"context_length": 256, "embedding_length": e, "block_count": s.n_layer, "feed_forward_length": s.n_ff,
            "attention.head_count": s.n_head, "attention.q_lora_rank": s.q_lora_rank,
            "attention.kv_lora_rank": s.kv_lora_rank, "rope.dimension_count": s.qk_rope}
    if s.full_heads:
        keys.update({"attention.head_count_kv": s.n_head, "attention.key_length": s.qk_nope + s.qk_rope,
                     "attention.value_length": s.v_head})
    else:
        keys.update({"attention.head_count_kv": 1, "attention.key_length": s.kv_lora_rank + s.qk_rope,
                     "attention.value_length": s.kv_lora_rank, "attention.key_length_mla": s.qk_nope + s.qk_rope,
                     "attention.value_length_mla": s.v_head})
    if arch == "deepseek2":
        keys.update({"expert_count": s.n_expert,
                     "expert_used_count": s.n_expert_used, "expert_feed_forward_length": s.n_ff_exp,
                     "expert_shared_count": s.n_shared, "leading_dense_block_count": s.n_dense_lead})
    tensors.header(arch, keys, s.metadata)
    tensors.embeddings(e, s.tied_output)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        vector(f"{b}.attn_norm.weight", e)
        if s.q_lora_rank:
            matrix(f"{b}.attn_q_a.weight", e, s.q_lora_rank, scale=0.2)
            vector(f"{b}.attn_q_a_norm.weight", s.q_lora_rank)
            matrix(f"{b}.attn_q_b.weight", s.q_lora_rank, s.n_head * (s.qk_nope + s.qk_rope), scale=0.2)
        else:
            matrix(f"{b}.attn_q.weight", e, s.n_head * (s.qk_nope + s.qk_rope), scale=0.2)
        matrix(f"{b}.attn_kv_a_mqa.weight", e, s.kv_lora_rank + s.qk_rope, scale=0.2)
        vector(f"{b}.attn_kv_a_norm.weight", s.kv_lora_rank)
        if s.full_heads:
            matrix(f"{b}.attn_kv_b.weight", s.kv_lora_rank, s.n_head * (s.qk_nope + s.v_head), scale=0.2)
        else:
            matrix(f"{b}.attn_k_b.weight", s.qk_nope, s.kv_lora_rank, n_stack=s.n_head, scale=0.2)
            matrix(f"{b}.attn_v_b.weight", s.kv_lora_rank, s.v_head, n_stack=s.n_head, scale=0.2)
        matrix(f"{b}.attn_output.weight", s.n_head * s.v_head, e)
        vector(f"{b}.ffn_norm.weight", e)
        if arch == "minicpm3" or il < s.n_dense_lead:
            matrix(f"{b}.ffn_gate.weight", e, s.n_ff)
            matrix(f"{b}.ffn_up.weight", e, s.n_ff)
            matrix(f"{b}.ffn_down.weight", s.n_ff, e)
            continue
        tensors.routed_ffn(b, e, s.n_expert, s.n_ff_exp, s.n_ff_exp * s.n_shared, s.probs_bias)
    w.write()


@st.composite
def tiny_mla_models(draw: st.DrawFn) -> TinyMLA:
    """DeepSeek-V2 shapes (with or without Q's low rank, 2..4 heads, latent ranks of whole
    blocks), every routing build_moe_ffn has for it, and every matrix of a type whose blocks fit."""
    n_expert = draw(st.sampled_from((4, 8, 16)))
    groups = draw(st.sampled_from([g for g in (0, 2, 4) if g < n_expert]))
    routing = {"expert_gating_func": draw(st.sampled_from((1, 2, 3))),
               "expert_weights_norm": draw(st.booleans()),
               "expert_weights_scale": draw(st.sampled_from((1.0, 2.5)))}
    if groups:
        routing.update(expert_group_count=groups, expert_group_used_count=draw(st.integers(1, groups - 1)))
    n_used_max = n_expert if not groups else routing["expert_group_used_count"] * (n_expert // groups)
    # 2+ heads: with one, attn_k_b is a matrix to ggml, which repacks it and then quantizes the
    # permuted Q as if its rows were contiguous (wrong rows 1-3 of each 4); no real model has one
    spec = TinyMLA(n_embd=draw(st.sampled_from((64, 96, 128))), n_head=draw(st.integers(2, 4)),
                   n_layer=draw(st.integers(1, 3)), q_lora_rank=draw(st.sampled_from((0, 32, 64))),
                   kv_lora_rank=draw(st.sampled_from((32, 64))), qk_nope=draw(st.sampled_from((16, 32))),
                   qk_rope=draw(st.sampled_from((8, 16))), v_head=draw(st.sampled_from((16, 32))),
                   n_expert=n_expert, n_expert_used=draw(st.integers(1, min(4, n_used_max))),
                   n_ff_exp=draw(st.sampled_from((32, 64))), n_shared=draw(st.integers(1, 2)),
                   n_dense_lead=draw(st.integers(0, 1)), probs_bias=draw(st.booleans()), absorbed=draw(st.booleans()),
                   tied_output=draw(st.booleans()), metadata=routing)
    tensor_types = {name: draw(st.sampled_from([t for t in WEIGHT_TYPES if fits(t, n_in)]))
                    for name, n_in in spec.matrices().items()}
    return TinyMLA(**{**spec.__dict__, "tensor_types": tensor_types})


@dataclass(frozen=True)
class TinyRouted:
    """A model of DeepSeek's routed experts under a Llama-like block to write
    (:func:`write_tiny_routed`): ``glm4moe`` (Q/K/V biases, optional per-head Q/K norms
    ``qk_norm``, the FFN norm as ``post_attention_norm``) or ``bailingmoe2`` (a fused QKV
    projection, Q/K norms always, ``n_head * head_dim = n_embd``), both with partial split-half
    RoPE of ``n_rot`` values and ``nextn`` NextN blocks at the end that inference skips; or
    ``ernie4_5-moe`` (Q/K/V and output biases, full adjacent-pair RoPE: ``n_rot = head_dim``, a
    shared expert only where ``metadata`` gives its width); or ``hunyuan-moe`` / ``hunyuan-dense``
    (Q/K/V biases, Q/K norms after full split-half RoPE; the experts ``n_ff`` wide in every layer,
    no selection bias, a shared feed-forward ``n_ff`` wide unless ``metadata`` says); or ``phimoe``
    (biases on every norm, Q/K/V, the attention output and the logits; experts ``n_ff`` wide in
    every layer; ``n_head * head_dim = n_embd``); or ``smallthinker`` (ReGLU experts in every layer,
    routed on the block's input; ``attention.sliding_window`` in ``metadata`` turns on its window
    and RoPE-less layers).
    ``metadata``, ``types`` and ``tensor_types`` as :class:`TinyMLA`'s."""

    arch: str = "glm4moe"
    n_embd: int = 64
    head_dim: int = 16
    n_head: int = 4
    n_head_kv: int = 2
    n_rot: int = 8
    n_layer: int = 2
    n_ff: int = 64
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_shared: int = 1
    n_dense_lead: int = 1
    qk_norm: bool = False
    nextn: int = 0
    tied_output: bool = False
    metadata: dict = field(default_factory=dict)
    types: dict[str, GGMLType] = field(default_factory=dict)
    tensor_types: dict[str, GGMLType] = field(default_factory=dict)

    @property
    def shared_ff(self) -> int:
        """The shared experts' width (0: none): bailingmoe2's own width where the file gives one,
        times their count; ERNIE's only where the file gives it."""
        if self.arch in ("ernie4_5-moe", "hunyuan-dense", "phimoe", "smallthinker"):
            return self.metadata.get("expert_shared_feed_forward_length", 0)
        if self.arch == "hunyuan-moe":
            return self.metadata.get("expert_shared_feed_forward_length", self.n_ff)
        return self.metadata.get("expert_shared_feed_forward_length", self.n_ff_exp) * self.n_shared

    @property
    def expert_ff(self) -> int:
        return self.n_ff if self.arch in ("hunyuan-moe", "phimoe") else self.n_ff_exp

    def has_experts(self, il: int) -> bool:
        return self.arch != "hunyuan-dense" and il >= self.n_dense_lead

    def matrices(self) -> dict[str, int]:
        """Every matrix of the blocks that run by tensor name: its row length (input width)."""
        s, out = self, {"token_embd.weight": self.n_embd}
        if not s.tied_output:
            out["output.weight"] = s.n_embd
        for il in range(s.n_layer):
            b = f"blk.{il}"
            for kind in ("attn_qkv",) if s.arch == "bailingmoe2" else ("attn_q", "attn_k", "attn_v"):
                out[f"{b}.{kind}.weight"] = s.n_embd
            out[f"{b}.attn_output.weight"] = s.n_head * s.head_dim
            if not s.has_experts(il):
                out.update({f"{b}.ffn_gate.weight": s.n_embd, f"{b}.ffn_up.weight": s.n_embd,
                            f"{b}.ffn_down.weight": s.n_ff})
                continue
            for kind in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps") + (("ffn_gate_shexp", "ffn_up_shexp")
                                                                              if s.shared_ff else ()):
                out[f"{b}.{kind}.weight"] = s.n_embd
            out[f"{b}.ffn_down_exps.weight"] = s.expert_ff
            if s.shared_ff:
                out[f"{b}.ffn_down_shexp.weight"] = s.shared_ff
        return out


def write_tiny_routed(spec: TinyRouted, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights (as :func:`write_tiny_mla`'s)."""
    s, arch, e = spec, spec.arch, spec.n_embd
    w = GGUFWriter(path, arch=arch)
    tensors = _RandomTensors(w, rng, s.types, s.tensor_types)
    vector, matrix = tensors.vector, tensors.matrix

    w.add("general.name", f"tiny-{arch}")
    n_blocks = s.n_layer + s.nextn
    keys = {"context_length": 256, "embedding_length": e, "block_count": n_blocks, "feed_forward_length": s.n_ff,
            "attention.head_count": s.n_head, "attention.head_count_kv": s.n_head_kv,
            "attention.key_length": s.head_dim, "attention.value_length": s.head_dim, "rope.dimension_count": s.n_rot}
    if arch != "hunyuan-dense":
        keys.update({"expert_count": s.n_expert, "expert_used_count": s.n_expert_used,
                     "expert_feed_forward_length": s.n_ff_exp, "expert_shared_count": s.n_shared,
                     "leading_dense_block_count": s.n_dense_lead})
    if s.nextn:
        keys["nextn_predict_layers"] = s.nextn
    if arch == "ernie4_5-moe":
        keys["interleave_moe_layer_step"] = 1
    tensors.header(arch, keys, s.metadata)
    tensors.embeddings(e, s.tied_output)
    biased = arch == "phimoe"   # biases on the norms, the attention output, the logits
    if biased:
        vector("output_norm.bias", e, scale=0.05, center=0.0)
        vector("output.bias", N_VOCAB, scale=0.05, center=0.0)
    for il in range(n_blocks):
        b = f"blk.{il}"
        vector(f"{b}.attn_norm.weight", e)
        if biased:
            vector(f"{b}.attn_norm.bias", e, scale=0.05, center=0.0)
        if arch == "bailingmoe2":
            matrix(f"{b}.attn_qkv.weight", e, (s.n_head + 2 * s.n_head_kv) * s.head_dim)
        else:
            for kind, n in (("attn_q", s.n_head * s.head_dim), ("attn_k", s.n_head_kv * s.head_dim),
                            ("attn_v", s.n_head_kv * s.head_dim)):
                matrix(f"{b}.{kind}.weight", e, n)
                vector(f"{b}.{kind}.bias", n, scale=0.05, center=0.0)
        matrix(f"{b}.attn_output.weight", s.n_head * s.head_dim, e)
        if arch in ("ernie4_5-moe", "phimoe"):   # ERNIE's is read by llama.cpp, never added
            vector(f"{b}.attn_output.bias", e, scale=0.05, center=0.0)
        if s.qk_norm or arch in ("bailingmoe2", "hunyuan-moe", "hunyuan-dense"):
            vector(f"{b}.attn_q_norm.weight", s.head_dim)
            vector(f"{b}.attn_k_norm.weight", s.head_dim)
        vector(f"{b}.{'post_attention_norm' if arch == 'glm4moe' else 'ffn_norm'}.weight", e)
        if biased:
            vector(f"{b}.ffn_norm.bias", e, scale=0.05, center=0.0)
        if not s.has_experts(il):
            matrix(f"{b}.ffn_gate.weight", e, s.n_ff)
            matrix(f"{b}.ffn_up.weight", e, s.n_ff)
            matrix(f"{b}.ffn_down.weight", s.n_ff, e)
        else:
            tensors.routed_ffn(b, e, s.n_expert, s.expert_ff, s.shared_ff,
                               arch not in ("hunyuan-moe", "phimoe", "smallthinker"))
        if il >= s.n_layer:   # a NextN block's own tensors
            matrix(f"{b}.nextn.eh_proj.weight", 2 * e, e)
            vector(f"{b}.nextn.enorm.weight", e)
            vector(f"{b}.nextn.hnorm.weight", e)
            vector(f"{b}.nextn.shared_head_norm.weight", e)
            if arch == "bailingmoe2":
                vector(f"{b}.layer_output_norm.weight", e)
    w.write()


@st.composite
def tiny_routed_models(draw: st.DrawFn, archs: tuple[str, ...] = ("glm4moe", "bailingmoe2", "ernie4_5-moe",
                                                                  "hunyuan-moe", "hunyuan-dense", "phimoe",
                                                                  "smallthinker")) -> TinyRouted:
    """Shapes (GQA, partial RoPE, with or without Q/K norms and NextN blocks), every routing
    build_moe_ffn has for them, and every matrix of a type whose blocks fit."""
    n_expert = draw(st.sampled_from((4, 8, 16)))
    groups = draw(st.sampled_from([g for g in (0, 2, 4) if g < n_expert]))
    routing = {"expert_gating_func": draw(st.sampled_from((1, 2, 3))), "expert_weights_norm": draw(st.booleans()),
               "expert_weights_scale": draw(st.sampled_from((1.0, 2.5)))}
    if groups:
        routing.update(expert_group_count=groups, expert_group_used_count=draw(st.integers(1, groups - 1)))
    n_used_max = n_expert if not groups else routing["expert_group_used_count"] * (n_expert // groups)
    arch = draw(st.sampled_from(archs))
    if arch == "hunyuan-dense":   # no experts: llama.cpp aborts on expert groups there
        routing = {k: v for k, v in routing.items() if not k.startswith("expert_group")}
    if arch == "ernie4_5-moe" and draw(st.booleans()):
        routing["expert_shared_feed_forward_length"] = draw(st.sampled_from((32, 64)))
    if arch == "smallthinker" and draw(st.booleans()):
        routing["attention.sliding_window"] = 4096
    head_dim = draw(st.sampled_from((16, 32, 64)))
    n_head_kv = draw(st.integers(1, 2))
    n_head = n_head_kv * draw(st.integers(1, 4))
    n_embd = n_head * head_dim if arch in ("bailingmoe2", "phimoe") else draw(st.sampled_from((64, 96, 256)))
    spec = TinyRouted(arch=arch, n_embd=n_embd, head_dim=head_dim, n_head=n_head, n_head_kv=n_head_kv,
                      n_rot=head_dim if arch in ("ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "phimoe", "smallthinker")
                      else draw(st.sampled_from((head_dim // 2, head_dim))),
                      n_layer=draw(st.integers(1, 3)),
                      n_expert=n_expert, n_expert_used=draw(st.integers(1, min(4, n_used_max))),
                      n_ff_exp=draw(st.sampled_from((32, 64))), n_shared=draw(st.integers(1, 2)),
                      n_dense_lead=0 if arch in ("hunyuan-moe", "phimoe", "smallthinker") else draw(st.integers(0, 1)),
                      qk_norm=arch == "glm4moe" and draw(st.booleans()),
                      nextn=arch in ("glm4moe", "bailingmoe2") and draw(st.integers(0, 1)),
                      tied_output=arch not in ("bailingmoe2", "phimoe") and draw(st.booleans()), metadata=routing)
    tensor_types = {name: draw(st.sampled_from([t for t in WEIGHT_TYPES if fits(t, n_in)]))
                    for name, n_in in spec.matrices().items()}
    return TinyRouted(**{**spec.__dict__, "tensor_types": tensor_types})


# -- the short-convolution and gated delta-net hybrids (LFM2, Qwen3.5, Qwen3-Next)


@dataclass(frozen=True)
class TinyLinearHybrid:
    """A hybrid model to write (:func:`write_tiny_linear_hybrid`): ``lfm2`` / ``lfm2moe`` (short
    convolution layers where ``recurrent`` says, attention layers elsewhere) or ``qwen35`` /
    ``qwen35moe`` / ``qwen3next`` (gated delta-net layers and gated attention); ``types`` maps matrix kinds to
    their types (default F16). Delta-net: ``n_v_heads`` value heads of ``d_state`` values,
    ``n_k_heads`` key heads; LFM2's head size is n_embd / n_head. Experts: ``n_expert`` (0: dense), ``n_expert_used``, ``n_ff_exp``."""

    arch: str = "lfm2"
    n_embd: int = 64
    n_ff: int = 96
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    recurrent: tuple[bool, ...] = (True, False, True)
    l_cache: int = 3
    d_conv: int = 4
    d_state: int = 16
    n_k_heads: int = 2
    n_v_heads: int = 4
    n_rot: int = 16
    rope_sections: tuple[int, ...] = (3, 3, 2, 0)
    n_expert: int = 0
    n_expert_used: int = 2
    n_ff_exp: int = 32
    n_layer_dense_lead: int = 1
    tied_output: bool = True
    types: dict[str, GGMLType] = field(default_factory=dict)


def write_tiny_linear_hybrid(spec: TinyLinearHybrid, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights: norms near 1, matrices N(0, 0.08) in their types; for
    the delta-net decays A = -exp(.) and dt biases as a trained model's."""
    s, e, arch = spec, spec.n_embd, spec.arch
    n_layer = len(s.recurrent)
    w = GGUFWriter(path, arch=arch)

    def f32(name: str, data: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32), GGMLType.F32)

    def norm(name: str, n: int) -> None:
        f32(name, 1.0 + 0.1 * rng.standard_normal(n))

    def matrix(name: str, kind: str, n_in: int, n_out: int, n_expert: int = 0, scale: float = 0.08) -> None:
        t = s.types.get(kind, GGMLType.F16)
        x = (scale * rng.standard_normal((max(n_expert, 1) * n_out, n_in))).astype(np.float32)
        shape = (n_in, n_out, n_expert) if n_expert else (n_in, n_out)
        if t is GGMLType.F16:
            w.add_tensor(name, x.reshape(shape[::-1]).astype(np.float16), GGMLType.F16)
        elif t is GGMLType.F32:
            w.add_tensor(name, x.reshape(shape[::-1]), GGMLType.F32)
        else:
            w.add_tensor(name, quantize_weight(t, x), t, shape=shape)

    lfm = arch.startswith("lfm2")
    w.add("general.name", f"tiny-{arch}")
    keys = {"context_length": 256, "embedding_length": e, "block_count": n_layer, "feed_forward_length": s.n_ff,
            "attention.head_count": s.n_head}
    if lfm:
        w.add(f"{arch}.attention.head_count_kv", np.array([0 if r else s.n_head_kv for r in s.recurrent], np.uint32))
        keys["shortconv.l_cache"] = s.l_cache
    else:
        keys |= {"attention.head_count_kv": s.n_head_kv, "attention.key_length": s.head_dim,
                 "attention.value_length": s.head_dim, "rope.dimension_count": s.n_rot,
                 "ssm.conv_kernel": s.d_conv, "ssm.inner_size": s.d_state * s.n_v_heads, "ssm.state_size": s.d_state,
                 "ssm.time_step_rank": s.n_v_heads, "ssm.group_count": s.n_k_heads}
        if arch != "qwen3next":   # Qwen3.5's multi-section RoPE
            w.add(f"{arch}.rope.dimension_sections", np.array(s.rope_sections, np.int32))
        # the attention layers every full_attention_interval-th, else flagged one by one
        interval = next((il + 1 for il, r in enumerate(s.recurrent) if not r), 0)
        if interval and all(r == ((il + 1) % interval != 0) for il, r in enumerate(s.recurrent)):
            keys["full_attention_interval"] = interval
        else:
            w.add(f"{arch}.attention.recurrent_layers", [bool(r) for r in s.recurrent])
    if s.n_expert:
        keys |= {"expert_count": s.n_expert, "expert_used_count": s.n_expert_used,
                 "expert_feed_forward_length": s.n_ff_exp}
        if lfm:
            keys |= {"leading_dense_block_count": s.n_layer_dense_lead, "expert_gating_func": 2}
    for key, value in keys.items():
        w.add(f"{arch}.{key}", value, GGUFValueType.UINT32)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add(f"{arch}.rope.freq_base", 10000.0)
    add_vocab(w)
    matrix("token_embd.weight", "token_embd", e, N_VOCAB, scale=0.5)
    norm("token_embd_norm.weight" if lfm else "output_norm.weight", e)
    if not s.tied_output:
        matrix("output.weight", "output", e, N_VOCAB)
    hd = e // s.n_head if lfm else s.head_dim   # LFM2's heads span the embedding
    n_q = s.n_head * hd
    key_dim, value_dim = s.d_state * s.n_k_heads, s.d_state * s.n_v_heads
    for il, recurrent in enumerate(s.recurrent):
        b = f"blk.{il}"
        norm(f"{b}.attn_norm.weight", e)
        norm(f"{b}.ffn_norm.weight" if lfm else f"{b}.post_attention_norm.weight", e)
        if lfm and recurrent:
            f32(f"{b}.shortconv.conv.weight", 0.3 * rng.standard_normal((e, s.l_cache)))
            matrix(f"{b}.shortconv.in_proj.weight", "shortconv_in_proj", e, 3 * e)
            matrix(f"{b}.shortconv.out_proj.weight", "shortconv_out_proj", e, e)
        elif recurrent:   # the gated delta-net
            matrix(f"{b}.attn_qkv.weight", "attn_qkv", e, 2 * key_dim + value_dim)
            matrix(f"{b}.attn_gate.weight", "attn_gate", e, value_dim)
            f32(f"{b}.ssm_conv1d.weight", 0.3 * rng.standard_normal((2 * key_dim + value_dim, s.d_conv)))
            f32(f"{b}.ssm_dt.bias", rng.uniform(-2.0, 1.0, s.n_v_heads))
            f32(f"{b}.ssm_a", -np.exp(rng.uniform(-1.0, 1.0, s.n_v_heads)))
            if arch == "qwen3next":   # per key head: its value heads' betas, then their alphas
                matrix(f"{b}.ssm_ba.weight", "ssm_ba", e, 2 * s.n_v_heads, scale=0.3)
            else:
                matrix(f"{b}.ssm_beta.weight", "ssm_beta", e, s.n_v_heads, scale=0.3)
                matrix(f"{b}.ssm_alpha.weight", "ssm_alpha", e, s.n_v_heads, scale=0.3)
            norm(f"{b}.ssm_norm.weight", s.d_state)
            matrix(f"{b}.ssm_out.weight", "ssm_out", value_dim, e)
        else:
            # Qwen3.5's Q projection holds each head's queries, then its gate
            matrix(f"{b}.attn_q.weight", "attn_q", e, n_q if lfm else 2 * n_q)
            matrix(f"{b}.attn_k.weight", "attn_k", e, s.n_head_kv * hd)
            matrix(f"{b}.attn_v.weight", "attn_v", e, s.n_head_kv * hd)
            matrix(f"{b}.attn_output.weight", "attn_output", n_q, e)
            norm(f"{b}.attn_q_norm.weight", hd)
            norm(f"{b}.attn_k_norm.weight", hd)
        if s.n_expert and not (lfm and il < s.n_layer_dense_lead):
            matrix(f"{b}.ffn_gate_inp.weight", "ffn_gate_inp", e, s.n_expert)
            matrix(f"{b}.ffn_gate_exps.weight", "ffn_gate_exps", e, s.n_ff_exp, s.n_expert)
            matrix(f"{b}.ffn_up_exps.weight", "ffn_up_exps", e, s.n_ff_exp, s.n_expert)
            matrix(f"{b}.ffn_down_exps.weight", "ffn_down_exps", s.n_ff_exp, e, s.n_expert)
            if lfm:
                f32(f"{b}.exp_probs_b.bias", 0.1 * rng.standard_normal(s.n_expert))
            else:   # Qwen3.5-MoE's shared expert and its sigmoid gate
                f32(f"{b}.ffn_gate_inp_shexp.weight", 0.3 * rng.standard_normal(e))
                matrix(f"{b}.ffn_gate_shexp.weight", "ffn_gate_shexp", e, s.n_ff)
                matrix(f"{b}.ffn_up_shexp.weight", "ffn_up_shexp", e, s.n_ff)
                matrix(f"{b}.ffn_down_shexp.weight", "ffn_down_shexp", s.n_ff, e)
        else:
            matrix(f"{b}.ffn_gate.weight", "ffn_gate", e, s.n_ff)
            matrix(f"{b}.ffn_up.weight", "ffn_up", e, s.n_ff)
            matrix(f"{b}.ffn_down.weight", "ffn_down", s.n_ff, e)
    w.write()


@dataclass(frozen=True)
class TinyRwkv:
    """An RWKV model to write (:func:`write_tiny_rwkv`): ``rwkv6`` or ``rwkv7``, heads of
    ``head_size`` (RWKV-7: a multiple of 64); ``types`` maps the matrices (``token_embd``,
    ``output``, ``time_mix`` for key, value, receptance, gate and output, ``channel_mix``,
    ``lora`` for the low-rank ones) to their types (default F16)."""

    arch: str = "rwkv6"
    n_embd: int = 64
    n_layer: int = 2
    head_size: int = 32
    n_ff: int = 128
    lora_rank: int = 8
    rescale_every_n_layers: int = 0
    types: dict[str, GGMLType] = field(default_factory=dict)
    vocab: str = "spm"   # or "rwkv", "plamo2", "hybriddna", "whitespace" (add_*_vocab's), "none": ids only
    gate: bool = True    # arwkv7: the time mix's gate and group norm
    n_head_kv: int = 0   # rwkv6qwen2: K/V heads (0: as many as the queries')


# multi-byte tokens of the tiny RWKV vocabulary: words, their prefixes (so that greedy matching
# must back off), runs of white space, bytes that need escapes, UTF-8 letters and a CJK word
RWKV_PIECES = [b"th", b"the", b" the", b" th", b"he", b"in", b"ing", b"ng", b" a", b" an", b" and", b"an", b"nd",
               b"er", b"re", b"ere", b" w", b" wh", b" where", b"\n\n", b"\n\n\n", b"  ", b"    ", b"\t\t", b" \n",
               b"\\n", b"'s", b"''", b"\xc3\xa9", b"\xc3\xa9t\xc3\xa9", "中文".encode(), "中".encode(), b"ab",
               b"abc", b"abcd", b"12", b"123", b"1234", b"==", b"===", b"->", b"\x00\x00", b"\r\n", b"You",
               b" you", b"ou", b"ll", b"ell", b"hello", b" hello", b"Hello", b"!!", b"...", b"..", b"ti", b"tion",
               b"ation", b" is", b"is", b"it", b" it", b"\xff\xfe"]


def add_rwkv_vocab(w: GGUFWriter) -> None:
    """An RWKV vocabulary of N_VOCAB tokens, escaped as llama.cpp's converter writes them
    (Python's repr of the bytes): ``<s>`` (control), every byte, RWKV_PIECES, padding."""
    tokens = ["<s>"] + [repr(bytes([b]))[2:-1] for b in range(256)] + [repr(p)[2:-1] for p in RWKV_PIECES]
    tokens += [f"[PAD{i}]" for i in range(N_VOCAB - len(tokens))]
    w.add("tokenizer.ggml.model", "rwkv")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", np.array([3] + [1] * (N_VOCAB - 1), np.int32))


# PLaMo-2's pieces: words and their parts (which the scores decide between), Japanese, a token
# that is also a suffix of others, the special tokens' look-alikes
PLAMO2_PIECES = ["hello", "hel", "lo", "he", "llo", "l", "o", "h", "e", " ", "  ", " world", "world", "wor", "ld",
                 "日本", "日本語", "語", "本", "は", "です", "す", "で", "こんにちは", "ab", "abc", "bc", "c", "a", "b",
                 "\n", "\n\n", "1", "12", "23", "123", "x", "xyz", "yz", "ing", "in", "g", "the", "th", " the",
                 "\u2581", "\u2581hi", "hi", "<|", "|>", "é", "ét", "été", "😀", "😀😀", "!", "?", ".", ",", "-"]


def add_plamo2_vocab(w: GGUFWriter) -> None:
    """A PLaMo-2 vocabulary of N_VOCAB tokens: unk, bos, eos, pad, the 256 byte tokens
    ``<0xXX>``, PLAMO2_PIECES with scores spread so that the search must weigh them."""
    tokens = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>"]
    tokens += [f"<0x{b:02X}>" for b in range(256)] + PLAMO2_PIECES[:N_VOCAB - 260]
    rng = np.random.default_rng(7)
    scores = np.concatenate([np.zeros(260), -rng.uniform(0.0, 12.0, len(tokens) - 260)]).astype(np.float32)
    w.add("tokenizer.ggml.model", "plamo2")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.scores", scores)
    w.add("tokenizer.ggml.token_type", np.array([2, 3, 3, 3] + [6] * 256 + [1] * (len(tokens) - 260), np.int32))


HYBRIDDNA_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "A C", "G T",
                    "AC GT"]


def add_hybriddna_vocab(w: GGUFWriter) -> None:
    """A HybriDNA vocabulary of N_VOCAB tokens: byte-level BPE (GPT-2's byte texts,
    HYBRIDDNA_MERGES), the control tokens ``<dna>``, ``</dna>``, ``<oov>``, then 6-mers of A, C,
    G, T carrying the marker U+E000 (``AAAAAA`` among them)."""
    from gguflm._ext import tokenize as _tk

    tokens = [_tk.gpt2_byte_to_text(b).decode() for b in range(256)]
    tokens += [m.replace(" ", "") for m in HYBRIDDNA_MERGES] + ["<dna>", "</dna>", "<oov>"]
    rng = np.random.default_rng(3)
    kmers = ["AAAAAA", "ACGTAC", "CCCCCC"] + ["".join(rng.choice(list("ACGT"), 6)) for _ in range(60)]
    kmers = list(dict.fromkeys(kmers))[:N_VOCAB - len(tokens)]
    tokens += [k + "\ue000" for k in kmers]
    types = [1] * (256 + len(HYBRIDDNA_MERGES)) + [3, 3, 3] + [1] * len(kmers)
    w.add("tokenizer.ggml.model", "hybriddna")
    w.add("tokenizer.ggml.pre", "gpt-2")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", np.array(types, np.int32))
    w.add("tokenizer.ggml.merges", HYBRIDDNA_MERGES)


WHITESPACE_MERGES = ["h e", "l l", "he ll", "hell o", "世 界", "a b", "ab c", "1 2", "ü b", "üb er"]


def add_whitespace_vocab(w: GGUFWriter) -> None:
    """A ``whitespace`` vocabulary (jina-embeddings-v2-base-zh's kind) of N_VOCAB tokens: unk,
    bos, eos, the byte tokens ``<0xXX>``, single characters and WHITESPACE_MERGES' results, on
    raw UTF-8 with the ``whitespace`` pre-tokenizer."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    chars = list("helowrdabcxyz123HE世界üé!.,") + [m.replace(" ", "") for m in WHITESPACE_MERGES]
    tokens += chars + [f"[unused{i}]" for i in range(N_VOCAB - len(tokens) - len(chars))]
    w.add("tokenizer.ggml.model", "whitespace")
    w.add("tokenizer.ggml.pre", "whitespace")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", np.array([2, 3, 3] + [6] * 256 + [1] * (N_VOCAB - 259), np.int32))
    w.add("tokenizer.ggml.merges", WHITESPACE_MERGES)


def write_tiny_rwkv(spec: TinyRwkv, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights in a trained RWKV's ranges: mixes in [0, 1], decays
    inside (0, 1), normalised keys' scales around 1."""
    s, e, arch, rank = spec, spec.n_embd, spec.arch, spec.lora_rank
    arwkv = arch in ("arwkv7", "rwkv6qwen2")   # RMSNorms without biases, a SwiGLU FFN, one token-shift row
    qrwkv = arch == "rwkv6qwen2"   # RWKV-6's time mix without time_mix_first and the group norm
    w = GGUFWriter(path, arch=arch)

    def f32(name: str, data: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32), GGMLType.F32)

    def matrix(name: str, kind: str, n_in: int, n_out: int, scale: float = 0.1) -> None:
        t = s.types.get(kind, GGMLType.F16)
        x = (scale * rng.standard_normal((n_out, n_in))).astype(np.float32)
        if t in (GGMLType.F16, GGMLType.F32):
            w.add_tensor(name, x.astype(np.float16 if t is GGMLType.F16 else np.float32), t)
        else:
            w.add_tensor(name, quantize_weight(t, x), t, shape=(n_in, n_out))

    def norm(name: str, bias: bool = True) -> None:
        f32(f"{name}.weight", 1.0 + 0.1 * rng.standard_normal(e))
        if bias:
            f32(f"{name}.bias", 0.05 * rng.standard_normal(e))

    w.add("general.name", f"tiny-{arch}")
    keys = {"context_length": 256, "embedding_length": e, "block_count": s.n_layer, "feed_forward_length": s.n_ff,
            "attention.head_count": e // s.head_size if qrwkv else 0, "wkv.head_size": s.head_size,
            "token_shift_count": 1 if arwkv else 2}
    if qrwkv:
        keys["attention.head_count_kv"] = s.n_head_kv or e // s.head_size
    if arch in ("rwkv6", "rwkv6qwen2"):
        keys.update(time_mix_extra_dim=rank, time_decay_extra_dim=2 * rank,
                    rescale_every_n_layers=s.rescale_every_n_layers)
    else:
        keys.update({"attention.decay_lora_rank": 2 * rank, "attention.iclr_lora_rank": rank,
                     "attention.value_residual_mix_lora_rank": rank // 2})
        if s.gate:
            keys["attention.gate_lora_rank"] = 4 * rank
    for key, value in keys.items():
        w.add(f"{arch}.{key}", value, GGUFValueType.UINT32)
    w.add(f"{arch}.attention.layer_norm_epsilon", 1e-5)
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if s.vocab == "none":
        w.add("tokenizer.ggml.model", "none")
        w.add(f"{arch}.vocab_size", N_VOCAB, GGUFValueType.UINT32)
    else:
        {"rwkv": add_rwkv_vocab, "plamo2": add_plamo2_vocab, "hybriddna": add_hybriddna_vocab,
         "whitespace": add_whitespace_vocab, "spm": add_vocab}[s.vocab](w)
    matrix("token_embd.weight", "token_embd", e, N_VOCAB, scale=0.5)
    if not arwkv:
        norm("token_embd_norm")
    norm("output_norm", bias=not arwkv)
    matrix("output.weight", "output", e, N_VOCAB)
    if qrwkv:
        f32("output_norm.bias", 0.05 * rng.standard_normal(e))
    rwkv6_mix = arch in ("rwkv6", "rwkv6qwen2")
    n_mix = 5 if rwkv6_mix or not s.gate else 6
    n_kv = s.n_head_kv * s.head_size if s.n_head_kv else e
    for il in range(s.n_layer):
        b = f"blk.{il}"
        norm(f"{b}.attn_norm", bias=not arwkv)
        norm(f"{b}.ffn_norm" if arwkv else f"{b}.attn_norm_2", bias=not arwkv)
        f32(f"{b}.time_mix_lerp_fused.weight", rng.uniform(0.0, 1.0, (n_mix, 1, 1, e)))
        for m, n_out in (("key", n_kv), ("value", n_kv), ("receptance", e), ("output", e)) + \
                (("gate", e),) * rwkv6_mix:
            matrix(f"{b}.time_mix_{m}.weight", "time_mix", e, n_out, scale=2.0 / np.sqrt(e))
            if qrwkv and m in ("key", "value", "receptance"):
                f32(f"{b}.time_mix_{m}.bias", 0.1 * rng.standard_normal(n_out))
        if s.gate and not qrwkv:
            norm(f"{b}.time_mix_ln")
        if arwkv:
            for m, n_in, n_out in (("gate", e, s.n_ff), ("up", e, s.n_ff), ("down", s.n_ff, e)):
                matrix(f"{b}.ffn_{m}.weight", "channel_mix", n_in, n_out, scale=1.0 / np.sqrt(n_in))
        else:
            f32(f"{b}.channel_mix_lerp_k.weight", rng.uniform(0.0, 1.0, (1, 1, e)))
            matrix(f"{b}.channel_mix_key.weight", "channel_mix", e, s.n_ff, scale=2.0 / np.sqrt(e))
            matrix(f"{b}.channel_mix_value.weight", "channel_mix", s.n_ff, e, scale=1.0 / np.sqrt(s.n_ff))
        if rwkv6_mix:
            f32(f"{b}.time_mix_lerp_x.weight", rng.uniform(0.0, 1.0, (1, 1, e)))
            matrix(f"{b}.time_mix_w1.weight", "lora", e, 5 * rank)
            f32(f"{b}.time_mix_w2.weight", 0.1 * rng.standard_normal((5, e, rank)))
            if not qrwkv:
                f32(f"{b}.time_mix_first.weight", 0.5 * rng.standard_normal((e // s.head_size, s.head_size)))
            f32(f"{b}.time_mix_decay.weight", rng.uniform(-4.0, 0.5, e))
            matrix(f"{b}.time_mix_decay_w1.weight", "lora", e, 2 * rank)
            matrix(f"{b}.time_mix_decay_w2.weight", "lora", 2 * rank, e)
            if not arwkv:
                f32(f"{b}.channel_mix_lerp_r.weight", rng.uniform(0.0, 1.0, (1, 1, e)))
                matrix(f"{b}.channel_mix_receptance.weight", "channel_mix", e, e, scale=2.0 / np.sqrt(e))
            continue
        value_rank = rank if il == 0 else rank // 2
        for c, r, bias in (("w", 2 * rank, rng.uniform(-5.0, -1.0, e)), ("a", rank, 0.3 * rng.standard_normal(e)),
                           ("v", value_rank, 0.5 * rng.standard_normal(e))):
            f32(f"{b}.time_mix_{c}0.weight", bias)
            matrix(f"{b}.time_mix_{c}1.weight", "lora", e, r, scale=0.3)
            matrix(f"{b}.time_mix_{c}2.weight", "lora", r, e, scale=0.3)
        if s.gate:
            matrix(f"{b}.time_mix_g1.weight", "lora", e, 4 * rank, scale=0.3)
            matrix(f"{b}.time_mix_g2.weight", "lora", 4 * rank, e, scale=0.3)
        f32(f"{b}.time_mix_k_k.weight", rng.uniform(0.5, 1.0, e))
        f32(f"{b}.time_mix_k_a.weight", rng.uniform(0.8, 1.2, e))
        f32(f"{b}.time_mix_r_k.weight", 0.3 * rng.standard_normal(e))
    w.write()


# -- the ALiBi families (bloom, mpt, jais, refact; Baichuan 13B is write_tiny_model's baichuan at 40 layers)

ALIBI_ARCHS = ("bloom", "mpt", "jais", "refact")


@dataclass(frozen=True)
class TinyAlibi:
    """A model that attends with ALiBi biases (:func:`write_tiny_alibi`): heads span n_embd;
    ``biases`` writes every bias (BLOOM and JAIS need them; MPT-7B has none; Refact's attention
    output and feed-forward biases are read and never added); ``qk_norm`` MPT's Q and K
    LayerNorms (which llama.cpp's graph aborts on); ``positions`` MPT's optional position embeddings; ``fused`` one QKV matrix (else
    Q, K and V apart: Refact); ``metadata`` more ``{arch}.*`` keys (attention.max_alibi_bias,
    attention.clamp_kqv). ``types`` maps a matrix kind to its type, ``tensor_types`` single tensors
    (default F16)."""

    arch: str
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 96
    n_layer: int = 2
    tied_output: bool = True
    biases: bool = True
    qk_norm: bool = False
    positions: bool = False
    fused: bool = True
    metadata: dict = field(default_factory=dict)
    types: dict[str, GGMLType] = field(default_factory=dict)
    tensor_types: dict[str, GGMLType] = field(default_factory=dict)


def write_tiny_alibi(spec: TinyAlibi, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights (as :func:`write_tiny_model`'s: norms near 1, biases near 0,
    matrices N(0, 0.08), the token embedding N(0, 0.5))."""
    s, arch, e = spec, spec.arch, spec.n_embd
    n_q, n_kv = e, e // s.n_head * s.n_head_kv
    w = GGUFWriter(path, arch=arch)
    tensors = _RandomTensors(w, rng, s.types, s.tensor_types)
    vector, matrix = tensors.vector, tensors.matrix
    layer_norm = arch != "refact"

    def norm(name: str, bias: bool) -> None:
        vector(f"{name}.weight", e)
        if bias:
            vector(f"{name}.bias", e, scale=0.05, center=0.0)

    def linear(name: str, n_in: int, n_out: int, bias: bool) -> None:
        matrix(f"{name}.weight", n_in, n_out)
        if bias:
            vector(f"{name}.bias", n_out, scale=0.05, center=0.0)

    w.add("general.name", f"tiny-{arch}")
    metadata = {"attention.layer_norm_epsilon": 1e-5, **s.metadata} if layer_norm else s.metadata
    tensors.header(arch, {"context_length": 256, "embedding_length": e, "block_count": s.n_layer,
                          "feed_forward_length": s.n_ff, "attention.head_count": s.n_head,
                          "attention.head_count_kv": s.n_head_kv}, metadata)
    matrix("token_embd.weight", e, N_VOCAB, scale=0.5)
    if arch == "bloom":
        norm("token_embd_norm", True)
    if s.positions:
        w.add_tensor("position_embd.weight", (0.1 * rng.standard_normal((256, e))).astype(np.float32), GGMLType.F32)
    norm("output_norm", layer_norm and s.biases)
    if not s.tied_output:
        matrix("output.weight", e, N_VOCAB)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        norm(f"{b}.attn_norm", layer_norm and s.biases)
        if s.fused:
            linear(f"{b}.attn_qkv", e, n_q + 2 * n_kv, s.biases)
        else:
            for proj, n in (("attn_q", n_q), ("attn_k", n_kv), ("attn_v", n_kv)):
                linear(f"{b}.{proj}", e, n, s.biases)
        linear(f"{b}.attn_output", n_q, e, s.biases)
        if s.qk_norm:
            norm(f"{b}.attn_q_norm", True)
            norm(f"{b}.attn_k_norm", True)
        norm(f"{b}.ffn_norm", layer_norm and s.biases)
        if arch in ("jais", "refact"):
            linear(f"{b}.ffn_gate", e, s.n_ff, s.biases)
        linear(f"{b}.ffn_up", e, s.n_ff, s.biases)
        linear(f"{b}.ffn_down", s.n_ff, e, s.biases)
    w.write()


@st.composite
def tiny_alibi_models(draw: st.DrawFn) -> TinyAlibi:
    """Any ALiBi family; 1..12 heads of 8..32 values (head counts that are not powers of two
    take ggml's second slope base), GQA where the family allows it, every optional part, every
    matrix of a type whose blocks fit its rows."""
    arch = draw(st.sampled_from(ALIBI_ARCHS))
    n_head = draw(st.integers(1, 12))
    head_dim = draw(st.sampled_from((8, 16, 32)))
    n_head_kv = draw(st.sampled_from([k for k in range(1, n_head + 1) if n_head % k == 0]))
    metadata = {}
    if arch in ("mpt", "jais") and draw(st.booleans()):
        metadata["attention.max_alibi_bias"] = draw(st.sampled_from((8.0, 4.0)))
    if arch == "mpt" and draw(st.booleans()):
        metadata["attention.clamp_kqv"] = draw(st.sampled_from((0.5, 2.0)))
    spec = TinyAlibi(arch, n_embd=n_head * head_dim, n_head=n_head, n_head_kv=n_head_kv,
                     n_ff=draw(st.integers(2, 12)) * 16, n_layer=draw(st.integers(1, 3)),
                     tied_output=arch != "jais" and draw(st.booleans()),
                     biases=arch in ("bloom", "jais") or draw(st.booleans()),
                     positions=arch == "mpt" and draw(st.booleans()),
                     fused=arch != "refact" or draw(st.booleans()), metadata=metadata)
    n_q = spec.n_embd
    inputs = {"token_embd.weight": n_q}
    if not spec.tied_output:
        inputs["output.weight"] = n_q
    for il in range(spec.n_layer):
        b = f"blk.{il}"
        projections = ("attn_qkv",) if spec.fused else ("attn_q", "attn_k", "attn_v")
        projections += ("ffn_up", "ffn_gate") if arch in ("jais", "refact") else ("ffn_up",)
        inputs.update({f"{b}.{p}.weight": n_q for p in projections})
        inputs.update({f"{b}.attn_output.weight": n_q, f"{b}.ffn_down.weight": spec.n_ff})
    types = {name: draw(st.sampled_from([t for t in WEIGHT_TYPES if fits(t, n_in)])) for name, n_in in inputs.items()}
    return TinyAlibi(**{**spec.__dict__, "tensor_types": types})


# -- Apertus (llama's attention with per-head Q/K norms; up, xIELU, down)

def write_tiny_apertus(path: Path, rng: np.random.Generator, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                       n_ff: int = 96, n_layer: int = 2, xielu: dict[str, Any] | None = None,
                       types: dict[str, GGMLType] | None = None) -> None:
    """An ``apertus`` model with random weights; ``xielu`` the global ``xielu.*`` keys (one value
    or one per layer; default: values near the released model's)."""
    w = GGUFWriter(path, arch="apertus")
    tensors = _RandomTensors(w, rng, types or {}, {})
    vector, matrix = tensors.vector, tensors.matrix
    hd = n_embd // n_head
    w.add("general.name", "tiny-apertus")
    tensors.header("apertus", {"context_length": 256, "embedding_length": n_embd, "block_count": n_layer,
                               "feed_forward_length": n_ff, "attention.head_count": n_head,
                               "attention.head_count_kv": n_head_kv}, {})
    keys = xielu or {"alpha_n": 0.8, "alpha_p": 0.8, "beta": 0.5, "eps": -1e-6}
    for key, value in keys.items():
        w.add(f"xielu.{key}", np.asarray(value, np.float32) if isinstance(value, (list, tuple)) else float(value))
    tensors.embeddings(n_embd, False)
    for il in range(n_layer):
        b = f"blk.{il}"
        vector(f"{b}.attn_norm.weight", n_embd)
        matrix(f"{b}.attn_q.weight", n_embd, n_embd)
        matrix(f"{b}.attn_k.weight", n_embd, hd * n_head_kv)
        matrix(f"{b}.attn_v.weight", n_embd, hd * n_head_kv)
        matrix(f"{b}.attn_output.weight", n_embd, n_embd)
        vector(f"{b}.attn_q_norm.weight", hd)
        vector(f"{b}.attn_k_norm.weight", hd)
        vector(f"{b}.ffn_norm.weight", n_embd)
        matrix(f"{b}.ffn_up.weight", n_embd, n_ff, scale=0.3)   # wide enough for both of xIELU's sides
        matrix(f"{b}.ffn_down.weight", n_ff, n_embd)
    w.write()


# -- ChatGLM (fused and biased QKV, partial RoPE, SwiGLU over one up projection's halves)

def write_tiny_chatglm(path: Path, rng: np.random.Generator, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                       n_ff: int = 64, n_layer: int = 2, fused: bool = True, tied_output: bool = False,
                       types: dict[str, GGMLType] | None = None) -> None:
    """A ``chatglm`` model with random weights: Q, K, V fused (``fused``) or apart, biased either
    way; RoPE over half of each head, as ChatGLM's."""
    w = GGUFWriter(path, arch="chatglm")
    tensors = _RandomTensors(w, rng, types or {}, {})
    vector, matrix = tensors.vector, tensors.matrix
    hd = n_embd // n_head
    w.add("general.name", "tiny-chatglm")
    tensors.header("chatglm", {"context_length": 256, "embedding_length": n_embd, "block_count": n_layer,
                               "feed_forward_length": n_ff, "attention.head_count": n_head,
                               "attention.head_count_kv": n_head_kv, "rope.dimension_count": hd // 2}, {})
    tensors.embeddings(n_embd, tied_output)
    widths = {"q": n_embd, "k": hd * n_head_kv, "v": hd * n_head_kv}
    for il in range(n_layer):
        b = f"blk.{il}"
        vector(f"{b}.attn_norm.weight", n_embd)
        parts = {"qkv": sum(widths.values())} if fused else widths
        for part, width in parts.items():
            matrix(f"{b}.attn_{part}.weight", n_embd, width)
            vector(f"{b}.attn_{part}.bias", width, scale=0.05, center=0.0)
        matrix(f"{b}.attn_output.weight", n_embd, n_embd)
        vector(f"{b}.ffn_norm.weight", n_embd)
        matrix(f"{b}.ffn_up.weight", n_embd, 2 * n_ff)
        matrix(f"{b}.ffn_down.weight", n_ff, n_embd)
    w.write()


# -- jina-bert-v3 (BERT's encoder with rotary positions, no position embeddings)

def write_tiny_jina_bert_v3(path: Path, rng: np.random.Generator, n_embd: int = 64, n_head: int = 4,
                            n_head_kv: int = 4, n_ff: int = 96, n_layer: int = 2, pooling_type: int = 1,
                            types: dict[str, GGMLType] | None = None) -> None:
    """A ``jina-bert-v3`` encoder with random weights: Q, K, V apart with biases, every norm
    and bias, a token-type embedding of two types."""
    arch = "jina-bert-v3"
    w = GGUFWriter(path, arch=arch)
    tensors = _RandomTensors(w, rng, types or {}, {})
    vector, matrix = tensors.vector, tensors.matrix
    hd = n_embd // n_head
    w.add("general.name", "tiny-jina-bert-v3")
    tensors.header(arch, {"context_length": 256, "embedding_length": n_embd, "block_count": n_layer,
                          "feed_forward_length": n_ff, "attention.head_count": n_head,
                          "attention.head_count_kv": n_head_kv, "pooling_type": pooling_type},
                   {"attention.layer_norm_epsilon": 1e-5, "attention.causal": False})
    w.add("tokenizer.ggml.token_type_count", 2, GGUFValueType.UINT32)

    def norm(name: str) -> None:
        vector(f"{name}.weight", n_embd)
        vector(f"{name}.bias", n_embd, scale=0.05, center=0.0)

    def linear(name: str, n_in: int, n_out: int) -> None:
        matrix(f"{name}.weight", n_in, n_out)
        vector(f"{name}.bias", n_out, scale=0.05, center=0.0)

    matrix("token_embd.weight", n_embd, N_VOCAB, scale=0.5)
    w.add_tensor("token_types.weight", (0.1 * rng.standard_normal((2, n_embd))).astype(np.float32), GGMLType.F32)
    norm("token_embd_norm")
    for il in range(n_layer):
        b = f"blk.{il}"
        for proj, n in (("attn_q", n_embd), ("attn_k", hd * n_head_kv), ("attn_v", hd * n_head_kv)):
            linear(f"{b}.{proj}", n_embd, n)
        linear(f"{b}.attn_output", n_embd, n_embd)
        norm(f"{b}.attn_output_norm")
        linear(f"{b}.ffn_up", n_embd, n_ff)
        linear(f"{b}.ffn_down", n_ff, n_embd)
        norm(f"{b}.layer_output_norm")
    w.write()



@dataclass(frozen=True)
class TinyGemma:
    """A model of the newer Gemma family to write (:func:`write_tiny_gemma`): ``gemma-embedding``
    (Gemma 3's block, bidirectional; ``n_dense`` > 0 adds the sentence-transformers projections
    dense_2 (n_embd -> n_dense) and dense_3 (back)) or ``gemma4`` (sliding layers with heads of
    ``head_dim_swa`` rotated over ``n_rot_swa``, global ones rotated over ``n_rot`` with
    rope_freqs and ``n_head_kv_global`` KV heads if not 0, ``no_v_layers`` without attn_v, the last
    ``n_shared_kv`` without K and V (they share an earlier layer's), ``n_ple`` per-layer input
    values per token and layer (0: none), block output scales, a separate output projection
    unless ``tied_output``). Every ``swa_period``-th layer is global, the others slide over
    ``n_swa`` positions. ``types`` maps a matrix kind (``attn_q``) to its type, ``tensor_types``
    single tensors (default F16). Gemma 4 with ``n_expert`` > 0 (the 26B-A4B): the layers of
    ``expert_layers`` (None: all) add ``n_expert_used`` of n_expert experts ``n_ff_exp`` wide,
    gate and up as one tensor with ``gate_up``, each scaled with ``down_scale``."""

    arch: str = "gemma-embedding"
    n_embd: int = 64
    head_dim: int = 32
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 96
    n_layer: int = 3
    n_swa: int = 6
    swa_period: int = 2
    n_dense: int = 0
    pooling_type: int = 1
    head_dim_swa: int = 0               # gemma4: 0 = head_dim
    n_rot: int = 0                      # gemma4: 0 = the layer's head size
    n_rot_swa: int = 0
    no_v_layers: tuple[int, ...] = ()
    n_head_kv_global: int = 0           # gemma4: 0 = n_head_kv (else head_count_kv is one per layer)
    n_shared_kv: int = 0
    n_ple: int = 0
    tied_output: bool = True
    types: dict[str, GGMLType] = field(default_factory=dict)
    tensor_types: dict[str, GGMLType] = field(default_factory=dict)
    n_expert: int = 0
    n_expert_used: int = 2
    n_ff_exp: int = 32
    expert_layers: tuple[int, ...] | None = None
    gate_up: bool = False
    down_scale: bool = True

    def is_swa(self, il: int) -> bool:
        return il % self.swa_period < self.swa_period - 1

    def has_experts(self, il: int) -> bool:
        return self.n_expert > 0 and (self.expert_layers is None or il in self.expert_layers)

    def head(self, il: int) -> int:
        return (self.head_dim_swa or self.head_dim) if self.is_swa(il) else self.head_dim

    def has_kv(self, il: int) -> bool:
        return il < self.n_layer - self.n_shared_kv

    def kv_heads(self, il: int) -> int:
        return self.n_head_kv if self.is_swa(il) or not self.n_head_kv_global else self.n_head_kv_global

    def matrices(self) -> dict[str, int]:
        """Every matrix by tensor name: its row length (input width)."""
        s, out = self, {"token_embd.weight": self.n_embd}
        if s.n_dense:
            out.update({"dense_2.weight": s.n_embd, "dense_3.weight": s.n_dense})
        if not s.tied_output:
            out["output.weight"] = s.n_embd
        if s.n_ple:
            out.update({"per_layer_token_embd.weight": s.n_ple * s.n_layer, "per_layer_model_proj.weight": s.n_embd})
        for il in range(s.n_layer):
            b = f"blk.{il}"
            if s.n_ple:
                out.update({f"{b}.inp_gate.weight": s.n_embd, f"{b}.proj.weight": s.n_ple})
            kinds = ("attn_q", "ffn_gate", "ffn_up") + (("attn_k",) if s.has_kv(il) else ()) + \
                (("attn_v",) if s.has_kv(il) and il not in s.no_v_layers else ())
            out.update({f"{b}.{kind}.weight": s.n_embd for kind in kinds})
            out.update({f"{b}.attn_output.weight": s.n_head * s.head(il), f"{b}.ffn_down.weight": s.n_ff})
            if s.has_experts(il):
                ins = ("ffn_gate_inp", "ffn_gate_up_exps") if s.gate_up else ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps")
                out.update({f"{b}.{kind}.weight": s.n_embd for kind in ins})
                out[f"{b}.ffn_down_exps.weight"] = s.n_ff_exp
        return out


def write_tiny_gemma(spec: TinyGemma, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights (norms near 1, matrices N(0, 0.08), the embedding N(0, 0.5))."""
    s, arch, e, hd = spec, spec.arch, spec.n_embd, spec.head_dim
    w = GGUFWriter(path, arch=arch)
    tensors = _RandomTensors(w, rng, s.types, s.tensor_types)
    vector, matrix = tensors.vector, tensors.matrix
    w.add("general.name", f"tiny-{arch}")
    keys = {"context_length": 256, "embedding_length": e, "block_count": s.n_layer, "feed_forward_length": s.n_ff,
            "attention.head_count": s.n_head, "attention.head_count_kv": s.n_head_kv, "attention.key_length": hd,
            "attention.value_length": hd, "attention.sliding_window": s.n_swa}
    metadata: dict[str, object] = {"rope.freq_base_swa": 1000.0}
    if arch == "gemma4":
        hd_swa = s.head_dim_swa or hd
        keys.update({"attention.key_length_swa": hd_swa, "attention.value_length_swa": hd_swa,
                     "rope.dimension_count": s.n_rot or hd, "rope.dimension_count_swa": s.n_rot_swa or hd_swa,
                     "embedding_length_per_layer_input": s.n_ple, "attention.shared_kv_layers": s.n_shared_kv})
        metadata.update({"attention.sliding_window_pattern": [s.is_swa(il) for il in range(s.n_layer)],
                         "final_logit_softcapping": 30.0})
        if s.n_expert:
            keys.update({"expert_count": s.n_expert, "expert_used_count": s.n_expert_used,
                         "expert_feed_forward_length": s.n_ff_exp})
        if s.n_head_kv_global:   # as Gemma 4's files: fewer KV heads in the global layers
            del keys["attention.head_count_kv"]
            metadata["attention.head_count_kv"] = np.array([s.kv_heads(il) for il in range(s.n_layer)], np.int32)
    else:
        keys.update({"attention.sliding_window_pattern": s.swa_period, "pooling_type": s.pooling_type})
    if s.n_dense:
        keys.update({"dense_2_feat_in": e, "dense_2_feat_out": s.n_dense, "dense_3_feat_in": s.n_dense,
                     "dense_3_feat_out": e})
    tensors.header(arch, keys, metadata)
    tensors.embeddings(e, tied_output=s.tied_output)
    if s.n_dense:
        matrix("dense_2.weight", e, s.n_dense, scale=0.2)
        matrix("dense_3.weight", s.n_dense, e, scale=0.2)
    if arch == "gemma4" and not all(s.is_swa(il) for il in range(s.n_layer)):
        # proportional RoPE's factors: a quarter of the pairs turn (here at other speeds too), the others barely
        w.add_tensor("rope_freqs.weight", np.concatenate([rng.uniform(1.0, 3.0, hd // 4), np.full(hd // 2 - hd // 4, 1e30)])
                     .astype(np.float32), GGMLType.F32)
    if s.n_ple:
        matrix("per_layer_token_embd.weight", s.n_ple * s.n_layer, N_VOCAB, scale=0.5)
        matrix("per_layer_model_proj.weight", e, s.n_ple * s.n_layer, scale=0.5)
        vector("per_layer_proj_norm.weight", s.n_ple)
    for il in range(s.n_layer):
        b, hd = f"blk.{il}", s.head(il)
        if s.n_ple:
            matrix(f"{b}.inp_gate.weight", e, s.n_ple, scale=0.3)
            matrix(f"{b}.proj.weight", s.n_ple, e, scale=0.3)
            vector(f"{b}.post_norm.weight", e)
        vector(f"{b}.attn_norm.weight", e)
        matrix(f"{b}.attn_q.weight", e, s.n_head * hd)
        if s.has_kv(il):
            matrix(f"{b}.attn_k.weight", e, s.kv_heads(il) * hd)
        if s.has_kv(il) and il not in s.no_v_layers:
            matrix(f"{b}.attn_v.weight", e, s.kv_heads(il) * hd)
        matrix(f"{b}.attn_output.weight", s.n_head * hd, e)
        vector(f"{b}.attn_q_norm.weight", hd)
        if s.has_kv(il):
            vector(f"{b}.attn_k_norm.weight", hd)
        if arch == "gemma4":
            vector(f"{b}.layer_output_scale.weight", 1, scale=0.2, center=0.7)
        vector(f"{b}.post_attention_norm.weight", e)
        vector(f"{b}.ffn_norm.weight", e)
        matrix(f"{b}.ffn_gate.weight", e, s.n_ff)
        matrix(f"{b}.ffn_up.weight", e, s.n_ff)
        matrix(f"{b}.ffn_down.weight", s.n_ff, e)
        vector(f"{b}.post_ffw_norm.weight", e)
        if s.has_experts(il):   # a router of spread rows: the experts' scores lie well apart
            matrix(f"{b}.ffn_gate_inp.weight", e, s.n_expert, scale=2.0)
            vector(f"{b}.ffn_gate_inp.scale", e, scale=0.3)
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                vector(f"{b}.{name}.weight", e)
            if s.gate_up:
                matrix(f"{b}.ffn_gate_up_exps.weight", e, 2 * s.n_ff_exp, n_stack=s.n_expert)
            else:
                matrix(f"{b}.ffn_gate_exps.weight", e, s.n_ff_exp, n_stack=s.n_expert)
                matrix(f"{b}.ffn_up_exps.weight", e, s.n_ff_exp, n_stack=s.n_expert)
            matrix(f"{b}.ffn_down_exps.weight", s.n_ff_exp, e, n_stack=s.n_expert)
            if s.down_scale:
                vector(f"{b}.ffn_down_exps.scale", s.n_expert, scale=0.5)
    w.write()


@st.composite
def tiny_gemma_embeddings(draw: st.DrawFn) -> TinyGemma:
    """EmbeddingGemma shapes: head_dim 8..128, one or two KV heads for 1..4 query heads each, 2..4
    layers, a global one every 2..n_layer with windows of 2..12 between (llama.cpp's encoder
    aborts on a model with no sliding or no global layer: the mask it leaves unused has no
    buffer), with or without the dense projections, and every matrix of a type drawn from those
    whose block fits its rows."""
    n_head_kv, n_layer = draw(st.integers(1, 2)), draw(st.integers(2, 5))
    spec = TinyGemma(n_embd=draw(st.integers(2, 16)) * 16, head_dim=draw(st.sampled_from((8, 16, 32, 64, 128))),
                     n_head=n_head_kv * draw(st.integers(1, 4)), n_head_kv=n_head_kv, n_ff=draw(st.integers(2, 12)) * 16,
                     n_layer=n_layer, n_swa=draw(st.integers(2, 12)), swa_period=draw(st.integers(2, n_layer)),
                     n_dense=draw(st.sampled_from((0, 0, 32, 96, 256))))
    tensor_types = {name: draw(st.sampled_from([t for t in WEIGHT_TYPES if fits(t, n_in)]))
                    for name, n_in in spec.matrices().items()}
    return TinyGemma(**{**spec.__dict__, "tensor_types": tensor_types})


@st.composite
def tiny_gemma4_models(draw: st.DrawFn) -> TinyGemma:
    """Gemma 4 shapes: sliding heads of 8..64, global ones as wide or twice, each rotated over half
    or all of it, one or two KV heads for 1..4 query heads each (the global layers' maybe one, as a
    per-layer array), 2..5 layers with a global one every 2..n_layer, layers without V, the last
    layers sharing K and V where the layers before them allow it, per-layer inputs or none, tied
    or separate output, and every matrix of a type drawn from those whose block fits its rows."""
    head_swa = draw(st.sampled_from((8, 16, 32, 64)))
    head = head_swa * draw(st.integers(1, 2))
    n_head_kv, n_layer = draw(st.integers(1, 2)), draw(st.integers(2, 5))
    spec = TinyGemma("gemma4", n_embd=draw(st.integers(2, 16)) * 16, head_dim=head, head_dim_swa=head_swa,
                     n_rot=draw(st.sampled_from((head // 2, head))), n_rot_swa=draw(st.sampled_from((head_swa // 2, head_swa))),
                     n_head=n_head_kv * draw(st.integers(1, 4)), n_head_kv=n_head_kv, n_ff=draw(st.integers(2, 12)) * 16,
                     n_layer=n_layer, n_swa=draw(st.integers(2, 12)), swa_period=draw(st.integers(2, n_layer)),
                     no_v_layers=tuple(sorted(draw(st.sets(st.integers(0, n_layer - 1))))),
                     n_head_kv_global=draw(st.sampled_from((0, 1))), tied_output=draw(st.booleans()),
                     n_ple=draw(st.sampled_from((0, 8, 16))))

    def can_share(n: int) -> bool:   # each of the last n layers has a layer of its kind just before them
        start = n_layer - n
        return all(spec.is_swa(il) == spec.is_swa(start - (2 if spec.is_swa(il) else 1)) for il in range(start, n_layer))

    spec = TinyGemma(**{**spec.__dict__, "n_shared_kv": draw(st.sampled_from([n for n in range(n_layer - 1)
                                                                              if can_share(n)]))})
    tensor_types = {name: draw(st.sampled_from([t for t in WEIGHT_TYPES if fits(t, n_in)]))
                    for name, n_in in spec.matrices().items()}
    return TinyGemma(**{**spec.__dict__, "tensor_types": tensor_types})


# -- modern-bert (pre-norm encoder without biases, symmetric sliding windows, fused GeGLU)

def write_tiny_modern_bert(path: Path, rng: np.random.Generator, n_embd: int = 64, n_head: int = 4, n_ff: int = 64,
                           n_layer: int = 4, n_swa: int = 4, pooling_type: int = 1, activation: str | None = None,
                           first_attn_norm: bool = False, head: bool = True, classifier_pooling: int | None = None,
                           types: dict[str, GGMLType] | None = None) -> None:
    """A ``modern-bert`` encoder with random weights: every third layer global (the first
    included), the others sliding over ``n_swa`` positions (0: none) with a RoPE base of their
    own; layer 0 without its attention norm unless ``first_attn_norm``; with ``head``, the rank
    head (dense, its norm, two labels); ``activation`` the file's hidden_activation."""
    arch = "modern-bert"
    w = GGUFWriter(path, arch=arch)
    tensors = _RandomTensors(w, rng, types or {}, {})
    vector, matrix = tensors.vector, tensors.matrix
    w.add("general.name", "tiny-modern-bert")
    metadata: dict[str, object] = {"attention.layer_norm_epsilon": 1e-5, "attention.causal": False}
    if n_swa:
        metadata.update({"attention.sliding_window": n_swa, "rope.freq_base_swa": 160.0})
    if activation is not None:
        metadata["hidden_activation"] = activation
    if classifier_pooling is not None:
        metadata["classifier.pooling_type"] = classifier_pooling
    if head:
        w.add(f"{arch}.classifier.output_labels", ["no", "yes"])
    tensors.header(arch, {"context_length": 256, "embedding_length": n_embd, "block_count": n_layer,
                          "feed_forward_length": n_ff, "attention.head_count": n_head,
                          "attention.head_count_kv": n_head, "pooling_type": pooling_type}, metadata)
    matrix("token_embd.weight", n_embd, N_VOCAB, scale=0.5)
    vector("token_embd_norm.weight", n_embd)
    vector("output_norm.weight", n_embd)
    for il in range(n_layer):
        b = f"blk.{il}"
        if il or first_attn_norm:
            vector(f"{b}.attn_norm.weight", n_embd)
        matrix(f"{b}.attn_qkv.weight", n_embd, 3 * n_embd)
        matrix(f"{b}.attn_output.weight", n_embd, n_embd)
        vector(f"{b}.ffn_norm.weight", n_embd)
        matrix(f"{b}.ffn_up.weight", n_embd, 2 * n_ff, scale=0.2)
        matrix(f"{b}.ffn_down.weight", n_ff, n_embd)
    if head:
        matrix("cls.weight", n_embd, n_embd, scale=0.2)
        vector("cls.norm.weight", n_embd)
        matrix("cls.output.weight", n_embd, 2, scale=0.3)
        vector("cls.output.bias", 2, scale=0.1, center=0.0)
    w.write()


# -- T5 (t5encoder: the encoder alone; t5: encoder and decoder with cross-attention)

def write_tiny_t5(path: Path, rng: np.random.Generator, arch: str = "t5", n_embd: int = 64, n_head: int = 4,
                  n_ff: int = 96, n_layer: int = 2, n_dec_layer: int | None = None, n_buckets: int = 32,
                  gated: bool = True, rel_b_every_layer: bool = False, decoder_start: int = 0,
                  types: dict[str, GGMLType] | None = None) -> None:
    """A ``t5`` or ``t5encoder`` model with random weights: RMS norms, bucket biases in the first
    layer only (or in every layer), F16 as the converter writes them; a GELU-gated feed-forward
    (``gated``, FLAN-T5) or a ReLU one (T5); the decoder's start token ``decoder_start``."""
    w = GGUFWriter(path, arch=arch)
    tensors = _RandomTensors(w, rng, types or {}, {})
    vector, matrix = tensors.vector, tensors.matrix
    w.add("general.name", f"tiny-{arch}")
    keys = {"context_length": 256, "embedding_length": n_embd, "block_count": n_layer, "feed_forward_length": n_ff,
            "attention.head_count": n_head, "attention.head_count_kv": n_head,
            "attention.key_length": n_embd // n_head, "attention.value_length": n_embd // n_head,
            "attention.relative_buckets_count": n_buckets}
    if arch == "t5":
        keys["decoder_start_token_id"] = decoder_start
        if n_dec_layer is not None:
            keys["decoder_block_count"] = n_dec_layer
    tensors.header(arch, keys, {})
    matrix("token_embd.weight", n_embd, N_VOCAB, scale=0.5)
    stacks = [("enc", n_layer, ("attn",))]
    if arch == "t5":
        stacks.append(("dec", n_layer if n_dec_layer is None else n_dec_layer, ("attn", "cross_attn")))
        matrix("output.weight", n_embd, N_VOCAB)
    for prefix, count, parts in stacks:
        vector(f"{prefix}.output_norm.weight", n_embd)
        for il in range(count):
            b = f"{prefix}.blk.{il}"
            for part in parts:
                vector(f"{b}.{part}_norm.weight", n_embd)
                if part == "attn" and (il == 0 or rel_b_every_layer):
                    bias = (rng.standard_normal((n_buckets, n_head))).astype(np.float16)
                    w.add_tensor(f"{b}.{part}_rel_b.weight", bias, GGMLType.F16)
                for proj in ("q", "k", "v", "o"):
                    matrix(f"{b}.{part}_{proj}.weight", n_embd, n_embd, scale=0.15)
            vector(f"{b}.ffn_norm.weight", n_embd)
            if gated:
                matrix(f"{b}.ffn_gate.weight", n_embd, n_ff)
            matrix(f"{b}.ffn_up.weight", n_embd, n_ff)
            matrix(f"{b}.ffn_down.weight", n_ff, n_embd)
    w.write()




@dataclass(frozen=True)
class TinyGemma3n:
    """A Gemma 3n to write (:func:`write_tiny_gemma3n`): Gemma 3n's block (AltUp's 4 streams,
    Laurel of rank 64, per-layer inputs of 256 values: llama.cpp fixes all three) at a small width.
    Layers from the 20th on share the cache of layer 18 or 19 (as llama.cpp fixes it), so the
    sharing needs 21 layers or more; ``swa`` gives each layer's window flag (written as the
    per-layer array), () the default pattern of a global layer every fifth. ``types`` maps a
    matrix kind (``attn_q``, ``laurel_l``, ``altup_proj``) to its type, ``tensor_types`` single
    tensors (default F16)."""

    n_embd: int = 64
    head_dim: int = 32
    n_head: int = 2
    n_head_kv: int = 1
    n_ff: int = 128
    n_layer: int = 3
    n_swa: int = 5
    swa: tuple[bool, ...] = ()
    tied_output: bool = True
    types: dict[str, GGMLType] = field(default_factory=dict)
    tensor_types: dict[str, GGMLType] = field(default_factory=dict)


def write_tiny_gemma3n(spec: TinyGemma3n, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights (norms near 1, matrices N(0, 0.08), the embeddings
    N(0, 0.5), AltUp's projections near the identity so that the streams stay alike)."""
    s, e, hd, n_ple, rank, n_altup = spec, spec.n_embd, spec.head_dim, 256, 64, 4
    w = GGUFWriter(path, arch="gemma3n")
    tensors = _RandomTensors(w, rng, s.types, s.tensor_types)
    vector, matrix = tensors.vector, tensors.matrix
    w.add("general.name", "tiny-gemma3n")
    keys = {"context_length": 256, "embedding_length": e, "block_count": s.n_layer, "feed_forward_length": s.n_ff,
            "attention.head_count": s.n_head, "attention.head_count_kv": s.n_head_kv, "attention.key_length": hd,
            "attention.value_length": hd, "attention.sliding_window": s.n_swa,
            "embedding_length_per_layer_input": n_ple}
    metadata: dict[str, object] = {"rope.freq_base_swa": 1000.0}
    if s.swa:
        metadata["attention.sliding_window_pattern"] = list(s.swa)
    tensors.header("gemma3n", keys, metadata)
    tensors.embeddings(e, tied_output=s.tied_output)
    for name in ("altup_proj.weight", "altup_unembd_proj.weight"):
        t = s.tensor_types.get(name, s.types.get(name.split(".")[0], GGMLType.F16))
        x = (np.eye(e) + 0.08 * rng.standard_normal((n_altup - 1, e, e))).astype(np.float32)
        w.add_tensor(name, quantize_weight(t, x.reshape(-1, e)), t, shape=(e, e, n_altup - 1))
    matrix("per_layer_token_embd.weight", n_ple * s.n_layer, N_VOCAB, scale=0.5)
    matrix("per_layer_model_proj.weight", e, n_ple * s.n_layer, scale=0.5)
    vector("per_layer_proj_norm.weight", n_ple)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        vector(f"{b}.attn_norm.weight", e)
        matrix(f"{b}.attn_q.weight", e, s.n_head * hd)
        matrix(f"{b}.attn_k.weight", e, s.n_head_kv * hd)
        matrix(f"{b}.attn_v.weight", e, s.n_head_kv * hd)
        matrix(f"{b}.attn_output.weight", s.n_head * hd, e)
        vector(f"{b}.attn_q_norm.weight", hd)
        vector(f"{b}.attn_k_norm.weight", hd)
        vector(f"{b}.post_attention_norm.weight", e)
        vector(f"{b}.ffn_norm.weight", e)
        matrix(f"{b}.ffn_gate.weight", e, s.n_ff)
        matrix(f"{b}.ffn_up.weight", e, s.n_ff)
        matrix(f"{b}.ffn_down.weight", s.n_ff, e)
        vector(f"{b}.post_ffw_norm.weight", e)
        matrix(f"{b}.inp_gate.weight", e, n_ple, scale=0.3)
        matrix(f"{b}.proj.weight", n_ple, e, scale=0.3)
        vector(f"{b}.post_norm.weight", e)
        matrix(f"{b}.altup_correct_coef.weight", n_altup, n_altup, scale=0.3)
        vector(f"{b}.altup_correct_scale.weight", e)
        matrix(f"{b}.altup_predict_coef.weight", n_altup, n_altup * n_altup, scale=0.3)
        matrix(f"{b}.altup_router.weight", e, n_altup, scale=0.5)
        vector(f"{b}.altup_router_norm.weight", e)
        matrix(f"{b}.laurel_l.weight", e, rank)
        matrix(f"{b}.laurel_r.weight", rank, e)
        vector(f"{b}.laurel_post_norm.weight", e)
    w.write()


@st.composite
def tiny_gemma3n_models(draw: st.DrawFn) -> TinyGemma3n:
    """Gemma 3n shapes below the shared-cache layers: n_embd 32..160, heads of 8..64, one or two KV
    heads for 1..3 query heads each, 2..4 layers of both window kinds, tied or separate output,
    and every matrix of a type drawn from those whose block fits its rows (AltUp's coefficient
    matrices, rows of 4, only the float types)."""
    n_head_kv, n_layer = draw(st.integers(1, 2)), draw(st.integers(2, 4))
    swa = draw(st.lists(st.booleans(), min_size=n_layer, max_size=n_layer).filter(lambda f: 0 < sum(f) < len(f)))
    spec = TinyGemma3n(n_embd=draw(st.integers(2, 10)) * 16, head_dim=draw(st.sampled_from((8, 16, 32, 64))),
                       n_head=n_head_kv * draw(st.integers(1, 3)), n_head_kv=n_head_kv,
                       n_ff=draw(st.integers(2, 16)) * 16, n_layer=n_layer, n_swa=draw(st.integers(2, 8)),
                       swa=tuple(swa), tied_output=draw(st.booleans()))
    e, hd, rank, n_ple = spec.n_embd, spec.head_dim, 64, 256
    rows = {"token_embd.weight": e, "altup_proj.weight": e, "altup_unembd_proj.weight": e,
            "per_layer_token_embd.weight": n_ple * n_layer, "per_layer_model_proj.weight": e}
    if not spec.tied_output:
        rows["output.weight"] = e
    for il in range(n_layer):
        b = f"blk.{il}"
        rows.update({f"{b}.{k}.weight": e for k in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up", "inp_gate",
                                                     "altup_router", "laurel_l")})
        rows.update({f"{b}.attn_output.weight": spec.n_head * hd, f"{b}.ffn_down.weight": spec.n_ff,
                     f"{b}.proj.weight": n_ple, f"{b}.laurel_r.weight": rank,
                     f"{b}.altup_correct_coef.weight": 4, f"{b}.altup_predict_coef.weight": 4})
    tensor_types = {name: draw(st.sampled_from([t for t in WEIGHT_TYPES if fits(t, n_in)])) for name, n_in in rows.items()}
    return TinyGemma3n(**{**spec.__dict__, "tensor_types": tensor_types})




@dataclass(frozen=True)
class TinyLlama4:
    """A ``llama4`` model to write (:func:`write_tiny_llama4`): experts (``n_expert`` of them,
    ``n_expert_used`` per token, ``n_ff_exp`` wide, beside a shared expert as wide) in every
    ``moe_step``-th layer, dense SwiGLU layers of ``n_ff`` between; heads of ``head_dim`` all
    rotated. ``types`` maps a matrix kind (``attn_q``) to its type (default F16)."""

    n_embd: int = 64
    head_dim: int = 16
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 96
    n_layer: int = 4
    n_expert: int = 4
    n_expert_used: int = 1
    n_ff_exp: int = 32
    moe_step: int = 2
    tied_output: bool = False
    types: dict[str, GGMLType] = field(default_factory=dict)


def write_tiny_llama4(spec: TinyLlama4, path: Path, rng: np.random.Generator) -> None:
    """Write ``spec`` with random weights (norms near 1, matrices N(0, 0.08), routers N(0, 0.5))."""
    s, e = spec, spec.n_embd
    w = GGUFWriter(path, arch="llama4")
    tensors = _RandomTensors(w, rng, s.types, {})
    w.add("general.name", "tiny-llama4")
    tensors.header("llama4", {"context_length": 16384, "embedding_length": e, "block_count": s.n_layer,
                              "feed_forward_length": s.n_ff, "attention.head_count": s.n_head,
                              "attention.head_count_kv": s.n_head_kv, "rope.dimension_count": s.head_dim,
                              "expert_count": s.n_expert, "expert_used_count": s.n_expert_used,
                              "expert_feed_forward_length": s.n_ff_exp, "interleave_moe_layer_step": s.moe_step,
                              "attention.sliding_window": 8192}, {})
    tensors.embeddings(e, tied_output=s.tied_output)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        tensors.vector(f"{b}.attn_norm.weight", e)
        tensors.matrix(f"{b}.attn_q.weight", e, s.n_head * s.head_dim)
        tensors.matrix(f"{b}.attn_k.weight", e, s.n_head_kv * s.head_dim)
        tensors.matrix(f"{b}.attn_v.weight", e, s.n_head_kv * s.head_dim)
        tensors.matrix(f"{b}.attn_output.weight", s.n_head * s.head_dim, e)
        tensors.vector(f"{b}.ffn_norm.weight", e)
        if s.moe_step and (il + 1) % s.moe_step == 0:
            tensors.routed_ffn(b, e, s.n_expert, s.n_ff_exp, s.n_ff_exp, probs_bias=False)
        else:
            tensors.matrix(f"{b}.ffn_gate.weight", e, s.n_ff)
            tensors.matrix(f"{b}.ffn_up.weight", e, s.n_ff)
            tensors.matrix(f"{b}.ffn_down.weight", s.n_ff, e)
    w.write()


if __name__ == "__main__":
    # python tests/tiny_models.py OUT.gguf: write the MoE benchmark's model;
    # python tests/tiny_models.py OUT.gguf TYPE: the per-type benchmark's model in TYPE (IQ2_XXS, ...)
    import sys

    spec = type_bench_model(GGMLType[sys.argv[2]]) if len(sys.argv) > 2 else mixtral_bench_model()
    write_tiny_model(spec, Path(sys.argv[1]), np.random.default_rng(0))
