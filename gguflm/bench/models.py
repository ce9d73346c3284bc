"""Random-weight benchmark models of real shapes: ``python -m gguflm.bench.models NAME --out FILE
[--type Q4_K_M]``.

A shape is one entry of :data:`SHAPES`: an architecture and its ``{arch}.*`` hyper-parameters as a
converted file carries them. The tensors to write are the ones the architecture's own class asks
for (``tensor_specs``), so a new shape needs no tensor list of its own; the vocabulary and
tokenizer are copied from a real file (SmolLM2's by default) so that prompts tokenize. Weights
are drawn at scales that keep every activation finite through many layers: matrices N(0, 1/n_in)
(unit-variance outputs from RMS-normed inputs), norms near 1, recurrent decays and time steps as
trained models have them (Mamba's A = -exp(.) with softplus(dt) around 0.01-0.1, the delta-net's
decays and write strengths inside (0, 1)). The file is written in F16 (vectors and convolutions
in F32, as llama.cpp's converter keeps them), then quantized by gguflm's own quantizer
(:func:`gguflm.quantize.quantize`, byte for byte llama-quantize's) to ``--type``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

VOCAB_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"   # in gguflm's models folder ($GGUFLM_MODELS)


def default_vocab() -> Path:
    from gguflm.default_model import models_dir

    return models_dir() / VOCAB_FILE


@dataclass(frozen=True)
class Shape:
    """One benchmark model: ``arch`` and its ``{arch}.*`` keys (ints are written as UINT32,
    floats as FLOAT32, tuples as INT32 arrays); ``tied``: the output projection is the token
    embedding; ``size_label``: ``general.size_label``."""

    arch: str
    keys: Mapping[str, Any]
    size_label: str
    tied: bool = True
    about: str = ""

    def with_keys(self, **keys: Any) -> Shape:
        """The same shape with some keys changed (a scaled-down variant for tests)."""
        return replace(self, keys={**self.keys, **keys})


def _mamba2(n_embd: int, n_layer: int, d_state: int = 128, head_dim: int = 64, n_group: int = 1) -> dict[str, Any]:
    """Mamba-2's keys as convert_hf_to_gguf writes them: d_inner = 2 * n_embd in heads of
    ``head_dim`` (``time_step_rank`` is the number of heads), one conv of 4 taps."""
    d_inner = 2 * n_embd
    return {"context_length": 1048576, "embedding_length": n_embd, "block_count": n_layer,
            "feed_forward_length": 0, "attention.head_count": 0, "attention.layer_norm_rms_epsilon": 1e-5,
            "ssm.conv_kernel": 4, "ssm.inner_size": d_inner, "ssm.state_size": d_state,
            "ssm.time_step_rank": d_inner // head_dim, "ssm.group_count": n_group}


SHAPES: dict[str, Shape] = {
    # between state-spaces' mamba2-370m (1024 x 48) and mamba2-780m (1536 x 48); d_state 128,
    # heads of 64, one group, as both
    "mamba2-0.5b": Shape("mamba2", _mamba2(1280, 48), "0.5B",
                         about="Mamba-2, n_embd 1280, 48 layers, 40 heads of 64, d_state 128"),
    # Qwen3.5-0.8B's text model (its config.json): 24 layers, every 4th full attention (8 query
    # heads of 256, 2 KV heads, a quarter of each rotated, mrope sections 11/11/10, theta 1e7),
    # the others gated delta-nets of 16 key and 16 value heads of 128; its vocabulary of 248320
    # is replaced by the tokenizer file's (SmolLM2: 49152)
    "qwen35-0.8b": Shape("qwen35", {
        "context_length": 262144, "embedding_length": 1024, "block_count": 24, "feed_forward_length": 3584,
        "attention.head_count": 8, "attention.head_count_kv": 2, "attention.key_length": 256,
        "attention.value_length": 256, "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.dimension_count": 64, "rope.dimension_sections": (11, 11, 10, 0), "rope.freq_base": 10000000.0,
        "ssm.conv_kernel": 4, "ssm.inner_size": 2048, "ssm.state_size": 128, "ssm.time_step_rank": 16,
        "ssm.group_count": 16, "full_attention_interval": 4}, "0.8B",
        about="Qwen3.5-0.8B: n_embd 1024, 24 layers (18 gated delta-net, 6 gated attention), n_ff 3584"),
}


# -- the weights

def _uniform(lo: float, hi: float) -> Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]:
    return lambda rng, shape: rng.uniform(lo, hi, shape)


def _normal(std: float, mean: float = 0.0) -> Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]:
    return lambda rng, shape: mean + std * rng.standard_normal(shape, dtype=np.float32)


# by the tensor name's last part (after "blk.N."); the first match wins, matrices otherwise
_INITS: tuple[tuple[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]], ...] = (
    ("ssm_a", lambda rng, shape: -np.exp(rng.uniform(0.0, 2.5, shape))),   # decays: A < 0
    ("ssm_dt.bias", _uniform(-4.5, -2.0)),        # softplus(dt + bias) mostly 0.01-0.1
    ("ssm_d", _normal(0.1, 1.0)),                 # skip connections near 1
    ("ssm_conv1d.weight", _normal(0.3)),
    ("ssm_conv1d.bias", _normal(0.05)),
    ("norm.weight", _normal(0.1, 1.0)),           # every RMS norm's weight near 1
    ("token_embd.weight", _normal(0.5)),
)


def _init_of(name: str) -> Callable[[np.random.Generator, tuple[int, ...]], np.ndarray] | None:
    return next((init for suffix, init in _INITS if name.endswith(suffix)), None)


def _is_matrix(name: str, shape: tuple[int, ...]) -> bool:
    """A projection stored in F16 (and quantized); vectors, per-head tables and convolutions
    stay F32, as llama.cpp's converter and quantizer keep them."""
    return len(shape) >= 2 and min(shape[:2]) > 1 and "conv1d" not in name


