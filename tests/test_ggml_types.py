"""Our type table against the gguf package's (an oracle no one here wrote)."""

import pytest

gguf = pytest.importorskip("gguf")

from gguflm.ggml_types import FileType, GGMLType  # noqa: E402


@pytest.mark.parametrize("t", list(GGMLType), ids=lambda t: t.name)
def test_sizes_match_gguf_package(t):
    theirs = gguf.GGMLQuantizationType[t.name]
    assert theirs.value == t.value
    if t is GGMLType.Q8_1:
        # gguf-py still lists the old float-scaled layout (40 bytes); ggml's block_q8_1 holds
        # two fp16 (d, s) and 32 int8: 36 bytes
        assert (t.block_size, t.type_size) == (32, 36)
    else:
        assert (t.block_size, t.type_size) == gguf.GGML_QUANT_SIZES[theirs]


def test_file_type_values_match_gguf_package():
    for ft in FileType:
        assert gguf.LlamaFileType[ft.name].value == ft.value
        assert ft.display_name


def test_row_bytes():
    assert GGMLType.Q4_K.row_bytes(512) == 288
    assert GGMLType.F16.row_bytes(3) == 6
    with pytest.raises(ValueError):
        GGMLType.Q8_0.row_bytes(33)
