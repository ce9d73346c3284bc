"""Malformed GGUF files: every one must give a GGUFError naming the file, the byte offset, what was
expected and what was found — never another exception, a crash, a hang or a huge allocation."""

from __future__ import annotations

import os
import re
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gguflm.errors import GGUFError
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFReader, GGUFValueType, GGUFWriter

T = GGUFValueType


# -- a raw builder that writes whatever it is told, valid or not


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + u32(vtype) + payload


def tensor_info(name: str | bytes, dims: list[int], ggml_type: int, offset: int) -> bytes:
    dims_raw = b"".join(u64(d) for d in dims)
    return gstr(name) + u32(len(dims)) + dims_raw + u32(ggml_type) + u64(offset)


def gguf_file(kvs=(), infos=(), data=b"", *, version=3, n_kv=None, n_tensors=None,
              alignment=32) -> tuple[bytes, list[int]]:
    """The file's bytes and the start offset of each kv, then of each tensor info."""
    out = b"GGUF" + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
    out += u64(len(kvs) if n_kv is None else n_kv)
    starts = []
    for part in (*kvs, *infos):
        starts.append(len(out))
        out += part
    if infos:
        out += bytes(-len(out) % alignment)
    return out + data, starts


def open_bytes(tmp_path: Path, raw: bytes, name: str = "bad.gguf") -> GGUFReader:
    path = tmp_path / name
    path.write_bytes(raw)
    return GGUFReader(path)


def assert_gguf_error(tmp_path, raw: bytes, offset: int | None, *fragments: str) -> None:
    path = tmp_path / "bad.gguf"
    with pytest.raises(GGUFError) as info:
        open_bytes(tmp_path, raw).close()
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    if offset is not None:
        assert f"at byte {offset}:" in message
    for fragment in fragments:
        assert re.search(fragment, message), (fragment, message)


F32_4 = tensor_info("t", [4], GGMLType.F32, 0)


@pytest.mark.parametrize("raw, offset, fragments", [
    (b"", 0, ["magic b'GGUF'", "an empty file"]),
    (b"GGML" + bytes(20), 0, ["magic b'GGUF'", "b'GGML'"]),
    (b"GGUF\x03\x00", 0, ["GGUF header", "end of file"]),
    (gguf_file(version=1)[0], 4, ["version 1", "no longer supported"]),
    (gguf_file(version=4)[0], 4, ["version 2 or 3", "version 4"]),
    (gguf_file(version=0)[0], 4, ["version 0"]),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), 4, ["little-endian", "version 3 written big-endian"]),
    (gguf_file(n_kv=2**40)[0], 16, ["metadata count that fits", str(2**40)]),
    (gguf_file(n_tensors=2**61)[0], 8, ["tensor count that fits", str(2**61)]),
])
def test_bad_header(tmp_path, raw, offset, fragments):
    assert_gguf_error(tmp_path, raw, offset, *fragments)


def test_version_2_is_read(tmp_path):
    raw, _ = gguf_file([kv("a", T.UINT8, b"\x07")], version=2)
    with open_bytes(tmp_path, raw) as reader:
        assert reader.version == 2 and reader.metadata == {"a": 7}


def test_bad_metadata(tmp_path):
    one = kv("a", T.UINT32, u32(1))
    cases = [
        ([one, one], 1, ["a new key", "duplicate key 'a'"]),
        ([kv("", T.UINT8, b"\x00")], 0, ["non-empty key"]),
        ([kv("a", 13, b"")], None, ["value type of 'a' \\(0..12\\)", "found 13"]),
        ([kv("a", T.ARRAY, u32(99) + u64(0))], None, ["element type of 'a'", "found 99"]),
        ([kv("a", T.ARRAY, u32(T.INT32) + u64(2**40))], None,
         ["count of INT32 elements that fits", f"{2**40} elements"]),
        ([u64(2**62) + b"abc"], 0, [f"key of metadata entry 0 of {2**62} bytes", "end of file"]),
        ([kv("a", T.STRING, u64(2**62))], None, [f"value of 'a' of {2**62} bytes"]),
        ([kv("a", T.ARRAY, u32(T.STRING) + u64(2) + gstr("x") + u64(99))], None,
         ["string element of 'a' of 99 bytes"]),
        ([kv("a", T.ARRAY, (u32(T.ARRAY) + u64(1)) * 17 + u32(T.UINT8) + u64(0))], None,
         ["nested at most 16 deep"]),
        ([kv("general.alignment", T.INT32, u32(64))], 0, ["general.alignment of type UINT32",
                                                           "found INT32"]),
        ([kv("general.alignment", T.UINT32, u32(48))], 0, ["power of two", "found 48"]),
        ([kv("general.alignment", T.UINT32, u32(0))], 0, ["power of two", "found 0"]),
    ]
    for kvs, bad_entry, fragments in cases:
        raw, starts = gguf_file(kvs)
        raw += bytes(32)  # so that the entry counts are plausible and the entries are read
        assert_gguf_error(tmp_path, raw, None if bad_entry is None else starts[bad_entry],
                          *fragments)


