"""llama-cpp-python's tokenizer wrappers (``llama_cpp.llama_tokenizer``): a ``Llama``'s vocabulary
behind ``tokenize``/``detokenize`` (bytes) and ``encode``/``decode`` (str). Defined in
:mod:`gguflm.llama_cpp.llama`, beside the ``Llama`` they wrap and make (``from_ggml_file``)."""

from __future__ import annotations

from gguflm.llama_cpp.llama import BaseLlamaTokenizer, LlamaTokenizer

__all__ = ["BaseLlamaTokenizer", "LlamaTokenizer"]
