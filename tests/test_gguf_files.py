"""Real GGUF files — the two models and llama.cpp's vocab suite — read as the gguf package reads
them, and written back byte for byte (the models were written by llama.cpp, the vocab files by
gguf-py)."""

from __future__ import annotations

import filecmp
import os
import time

import numpy as np
import pytest

from conftest import GEMMA_FILE, SMOLLM_FILE, VOCAB_DIR
from gguf_oracle import GGUFPyOracle, digest, our_view
from gguflm.default_model import models_dir
from gguflm.errors import GGUFError
from gguflm.gguf import GGUFReader, GGUFValueType, GGUFWriter


VOCAB_FILES = sorted(p.name for p in VOCAB_DIR.glob("*.gguf"))


@pytest.fixture(scope="module")
def oracle(request):
    """gguf-py's digests of every file (cached; else computed in worker processes)."""
    paths = [VOCAB_DIR / name for name in VOCAB_FILES]
    paths += [models_dir() / name for name in (GEMMA_FILE, SMOLLM_FILE)
              if (models_dir() / name).is_file()]
    return GGUFPyOracle(paths, getattr(request.config, "cache", None))


@pytest.fixture(params=VOCAB_FILES)
def vocab_path(request, vocab_dir):
    return vocab_dir / request.param


def _assert_same_as_gguf_package(path, oracle):
    with GGUFReader(path) as reader:
        ours = digest(our_view(reader))
    theirs = oracle[path]
    assert list(ours["fields"]) == list(theirs["fields"])
    for key, (types, n_leaves, leaves_hash) in theirs["fields"].items():
        assert ours["fields"][key] == [types, n_leaves, leaves_hash], key
    assert ours["alignment"] == theirs["alignment"]
    assert ours["tensors"] == theirs["tensors"]


def test_real_model_matches_gguf_package(real_model_path, oracle):
    _assert_same_as_gguf_package(real_model_path, oracle)


def test_vocab_file_matches_gguf_package(vocab_path, oracle):
    _assert_same_as_gguf_package(vocab_path, oracle)


def _rewrite(reader: GGUFReader, path) -> None:
    writer = GGUFWriter(path, alignment=reader.alignment)
    for key, value in reader.metadata.items():
        writer.add(key, value, reader.value_types[key], reader.array_type(key))
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, t.type, t.shape)
    writer.write()


def test_real_model_rewrites_byte_identical(real_model_path, tmp_path):
    with GGUFReader(real_model_path) as reader:
        _rewrite(reader, tmp_path / "copy.gguf")
    assert filecmp.cmp(real_model_path, tmp_path / "copy.gguf", shallow=False)


def test_vocab_file_rewrites_byte_identical(vocab_path, tmp_path):
    with GGUFReader(vocab_path) as reader:
        _rewrite(reader, tmp_path / "copy.gguf")
    assert filecmp.cmp(vocab_path, tmp_path / "copy.gguf", shallow=False)


def test_zero_copy_views_of_the_map(smollm_path):
    with GGUFReader(smollm_path) as reader:
        token_types = reader.get_array("tokenizer.ggml.token_type")
        embd = reader.tensor("token_embd.weight")
        for view in (token_types, embd.data):
            assert not view.flags.writeable
            assert not view.flags.owndata
        # the view's bytes are the file's bytes at the tensor's offset
        with open(smollm_path, "rb") as f:
            f.seek(embd.file_offset)
            head = f.read(4096)
        assert embd.data.reshape(-1)[:4096].tobytes() == head
        assert embd.data.shape == (*embd.shape[:0:-1], embd.type.row_bytes(embd.shape[0]))
        assert token_types.dtype == np.int32
        del token_types, embd, view


def test_typed_views_and_shapes(gemma_path):
    with GGUFReader(gemma_path) as reader:
        assert reader.get_array("tokenizer.ggml.scores").dtype == np.float32
        norm = reader.tensor("output_norm.weight")
        assert norm.data.dtype == np.float32 and norm.data.shape == norm.shape[::-1]
        assert "token_embd.weight" in reader and "no.such.tensor" not in reader
        with pytest.raises(KeyError, match="no.such.tensor"):
            reader.tensor("no.such.tensor")


