"""Model loading: architectures, hyper-parameters, tensors, load modes, progress, failures."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import VOCAB_DIR

from gguflm import Context, LoadCancelled, Model, ModelLoadError, VocabOnlyError
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguflm.hparams import MissingKeyError, HParamError
from gguflm.loader import (InvalidTensorDataError, MissingTensorError, OverrideError,
                           TensorCountError, TensorShapeError, UnsupportedTensorTypeError)
from gguflm.models import UnknownArchitectureError, architectures

ARCH_DIR = Path(__file__).resolve().parent / "data" / "arch"
ARCHS = ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"]


def rewrite(src: Path, dst: Path, *, drop_keys=(), set_keys=None, drop_tensors=(),
            tensor_edits=None, extra_tensors=None) -> Path:
    """Copy a GGUF file with changes: keys dropped or set, tensors dropped, edited or added."""
    with GGUFReader(src) as r:
        w = GGUFWriter(dst, alignment=r.alignment)
        for key, value in r.metadata.items():
            if key in drop_keys:
                continue
            if set_keys and key in set_keys:
                value = set_keys[key]
                w.add(key, value)
            else:
                w.add(key, value, r.value_types[key], r.array_type(key))
        for key, value in (set_keys or {}).items():
            if key not in r.metadata:
                w.add(key, value)
        for t in r.tensors:
            if t.name in drop_tensors:
                continue
            if tensor_edits and t.name in tensor_edits:
                data, ttype, shape = tensor_edits[t.name](t)
                w.add_tensor(t.name, data, ttype, shape)
            else:
                w.add_tensor(t.name, np.array(t.data), t.type, t.shape)
        for name, (data, ttype, shape) in (extra_tensors or {}).items():
            w.add_tensor(name, data, ttype, shape)
        w.write()
    return dst


# -- the real models

def expected_hparams(path: Path) -> dict:
    with GGUFReader(path) as r:
        arch = r.metadata["general.architecture"]
        m = r.metadata
        return {
            "n_ctx_train": m[f"{arch}.context_length"], "n_embd": m[f"{arch}.embedding_length"],
            "n_layer": m[f"{arch}.block_count"], "n_ff": m[f"{arch}.feed_forward_length"],
            "n_head": m[f"{arch}.attention.head_count"], "n_head_kv": m[f"{arch}.attention.head_count_kv"],
            "eps": m[f"{arch}.attention.layer_norm_rms_epsilon"], "base": m[f"{arch}.rope.freq_base"],
            "n_vocab": len(m["tokenizer.ggml.tokens"]), "arch": arch, "file_type": m["general.file_type"],
            "n_params": sum(t.n_elements for t in r.tensors), "nbytes": sum(t.nbytes for t in r.tensors),
        }


def test_real_models_load_with_the_files_hparams(real_model_path):
    want = expected_hparams(real_model_path)
    with Model.load(real_model_path) as model:
        hp = model.hparams
        assert model.arch == want["arch"]
        assert hp.n_ctx_train == want["n_ctx_train"] and hp.n_embd == want["n_embd"]
        assert hp.n_layer == want["n_layer"]
        assert hp.n_ff == (want["n_ff"],) * hp.n_layer
        assert hp.n_head == (want["n_head"],) * hp.n_layer
        assert hp.n_head_kv == (want["n_head_kv"],) * hp.n_layer
        assert hp.f_norm_rms_eps == pytest.approx(want["eps"])
        assert hp.rope_freq_base_train == pytest.approx(want["base"])
        assert hp.n_vocab == model.n_vocab == want["n_vocab"] == model.vocab.n_tokens
        # the output matrix is tied to the embedding in both files: counted once
        assert model.n_params == want["n_params"]
        assert model.size_bytes == want["nbytes"]
        text = model.describe()
        for name, value in hp.describe():
            assert f"{name}" in text and value in text
        assert "BPW" in text and model.file_type in text


def test_gemma3_specifics(gemma_path):
    with Model.load(gemma_path) as model:
        hp = model.hparams
        assert model.file_type == "Q4_K - Medium"
        assert hp.n_embd_head_k == 256 and hp.n_swa == 512
        assert [il for il in range(hp.n_layer) if not hp.is_swa(il)] == [5, 11, 17]
        assert hp.rope_freq_base_train == 1e6 and hp.rope_freq_base_train_swa == 10000.0
        assert hp.kq_scale == pytest.approx(1 / 16)
        assert model.tensors["output.weight"] is model.tensors["token_embd.weight"]
        assert model.layers[3].attn_q_norm.shape == (256,)


def test_smollm_specifics(smollm_path):
    with Model.load(smollm_path) as model:
        assert model.file_type == "Q4_1"
        assert model.hparams.n_rot == 64 and not any(model.hparams.swa_layers)
        assert model.layers[0].attn_q.type is GGMLType.Q4_1


def _mapped_rss_bytes(path) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:   # a mapping's header line
                inside = fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def test_mmap_load_reads_no_weights(gemma_path):
    """Only the header's pages of the mapped file become resident (the vocabulary's tables the
    load builds count elsewhere: they are the same whatever the load mode)."""
    path = gemma_path.resolve()
    model = Model.load(path, load_mode="mmap")
    try:
        resident = _mapped_rss_bytes(path)
        assert 0 < resident < 0.25 * path.stat().st_size
        w = model.tensors["blk.0.ffn_down.weight"]
        assert not w.data.flags.owndata and not w.data.flags.writeable
    finally:
        model.close()


def test_load_mode_none_copies_into_private_memory(smollm_path):
    # (not an RSS check: the copy may land in heap pages an earlier test freed, already resident)
    gc.collect()
    with Model.load(smollm_path, load_mode="none") as model:
        assert model.load_mode == "none"
        assert _maps_of(smollm_path) == 0                  # the file is read, not mapped
        private = model.tensors["blk.0.ffn_down.weight"].data
        with Model.load(smollm_path, load_mode="mmap") as mapped:
            assert _maps_of(smollm_path) == 1
            assert np.array_equal(private, mapped.tensors["blk.0.ffn_down.weight"].data)
    with pytest.raises(ValueError):
        Model.load(smollm_path, load_mode="fast")


def _open_fds_to(path: Path) -> int:
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path.resolve()):
                fds += 1
        except OSError:
            pass
    return fds


def _maps_of(path: Path) -> int:
    with open("/proc/self/maps") as f:
        return sum(str(path.resolve()) in line for line in f)


@pytest.mark.parametrize("stop_at", [0.0, 0.5, 0.99])
def test_cancelling_from_the_progress_callback_releases_everything(smollm_path, stop_at):
    seen = []

    def progress(fraction: float) -> bool:
        seen.append(fraction)
        return fraction < stop_at if stop_at > 0 else False

    gc.collect()
    with pytest.raises(LoadCancelled):
        Model.load(smollm_path, progress_callback=progress)
    gc.collect()
    assert _open_fds_to(smollm_path) == 0
    assert _maps_of(smollm_path) == 0
    assert seen[-1] >= stop_at


def test_progress_reaches_one_and_rises(smollm_path):
    seen = []
    with Model.load(smollm_path, progress_callback=lambda f: seen.append(f) or True):
        pass
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert all(a <= b for a, b in zip(seen, seen[1:]))
    assert len(seen) > 10


def test_vocab_only_touches_no_tensor(smollm_path):
    with Model.load(smollm_path, vocab_only=True) as model:
        assert model.tensors == {} and model.vocab_only
        assert model.vocab.n_tokens == 49152


VOCAB_FILES = sorted(p.name for p in VOCAB_DIR.glob("*.gguf"))


def _file_facts(path: Path) -> tuple[str, int, str]:
    """general.architecture, n_vocab as llama.cpp reads it, general.name."""
    with GGUFReader(path) as r:
        arch = r.metadata["general.architecture"]
        n_vocab = r.metadata.get(f"{arch}.vocab_size", len(r.metadata["tokenizer.ggml.tokens"]))
        return arch, int(n_vocab), r.metadata["general.name"]


def test_vocab_only_needs_no_architecture_class(vocab_dir, tmp_path):
    """Every architecture of llama.cpp's tokenizer-suite files runs here now: one renamed to an
    architecture gguflm does not know still loads vocab-only, and a full load names it."""
    path = rewrite(vocab_dir / "ggml-vocab-mpt.gguf", tmp_path / "renamed.gguf",
                   set_keys={"general.architecture": "not-yet-known"})
    with Model.load(path, vocab_only=True) as model:
        assert model.arch == "not-yet-known" and model.vocab.n_tokens == _file_facts(path)[1]
    with pytest.raises(UnknownArchitectureError, match="unknown model architecture: 'not-yet-known'"):
        Model.load(path)


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_vocab_only_loads_any_architecture(vocab_dir, name):
    """llama.cpp's tokenizer-suite files: a vocab-only load needs no architecture class (their
    tokenization is checked in test_vocab.py); what needs the forward pass says so."""
    path = vocab_dir / name
    arch, n_vocab, general_name = _file_facts(path)
    with Model.load(path, vocab_only=True) as model:
        assert (model.arch, model.n_vocab, model.name) == (arch, n_vocab, general_name)
        assert model.vocab_only and model.tensors == {} and model.layers == []
        assert model.n_params == 0
        with pytest.raises(VocabOnlyError, match="vocab_only=True: it has no hyper-parameters"):
            model.hparams
        with pytest.raises(VocabOnlyError, match="vocab_only=True: it has no architecture"):
            model.architecture
        with pytest.raises(VocabOnlyError, match=f"cannot create a context from {name}"):
            Context(model)
        text = model.describe()
        assert f"{'vocab_only':<26} = 1" in text and f"{'n_vocab':<26} = {n_vocab}" in text
        assert "vocab only" in repr(model)
    # a full load needs gguflm's architecture class, then the tensors these files lack
    assert arch in architectures()
    with pytest.raises(MissingTensorError):
        Model.load(path)


def test_one_model_many_closes(smollm_path):
    model = Model.load(smollm_path)
    described = model.describe()
    model.close()
    model.close()
    assert _maps_of(smollm_path) == 0
    # the file's facts outlive the map; the tensor sizes go with the tensors
    def facts(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith(("file size", "model params"))]

    assert facts(model.describe()) == facts(described)


# -- the synthetic models, intact and broken

@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_loads(arch):
    with Model.load(ARCH_DIR / f"{arch}.gguf", check_tensors=True) as model:
        assert model.arch == arch
        assert model.file_type.endswith("(guessed)")
        assert model.tensors["output.weight"] is model.tensors["token_embd.weight"]


def test_unknown_architecture(tmp_path):
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "x.gguf", set_keys={"general.architecture": "xyz"})
    with pytest.raises(UnknownArchitectureError, match="unknown model architecture: 'xyz'"):
        Model.load(bad)
    # the vocabulary needs no architecture
    with Model.load(bad, vocab_only=True) as model, \
            Model.load(ARCH_DIR / "llama.gguf", vocab_only=True) as llama:
        assert model.arch == "xyz" and model.n_vocab == llama.n_vocab
        text = "Hello world <s>"
        assert model.vocab.tokenize(text, True, True) == llama.vocab.tokenize(text, True, True)


def test_missing_tensor(tmp_path):
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "x.gguf", drop_tensors={"blk.1.ffn_up.weight"})
    with pytest.raises(MissingTensorError, match="blk.1.ffn_up.weight"):
        Model.load(bad)


def test_wrong_shape(tmp_path):
    def narrower(t):
        return np.array(t.data[:128], np.float32), GGMLType.F32, (128,)
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "x.gguf", tensor_edits={"blk.0.attn_norm.weight": narrower})
    with pytest.raises(TensorShapeError, match=r"blk.0.attn_norm.weight.*expected \[256\], got \[128\]"):
        Model.load(bad)


def test_wrong_tensor_count(tmp_path):
    extra = {"blk.0.mystery.weight": (np.zeros(4, np.float32), GGMLType.F32, (4,))}
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "x.gguf", extra_tensors=extra)
    with pytest.raises(TensorCountError, match="wrong number of tensors"):
        Model.load(bad)
    # Gemma 2's output projection is its token embedding: llama.cpp reads no output.weight
    with Model.load(ARCH_DIR / "gemma2.gguf") as model:
        embd = model.tensors["token_embd.weight"]
        assert model.tensors["output.weight"] is embd
        output = {"output.weight": (np.asarray(embd.data), embd.type, embd.shape)}
    bad = rewrite(ARCH_DIR / "gemma2.gguf", tmp_path / "g.gguf", extra_tensors=output)
    with pytest.raises(TensorCountError, match="not used: output.weight"):
        Model.load(bad)


def test_missing_key_and_bad_hparam(tmp_path):
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "a.gguf", drop_keys={"llama.block_count"})
    with pytest.raises(MissingKeyError, match="llama.block_count"):
        Model.load(bad)
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "b.gguf", set_keys={"llama.attention.head_count_kv": 3})
    with pytest.raises(HParamError, match="not a multiple"):
        Model.load(bad)
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "c.gguf", set_keys={"llama.block_count": "two"})
    with pytest.raises(HParamError, match="block_count"):
        Model.load(bad)
    # as llama.cpp, a vocab-only load reads no hyper-parameter but vocab_size
    with Model.load(bad, vocab_only=True) as model:
        assert model.vocab_only and model.arch == "llama"
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "d.gguf", set_keys={"llama.vocab_size": "many"})
    with pytest.raises(HParamError, match="llama.vocab_size"):
        Model.load(bad, vocab_only=True)
    # Qwen 2's Q is n_embd x n_embd in llama.cpp: its heads must span n_embd
    bad = rewrite(ARCH_DIR / "qwen2.gguf", tmp_path / "e.gguf", set_keys={"qwen2.attention.key_length": 32,
                                                                        "qwen2.attention.value_length": 32})
    with pytest.raises(HParamError, match="4 heads of 32"):
        Model.load(bad)


def test_unsupported_tensor_type(tmp_path):
    def to_i8(t):   # a matrix of int8 values: GGUF holds it, no matmul kernel takes it
        rows = t.data.shape[0]
        return np.zeros((rows, 256), np.uint8), GGMLType.I8, t.shape
    bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / "x.gguf", tensor_edits={"blk.0.attn_q.weight": to_i8})
    with pytest.raises(UnsupportedTensorTypeError, match="I8"):
        Model.load(bad)


def test_check_tensors_finds_nan(tmp_path):
    def with_nan(t):
        data = np.array(t.data, np.float32)
        data[3] = np.nan
        return data, t.type, t.shape

    def with_inf_scale(t):
        data = np.array(t.data)
        data[0, 0:2] = np.array([np.inf], np.float16).view(np.uint8)   # first block's fp16 scale
        return data, t.type, t.shape

    for name, edit in (("output_norm.weight", with_nan), ("blk.0.attn_q.weight", with_inf_scale)):
        bad = rewrite(ARCH_DIR / "llama.gguf", tmp_path / f"{name}.gguf", tensor_edits={name: edit})
        with Model.load(bad):
            pass  # without the check, loading does not look at the data
        with pytest.raises(InvalidTensorDataError, match=name):
            Model.load(bad, check_tensors=True)


def test_kv_overrides():
    path = ARCH_DIR / "llama.gguf"
    with Model.load(path, kv_overrides={"llama.context_length": 1024,
                                        "llama.rope.freq_base": 500000,
                                        "general.name": "renamed"}) as model:
        assert model.hparams.n_ctx_train == 1024
        assert model.hparams.rope_freq_base_train == 500000.0
        assert model.meta["general.name"] == "renamed"
    with pytest.raises(OverrideError):
        Model.load(path, kv_overrides={"llama.context_length": "long"})
    with pytest.raises(OverrideError):
        Model.load(path, kv_overrides={"llama.context_length": [1, 2]})


def test_meta_strings():
    with Model.load(ARCH_DIR / "gemma2.gguf") as model:
        assert model.meta["general.architecture"] == "gemma2"
        assert model.meta["gemma2.attention.sliding_window"] == "16"
        assert "tokenizer.ggml.tokens" not in model.meta   # arrays are not scalar metadata


def test_a_corrupt_file_is_a_model_load_error(tmp_path):
    data = (ARCH_DIR / "llama.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:1000])
    with pytest.raises(ModelLoadError):
        Model.load(tmp_path / "cut.gguf")
    with pytest.raises(ModelLoadError):
        Model.load(tmp_path / "does-not-exist.gguf")


@pytest.mark.parametrize("arch, key, value, message", [
    ("glm4", "glm4.nextn_predict_layers", 1, "glm4 with nextn_predict_layers is not supported"),
])
def test_architecture_variants_not_run_here_are_named(tmp_path, arch, key, value, message):
    from tiny_models import TinyModel, write_tiny_model

    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(TinyModel(arch, n_embd=64, head_dim=16, n_head=4, n_head_kv=4, n_ff=64, n_layer=1),
                     path, np.random.default_rng(0))
    bad = rewrite(path, tmp_path / "bad.gguf", set_keys={key: value})
    with pytest.raises(HParamError, match=message):
        Model.load(bad)
