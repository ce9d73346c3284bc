"""The exceptions gguflm raises; every one derives from :class:`Error`."""


class Error(Exception):
    """Base class of every gguflm error."""


class GGUFError(Error):
    """A GGUF file is malformed, truncated or uses something this reader does not know."""


class ModelLoadError(Error):
    """A model could not be built from a GGUF file."""


class LoadCancelled(ModelLoadError):
    """The progress callback returned False; everything opened for the load was released."""


class VocabError(ModelLoadError):
    """A GGUF file's tokenizer metadata is missing, malformed or names a tokenizer gguflm lacks."""


class TokenizeError(Error, ValueError):
    """Text the vocabulary cannot tokenize: a str with a lone surrogate (no UTF-8 form), bytes
    decoding past U+10FFFF (llama.cpp aborts), a byte or word the vocabulary has no token for."""


class QuantizeError(Error):
    """A model cannot be quantized as asked: an input type llama.cpp's quantizer refuses too,
    requantizing without permission, a very low-bit type without importance data."""


class EncoderError(Error):
    """An encoder-decoder model decoded before anything was encoded (its cross-attention needs
    the encoder's output), or an encode asked of a model without an encoder."""


class StateError(Error):
    """A saved context state is malformed or does not fit this context."""


class SpeculationError(Error):
    """A draft model that cannot draft for the target (its vocabulary differs), or bad
    speculative-decoding settings."""


class VocabOnlyError(Error):
    """What was asked needs the forward pass (architecture, hyper-parameters, tensors, a Context),
    and the model was loaded with ``vocab_only=True``."""


class BufferOverrunError(Error):
    """Guard mode (``GGUFLM_GUARD=1``) found bytes written outside the buffers a kernel was given:
    a bug in gguflm, never in the input. ``zone`` is the damaged guard zone's index."""

    def __init__(self, message: str, zone: int):
        super().__init__(message)
        self.zone = zone


class ModelSourceError(Error):
    """A model file named by a path or URI cannot be read on this node (gguflm.ray fetches
    remote ones into a per-node cache)."""