def test_read_mode_equals_mmap_mode(smollm_path):
    with GGUFReader(smollm_path) as mapped, GGUFReader(smollm_path, mode="read") as private:
        assert our_view(mapped) == our_view(private)
        assert mapped.n_parts == private.n_parts == 1
        assert mapped.paths == (smollm_path,)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_close_releases_map_and_descriptor(smollm_path):
    before = _open_fds()
    reader = GGUFReader(smollm_path)
    assert _open_fds() == before + 1  # the map's own descriptor
    buffers = list(reader._buffers)
    reader.close()
    assert all(buf.closed for buf in buffers)
    assert _open_fds() == before
    assert reader.tensors == [] and reader.get_int("llama.block_count") > 0  # metadata copied out


def test_close_with_live_views_keeps_them_readable(smollm_path):
    reader = GGUFReader(smollm_path)
    embd = reader.tensor("token_embd.weight").data
    tokens = reader.get_array("tokenizer.ggml.token_type")
    expected = embd[:2].copy()
    reader.close()  # must not raise although the views pin the map
    reader.close()  # closing twice is harmless
    assert np.array_equal(embd[:2], expected)
    assert tokens.size == reader.get_array("tokenizer.ggml.token_type").size


def test_getters(smollm_path):
    with GGUFReader(smollm_path) as reader:
        assert reader.get_int("llama.block_count") == reader.metadata["llama.block_count"]
        assert reader.get_float("llama.rope.freq_base") == reader.metadata["llama.rope.freq_base"]
        assert isinstance(reader.get_float("llama.block_count"), float)  # ints widen to float
        assert reader.get_str("tokenizer.ggml.model") == "gpt2"
        assert reader.get_bool("tokenizer.ggml.add_bos_token") is False
        assert reader.get("missing.key") is None
        assert reader.get_int("missing.key", 7) == 7
        assert reader.value_types["tokenizer.ggml.tokens"] is GGUFValueType.ARRAY
        assert reader.array_type("tokenizer.ggml.tokens") is GGUFValueType.STRING
        assert reader.array_type("llama.block_count") is None
        with pytest.raises(KeyError, match="missing.key"):
            reader.get_int("missing.key")
        with pytest.raises(GGUFError, match=r"'tokenizer.ggml.model'.*an integer.*STRING"):
            reader.get_int("tokenizer.ggml.model")
        with pytest.raises(GGUFError, match=r"BOOL.*found UINT32"):
            reader.get_bool("llama.block_count")
        with pytest.raises(GGUFError, match=r"STRING.*found ARRAY of STRING"):
            reader.get_str("tokenizer.ggml.tokens")


def test_opening_gemma_is_fast(gemma_path):
    """262,144 token strings decode in one C pass; gguf-py takes seconds for the same file."""
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        GGUFReader(gemma_path).close()
        timings.append(time.perf_counter() - start)
    print(f"open gemma: best {min(timings) * 1e3:.1f} ms")
    assert min(timings) < 0.5


def _rss_kib(kind: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(kind + ":"))


@pytest.mark.parametrize("mode", ["mmap", "read"])
def test_release_gives_back_the_pages_under_a_tensor(tmp_path, mode):
    """release() drops the whole pages under a tensor and no byte of its neighbours (which share
    its first and last pages): the file's map reads the tensor again from the page cache, read
    mode's private memory is freed."""
    from gguflm.ggml_types import GGMLType

    rng = np.random.default_rng(0)
    big = rng.integers(0, 255, 1 << 22, dtype=np.uint8).view(np.float32)   # 4 MiB
    small = [rng.standard_normal(100).astype(np.float32) for _ in range(2)]
    path = tmp_path / "release.gguf"
    w = GGUFWriter(path, alignment=32)
    w.add("general.architecture", "llama")
    w.add_tensor("a", small[0], GGMLType.F32, (100,))
    w.add_tensor("big", big, GGMLType.F32, (big.size,))
    w.add_tensor("c", small[1], GGMLType.F32, (100,))
    w.write()
    with GGUFReader(path, mode=mode) as r:
        data = r.tensor("big").data
        assert int(data.view(np.uint8).sum(dtype=np.uint64)) == int(big.view(np.uint8).sum(dtype=np.uint64))
        kind = "RssFile" if mode == "mmap" else "RssAnon"
        before = _rss_kib(kind)
        r.release(data)
        assert before - _rss_kib(kind) >= 3 * 1024
        assert np.array_equal(r.tensor("a").data, small[0]) and np.array_equal(r.tensor("c").data, small[1])
        if mode == "mmap":
            assert np.array_equal(data.view(np.uint8), big.view(np.uint8))
        r.release(np.zeros(8))   # not in the reader's memory: nothing happens
