"""GPT-NeoX (Pythia, RedPajama-INCITE): GPT-2's block with split-half RoPE (often partial) instead
of position embeddings, an output projection of its own, and with ``use_parallel_residual`` the
feed-forward beside attention on the same residual."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.gpt2 import GPT2


class GPTNeoX(GPT2):
    name = "gptneox"
    rope_type = RopeType.NEOX
    required_output = True
    position_embeddings = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        return hp.with_changes(use_par_res=kv.get_bool("{arch}.use_parallel_residual"))
