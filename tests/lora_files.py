"""LoRA adapters and control vectors for tests, written with the ``gguf`` package as llama.cpp's
tools write them.

An adapter (``convert_lora_to_gguf.py``'s layout): ``general.type`` = adapter, ``adapter.type`` =
lora, ``adapter.lora.alpha``, and per adapted matrix ``<name>.lora_a`` (numpy [rank, n_in], ggml
ne [n_in, rank]) and ``<name>.lora_b`` (numpy [n_out, rank]); the token embedding's pair is
flipped, as llama.cpp's ``build_inp_embd`` reads it: ``lora_a`` [n_vocab, rank] (rows looked up by
token), ``lora_b`` [n_embd, rank]. Q8_0 tensors whose rows are no whole number of blocks fall
back to F16, as the converter does.

A control vector (``cvector-generator``'s layout): ``general.architecture`` = controlvector,
``controlvector.model_hint``, ``controlvector.layer_count`` and one F32 ``direction.<layer>`` per
layer from 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import gguf
import numpy as np

from gguflm.gguf import GGUFReader

ATTENTION = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output")
FFN = ("ffn_gate", "ffn_up", "ffn_down")


def model_matrices(model_path: Path) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The architecture and the ggml shapes (ne) of every tensor of a GGUF model (read with
    gguflm's reader: the gguf package's takes half a minute over a 262k-token vocabulary)."""
    with GGUFReader(model_path) as reader:
        return reader.get_str("general.architecture"), {t.name: tuple(t.shape) for t in reader.tensors}


def _tensor(w: gguf.GGUFWriter, name: str, x: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    if qtype == gguf.GGMLQuantizationType.Q8_0 and x.shape[-1] % 32:
        qtype = gguf.GGMLQuantizationType.F16   # the converter's fallback for rows Q8_0 cannot hold
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, x.astype(np.float32))
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, x.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(x.astype(np.float32), qtype), raw_dtype=qtype)


def write_lora(path: Path, model_path: Path, rng: np.random.Generator, *, rank: int = 16,
               alpha: float = 32.0, kinds: Iterable[str] = ATTENTION + FFN, layers: Iterable[int] | None = None,
               qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F16, embeddings: bool = False,
               output: bool = False, strength: float = 1.0, arch: str | None = None,
               shapes: dict[str, tuple[int, int]] | None = None, extra: Iterable[str] = ()) -> Path:
    """A LoRA adapter for the model at ``model_path``: a pair for ``blk.<il>.<kind>.weight`` of
    every kind in ``kinds`` and layer in ``layers`` (all) that the model has, the token embedding's
    with ``embeddings``, ``output.weight``'s with ``output``. ``strength`` scales B (the size of
    the change); ``arch`` writes another architecture, ``shapes`` overrides the numpy shapes of
    named tensors (``"blk.0.attn_q.weight.lora_a": (16, 7)``) and ``extra`` adds tensors of these
    names: bad adapters."""
    model_arch, tensors = model_matrices(model_path)
    w = gguf.GGUFWriter(path, arch or model_arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    n_layer = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("blk."))
    names = [f"blk.{il}.{kind}.weight" for il in (range(n_layer) if layers is None else layers) for kind in kinds]
    names += ["output.weight"] * output
    pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in names:
        if name not in tensors:
            continue
        n_in, n_out = tensors[name][:2]
        a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
        b = strength * 0.02 * rng.standard_normal((n_out, rank))
        pairs[name] = (a, b)
    if embeddings:
        n_embd, n_vocab = tensors["token_embd.weight"][:2]
        pairs["token_embd.weight"] = (rng.standard_normal((n_vocab, rank)),
                                      strength * 0.02 * rng.standard_normal((n_embd, rank)))
    for name, (a, b) in pairs.items():
        for suffix, x in ((".lora_a", a), (".lora_b", b)):
            full = name + suffix
            if shapes and full in shapes:
                x = rng.standard_normal(shapes[full])
            _tensor(w, full, x, qtype)
    for name in extra:
        _tensor(w, name, rng.standard_normal((rank, 32)), gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_control_vector(path: Path, n_embd: int, layers: Iterable[int], rng: np.random.Generator,
                         size: float = 1.0, model_hint: str = "llama") -> Path:
    """A control vector with a random direction of norm about ``size`` for each of ``layers``."""
    w = gguf.GGUFWriter(path, "controlvector")
    w.add_string("controlvector.model_hint", model_hint)
    layers = list(layers)
    w.add_int32("controlvector.layer_count", len(layers))
    for il in layers:
        w.add_tensor(f"direction.{il}", (size * rng.standard_normal(n_embd) / np.sqrt(n_embd)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
