"""Hyper-parameters: the numbers that fix a model's shapes and numerics (llama.cpp's llama_hparams).

Every architecture reads them from ``{arch}.*`` metadata keys through :class:`HParamReader`, which
resolves key templates and scalar-or-per-layer arrays, then adds its own extras.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import numpy as np

from gguflm.errors import ModelLoadError


class RopeType(Enum):
    """How RoPE pairs dimensions: ``NORM`` adjacent (2i, 2i+1), ``NEOX`` split halves (i, i+d/2)."""

    NONE = "none"
    NORM = "norm"
    NEOX = "neox"


class MissingKeyError(ModelLoadError):
    """A required metadata key is absent."""


class HParamError(ModelLoadError):
    """A metadata value has the wrong type or an impossible value."""


@dataclass(frozen=True)
class HParams:
    """What llama.cpp's ``llama_hparams`` holds for the architectures we run."""

    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: tuple[int, ...]          # per layer
    n_head: tuple[int, ...]        # per layer
    n_head_kv: tuple[int, ...]     # per layer
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int
    f_norm_rms_eps: float
    n_embd_head_k_swa: int = 0                       # sliding layers' K, V head sizes and rotated
    n_embd_head_v_swa: int = 0                       #   dimensions where they differ (Gemma 4);
    n_rot_swa: int = 0                               #   0 = the global layers' ones
    rope_freqs_swa: bool = True                      # whether sliding layers take rope_freqs too (not Gemma 4's)
    n_layer_kv_from_start: int = -1                  # KV sharing (Gemma 4): the layers from this one on keep no
                                                     #   K and V of their own (kv_source); -1 = none
    f_norm_eps: float = 0.0
    rope_type: RopeType = RopeType.NORM
    rope_freq_base_train: float = 10000.0
    rope_freq_scale_train: float = 1.0
    rope_freq_base_train_swa: float = 10000.0
    rope_freq_scale_train_swa: float = 1.0
    rope_scaling_type: str = "none"
    n_ctx_orig_yarn: int = 0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    rope_yarn_log_mul: float = 0.0                   # rope.scaling.yarn_log_multiplier
    rope_yarn_mscale: float = 1.0                    # YaRN's mscale beside the log multiplier (DeepSeek-V2: it)
    n_swa: int = 0                                   # sliding window, 0 = none
    swa_layers: tuple[bool, ...] = ()                # per layer: uses the sliding window
    swa_symmetric: bool = False                      # the window reaches n_swa / 2 positions both ways
    swa_chunked: bool = False                        # the window is the token's chunk of n_swa positions
                                                     #   (llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC)
    no_rope_layers: tuple[bool, ...] = ()            # per layer: skips RoPE (SmolLM 3), () = none does
    f_attention_scale: float = 0.0                   # 0 = 1/sqrt(n_embd_head_k)
    f_attn_logit_softcapping: float = 0.0            # 0 = none
    f_final_logit_softcapping: float = 0.0           # 0 = none
    f_embedding_scale: float = 0.0                   # 0 = none
    f_max_alibi_bias: float = 0.0                    # ALiBi's maximum bias, 0 = none
    f_clamp_kqv: float = 0.0                         # Q, K, V clamped to [-c, c] (attention.clamp_kqv), 0 = none
    f_attn_temp_scale: float = 0.0                   # queries scaled by position (attention.temperature_scale), 0 = none
    f_attn_temp_offset: float = 0.0                  # ... log(floor((pos + offset) / floor_scale) + 1) * scale + 1
    n_attn_temp_floor_scale: int = 0
    causal_attn: bool = True
    pooling_type: int = -1                           # {arch}.pooling_type, -1 = unspecified
    pooling_type_cls: int = -1                       # rank pooling's pooling before the head, -1 = first token
    n_cls_out: int = 1                               # classifier outputs (rank pooling)
    n_expert: int = 0                                # mixture of experts: experts per layer, 0 = dense
    n_expert_used: int = 0                           # experts each token is routed to
    n_ff_exp: int = 0                                # an expert's feed-forward width
    n_ff_shexp: int = 0                              # the shared expert's width, 0 = none
    n_layer_dense_lead: int = 0                      # leading layers with a dense feed-forward instead
    expert_gating_func: int = 0                      # llama_expert_gating_func_type from the file, 0 = none read
    expert_weights_norm: bool = False                # selected weights divided by their sum (where read)
    expert_weights_scale: float = 0.0                # selected weights multiplied by it, 0 = none
    n_expert_groups: int = 0                         # > 1: experts in equal groups, routing limited to
    n_group_used: int = 0                            #   the n_group_used best groups (DeepSeek V3)
    n_layer_nextn: int = 0                           # NextN (MTP) blocks after the n_layer ones: never run
    n_lora_q: int = 0                                # multi-head latent attention: Q's low rank (0: none)
    n_lora_kv: int = 0                               #   the latent K/V rank (0: no MLA-style attention)
    n_embd_head_k_mla: int = 0                       #   a head's K and V widths once decompressed; 0:
    n_embd_head_v_mla: int = 0                       #   the cache holds full heads (no absorbed form)
    f_residual_scale: float = 0.0                    # Granite: branch outputs' scale, 0 = none
    f_logit_scale: float = 0.0                       # logits multiplied by it (Command R; Granite's 1 / scale), 0 = none
    use_par_res: bool = False                        # attention and feed-forward side by side on the residual (GPT-NeoX)
    recurrent_layers: tuple[bool, ...] = ()          # per layer: keeps a recurrent state (llama.cpp's is_recr), () = none does
    extras: Mapping[str, Any] = field(default_factory=dict)

    def n_gqa(self, il: int = 0) -> int:
        return self.n_head[il] // self.n_head_kv[il] if self.n_head_kv[il] else 0   # 0: no attention (Mamba)

    def n_embd_k_gqa(self, il: int = 0) -> int:
        return self.head_k(il) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int = 0) -> int:
        return self.head_v(il) * self.n_head_kv[il]

    def head_k(self, il: int) -> int:
        """Layer ``il``'s K head size (llama.cpp's n_embd_head_k(il))."""
        return self.n_embd_head_k_swa if self.n_embd_head_k_swa and self.is_swa(il) else self.n_embd_head_k

    def head_v(self, il: int) -> int:
        return self.n_embd_head_v_swa if self.n_embd_head_v_swa and self.is_swa(il) else self.n_embd_head_v

    def kv_source(self, il: int) -> int:
        """The layer whose cached K and V layer ``il`` attends over: itself, or with KV sharing the
        last layer of its kind (sliding or global) that keeps its own (llama.cpp's reuse callback)."""
        if 0 <= self.n_layer_kv_from_start <= il:
            return self.n_layer_kv_from_start - (2 if self.is_swa(il) else 1)
        return il

    def rot(self, il: int) -> int:
        """Layer ``il``'s rotated dimensions (llama.cpp's n_rot(il))."""
        return self.n_rot_swa if self.n_rot_swa and self.is_swa(il) else self.n_rot

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention in its absorbed form (llama.cpp's is_mla): the cache holds one
        latent row per token ([latent, rotated part] as K) whose first n_embd_head_v values are V."""
        return bool(self.n_embd_head_k_mla and self.n_embd_head_v_mla)

    @property
    def k_rope_offset(self) -> int:
        """Where RoPE's part of a K head starts: at its end with a low-rank K/V (llama.cpp's
        n_embd_nope in the K-shift), else at its start."""
        return self.n_embd_head_k - self.n_rot if self.n_lora_kv else 0

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def is_recurrent(self, il: int) -> bool:
        """Whether layer ``il`` keeps a recurrent state (llama.cpp's ``hparams.is_recr(il)``)."""
        return bool(self.recurrent_layers) and self.recurrent_layers[il]

    def has_rope(self, il: int) -> bool:
        return self.rope_type is not RopeType.NONE and not (self.no_rope_layers and self.no_rope_layers[il])

    @property
    def kq_scale(self) -> float:
        """Scale of K·Q before softmax."""
        return self.f_attention_scale or rsqrt_f32(self.n_embd_head_k)

    def with_changes(self, **changes: Any) -> HParams:
        return replace(self, **changes)

    def describe(self) -> list[tuple[str, str]]:
        """(name, value) pairs in the order llama.cpp's ``print_info`` logs them."""

        def per_layer(values: Sequence[int]) -> str:
            return str(values[0]) if len(set(values)) == 1 else str(list(values))

        rows = [
            ("arch", self.arch),
            ("n_vocab", str(self.n_vocab)),
            ("n_ctx_train", str(self.n_ctx_train)),
            ("n_embd", str(self.n_embd)),
            ("n_layer", str(self.n_layer)),
            ("n_head", per_layer(self.n_head)),
            ("n_head_kv", per_layer(self.n_head_kv)),
            ("n_rot", str(self.n_rot)),
            ("n_swa", str(self.n_swa)),
            ("is_swa_any", str(int(any(self.swa_layers)))),
            ("n_embd_head_k", str(self.n_embd_head_k)),
            ("n_embd_head_v", str(self.n_embd_head_v)),
            ("n_gqa", per_layer([self.n_gqa(il) for il in range(self.n_layer)])),
            ("f_norm_eps", f"{self.f_norm_eps:.1e}"),
            ("f_norm_rms_eps", f"{self.f_norm_rms_eps:.1e}"),
            ("f_clamp_kqv", f"{self.f_clamp_kqv:.1e}"),
            ("f_max_alibi_bias", f"{self.f_max_alibi_bias:.1e}"),
            ("f_attn_logit_softcapping", f"{self.f_attn_logit_softcapping:.1f}"),
            ("f_final_logit_softcapping", f"{self.f_final_logit_softcapping:.1f}"),
            ("f_attention_scale", f"{self.kq_scale:.6f}"),
            ("n_ff", per_layer(self.n_ff)),
            ("causal attn", str(int(self.causal_attn))),
            ("pooling type", str(self.pooling_type)),
            ("rope type", self.rope_type.value),
            ("rope scaling", self.rope_scaling_type),
            ("freq_base_train", f"{self.rope_freq_base_train:.1f}"),
            ("freq_scale_train", f"{self.rope_freq_scale_train:g}"),
        ]
        if any(self.swa_layers):
            rows.append(("freq_base_swa", f"{self.rope_freq_base_train_swa:.1f}"))
        rows.append(("n_ctx_orig_yarn", str(self.n_ctx_orig_yarn)))
        if self.n_expert:
            rows += [("n_expert", str(self.n_expert)), ("n_expert_used", str(self.n_expert_used)),
                     ("n_ff_exp", str(self.n_ff_exp))]
            if self.n_ff_shexp:
                rows.append(("n_ff_shexp", str(self.n_ff_shexp)))
        return rows


class HParamReader:
    """Typed access to ``{arch}.*`` metadata keys, with llama.cpp's scalar-or-array convention."""

    def __init__(self, arch: str, metadata: Mapping[str, Any], source: str):
        self.arch = arch
        self.metadata = metadata
        self.source = source  # file name, for messages

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def _missing(self, key: str) -> MissingKeyError:
        return MissingKeyError(f"{self.source}: key not found in model: {key}")

    def _raw(self, template: str, default: Any) -> Any:
        key = self.key(template)
        if key in self.metadata:
            return self.metadata[key]
        if default is _REQUIRED:
            raise self._missing(key)
        return default

    def get_int(self, template: str, default: Any = None) -> Any:
        value = self._raw(template, _REQUIRED if default is None else default)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise HParamError(f"{self.source}: {self.key(template)} should be an integer, "
                              f"found {type(value).__name__} {value!r}")
        return int(value)

    def get_float(self, template: str, default: Any = None) -> Any:
        value = self._raw(template, _REQUIRED if default is None else default)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise HParamError(f"{self.source}: {self.key(template)} should be a number, "
                              f"found {type(value).__name__} {value!r}")
        return float(value)

    def get_bool(self, template: str, default: Any = None) -> Any:
        value = self._raw(template, _REQUIRED if default is None else default)
        if not isinstance(value, (bool, np.bool_)):
            raise HParamError(f"{self.source}: {self.key(template)} should be a bool, found {value!r}")
        return bool(value)

    def get_str(self, template: str, default: Any = None) -> Any:
        value = self._raw(template, _REQUIRED if default is None else default)
        if not isinstance(value, str):
            raise HParamError(f"{self.source}: {self.key(template)} should be a string, found {value!r}")
        return value

    def get_ints(self, template: str, default: Any = None) -> tuple[int, ...]:
        """An array of integers (or bools, as 0 and 1)."""
        value = self._raw(template, _REQUIRED if default is None else default)
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise HParamError(f"{self.source}: {self.key(template)} should be an array of integers, found {value!r}")
        return tuple(int(v) for v in np.asarray(value).reshape(-1))

    def per_layer(self, template: str, n_layer: int, default: Any = None) -> tuple[int, ...]:
        """A value that is one integer for all layers or an array with one per layer."""
        value = self._raw(template, _REQUIRED if default is None else default)
        if isinstance(value, (list, tuple, np.ndarray)):
            values = [int(v) for v in np.asarray(value).reshape(-1)]
            if len(values) != n_layer:
                raise HParamError(f"{self.source}: {self.key(template)} has {len(values)} values "
                                  f"for {n_layer} layers")
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            values = [int(value)] * n_layer
        else:
            raise HParamError(f"{self.source}: {self.key(template)} should be an integer or an "
                              f"array of integers, found {value!r}")
        return tuple(values)

    def positive(self, name: str, value: int) -> int:
        if value <= 0:
            raise HParamError(f"{self.source}: {name} must be positive, found {value}")
        return value


_REQUIRED: Any = object()


def read_common_hparams(kv: HParamReader, n_vocab: int, rope_type: RopeType, *,
                        headless_layers: bool = False) -> HParams:
    """The keys every transformer architecture shares (llama.cpp's ``load_hparams`` preamble).

    ``headless_layers``: a layer may have no attention (``head_count_kv`` 0, and for some
    architectures ``head_count`` 0 too): hybrid models' recurrent and feed-forward-only layers.
    As llama.cpp, the head sizes then come from layer 0's heads, and are 0 when it has none."""
    n_layer = kv.positive("block_count", kv.get_int("{arch}.block_count"))
    n_embd = kv.positive("embedding_length", kv.get_int("{arch}.embedding_length"))
    n_head = kv.per_layer("{arch}.attention.head_count", n_layer)
    n_head_kv = kv.per_layer("{arch}.attention.head_count_kv", n_layer, default=list(n_head))
    n_ff = kv.per_layer("{arch}.feed_forward_length", n_layer, default=0)
    if any(h < 0 if headless_layers else h <= 0 for h in n_head):
        raise HParamError(f"{kv.source}: attention.head_count must be positive, found {list(n_head)}")
    for il in range(n_layer):
        if headless_layers and n_head_kv[il] == 0:
            continue
        if n_head_kv[il] <= 0 or n_head[il] % n_head_kv[il]:
            raise HParamError(f"{kv.source}: layer {il}: head_count {n_head[il]} is not a multiple "
                              f"of head_count_kv {n_head_kv[il]}")
    if n_head[0] > 0:
        head_default = n_embd // n_head[0] if n_embd % n_head[0] == 0 else 0
        n_embd_head_k = kv.get_int("{arch}.attention.key_length", head_default)
        n_embd_head_v = kv.get_int("{arch}.attention.value_length", head_default)
        kv.positive("attention.key_length", n_embd_head_k)
        kv.positive("attention.value_length", n_embd_head_v)
    else:   # llama.cpp reads no head size when layer 0 has no heads
        n_embd_head_k = n_embd_head_v = 0
    n_rot = kv.get_int("{arch}.rope.dimension_count", n_embd_head_k) if n_head[0] > 0 else 0
    if n_rot > n_embd_head_k or n_rot % 2:
        raise HParamError(f"{kv.source}: rope.dimension_count {n_rot} must be even and at most "
                          f"the head size {n_embd_head_k}")

    rope_scale = kv.get_float("{arch}.rope.scaling.factor", 0.0)
    if rope_scale == 0.0:
        rope_scale = kv.get_float("{arch}.rope.scale_linear", 0.0)
    scaling_type = kv.get_str("{arch}.rope.scaling.type", "linear" if rope_scale else "none")
    n_ctx_train = kv.get_int("{arch}.context_length")
    freq_base = kv.get_float("{arch}.rope.freq_base", 10000.0)
    return HParams(
        arch=kv.arch,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head_k=n_embd_head_k,
        n_embd_head_v=n_embd_head_v,
        n_rot=n_rot,
        f_norm_rms_eps=kv.get_float("{arch}.attention.layer_norm_rms_epsilon", 0.0),
        f_norm_eps=kv.get_float("{arch}.attention.layer_norm_epsilon", 0.0),
        rope_type=rope_type,
        rope_freq_base_train=freq_base,
        rope_freq_scale_train=1.0 / rope_scale if rope_scale else 1.0,
        # sliding-window layers use the global RoPE unless an architecture says otherwise
        rope_freq_base_train_swa=freq_base,
        rope_freq_scale_train_swa=1.0 / rope_scale if rope_scale else 1.0,
        rope_scaling_type=scaling_type,
        n_ctx_orig_yarn=kv.get_int("{arch}.rope.scaling.original_context_length", n_ctx_train),
        yarn_ext_factor=-1.0,
        yarn_attn_factor=kv.get_float("{arch}.rope.scaling.attn_factor", 1.0),
        yarn_beta_fast=kv.get_float("{arch}.rope.scaling.yarn_beta_fast", 32.0),
        yarn_beta_slow=kv.get_float("{arch}.rope.scaling.yarn_beta_slow", 1.0),
        rope_yarn_log_mul=kv.get_float("{arch}.rope.scaling.yarn_log_multiplier", 0.0),
        causal_attn=kv.get_bool("{arch}.attention.causal", True),
        pooling_type=kv.get_int("{arch}.pooling_type", -1),
        pooling_type_cls=kv.get_int("{arch}.classifier.pooling_type", -1),
        n_cls_out=_n_classifier_outputs(kv),
    )


LLAMA_MAX_EXPERTS = 1024


def read_expert_hparams(kv: HParamReader, hp: HParams, *, required: bool = True,
                        n_ff_exp_key: bool = True, shared: bool = False) -> HParams:
    """Mixture-of-experts keys: ``{arch}.expert_count`` and ``expert_used_count`` (validated as
    llama.cpp asserts them), the expert width (``expert_feed_forward_length`` where the
    architecture reads it, else ``n_ff / n_expert_used`` if it does, else ``n_ff``), the shared
    expert's width. Without ``required`` a file may have no experts (dense)."""
    n_expert = kv.get_int("{arch}.expert_count", 0 if not required else None)
    n_used = kv.get_int("{arch}.expert_used_count", 0)
    if not required and n_expert == 0:
        return hp
    if not 0 < n_expert <= LLAMA_MAX_EXPERTS:
        raise HParamError(f"{kv.source}: {kv.key('{arch}.expert_count')} must be 1..{LLAMA_MAX_EXPERTS}, "
                          f"found {n_expert}")
    if not 0 < n_used <= n_expert:
        raise HParamError(f"{kv.source}: {kv.key('{arch}.expert_used_count')} must be 1..{n_expert} "
                          f"(expert_count), found {n_used}")
    if len(set(hp.n_ff)) != 1:
        raise HParamError(f"{kv.source}: per-layer feed_forward_length is not supported with experts")
    n_ff = hp.n_ff[0]
    if n_ff_exp_key:
        n_ff_exp = kv.get_int("{arch}.expert_feed_forward_length", 0) or n_ff // n_used
    else:
        n_ff_exp = n_ff
    kv.positive("expert feed-forward length", n_ff_exp)
    # group-limited routing, as llama.cpp's common loader reads and asserts it
    n_groups = kv.get_int("{arch}.expert_group_count", 0)
    n_group_used = kv.get_int("{arch}.expert_group_used_count", 0)
    if not 0 <= n_groups < n_expert or (n_groups > 1 and (n_expert % n_groups or not 0 < n_group_used < n_groups)):
        raise HParamError(f"{kv.source}: {kv.key('{arch}.expert_group_count')} {n_groups} must divide expert_count "
                          f"{n_expert} into groups, and expert_group_used_count {n_group_used} be 1..groups - 1")
    return hp.with_changes(
        n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp,
        n_ff_shexp=kv.get_int("{arch}.expert_shared_feed_forward_length", 0) if shared else 0,
        n_expert_groups=n_groups, n_group_used=n_group_used)


# llama_expert_gating_func_type values build_moe_ffn runs (llama.cpp aborts on any other)
EXPERT_GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def read_routed_expert_hparams(kv: HParamReader, hp: HParams, *, gating: int | None = None,
                               weights_norm: bool = False) -> HParams:
    """DeepSeek's mixture of experts (dots1, DeepSeek-V2/V3, GLM-4.5, Ling 2): the common expert
    keys, ``expert_feed_forward_length`` wide experts, ``expert_shared_count`` shared experts of that
    width (one feed-forward, no gate), ``leading_dense_block_count`` dense layers first, and the
    routing: ``expert_gating_func`` (one build_moe_ffn runs, or ``gating`` where the file has none), the selected
    weights normalised (``expert_weights_norm``, default ``weights_norm``) and scaled
    (``expert_weights_scale``)."""
    hp = read_expert_hparams(kv, hp)
    n_dense = kv.get_int("{arch}.leading_dense_block_count", 0)
    if not 0 <= n_dense <= hp.n_layer:
        raise HParamError(f"{kv.source}: {kv.key('{arch}.leading_dense_block_count')} must be "
                          f"0..{hp.n_layer} (block_count), found {n_dense}")
    n_ff_exp = kv.positive("expert feed-forward length", kv.get_int("{arch}.expert_feed_forward_length"))
    n_shared = kv.positive("expert_shared_count", kv.get_int("{arch}.expert_shared_count"))
    gating = kv.get_int("{arch}.expert_gating_func", 0 if gating is None else gating)   # 0: none given
    if gating not in EXPERT_GATING:
        raise HParamError(f"{kv.source}: {kv.key('{arch}.expert_gating_func')} must be one of "
                          f"{sorted(EXPERT_GATING)} ({', '.join(EXPERT_GATING.values())}), found {gating}")
    return hp.with_changes(
        n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_exp * n_shared, n_layer_dense_lead=n_dense, expert_gating_func=gating,
        expert_weights_norm=kv.get_bool("{arch}.expert_weights_norm", weights_norm),
        expert_weights_scale=kv.get_float("{arch}.expert_weights_scale", 0.0))


def _n_classifier_outputs(kv: HParamReader) -> int:
    """One score per sequence, or as many as ``{arch}.classifier.output_labels`` names."""
    labels = kv.metadata.get(kv.key("{arch}.classifier.output_labels"))
    return len(labels) if labels is not None and len(labels) else 1


def rsqrt_f32(n: float) -> float:
    """1.0f / sqrtf(n) in float32 arithmetic, as llama.cpp computes attention scales (a double
    1/sqrt rounded to float32 is one ulp off for some n, e.g. 96)."""
    return float(np.float32(1) / np.sqrt(np.float32(n)))


def sqrt_f32(n: float) -> float:
    """sqrtf(n), as llama.cpp computes Gemma's embedding scale."""
    return float(np.sqrt(np.float32(n)))


def require_heads_span_embd(kv: HParamReader, hp: HParams) -> None:
    """Architectures whose Q and attention output llama.cpp declares n_embd x n_embd (Qwen 2,
    Phi 3) reshape those rows into heads: n_head * head_dim must be n_embd in every layer."""
    for il in range(hp.n_layer):
        if hp.n_head[il] * hp.n_embd_head_k != hp.n_embd:
            raise HParamError(f"{kv.source}: layer {il}: {hp.n_head[il]} heads of {hp.n_embd_head_k} "
                              f"(attention.key_length) do not make embedding_length {hp.n_embd}")


def swa_pattern(n_layer: int, period: int, dense_first: bool = False) -> tuple[bool, ...]:
    """llama.cpp's ``set_swa_pattern(period, dense_first)``: every ``period``-th layer is global
    (the last of each period, or with ``dense_first`` the first), the others slide."""
    if dense_first:
        return tuple(il % period != 0 for il in range(n_layer))
    return tuple(il % period < period - 1 for il in range(n_layer))


def read_swa_layers(kv: HParamReader, n_layer: int, period: int, dense_first: bool = False) -> tuple[bool, ...]:
    """llama.cpp's ``load_swa_pattern``: ``attention.sliding_window_pattern`` as one flag per layer,
    or as the period of :func:`swa_pattern` (``period`` where the key is absent)."""
    key = "{arch}.attention.sliding_window_pattern"
    pattern = kv.metadata.get(kv.key(key))
    if not isinstance(pattern, (list, tuple, np.ndarray)):
        return swa_pattern(n_layer, kv.positive("attention.sliding_window_pattern", kv.get_int(key, period)),
                           dense_first)
    swa = tuple(bool(v) for v in pattern)
    if len(swa) != n_layer:
        raise HParamError(f"{kv.source}: sliding_window_pattern has {len(swa)} values for {n_layer} layers")
    return swa


def check_kv_sharing(hp: HParams, source: str) -> None:
    """Each layer that attends over another's cache (:meth:`HParams.kv_source`) needs one of its
    own kind (sliding or global) and number of KV heads: a ``HParamError`` otherwise."""
    for il in range(hp.n_layer):
        src = hp.kv_source(il)
        if hp.is_swa(src) != hp.is_swa(il) or hp.n_head_kv[src] != hp.n_head_kv[il]:
            raise HParamError(f"{source}: layer {il} would share the K and V of layer {src}, which "
                              f"is of another kind or number of KV heads")


def read_interleaved_swa(kv: HParamReader, hp: HParams, period: int, n_swa: int | None = None) -> HParams:
    """Sliding-window layers interleaved with global ones that take no RoPE (EXAONE 4's 32B,
    Cohere 2): the window (``n_swa`` where the key is absent), :func:`read_swa_layers`, and the
    sliding layers' RoPE base (``rope.freq_base_swa``, else the model's) and scale (the model's)."""
    swa = read_swa_layers(kv, hp.n_layer, period)
    return hp.with_changes(
        n_swa=kv.positive("attention.sliding_window", kv.get_int("{arch}.attention.sliding_window", n_swa)),
        swa_layers=swa, no_rope_layers=tuple(not s for s in swa),
        rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa", hp.rope_freq_base_train),
        rope_freq_scale_train_swa=hp.rope_freq_scale_train)


def drop_nextn_layers(kv: HParamReader, hp: HParams) -> HParams:
    """``nextn_predict_layers``: the last blocks of the file are NextN (multi-token prediction)
    blocks, which llama.cpp neither loads nor runs at inference; the model is the blocks before."""
    n_nextn = kv.get_int("{arch}.nextn_predict_layers", 0)
    if not 0 <= n_nextn < hp.n_layer:
        raise HParamError(f"{kv.source}: {kv.key('{arch}.nextn_predict_layers')} must be 0..{hp.n_layer - 1} "
                          f"(block_count - 1), found {n_nextn}")
    n = hp.n_layer - n_nextn
    return hp.with_changes(n_layer=n, n_layer_nextn=n_nextn, n_ff=hp.n_ff[:n], n_head=hp.n_head[:n],
                           n_head_kv=hp.n_head_kv[:n])