def test_bad_tensor_infos(tmp_path):
    q8 = GGMLType.Q8_0
    cases = [
        ([F32_4, F32_4], 1, ["a new tensor name", "duplicate tensor 't'"]),
        ([tensor_info("x" * 64, [4], GGMLType.F32, 0)], 0, ["at most 63 bytes", "64 bytes"]),
        ([tensor_info("t", [1] * 5, GGMLType.F32, 0)], None, ["at most 4 dimensions", "found 5"]),
        ([tensor_info("t", [4, 0], GGMLType.F32, 0)], None, ["dimension 1 of tensor 't'",
                                                              "found 0$"]),
        ([tensor_info("t", [2**64 - 1], GGMLType.F32, 0)], None, ["found -1$"]),
        ([tensor_info("t", [2**32, 2**32], GGMLType.F32, 0)], None, ["fewer than", "2 ?\\*\\* ?63"
                                                                     "|9223372036854775807"]),
        ([tensor_info("t", [4], 4, 0)], None, ["known ggml type for tensor 't'", "found 4$"]),
        ([tensor_info("t", [4], 99, 0)], None, ["found 99$"]),
        ([tensor_info("t", [33], q8, 0)], None, ["multiple of Q8_0's block size 32",
                                                 "33 elements per row"]),
    ]
    for infos, bad_info, fragments in cases:
        raw, starts = gguf_file([], infos, bytes(4096))
        assert_gguf_error(tmp_path, raw, None if bad_info is None else starts[bad_info],
                          *fragments)


def test_bad_tensor_data(tmp_path):
    def offset_field(raw_info_start: int, info: bytes) -> int:
        return raw_info_start + len(info) - 8  # the data offset is the info's last field

    cases = [
        ([tensor_info("t", [4], GGMLType.F32, 4)], bytes(64), ["multiple of 32", "found 4$"]),
        ([tensor_info("t", [64], GGMLType.F32, 0)], bytes(100), ["the 256 bytes of 't' inside",
                                                                 "data at bytes"]),
        ([tensor_info("t", [4], GGMLType.F32, 2**62)], bytes(64), ["inside the file"]),
        ([tensor_info("a", [16], GGMLType.F32, 0), tensor_info("b", [4], GGMLType.F32, 32)],
         bytes(128), ["data of 'b' after the end of 'a'", "data offset 32$"]),
    ]
    for infos, data, fragments in cases:
        raw, starts = gguf_file([], infos, data)
        assert_gguf_error(tmp_path, raw, offset_field(starts[-1], infos[-1]), *fragments)
    # the tensor infos end where the data section should start: nothing left to pad to
    raw, starts = gguf_file([], [F32_4])
    raw = raw[: starts[0] + len(F32_4) + 1]
    assert_gguf_error(tmp_path, raw, starts[0] + len(F32_4), "padding to the data section")


def test_unusual_but_valid(tmp_path):
    # no dimensions (ggml treats it as one element), a bool byte other than 0/1, bytes that are
    # not UTF-8, tensors stored out of order, an empty array
    infos = [tensor_info("scalar", [], GGMLType.F32, 32),
             tensor_info("first", [2], GGMLType.F32, 0)]
    kvs = [kv("flags", T.ARRAY, u32(T.BOOL) + u64(3) + b"\x00\x01\x02"),
           kv(b"k\xff", T.STRING, gstr(b"v\xfe")),
           kv("empty", T.ARRAY, u32(T.FLOAT32) + u64(0))]
    data = np.array([1, 2, 0, 0, 0, 0, 0, 0, 3], np.float32).tobytes()
    raw, _ = gguf_file(kvs, infos, data)
    with open_bytes(tmp_path, raw) as reader:
        assert reader.tensor("scalar").shape == () and reader.tensor("scalar").data[()] == 3.0
        assert reader.tensor("first").data.tolist() == [1.0, 2.0]
        assert reader.get_array("flags").tolist() == [False, True, True]
        assert reader.get_str("k\udcff") == "v\udcfe"
        empty = reader.get_array("empty")
        assert empty.dtype == np.float32 and empty.size == 0


# -- a valid file, cut short and bit-flipped


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory) -> tuple[bytes, int, int]:
    """(bytes, start of the data section, end of the last tensor's data)."""
    path = tmp_path_factory.mktemp("valid") / "valid.gguf"
    rng = np.random.default_rng(0)
    writer = GGUFWriter(path, arch="llama")
    writer.add("name", "small model")
    writer.add("count", 2**40)
    writer.add("flag", True)
    writer.add("tokens", ["a", "bc", "", "déf"])
    writer.add("scores", np.linspace(-1, 1, 5, dtype=np.float32))
    writer.add("nested", [np.arange(3, dtype=np.int16), ["x", "y"], []])
    writer.add_tensor("norm", np.ones(8, np.float32))
    writer.add_tensor("q8", rng.integers(0, 256, (2, 34), dtype=np.uint8), GGMLType.Q8_0)
    writer.add_tensor("q4k", rng.integers(0, 256, (1, 144), dtype=np.uint8), GGMLType.Q4_K)
    writer.write()
    with GGUFReader(path) as reader:
        data_start = min(t.file_offset for t in reader.tensors)
        data_end = max(t.file_offset + t.nbytes for t in reader.tensors)
    return path.read_bytes(), data_start, data_end


