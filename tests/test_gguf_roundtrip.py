"""Writer → reader round trips on random metadata and tensors, checked against the gguf package:
it must read what we write, and its own writer must produce the same bytes for the same content."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gguf_oracle import gguf_py_view, our_view
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguflm.gguf.constants import TENSOR_DTYPES


T = GGUFValueType
NUMERIC = [t for t in T if t.dtype is not None]  # every scalar type but STRING, BOOL included
# gguf-py sizes Q8_1 blocks by an old 40-byte layout (ggml's block_q8_1 is 36 bytes)
TYPES_GGUF_PY_READS = [t for t in GGMLType if t is not GGMLType.Q8_1]
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def scalars(t: GGUFValueType) -> st.SearchStrategy:
    if t is T.BOOL:
        return st.booleans()
    if t.is_integer:
        return st.integers(*t.integer_range)
    if t is T.FLOAT32:
        return st.floats(width=32, allow_nan=False)
    if t is T.FLOAT64:
        return st.floats(allow_nan=False)
    return st.text(max_size=12)


keys = st.text(min_size=1, max_size=16).filter(
    lambda k: not k.startswith(("GGUF.", "general.alignment", "split.")))
numpy_arrays = st.sampled_from(NUMERIC).flatmap(
    lambda t: hnp.arrays(t.dtype, st.integers(0, 8), elements=scalars(t)))
string_lists = st.lists(st.text(max_size=8), min_size=1, max_size=5)
nested_arrays = st.recursive(st.one_of(numpy_arrays, string_lists),
                             lambda inner: st.lists(inner, max_size=3), max_leaves=6)

# a metadata entry: (value, value_type or None to infer, array_type or None)
explicit_scalars = st.sampled_from(NUMERIC + [T.STRING]).flatmap(
    lambda t: scalars(t).map(lambda v: (v, t, None)))
inferred_scalars = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(width=32, allow_nan=False),
    st.text(max_size=12)).map(lambda v: (v, None, None))
typed_lists = st.sampled_from(NUMERIC + [T.STRING]).flatmap(
    lambda t: st.lists(scalars(t), max_size=8).map(lambda v: (v, T.ARRAY, t)))
inferred_arrays = st.one_of(numpy_arrays, string_lists,
                            st.lists(nested_arrays, min_size=1, max_size=3)).map(
    lambda v: (v, None, None))
entries = st.one_of(explicit_scalars, inferred_scalars, typed_lists, inferred_arrays)
metadata = st.dictionaries(keys, entries, max_size=8)


@st.composite
def tensors(draw, max_count: int = 4, types: list[GGMLType] | None = None) -> list[tuple]:
    """(name, data, type or None, ggml shape or None, expected ggml shape), random bytes."""
    names = draw(st.lists(st.text(min_size=1, max_size=12), max_size=max_count, unique=True))
    out = []
    for name in names:
        ggml_type = draw(st.sampled_from(types or list(GGMLType)))
        n_dims = draw(st.integers(1, 4))
        shape = [ggml_type.block_size * draw(st.integers(1, 2))][:n_dims]
        shape += [draw(st.integers(1, 3)) for _ in range(n_dims - 1)]
        n_bytes = int(np.prod(shape)) // ggml_type.block_size * ggml_type.type_size
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        raw = rng.integers(0, 256, n_bytes, dtype=np.uint8)
        if ggml_type in TENSOR_DTYPES:
            data = raw.view(TENSOR_DTYPES[ggml_type]).reshape(shape[::-1])
            inferable = ggml_type is not GGMLType.BF16
            type_arg = None if inferable and draw(st.booleans()) else ggml_type
            out.append((name, data, type_arg, None, tuple(shape)))
        else:
            data = raw.reshape(*shape[:0:-1], ggml_type.row_bytes(shape[0]))
            shape_arg = tuple(shape) if draw(st.booleans()) else None
            out.append((name, data, ggml_type, shape_arg, tuple(shape)))
    return out


def expected_value(value, vtype, array_type):
    """What the reader must return for ``value`` added with these (possibly inferred) types."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list):
        if array_type is not None and array_type is not T.STRING:
            return np.array(value, dtype=array_type.dtype)
        if array_type is None and value and not isinstance(value[0], str):
            return [expected_value(item, None, None) for item in value]
        return value
    if vtype is T.FLOAT32 or (vtype is None and isinstance(value, float)):
        return float(np.float32(value))
    return value


