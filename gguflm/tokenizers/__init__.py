"""The tokenization algorithms behind :class:`gguflm.vocab.Vocab`, one module each.

``spm`` (``tokenizer.ggml.model`` = ``llama``), ``bpe`` (``gpt2``, ``gemma4``; with the
pre-tokenizer table keyed by ``tokenizer.ggml.pre``), ``wpm`` (``bert``), ``ugm`` (``t5``), ``rwkv``, ``plamo2``, ``hybriddna`` (BPE with DNA k-mers) and ``whitespace`` (BPE between white space). Each ``build_engine``
returns an engine from :mod:`gguflm._ext.tokenize` whose ``encode(text, fragments)`` turns UTF-8
text, already split around special tokens, into token ids exactly as llama.cpp's session does.
"""
