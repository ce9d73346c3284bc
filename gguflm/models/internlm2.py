"""InternLM 2: Llama's block (its fused QKV split into Q, K and V by the converter), with an
output projection of its own and heads that span the embedding."""

from __future__ import annotations

from gguflm.models.llama import Llama


class InternLM2(Llama):
    name = "internlm2"
    required_output = True
    heads_span_embd = True