def assert_same(read, expected) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(read, np.ndarray) and not read.flags.writeable
        assert read.dtype == expected.dtype.newbyteorder("<") and read.shape == expected.shape
        assert read.tobytes() == expected.astype(read.dtype).tobytes()
    elif isinstance(expected, list):
        assert isinstance(read, list) and len(read) == len(expected)
        for r, e in zip(read, expected):
            assert_same(r, e)
    else:
        assert type(read) is type(expected) and read == expected


def write(path: Path, md: dict, tensor_list: list[tuple], **kwargs) -> GGUFWriter:
    writer = GGUFWriter(path, **kwargs)
    for key, (value, vtype, array_type) in md.items():
        writer.add(key, value, vtype, array_type)
    for name, data, ggml_type, shape, _ in tensor_list:
        writer.add_tensor(name, data, ggml_type, shape)
    return writer


def assert_tensors_read_back(reader: GGUFReader, tensor_list: list[tuple]) -> None:
    assert [t.name for t in reader.tensors] == [name for name, *_ in tensor_list]
    for (name, data, _, _, shape), t in zip(tensor_list, reader.tensors):
        assert t.shape == shape and t.data.tobytes() == data.tobytes()
        assert t.nbytes == data.nbytes and t.n_elements == int(np.prod(shape))
        if t.type in TENSOR_DTYPES:
            assert t.data.dtype == TENSOR_DTYPES[t.type] and t.data.shape == shape[::-1]
        else:
            assert t.data.dtype == np.uint8 and t.data.shape == data.shape
        assert t.offset % reader.alignment == 0


@SETTINGS
@given(md=metadata, tensor_list=tensors(), alignment=st.sampled_from([32, 8, 64, 256]))
def test_round_trip_and_gguf_package_reads_it(md, tensor_list, alignment):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.gguf"
        assert write(path, md, tensor_list, arch="test", alignment=alignment).write() == [path]
        with GGUFReader(path) as reader:
            assert list(reader.metadata) == ["general.architecture"] + (
                ["general.alignment"] if alignment != 32 else []) + list(md)
            assert reader.alignment == alignment
            for key, (value, vtype, array_type) in md.items():
                assert_same(reader.metadata[key], expected_value(value, vtype, array_type))
                if vtype is not None:
                    assert reader.value_types[key] is vtype
                if array_type is not None:
                    assert reader.array_type(key) is array_type
            assert_tensors_read_back(reader, tensor_list)
            ours = our_view(reader)
        if all(ggml_type is not GGMLType.Q8_1 for _, _, ggml_type, _, _ in tensor_list):
            assert gguf_py_view(path) == ours


def test_inferred_types():
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        md = {"b": True, "i": -5, "i64": -(2**40), "u64": 2**63, "f": 0.5, "s": "x",
              "ai": [1, 2**33], "af": [1, 2.5], "ab": [True], "as": ["a"], "np": np.int16(3),
              "anp": np.arange(3, dtype=np.uint8), "nested": [[1], ["a"]]}
        writer = GGUFWriter(path)
        for key, value in md.items():
            writer.add(key, value)
        writer.write()
        with GGUFReader(path) as reader:
            types = {k: reader.value_types[k].name for k in md}
            arrays = {k: reader.array_type(k).name for k in md
                      if reader.array_type(k) is not None}
    assert types == {"b": "BOOL", "i": "INT32", "i64": "INT64", "u64": "UINT64", "f": "FLOAT32",
                     "s": "STRING", "ai": "ARRAY", "af": "ARRAY", "ab": "ARRAY", "as": "ARRAY",
                     "np": "INT16", "anp": "ARRAY", "nested": "ARRAY"}
    assert arrays == {"ai": "INT64", "af": "FLOAT32", "ab": "BOOL", "as": "STRING",
                      "anp": "UINT8", "nested": "ARRAY"}


# what gguf-py's writer can express: typed scalars and non-empty typed lists
gguf_py_entries = st.one_of(
    explicit_scalars,
    st.sampled_from(NUMERIC + [T.STRING]).flatmap(
        lambda t: st.lists(scalars(t), min_size=1, max_size=8).map(lambda v: (v, T.ARRAY, t))))