def _tensor_data(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Tensor ``name`` of ggml shape ``shape`` as a numpy array (rows last)."""
    dims = tuple(reversed(shape))
    init = _init_of(name)
    x = init(rng, dims) if init else rng.standard_normal(dims, dtype=np.float32) / np.float32(math.sqrt(shape[0]))
    return np.ascontiguousarray(x, dtype=np.float16 if _is_matrix(name, shape) else np.float32)


# -- the file

def _architecture(shape: Shape, n_vocab: int) -> tuple[Any, Any]:
    """The architecture class and its hyper-parameters read from ``shape``'s keys."""
    from gguflm.hparams import HParamReader
    from gguflm.models import get_architecture

    arch = get_architecture(shape.arch)
    metadata = {f"{shape.arch}.{k}": v for k, v in shape.keys.items()}
    return arch, arch.read_hparams(HParamReader(shape.arch, metadata, f"<{shape.arch} shape>"), n_vocab)


def tensor_shapes(shape: Shape, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Name -> ggml shape of every tensor the file holds: the architecture's required tensors
    (optional ones left out: a tied output is the embedding)."""
    arch, hp = _architecture(shape, n_vocab)
    return {s.name: tuple(s.shape) for s in arch.tensor_specs(hp)
            if s.in_file and (not s.optional or (s.name == "output.weight" and not shape.tied))}


def n_params(shape: Shape, n_vocab: int) -> int:
    """Weights in the file of ``shape`` with a vocabulary of ``n_vocab``."""
    return sum(math.prod(s) for s in tensor_shapes(shape, n_vocab).values())


def _vocab_keys(vocab_file: Path) -> list[tuple[str, Any, Any, Any]]:
    """The ``tokenizer.*`` entries of ``vocab_file``: (key, value, value type, element type)."""
    from gguflm.gguf import GGUFReader

    with GGUFReader(vocab_file, mode="read") as reader:
        return [(k, reader.metadata[k], reader.value_types[k], reader.array_type(k))
                for k in reader.metadata if k.startswith("tokenizer.")]


def write_f16(shape: Shape, path: Path, *, vocab_file: Path | None = None, seed: int = 0) -> int:
    """Write ``shape`` with random weights in F16 (F32 vectors) to ``path``; returns its number
    of weights. Every tensor draws from its own generator (``seed``, its index), so a tensor's
    values do not depend on the others'."""
    from gguflm.ggml_types import GGMLType
    from gguflm.gguf import GGUFValueType, GGUFWriter

    vocab = _vocab_keys(vocab_file or default_vocab())
    n_vocab = len(next(v for k, v, *_ in vocab if k == "tokenizer.ggml.tokens"))
    w = GGUFWriter(path, arch=shape.arch)
    w.add("general.name", f"gguflm-bench {shape.arch} {shape.size_label}")
    w.add("general.size_label", shape.size_label)
    for key, value in shape.keys.items():
        if isinstance(value, tuple):
            w.add(f"{shape.arch}.{key}", np.array(value, np.int32))
        elif isinstance(value, float):
            w.add(f"{shape.arch}.{key}", value, GGUFValueType.FLOAT32)
        else:
            w.add(f"{shape.arch}.{key}", value, GGUFValueType.UINT32)
    for key, value, vtype, etype in vocab:
        w.add(key, value, vtype, etype)
    shapes = tensor_shapes(shape, n_vocab)
    for index, (name, dims) in enumerate(shapes.items()):
        rng = np.random.default_rng([seed, index])
        w.add_tensor(name, lambda name=name, dims=dims, rng=rng: _tensor_data(name, dims, rng),
                     GGMLType.F16 if _is_matrix(name, dims) else GGMLType.F32, dims)
    w.write()
    return sum(math.prod(s) for s in shapes.values())


def write(shape: Shape, out: Path, file_type: str = "Q4_K_M", *, vocab_file: Path | None = None,
          seed: int = 0, nthread: int | None = None) -> None:
    """Write ``shape`` to ``out`` in ``file_type`` (``F16``: as drawn; else quantized from F16 by
    :func:`gguflm.quantize.quantize`)."""
    from gguflm.quantize import quantize

    if file_type.upper() == "F16":
        write_f16(shape, out, vocab_file=vocab_file, seed=seed)
        return
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".bench-model-") as tmp:
        f16 = Path(tmp) / "f16.gguf"
        write_f16(shape, f16, vocab_file=vocab_file, seed=seed)
        quantize(f16, out, file_type, nthread=nthread)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguflm.bench.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=tuple(SHAPES), help="the shape: " + "; ".join(
        f"{name}: {s.about}" for name, s in SHAPES.items()))
    parser.add_argument("--out", required=True, type=Path, help="GGUF file to write")
    parser.add_argument("--type", default="Q4_K_M", help="F16, or a llama-quantize type (default Q4_K_M)")
    parser.add_argument("--vocab", type=Path, default=None,
                        help=f"GGUF file whose tokenizer to copy (default: {VOCAB_FILE} in the models folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-t", "--threads", type=int, default=None, help="quantizing threads")
    args = parser.parse_args(argv)
    from gguflm.errors import Error

    try:
        write(SHAPES[args.name], args.out, args.type, vocab_file=args.vocab, seed=args.seed, nthread=args.threads)
    except (Error, OSError) as e:
        print(f"gguflm bench models: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
