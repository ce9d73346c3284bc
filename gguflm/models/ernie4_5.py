"""ERNIE 4.5 (the dense 0.3B): Llama's block; the file may carry Q/K/V biases, which the graph
adds, and an attention output bias, which llama.cpp's graph reads but never adds."""

from __future__ import annotations

from gguflm.models.llama import Llama


class Ernie4_5(Llama):
    name = "ernie4_5"
    attention_output_bias = False
