"""StarCoder (1): GPT-2's graph (llama.cpp's starcoder.cpp builds the same one)."""

from __future__ import annotations

from gguflm.models.gpt2 import GPT2


class StarCoder(GPT2):
    name = "starcoder"