def test_truncation_at_every_header_byte(valid_file, tmp_path):
    raw, data_start, data_end = valid_file
    lengths = list(range(data_start + 1)) + list(range(data_start, len(raw) + 1, 7))
    for length in lengths:
        path = tmp_path / "cut.gguf"
        path.write_bytes(raw[:length])
        if length < data_end:
            with pytest.raises(GGUFError):
                GGUFReader(path).close()
        else:  # only trailing padding is missing
            with GGUFReader(path) as reader:
                assert len(reader.tensors) == 3


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_byte_flips_in_header(valid_file, data):
    raw, data_start, _ = valid_file
    corrupted = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, data_start - 1))
        corrupted[position] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[position]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "flipped.gguf"
        path.write_bytes(bytes(corrupted))
        try:
            reader = GGUFReader(path)
        except GGUFError:
            return
        with reader:  # a flip the format cannot notice (a value, a name): views still work
            for t in reader.tensors:
                assert t.data.nbytes == t.nbytes
                t.data.tobytes()


# -- split models


@pytest.fixture()
def split_model(tmp_path) -> list[Path]:
    writer = GGUFWriter(tmp_path / "model.gguf", arch="llama")
    writer.add("name", "split")
    for i in range(3):
        writer.add_tensor(f"t{i}", np.full(8, i, np.float32))
    return writer.write(split_max_tensors=1)


def write_part(path: Path, no: int, tensors: list[str], count: int = 3, n_tensors: int = 3):
    """One part of a split model, written key by key so that it can be wrong."""
    writer = GGUFWriter(path)
    writer.add("split.no", no, T.UINT16)
    writer.add("split.count", count, T.UINT16)
    writer.add("split.tensors.count", n_tensors, T.INT32)
    for name in tensors:
        writer.add_tensor(name, np.zeros(8, np.float32))
    writer.write()


def test_split_model_reads_all_parts(split_model):
    assert [p.name for p in split_model] == [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with GGUFReader(split_model[0]) as reader:
        assert [(t.name, t.part, t.data[0]) for t in reader.tensors] == [
            ("t0", 0, 0.0), ("t1", 1, 1.0), ("t2", 2, 2.0)]
        assert reader.get_str("name") == "split"
        assert reader.paths == tuple(split_model)


def test_missing_split_part(split_model):
    split_model[1].unlink()
    missing = re.escape(f"split part 2 of 3 is missing: {split_model[1]}")
    with pytest.raises(GGUFError, match=missing):
        GGUFReader(split_model[0])


def test_opening_a_later_part(split_model):
    with pytest.raises(GGUFError, match="part 2 of a split model; open the first part"):
        GGUFReader(split_model[1])


def test_split_tensor_count_mismatch(split_model):
    write_part(split_model[0], 0, ["t0"], n_tensors=4)
    with pytest.raises(GGUFError, match="split.tensors.count is 4 but the 3 parts hold 3 tensors"):
        GGUFReader(split_model[0])


def test_split_part_with_wrong_number(split_model):
    write_part(split_model[2], 1, ["t2"])
    with pytest.raises(GGUFError, match=f"{re.escape(str(split_model[2]))}: expected split.no = 2"):
        GGUFReader(split_model[0])


def test_split_name_not_following_the_pattern(split_model, tmp_path):
    renamed = split_model[0].rename(tmp_path / "model.gguf")
    with pytest.raises(GGUFError, match="does not follow the split pattern"):
        GGUFReader(renamed)


def test_tensor_in_two_parts(split_model):
    write_part(split_model[2], 2, ["t1"])
    with pytest.raises(GGUFError, match="tensor 't1' is also in an earlier part"):
        GGUFReader(split_model[0])


def test_broken_later_part(split_model):
    split_model[2].write_bytes(split_model[2].read_bytes()[:40])
    with pytest.raises(GGUFError, match=re.escape(str(split_model[2]))):
        GGUFReader(split_model[0])


def test_failed_open_releases_the_file(tmp_path, split_model):
    split_model[2].write_bytes(b"GGUF" + bytes(30))
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(GGUFError):
            GGUFReader(split_model[0])
    assert len(os.listdir("/proc/self/fd")) == fds


def test_nonexistent_file(tmp_path):
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFReader(tmp_path / "nothing.gguf")


def test_bad_mode(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        GGUFReader(tmp_path / "x.gguf", mode="write")
