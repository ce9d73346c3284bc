"""``gguflm.quantize`` / ``gguflm quantize`` against llama.cpp's ``llama_model_quantize`` (through
llama-cpp-python): the sha256 of our file equals llama.cpp's for the same parameters.

Models: the F16 SmolLM2 (conftest's ``smollm_f16``, from the Q4_1 file) for the common mixes;
a small F16 SmolLM2 (2 blocks, 2048 embedding rows, an untied output.weight) for the i-quant
mixes, whose ggml quantizers are slow (IQ4_NL, the fallback of 576-wide rows, takes about a
minute for the full model on each side), and for ``--leave-output-tensor`` (the full SmolLM2 ties
its output to the embeddings, so the option changes nothing there); the Gemma Q4_K_M file with
``allow_requantize``.

CI runs a representative subset (about two minutes with the imatrix tests); ``GGUFLM_QUANTIZE_ALL=1``
adds the rest of the issue's list (full-model Q8_0 and Q5_K_S, small-model IQ3_M, Gemma Q8_0,
MoE Q3_K_M and IQ3_XS), each also equal to llama.cpp's when this was written.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

import gguflm
from _llama import require_peer
from gguflm import cli
from gguflm.errors import QuantizeError
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFReader
from gguflm.imatrix import Imatrix, read_imatrix, write_imatrix, write_imatrix_legacy
from gguflm.quantize import QuantizeResult, parse_ftype

pytestmark = pytest.mark.slow  # minutes: still part of the default run (CI runs it)

NTHREAD = 2
ALL = os.environ.get("GGUFLM_QUANTIZE_ALL") == "1"


def _cases(ci: list, more: list) -> list:
    return ci + more if ALL else ci


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _llama_quantize(src: Path, dst: Path, ftype: str, *, imatrix: dict[str, np.ndarray] | None = None,
                    kv_overrides: dict | None = None, **options) -> Path:
    """llama.cpp's quantizer with llama_model_quantize_params set like ours."""
    llama_cpp = require_peer()
    ft, only_copy = parse_ftype(ftype)
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread, p.only_copy = int(ft), NTHREAD, only_copy
    p.allow_requantize = options.pop("allow_requantize", False)
    p.quantize_output_tensor = not options.pop("leave_output_tensor", False)
    p.pure = options.pop("pure", False)
    for key in ("output_tensor_type", "token_embedding_type"):
        if key in options:
            setattr(p, key, int(GGMLType[options.pop(key)]))
    assert not options, options
    keep = []
    if imatrix:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, v) in enumerate(imatrix.items()):
            v = np.ascontiguousarray(v, dtype=np.float32)
            keep.append(v)
            entries[i].name = name.encode()
            entries[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = v.size
        p.imatrix = entries
    if kv_overrides:
        kvo = (llama_cpp.llama_model_kv_override * (len(kv_overrides) + 1))()
        for i, (key, value) in enumerate(kv_overrides.items()):
            kvo[i].key = key.encode()
            if isinstance(value, bool):
                kvo[i].tag, kvo[i].value.val_bool = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL, value
            elif isinstance(value, int):
                kvo[i].tag, kvo[i].value.val_i64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, value
            elif isinstance(value, float):
                kvo[i].tag, kvo[i].value.val_f64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT, value
            else:
                kvo[i].tag, kvo[i].value.val_str = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, value.encode()
        p.kv_overrides = kvo
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) == 0
    return dst


def _assert_same(src: Path, tmp_path: Path, ftype: str, **options) -> QuantizeResult:
    theirs = _llama_quantize(src, tmp_path / "theirs.gguf", ftype, **options)
    result = gguflm.quantize(src, tmp_path / "ours.gguf", ftype, nthread=NTHREAD, **options)
    assert result.paths == [tmp_path / "ours.gguf"]
    assert _sha(tmp_path / "ours.gguf") == _sha(theirs), _first_difference(tmp_path / "ours.gguf", theirs)
    return result


