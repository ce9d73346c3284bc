"""``gguflm inspect`` on the real models (against gguf-py's tensor table) and on written files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf_oracle import gguf_py_view
from gguflm.ggml_types import FileType, GGMLType
from gguflm.gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguflm.inspect import file_type_name, inspect_report

REPO = Path(__file__).resolve().parent.parent


def _total(report: str, label: str) -> str:
    match = re.search(rf"^  {label}:\s+(.*)$", report, re.MULTILINE)
    assert match, label
    return match.group(1)


def _tensor_rows(report: str) -> list[list[str]]:
    table = report.split("\ntensors:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [re.split(r"\s{2,}", row.strip()) for row in table[1:]]


def _expected_totals(view: dict) -> tuple[int, int]:
    """Parameters and tensor bytes by the gguf package's reading of the tensor index."""
    return (sum(n_elements for *_, n_elements, _ in view["tensors"]),
            sum(n_bytes for *_, n_bytes, _, _ in view["tensors"]))


def test_gemma_report(gemma_path):
    report = inspect_report(gemma_path)
    assert _total(report, "file type") == "Q4_K - Medium"
    with GGUFReader(gemma_path) as reader:
        n_params = sum(t.n_elements for t in reader.tensors)
        n_bytes = sum(t.nbytes for t in reader.tensors)
        rows = _tensor_rows(report)
        assert [row[0] for row in rows] == [t.name for t in reader.tensors]
        assert [row[1] for row in rows] == [t.type.name for t in reader.tensors]
    assert _total(report, "parameters").startswith(f"{n_params:,} ")
    assert _total(report, "bits per weight") == f"{8 * n_bytes / n_params:.2f}"
    assert "tokenizer.ggml.tokens" in report and "ARRAY[STRING, 262144]" in report
    assert "'<pad>', '<eos>', '<bos>', '<unk>', '<mask>', ...]" in report


def test_smollm_report_against_gguf_package(smollm_path):
    report = inspect_report(smollm_path, max_items=2)
    view = gguf_py_view(smollm_path)
    n_params, n_bytes = _expected_totals(view)
    assert _total(report, "parameters").startswith(f"{n_params:,} ")
    assert _total(report, "tensor bytes").startswith(f"{n_bytes:,} ")
    types, [file_type] = view["fields"]["general.file_type"]
    assert types == ["UINT32"]
    assert _total(report, "file type") == FileType(int.from_bytes(file_type, "little")).display_name
    assert _total(report, "file type") == "Q4_1"
    assert "['<|endoftext|>', '<|im_start|>', ...]" in report


def test_cli_subprocess(gemma_path):
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-m", "gguflm.cli", "inspect", str(gemma_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _total(done.stdout, "file type") == "Q4_K - Medium"
    failed = subprocess.run([sys.executable, "-m", "gguflm.cli", "inspect", str(REPO / "setup.py")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert failed.returncode == 1 and "expected magic b'GGUF'" in failed.stderr


def _write(path: Path, metadata: dict | None = None) -> None:
    writer = GGUFWriter(path, arch="test")
    for key, (value, vtype) in (metadata or {}).items():
        writer.add(key, value, vtype)
    writer.add_tensor("big", np.zeros((2, 34), np.uint8), GGMLType.Q8_0)
    writer.add_tensor("small.1", np.zeros(4, np.float32))
    writer.add_tensor("small.2", np.zeros(4, np.float32))
    writer.write()


def test_file_type_guessed_from_bytes(tmp_path):
    _write(tmp_path / "m.gguf")
    with GGUFReader(tmp_path / "m.gguf") as reader:
        assert file_type_name(reader) == "Q8_0 (guessed)"  # most bytes, though fewer tensors
    report = inspect_report(tmp_path / "m.gguf")
    assert _total(report, "parameters") == "72 (0.00 M)"
    assert _total(report, "bits per weight") == f"{8 * (68 + 32) / 72:.2f}"


@pytest.mark.parametrize("value, name", [(15, "Q4_K - Medium"), (7 | 1024, "Q8_0 (guessed)"),
                                         (999, "unknown file type 999")])
def test_file_type_from_metadata(tmp_path, value, name):
    _write(tmp_path / "m.gguf", {"general.file_type": (value, GGUFValueType.UINT32)})
    with GGUFReader(tmp_path / "m.gguf") as reader:
        assert file_type_name(reader) == name


def test_report_of_split_model_and_odd_values(tmp_path):
    writer = GGUFWriter(tmp_path / "m.gguf", arch="test")
    writer.add("text", "line\nbreak \udcff" + "x" * 100)
    writer.add("nested", [np.arange(7, dtype=np.int8), ["a"], []])
    writer.add("eps", 1e-6)
    for i in range(3):
        writer.add_tensor(f"t{i}", np.zeros(4, np.float32))
    paths = writer.write(split_max_tensors=2)
    report = inspect_report(paths[0], max_items=3)
    assert "parts:       2" in report
    assert [row[-1] for row in _tensor_rows(report)] == ["1", "1", "2"]
    assert "'line\\nbreak \\udcff" in report and "x" * 100 not in report
    assert "[[0, 1, 2, ...], ['a'], []]" in report
    assert re.search(r"eps\s+FLOAT32\s+1e-06", report)
    assert _total(report, "file type") == "F32 (guessed)"
