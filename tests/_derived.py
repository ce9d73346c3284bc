"""Models derived from the real ones, made once and kept beside pytest's temporary directories
(pytest-of-<user>/gguflm-derived, which outlives one run): made again only when missing."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import gguflm.quants as q
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFReader, GGUFWriter

_LAYER = re.compile(r"blk\.(\d+)\.")


def derived_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.getbasetemp().parent / "gguflm-derived"
    folder.mkdir(exist_ok=True)
    return folder


def write_f16(src: Path, dst: Path, n_layers: int | None = None, untie: bool = False,
              n_vocab: int | None = None) -> None:
    """src with every quantized matrix dequantized to F16 (F32 tensors kept), metadata copied.
    ``n_layers`` keeps only the first blocks; ``untie`` adds output.weight, a copy of the token
    embeddings (the output tensor's own type rules then apply); ``n_vocab`` keeps only the first
    rows of the embeddings (a file for the quantizer, which reads no vocabulary, not for running)."""
    tmp = dst.with_suffix(".part")
    with GGUFReader(src) as reader:
        arch = reader.metadata["general.architecture"]
        w = GGUFWriter(tmp)
        for key, value in reader.metadata.items():
            if key == "general.alignment":
                continue
            if key == f"{arch}.block_count" and n_layers is not None:
                value = n_layers
            w.add(key, value, reader.value_types[key], reader.array_type(key))
        w.add("general.file_type", 1, reader.value_types.get("general.file_type"))   # LLAMA_FTYPE_MOSTLY_F16
        for t in reader.tensors:
            layer = _LAYER.match(t.name)
            if n_layers is not None and layer and int(layer[1]) >= n_layers:
                continue
            data, shape = np.array(t.data), t.shape
            if n_vocab is not None and t.name == "token_embd.weight":
                data, shape = data[:n_vocab], (shape[0], n_vocab)
            if t.type == GGMLType.F32:
                w.add_tensor(t.name, data, GGMLType.F32, shape=shape)
            else:
                rows = q.get(t.type).dequantize(data.reshape(-1, data.shape[-1]), shape[0])
                f16 = rows.astype(np.float16).reshape(data.shape[:-1] + (shape[0],))
                w.add_tensor(t.name, f16, GGMLType.F16, shape=shape)
                if untie and t.name == "token_embd.weight":
                    w.add_tensor("output.weight", f16, GGMLType.F16, shape=shape)
        w.write()
    tmp.rename(dst)