def _first_difference(ours: Path, theirs: Path) -> str:
    """Which tensor or metadata differs, for the failure message."""
    with GGUFReader(ours) as a, GGUFReader(theirs) as b:
        if list(a.metadata) != list(b.metadata):
            return f"metadata keys {list(a.metadata)} vs {list(b.metadata)}"
        for x, y in zip(a.tensors, b.tensors):
            if (x.name, x.type, x.shape) != (y.name, y.type, y.shape):
                return f"tensor {x.name} {x.type.name} {x.shape} vs {y.name} {y.type.name} {y.shape}"
            if not np.array_equal(np.asarray(x.data).view(np.uint8), np.asarray(y.data).view(np.uint8)):
                return f"bytes of {x.name} ({x.type.name})"
    return "same tensors; header or padding differs"


def _synthetic_importance(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Positive importance weights for every matrix (what an imatrix file normalizes to)."""
    rng = np.random.default_rng(seed)
    with GGUFReader(path) as r:
        return {t.name: rng.uniform(0.1, 4.0, t.shape[0]).astype(np.float32)
                for t in r.tensors if len(t.shape) >= 2 and t.name.startswith("blk.")}


@pytest.mark.parametrize("ftype", _cases(["Q4_K_M", "Q6_K", "Q2_K"], ["Q8_0", "Q5_K_S"]))
def test_smollm_f16_is_llama_cpp_byte_for_byte(smollm_f16, tmp_path, ftype):
    result = _assert_same(smollm_f16, tmp_path, ftype)
    assert result.size_after < result.size_before
    assert result.bpw_before == pytest.approx(16.0, abs=0.01)


@pytest.mark.parametrize("ftype, options", [
    ("IQ4_XS", {}),
    ("Q8_0", {}),
    ("Q5_K_S", {}),
    ("Q4_K_M", {"leave_output_tensor": True}),
    ("Q3_K_S", {"pure": True}),
    ("Q5_K_M", {"output_tensor_type": "Q4_0", "token_embedding_type": "Q8_0"}),
], ids=["IQ4_XS", "Q8_0", "Q5_K_S", "leave-output", "pure", "tensor-types"])
def test_small_smollm_mixes_are_llama_cpp_byte_for_byte(small_f16, tmp_path, ftype, options):
    _assert_same(small_f16, tmp_path, ftype, **options)


@pytest.mark.parametrize("ftype", _cases(["IQ2_M"], ["IQ3_M"]))
def test_imatrix_mixes_are_llama_cpp_byte_for_byte(small_f16, tmp_path, ftype):
    weights = _synthetic_importance(small_f16)
    result = _assert_same(small_f16, tmp_path, ftype, imatrix=weights)
    types = {p.dst_type for p in result.tensors}
    assert GGMLType.IQ3_S in types or GGMLType.IQ2_S in types or GGMLType.IQ4_NL in types


def test_leave_output_tensor_keeps_the_output(small_f16, tmp_path):
    kept = gguflm.quantize(small_f16, tmp_path / "a.gguf", "Q4_K_M", leave_output_tensor=True)
    plain = gguflm.quantize(small_f16, tmp_path / "b.gguf", "Q4_K_M")
    out = {p.name: p.dst_type for p in kept.tensors}["output.weight"]
    assert out == GGMLType.F16
    assert {p.name: p.dst_type for p in plain.tensors}["output.weight"] == GGMLType.Q8_0


@pytest.mark.parametrize("ftype", _cases(["Q4_K_M"], ["Q8_0"]))
def test_gemma_requantized_is_llama_cpp_byte_for_byte(gemma_path, tmp_path, ftype):
    _assert_same(gemma_path, tmp_path, ftype, allow_requantize=True)


def test_requantizing_needs_permission(gemma_path, tmp_path):
    with pytest.raises(QuantizeError, match="requantizing from type"):
        gguflm.quantize(gemma_path, tmp_path / "out.gguf", "Q8_0")
    assert not list(tmp_path.iterdir())


def test_very_low_bit_types_need_an_imatrix(small_f16, tmp_path):
    with pytest.raises(QuantizeError, match="importance matrix"):
        gguflm.quantize(small_f16, tmp_path / "out.gguf", "IQ2_XXS")
    assert not list(tmp_path.iterdir())


def test_unknown_file_type_is_a_clear_error(small_f16, tmp_path):
    with pytest.raises(ValueError, match="unknown file type"):
        gguflm.quantize(small_f16, tmp_path / "out.gguf", "Q9_9")


def test_the_bytes_do_not_depend_on_the_thread_count(small_f16, tmp_path):
    weights = _synthetic_importance(small_f16, seed=1)
    a = gguflm.quantize(small_f16, tmp_path / "1.gguf", "Q4_K_M", imatrix=weights, nthread=1)
    b = gguflm.quantize(small_f16, tmp_path / "3.gguf", "Q4_K_M", imatrix=weights, nthread=3)
    assert _sha(a.paths[0]) == _sha(b.paths[0])


def test_an_interrupted_run_leaves_no_output(small_f16, tmp_path):
    def stop(done, total, name):
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gguflm.quantize(small_f16, tmp_path / "out.gguf", "Q4_K_M", progress=stop)
    assert not list(tmp_path.iterdir())


def test_cli_matches_llama_cpp_and_prints_a_summary(small_f16, tmp_path, capsys):
    theirs = _llama_quantize(small_f16, tmp_path / "theirs.gguf", "Q5_K_M",
                             kv_overrides={"general.name": "renamed", "test.answer": 42})
    rc = cli.main(["quantize", "--override-kv", "general.name=str:renamed",
                   "--override-kv", "test.answer=int:42", str(small_f16),
                   str(tmp_path / "ours.gguf"), "q5_k_m", str(NTHREAD)])
    assert rc == 0
    assert _sha(tmp_path / "ours.gguf") == _sha(theirs)
    out = capsys.readouterr().out
    assert "quant size" in out and "BPW" in out


def test_cli_writes_beside_the_input_without_an_output_name(small_f16, tmp_path):
    src = tmp_path / "model.gguf"
    src.symlink_to(small_f16)
    assert cli.main(["quantize", str(src), "Q8_0", "1"]) == 0
    assert (tmp_path / "ggml-model-Q8_0.gguf").is_file()


def test_cli_errors_are_messages(small_f16, tmp_path, capsys):
    assert cli.main(["quantize", str(small_f16), str(tmp_path / "o.gguf"), "IQ1_S"]) == 1
    assert "importance matrix" in capsys.readouterr().err


# ---- importance matrix files


def _imatrix_of(path: Path, seed: int = 2) -> Imatrix:
    rng = np.random.default_rng(seed)
    im = Imatrix(datasets=["wiki.txt"], chunk_count=3, chunk_size=512)
    with GGUFReader(path) as r:
        for t in r.tensors:
            if len(t.shape) >= 2 and t.name.startswith("blk."):
                im.counts[t.name] = np.array([1536], dtype=np.int64)
                im.sums[t.name] = (rng.uniform(0.1, 4.0, t.shape[0]) * 1536).astype(np.float32)
    return im


def test_gguf_imatrix_file_reads_in_gguf_py(small_f16, tmp_path):
    """Our GGUF imatrix as the gguf package reads it; quantizing with the file equals llama.cpp's
    quantizer given the values llama-quantize's load_imatrix makes of it (sums / counts)."""
    import gguf

    im = _imatrix_of(small_f16)
    path = write_imatrix(tmp_path / "imatrix.gguf", im)
    r = gguf.GGUFReader(path)
    assert r.fields["general.type"].contents() == "imatrix"
    assert r.fields["imatrix.datasets"].contents() == ["wiki.txt"]
    assert r.fields["imatrix.chunk_count"].contents() == 3
    tensors = {t.name: np.array(t.data).reshape(-1) for t in r.tensors}
    assert [t.name for t in r.tensors] == [n + suffix for n in sorted(im.sums)
                                           for suffix in (".in_sum2", ".counts")]
    weights = {}
    for name in im.sums:
        np.testing.assert_array_equal(tensors[name + ".in_sum2"], im.sums[name])
        assert tensors[name + ".counts"].tolist() == [1536.0]
        weights[name] = tensors[name + ".in_sum2"] / np.float32(tensors[name + ".counts"][0])
    theirs = _llama_quantize(small_f16, tmp_path / "theirs.gguf", "Q4_K_S", imatrix=weights)
    gguflm.quantize(small_f16, tmp_path / "ours.gguf", "Q4_K_S", imatrix=path, nthread=NTHREAD)
    assert _sha(tmp_path / "ours.gguf") == _sha(theirs)


def test_legacy_dat_imatrix_round_trips(small_f16, tmp_path):
    im = _imatrix_of(small_f16)
    legacy = read_imatrix(write_imatrix_legacy(tmp_path / "imatrix.dat", im))
    assert legacy.is_legacy and legacy.chunk_count == 3 and legacy.datasets == ["wiki.txt"]
    ours = read_imatrix(write_imatrix(tmp_path / "imatrix.gguf", im)).importance()
    old = legacy.importance()
    assert sorted(old) == sorted(ours)
    for name in ours:   # (s / c) * ncall / ncall: float32 rounding apart
        np.testing.assert_allclose(old[name], ours[name], rtol=1e-6)


def test_cli_imatrix_records_what_llama_quantize_records(small_f16, tmp_path):
    im = _imatrix_of(small_f16)
    path = write_imatrix(tmp_path / "imatrix.gguf", im)
    weights = read_imatrix(path).importance()
    theirs = _llama_quantize(small_f16, tmp_path / "theirs.gguf", "Q4_K_M", imatrix=weights,
                             kv_overrides={"quantize.imatrix.file": str(path),
                                           "quantize.imatrix.dataset": "wiki.txt",
                                           "quantize.imatrix.entries_count": len(weights),
                                           "quantize.imatrix.chunks_count": 3})
    assert cli.main(["quantize", "--imatrix", str(path), str(small_f16), str(tmp_path / "ours.gguf"),
                     "Q4_K_M", str(NTHREAD)]) == 0
    assert _sha(tmp_path / "ours.gguf") == _sha(theirs)


@pytest.fixture
def split_f16(small_f16, tmp_path) -> Path:
    """The small model written in 3 shards (8 tensors each); the first part's path."""
    from gguflm.gguf import GGUFWriter

    with GGUFReader(small_f16) as r:
        w = GGUFWriter(tmp_path / "in" / "model.gguf")
        (tmp_path / "in").mkdir()
        for key, value in r.metadata.items():
            w.add(key, value, r.value_types[key], r.array_type(key))
        for t in r.tensors:
            w.add_tensor(t.name, np.array(t.data).view(np.uint8).reshape(-1), t.type, t.shape)
        paths = w.write(split_max_tensors=8)
    assert len(paths) == 3
    return paths[0]


def test_keep_split_writes_llama_cpp_shards(split_f16, tmp_path):
    llama_cpp = require_peer()
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread, p.keep_split = int(parse_ftype("Q4_K_M")[0]), NTHREAD, True
    assert llama_cpp.llama_model_quantize(str(split_f16).encode(), str(tmp_path / "theirs").encode(),
                                          ctypes.byref(p)) == 0
    result = gguflm.quantize(split_f16, tmp_path / "ours.gguf", "Q4_K_M", keep_split=True, nthread=NTHREAD)
    assert [p.name for p in result.paths] == [f"ours-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for i in (1, 2, 3):
        assert _sha(tmp_path / f"ours-0000{i}-of-00003.gguf") == _sha(tmp_path / f"theirs-0000{i}-of-00003.gguf")


def test_a_split_input_quantizes_into_one_file(split_f16, tmp_path):
    _assert_same(split_f16, tmp_path, "Q4_K_M")


def test_copy_keeps_every_tensor(small_f16, tmp_path):
    result = _assert_same(small_f16, tmp_path, "COPY")
    assert all(p.dst_type == p.src_type for p in result.tensors)


@pytest.fixture(scope="module")
def moe_f16(tmp_path_factory) -> Path:
    """A tiny F16 Mixtral-shaped model (8 experts, 2 used; llama.cpp's 8-expert rules apply),
    untied output, 4 blocks."""
    from tiny_models import TinyModel, write_tiny_model

    path = tmp_path_factory.mktemp("moe") / "moe-f16.gguf"
    spec = TinyModel("llama", n_embd=256, head_dim=64, n_head=4, n_head_kv=1, n_ff=512, n_layer=4,
                     tied_output=False, n_expert=8, n_expert_used=2,
                     types={"ffn_gate_inp": GGMLType.F32})
    write_tiny_model(spec, path, np.random.default_rng(5))
    return path


@pytest.mark.parametrize("ftype", _cases(["Q4_K_M", "MXFP4_MOE", "IQ2_M"], ["Q3_K_M", "IQ3_XS"]))
def test_moe_experts_are_llama_cpp_byte_for_byte(moe_f16, tmp_path, ftype):
    """3-D expert tensors, per-expert importance weights (n_expert rows of n_per_row), the
    8-expert rules (attn_v, attn_k, attn_output), MXFP4 for experts."""
    rng = np.random.default_rng(3)
    with GGUFReader(moe_f16) as r:
        weights = {t.name: rng.uniform(0.1, 4.0, t.shape[0] * (t.shape[2] if len(t.shape) > 2 else 1)).astype(np.float32)
                   for t in r.tensors if len(t.shape) >= 2 and t.name.startswith("blk.")}
    result = _assert_same(moe_f16, tmp_path, ftype, imatrix=weights)
    experts = [p for p in result.tensors if "_exps" in p.name]
    assert experts and all(len(p.shape) == 3 for p in experts)


def test_pruned_layers_are_llama_cpp_byte_for_byte(moe_f16, tmp_path):
    """--prune-layers 1,2 of 4 blocks: blk.3 becomes blk.1, block_count 2 (moved to the end of
    the metadata), importance weights still found under the original names."""
    llama_cpp = require_peer()
    weights = _synthetic_importance(moe_f16, seed=4)
    weights = {n: np.tile(v, 8) if "_exps" in n else v for n, v in weights.items()}
    entries = (llama_cpp.llama_model_imatrix_data * (len(weights) + 1))()
    for i, (name, v) in enumerate(weights.items()):
        entries[i].name, entries[i].size = name.encode(), v.size
        entries[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = int(parse_ftype("Q4_K_M")[0]), NTHREAD
    p.imatrix = entries
    prune = (ctypes.c_int32 * 3)(1, 2, -1)
    p.prune_layers = prune
    assert llama_cpp.llama_model_quantize(str(moe_f16).encode(), str(tmp_path / "theirs.gguf").encode(),
                                          ctypes.byref(p)) == 0
    result = gguflm.quantize(moe_f16, tmp_path / "ours.gguf", "Q4_K_M", imatrix=weights, nthread=NTHREAD,
                             prune_layers=[2, 1])
    assert _sha(result.paths[0]) == _sha(tmp_path / "theirs.gguf"), \
        _first_difference(result.paths[0], tmp_path / "theirs.gguf")
    with GGUFReader(result.paths[0]) as r:
        assert r.metadata["llama.block_count"] == 2 and list(r.metadata)[-1] == "llama.block_count"
        assert {t.name.split(".")[1] for t in r.tensors if t.name.startswith("blk.")} == {"0", "1"}
