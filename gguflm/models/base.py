"""What every architecture module defines, and the registry they join."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams, RopeType, read_common_hparams, require_heads_span_embd

REGISTRY: dict[str, type[Architecture]] = {}


class UnknownArchitectureError(ModelLoadError):
    """``general.architecture`` names an architecture gguflm does not implement."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor an architecture asks for.

    ``shape`` is in ggml order (row length first). An ``optional`` tensor may be absent; then, if
    ``fallback`` names another tensor, that one is used in its place (llama.cpp's
    TENSOR_DUPLICATED, e.g. ``output.weight`` → ``token_embd.weight``). A spec with ``in_file``
    False is never read from the file: its name always means ``fallback`` (Gemma 2's output is its
    token embedding, and llama.cpp refuses a file that has an ``output.weight`` of its own).
    ``alt_shapes`` are other shapes the file may give it (llama.cpp reads some widths from the
    file: jina-bert-v2's up projection may carry the gate). ``field`` is the block attribute the
    tensor fills when an architecture stores it under another role's name (Seed-OSS keeps its FFN
    norm as ``post_attention_norm``, and its graph uses it where Llama's uses ``ffn_norm``).
    """

    name: str
    shape: tuple[int, ...]
    optional: bool = False
    fallback: str | None = None
    in_file: bool = True
    alt_shapes: tuple[tuple[int, ...], ...] = ()
    field: str | None = None


class Architecture:
    """Base of the per-architecture classes in ``gguflm/models/<arch>.py``."""

    name: ClassVar[str]
    rope_type: ClassVar[RopeType] = RopeType.NORM
    # decoders keep K and V in a cache; encoders (llama.cpp gives them no memory) attend within
    # each ubatch, which must then hold the whole batch
    kv_cache: ClassVar[bool] = True
    # the memory a context keeps, as llama.cpp's llama_model_is_recurrent/_is_hybrid tell it:
    # "attention" (a KV cache, or none for an encoder), "recurrent" (a state per sequence) or
    # "hybrid" (both)
    memory: ClassVar[str] = "attention"
    # whether a control vector joins each block's output (llama.cpp's graphs that call build_cvec)
    control_vector: ClassVar[bool] = True
    # whether the model has an encoder that Context.encode runs (llama_model_has_encoder) and a
    # decoder that Context.decode runs (llama_model_has_decoder)
    has_encoder: ClassVar[bool] = False
    has_decoder: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            REGISTRY[cls.name] = cls

    # -- hyper-parameters

    # checks of the common keys that llama.cpp's graph or loader makes for some architectures:
    # Q and the attention output declared n_embd x n_embd, so n_head * head_dim must be n_embd
    heads_span_embd: ClassVar[bool] = False
    # LayerNorm models: attention.layer_norm_epsilon is a required key
    requires_layer_norm_eps: ClassVar[bool] = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        """The common keys; architectures override to add their own."""
        return cls.read_common(kv, n_vocab)

    @classmethod
    def read_common(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = read_common_hparams(kv, n_vocab, cls.rope_type)
        if cls.heads_span_embd:
            require_heads_span_embd(kv, hp)
        if cls.requires_layer_norm_eps:
            kv.get_float("{arch}.attention.layer_norm_epsilon")
        return hp

    @classmethod
    def state_sizes(cls, hp: HParams) -> tuple[int, int]:
        """A recurrent model's floats per sequence and layer: its conv state and its SSM state
        (llama.cpp's n_embd_r and n_embd_s)."""
        raise NotImplementedError

    @classmethod
    def recurrent_layers(cls, hp: HParams) -> list[int]:
        """The layers whose state the recurrent memory keeps (llama.cpp's ``filter_recr``): every
        layer of a recurrent model, ``hparams.is_recurrent`` ones of a hybrid, none otherwise."""
        if cls.memory == "recurrent":
            return list(range(hp.n_layer))
        return [il for il in range(hp.n_layer) if hp.is_recurrent(il)] if cls.memory == "hybrid" else []

    @classmethod
    def attention_layers(cls, hp: HParams) -> list[int]:
        """The layers with K and V in the KV cache (llama.cpp's ``filter_attn``): all of an
        attention model (none of an encoder's context has a cache) but those that share an earlier
        layer's (``kv_source``), the non-recurrent ones of a hybrid."""
        if cls.memory == "recurrent":
            return []
        return [il for il in range(hp.n_layer) if not hp.is_recurrent(il) and hp.kv_source(il) == il]

    @classmethod
    def shifts_rope(cls, hp: HParams, il: int) -> bool:
        """Whether llama.cpp's K-shift re-rotates layer ``il``'s cached K rows (its RoPE type and
        rope pattern say so): where the graph rotates them, unless an architecture says otherwise."""
        return hp.has_rope(il)

    @classmethod
    def max_positions(cls, hp: HParams) -> int | None:
        """How many positions the model has embeddings for (absolute positions), or None."""
        return None

    # -- forward pass

    def forward(self, g: Any) -> tuple[Any, Any]:
        """Run the ubatch of ``g`` (a :class:`gguflm.graph.Graph`) through the model; return the
        final hidden states and the logits of its output rows."""
        raise NotImplementedError

    @staticmethod
    def classifier_hidden(g: Any, x: Any) -> Any:
        """The classification head's activation of its dense layer's output (rank pooling):
        tanh, as RoBERTa's head."""
        return g.tanh(x)

    # -- tensors

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        raise NotImplementedError

    @classmethod
    def required_together(cls, hp: HParams, present: set[str]) -> list[str]:
        """Tensors declared optional that the file must have given the ones it has (``present``,
        by name): an architecture whose layers take one of two sets of tensors, as the file
        has them (Jamba's experts or dense feed-forward). The loader names the first missing."""
        return []

    # whether the output projection may have a tensor of its own (else it is the token embedding)
    untied_output: ClassVar[bool] = True
    # whether it must (llama.cpp then refuses a file without one)
    required_output: ClassVar[bool] = False

    @classmethod
    def output_specs(cls, hp: HParams) -> list[TensorSpec]:
        """Token embedding, final norm and output projection (tied to the embedding if absent)."""
        return [
            TensorSpec("token_embd.weight", (hp.n_embd, hp.n_vocab)),
            TensorSpec("output_norm.weight", (hp.n_embd,)),
            TensorSpec("output.weight", (hp.n_embd, hp.n_vocab), optional=not cls.required_output,
                       fallback=None if cls.required_output else "token_embd.weight", in_file=cls.untied_output),
        ]

    @staticmethod
    def attention_specs(hp: HParams, il: int, *, bias: bool | None = False) -> list[TensorSpec]:
        """Q, K, V, output projections of layer ``il``; biases required (True), optional (None)
        or not declared (False)."""
        blk = f"blk.{il}"
        n_q = hp.n_embd_head_k * hp.n_head[il]
        n_v_out = hp.n_embd_head_v * hp.n_head[il]
        specs = [
            TensorSpec(f"{blk}.attn_q.weight", (hp.n_embd, n_q)),
            TensorSpec(f"{blk}.attn_k.weight", (hp.n_embd, hp.n_embd_k_gqa(il))),
            TensorSpec(f"{blk}.attn_v.weight", (hp.n_embd, hp.n_embd_v_gqa(il))),
            TensorSpec(f"{blk}.attn_output.weight", (n_v_out, hp.n_embd)),
        ]
        if bias is not False:
            optional = bias is None
            specs += [
                TensorSpec(f"{blk}.attn_q.bias", (n_q,), optional=optional),
                TensorSpec(f"{blk}.attn_k.bias", (hp.n_embd_k_gqa(il),), optional=optional),
                TensorSpec(f"{blk}.attn_v.bias", (hp.n_embd_v_gqa(il),), optional=optional),
                TensorSpec(f"{blk}.attn_output.bias", (hp.n_embd,), optional=True),
            ]
        return specs

    @classmethod
    def qkv_specs(cls, hp: HParams, il: int, *, optional: bool = False) -> list[TensorSpec]:
        """Q, K, V projections of layer ``il`` and their optional biases, without the output
        projection (architectures that declare that one otherwise); all optional with
        ``optional`` (a fused QKV may stand in for them)."""
        attention = cls.attention_specs(hp, il, bias=None)
        specs = attention[:3] + attention[4:7]
        return [TensorSpec(s.name, s.shape, optional=True) for s in specs] if optional else specs

    @staticmethod
    def norm_specs(name: str, n: int, *, bias: bool = True, optional: bool = False) -> list[TensorSpec]:
        """A norm's ``name.weight`` and (``bias``) ``name.bias``, n values each."""
        specs = [TensorSpec(f"{name}.weight", (n,), optional=optional)]
        if bias:
            specs.append(TensorSpec(f"{name}.bias", (n,), optional=optional))
        return specs

    @staticmethod
    def classifier_specs(hp: HParams, n_hidden: int | None = None, output: bool = True) -> list[TensorSpec]:
        """The optional classification head of rank pooling (``gguflm.pooling``): ``cls``
        (n_embd → ``n_hidden``, default n_embd, then tanh) and, with ``output``, ``cls.output``
        (n_hidden → n_cls_out scores)."""
        n_hidden = hp.n_embd if n_hidden is None else n_hidden
        specs = [TensorSpec("cls.weight", (hp.n_embd, n_hidden), optional=True),
                 TensorSpec("cls.bias", (n_hidden,), optional=True)]
        if output:
            specs += [TensorSpec("cls.output.weight", (n_hidden, hp.n_cls_out), optional=True),
                      TensorSpec("cls.output.bias", (hp.n_cls_out,), optional=True)]
        return specs

    @staticmethod
    def ffn_specs(hp: HParams, il: int, *, biases: bool = False) -> list[TensorSpec]:
        """Gated feed-forward of layer ``il``: gate and up (n_embd → n_ff), down (n_ff → n_embd);
        with ``biases``, each matrix's bias where the file has one."""
        blk = f"blk.{il}"
        specs = [
            TensorSpec(f"{blk}.ffn_gate.weight", (hp.n_embd, hp.n_ff[il])),
            TensorSpec(f"{blk}.ffn_up.weight", (hp.n_embd, hp.n_ff[il])),
            TensorSpec(f"{blk}.ffn_down.weight", (hp.n_ff[il], hp.n_embd)),
        ]
        if biases:
            specs += [TensorSpec(f"{blk}.ffn_gate.bias", (hp.n_ff[il],), optional=True),
                      TensorSpec(f"{blk}.ffn_up.bias", (hp.n_ff[il],), optional=True),
                      TensorSpec(f"{blk}.ffn_down.bias", (hp.n_embd,), optional=True)]
        return specs

    @staticmethod
    def expert_specs(hp: HParams, il: int) -> list[TensorSpec]:
        """The router (n_embd → n_expert) and the experts' gate, up and down matrices of layer
        ``il``, each expert one slice of a 3-D tensor."""
        blk, e, f, n = f"blk.{il}", hp.n_embd, hp.n_ff_exp, hp.n_expert
        return [
            TensorSpec(f"{blk}.ffn_gate_inp.weight", (e, n)),
            TensorSpec(f"{blk}.ffn_gate_exps.weight", (e, f, n)),
            TensorSpec(f"{blk}.ffn_down_exps.weight", (f, e, n)),
            TensorSpec(f"{blk}.ffn_up_exps.weight", (e, f, n)),
        ]

    @staticmethod
    def shared_expert_specs(hp: HParams, il: int, n_ff: int) -> list[TensorSpec]:
        """A shared expert's gated feed-forward (every token runs it) of width ``n_ff``."""
        blk = f"blk.{il}"
        return [
            TensorSpec(f"{blk}.ffn_gate_shexp.weight", (hp.n_embd, n_ff)),
            TensorSpec(f"{blk}.ffn_down_shexp.weight", (n_ff, hp.n_embd)),
            TensorSpec(f"{blk}.ffn_up_shexp.weight", (hp.n_embd, n_ff)),
        ]
