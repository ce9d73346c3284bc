"""The GGUF container: read (:class:`GGUFReader`) and write (:class:`GGUFWriter`) GGUF files.

GGUF is llama.cpp's model file: a header, typed key/value metadata, a tensor index, then the
aligned tensor data. A model may be split over ``name-0000i-of-0000n.gguf`` parts.
"""

from gguflm.gguf.constants import GGUFValueType
from gguflm.gguf.reader import GGUFReader, TensorInfo
from gguflm.gguf.writer import GGUFWriter

__all__ = ["GGUFReader", "GGUFValueType", "GGUFWriter", "TensorInfo"]
