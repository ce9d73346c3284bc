"""What the hybrid Mamba + attention architectures share (granitehybrid, falcon-h1, nemotron_h,
jamba): their hyper-parameters, read as llama.cpp reads them (the common keys with layers that
may have no attention heads, the ``ssm.*`` keys; a layer without KV heads keeps a recurrent
state), and the checks that the layer layout adds up. Their memory is a
:class:`gguflm.memory_hybrid.HybridMemory`."""

from __future__ import annotations

from collections.abc import Iterable

from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, read_common_hparams
from gguflm.models.mamba import Mamba
from gguflm.models.mamba2 import Mamba2


def read_hybrid_hparams(kv: HParamReader, n_vocab: int, rope_type: RopeType, *, mamba2: bool = True) -> HParams:
    """The common keys (``head_count_kv`` 0 marks a layer without attention) and the Mamba
    block's ``ssm.*`` keys (Mamba-2's group count with ``mamba2``) in ``extras``; the layers
    without KV heads are the recurrent ones (llama.cpp's ``is_recr_impl[il] = n_head_kv(il) == 0``;
    architectures narrow it further)."""
    hp = read_common_hparams(kv, n_vocab, rope_type, headless_layers=True)
    ssm = Mamba.read_ssm_keys(kv)
    if mamba2:
        ssm = Mamba2.read_ssm2_keys(kv, ssm)
    return hp.with_changes(extras=ssm, recurrent_layers=tuple(n == 0 for n in hp.n_head_kv))


def require_attention(kv: HParamReader, hp: HParams, layers: Iterable[int]) -> None:
    """The attention layers need KV heads and head sizes (read from layer 0's heads)."""
    for il in layers:
        if hp.n_head[il] <= 0 or hp.n_head_kv[il] <= 0 or hp.n_embd_head_k <= 0 or hp.n_embd_head_v <= 0:
            raise HParamError(f"{kv.source}: layer {il} attends but has {hp.n_head[il]} heads, {hp.n_head_kv[il]} "
                              f"KV heads of size {hp.n_embd_head_k} (head sizes come from layer 0's heads): "
                              f"the layer layout does not add up")