@SETTINGS
@given(md=st.dictionaries(keys, gguf_py_entries, max_size=8),
       tensor_list=tensors(types=TYPES_GGUF_PY_READS).filter(bool))
def test_same_bytes_as_gguf_package_writer(md, tensor_list):
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = Path(tmp) / "ours.gguf", Path(tmp) / "theirs.gguf"
        write(ours, md, tensor_list, arch="test").write()
        writer = gguf.GGUFWriter(theirs, "test")
        for key, (value, vtype, array_type) in md.items():
            sub_type = None if array_type is None else gguf.GGUFValueType(array_type)
            writer.add_key_value(key, value, gguf.GGUFValueType(vtype), sub_type=sub_type)
        for name, data, ggml_type, _, _ in tensor_list:
            raw_dtype = None if ggml_type is None else gguf.GGMLQuantizationType(ggml_type)
            if data.dtype == np.float32 or data.dtype == np.float16:
                raw_dtype = None
            writer.add_tensor(name, data, raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        assert ours.read_bytes() == theirs.read_bytes()


@SETTINGS
@given(md=metadata,
       tensor_list=tensors(max_count=6, types=TYPES_GGUF_PY_READS).filter(lambda t: len(t) >= 2),
       limit=st.integers(1, 3), by_size=st.booleans())
def test_split_round_trip(md, tensor_list, limit, by_size):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.gguf"
        writer = write(path, md, tensor_list, alignment=64)
        sizes = [data.nbytes for _, data, *_ in tensor_list]
        if by_size:
            written = writer.write(split_max_size=max(sizes) * limit)
        else:
            written = writer.write(split_max_tensors=limit)
            assert len(written) == -(-len(tensor_list) // limit)
        with GGUFReader(written[0]) as reader:
            assert reader.paths == tuple(written) and reader.n_parts == len(written)
            assert_tensors_read_back(reader, tensor_list)
            for key, (value, vtype, array_type) in md.items():
                assert_same(reader.metadata[key], expected_value(value, vtype, array_type))
            if len(written) > 1:
                assert reader.get_int("split.count") == len(written)
                assert reader.get_int("split.tensors.count") == len(tensor_list)
                parts = {t.name: t.part for t in reader.tensors}
                for i, part_path in enumerate(written):
                    theirs = gguf_py_view(part_path)
                    assert theirs["fields"]["split.no"] == (["UINT16"], [i.to_bytes(2, "little")])
                    assert theirs["alignment"] == 64
                    assert [t[0] for t in theirs["tensors"]] == [
                        name for name, part in parts.items() if part == i]


@settings(max_examples=30, deadline=None)
@given(raw=st.binary(max_size=24))
def test_undecodable_strings_round_trip(raw):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        writer = GGUFWriter(path)
        writer.add("raw", raw)
        writer.add("raw.list", [raw, raw + b"\xff"], T.ARRAY, T.STRING)
        writer.write()
        with GGUFReader(path) as reader:
            assert reader.get_str("raw").encode("utf-8", "surrogateescape") == raw
            rewritten = Path(tmp) / "again.gguf"
            again = GGUFWriter(rewritten)
            for key, value in reader.metadata.items():
                again.add(key, value, reader.value_types[key], reader.array_type(key))
            again.write()
        assert rewritten.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("call, error, match", [
    (lambda w: w.add("", 1), ValueError, "non-empty"),
    (lambda w: w.add("k", "\ud800"), ValueError, "metadata 'k'.*surrogate"),
    (lambda w: w.add("\ud800", 1), ValueError, "surrogate"),
    (lambda w: w.add_tensor("\ud800", np.zeros(4, np.float32)), ValueError, "cannot be encoded"),
    (lambda w: w.add("k", 2**64), ValueError, "does not fit"),
    (lambda w: w.add("k", 300, T.UINT8), ValueError, "out of UINT8 range"),
    (lambda w: w.add("k", 1.5, T.INT32), TypeError, "integers"),
    (lambda w: w.add("k", "x", T.INT32), TypeError, "integers"),
    (lambda w: w.add("k", 1, T.STRING), TypeError, "str or bytes"),
    (lambda w: w.add("k", 1, T.BOOL), TypeError, "bools"),
    (lambda w: w.add("k", 1e300), ValueError, "too large for FLOAT32"),
    (lambda w: w.add("k", 10**400, T.FLOAT64), ValueError, "too large for FLOAT64"),
    (lambda w: w.add("k", [1, "a"]), TypeError, "mixed"),
    (lambda w: w.add("k", "abc", T.ARRAY), TypeError, "list"),
    (lambda w: w.add("k", np.zeros((2, 2))), ValueError, "one-dimensional"),
    (lambda w: w.add("k", np.zeros(2, np.float16)), TypeError, "float16"),
    (lambda w: w.add("k", object()), TypeError, "no GGUF value type"),
    (lambda w: w.add("k", 1, array_type=T.INT32), ValueError, "array_type"),
    (lambda w: w.add("general.alignment", 48), ValueError, "power of two"),
    (lambda w: w.add("general.alignment", 64, T.UINT64), ValueError, "UINT32"),
    (lambda w: w.add_tensor("", np.zeros(4, np.float32)), ValueError, "non-empty"),
    (lambda w: w.add_tensor("x" * 64, np.zeros(4, np.float32)), ValueError, "63 bytes"),
    (lambda w: w.add_tensor("t", np.zeros(4, np.uint32)), TypeError, "infer"),
    (lambda w: w.add_tensor("t", np.zeros(4, np.float32), GGMLType.F16), TypeError, "float16"),
    (lambda w: w.add_tensor("t", np.zeros(4, np.float32), GGMLType.Q8_0), TypeError, "uint8"),
    (lambda w: w.add_tensor("t", np.zeros(34, np.uint8), GGMLType.Q8_0, (64,)), ValueError,
     "needs 68 bytes"),
    (lambda w: w.add_tensor("t", np.zeros(33, np.uint8), GGMLType.Q8_0), ValueError, "shape="),
    (lambda w: w.add_tensor("t", np.zeros(34, np.uint8), GGMLType.Q8_0, (16, 2)), ValueError,
     "block size"),
    (lambda w: w.add_tensor("t", np.zeros(4, np.float32), shape=(5,)), ValueError, "elements"),
    (lambda w: w.add_tensor("t", np.zeros((1,) * 5, np.float32)), ValueError, "dimensions"),
    (lambda w: w.add_tensor("t", np.float32(1)), ValueError, "dimensions"),
    (lambda w: w.add_tensor("t", np.zeros(4, np.float32), shape=(4, 0)), ValueError, ">= 1"),
    (lambda w: w.write(split_max_tensors=-1), ValueError, ">= 0"),
])
def test_writer_rejects_bad_input(tmp_path, call, error, match):
    writer = GGUFWriter(tmp_path / "m.gguf")
    with pytest.raises(error, match=match):
        call(writer)
    assert not list(tmp_path.iterdir())


def test_writer_duplicates(tmp_path):
    writer = GGUFWriter(tmp_path / "m.gguf", arch="a")
    writer.add("k", 1)
    writer.add("j", 2)
    writer.add("k", "replaced")  # a key added again keeps its place
    writer.add_tensor("t", np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="already added"):
        writer.add_tensor("t", np.zeros(4, np.float32))
    writer.write()
    with GGUFReader(tmp_path / "m.gguf") as reader:
        assert list(reader.metadata.items()) == [
            ("general.architecture", "a"), ("k", "replaced"), ("j", 2)]


def test_big_endian_tensor_data_is_written_little_endian(tmp_path):
    data = np.arange(6, dtype=">f4").reshape(2, 3)
    writer = GGUFWriter(tmp_path / "m.gguf")
    writer.add_tensor("t", data)
    writer.write()
    with GGUFReader(tmp_path / "m.gguf") as reader:
        assert np.array_equal(reader.tensor("t").data, data) and reader.tensor("t").shape == (3, 2)


any_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
    | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(value=any_values, value_type=st.none() | st.sampled_from(T),
       array_type=st.none() | st.sampled_from(T))
def test_add_accepts_or_rejects_cleanly(value, value_type, array_type):
    """Any value and type combination is either written (and reads back) or refused with
    ValueError/TypeError at add time."""
    with tempfile.TemporaryDirectory() as tmp:
        writer = GGUFWriter(Path(tmp) / "m.gguf")
        try:
            writer.add("key", value, value_type, array_type)
        except (ValueError, TypeError):
            return
        [path] = writer.write()
        with GGUFReader(path) as reader:
            assert list(reader.metadata) == ["key"]
            if value_type is not None:
                assert reader.value_types["key"] is value_type
