"""Runs llama-cpp-python 0.3.36's own tests (the files beside this one, copied unchanged from its
sdist, MIT licence in LICENSE.md) against one backend: ``--backend llama_cpp`` (llama-cpp-python
itself) or ``--backend gguflm`` (``gguflm.llama_cpp``, imported as ``llama_cpp``).
tests/test_llama_cpp_python_suite.py runs them under both and compares.

The suite downloads its models from the Hugging Face hub; here ``huggingface_hub.hf_hub_download``
answers with local files instead (the real models; all-MiniLM for bge-small; tiny random models,
written once per run by tests/tiny_models.py, for mamba-130m and Falcon-H1-Tiny-90M), and models
that are not here raise FileNotFoundError, which fails those tests under both backends. The suite's
vocabulary file path (``./vendor/llama.cpp/models/...``) is resolved by running from a folder that
holds it (the harness makes one).
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import types
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--backend", choices=("llama_cpp", "gguflm"), default="llama_cpp",
                     help="which implementation `import llama_cpp` gives the suite")


def _local_models() -> dict[tuple[str, str], Path]:
    models = Path(os.environ.get("GGUFLM_MODELS", Path.home() / ".cache" / "gguflm" / "models"))
    smollm = models / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return {
        ("lmstudio-community/Qwen3.5-0.8B-GGUF", "Qwen3.5-0.8B-Q8_0.gguf"): smollm,
        ("ggml-org/models", "tinyllamas/stories15M-q4_0.gguf"): smollm,
        ("CompendiumLabs/bge-small-en-v1.5-gguf", "bge-small-en-v1.5-q4_k_m.gguf"):
            DATA / "models" / "all-MiniLM-L6-v2-Q8_0.gguf",
    }


@functools.cache
def _tiny_model(kind: str) -> Path:
    """A tiny random model written once per run: the suite's recurrent model (a Mamba) or its
    hybrid one (a Falcon-H1)."""
    sys.path.insert(0, str(HERE.parent))
    import numpy as np
    from tiny_models import TinyHybrid, TinyMamba, write_tiny_hybrid, write_tiny_mamba

    path = Path(tempfile.mkdtemp(prefix="gguflm-suite-")) / f"tiny-{kind}.gguf"
    if kind == "mamba":
        write_tiny_mamba(TinyMamba(), path, np.random.default_rng(0))
    else:
        write_tiny_hybrid(TinyHybrid(kind, layout="AA"), path, np.random.default_rng(0))
    return path


_TINY = {("QuantFactory/mamba-130m-hf-GGUF", "mamba-130m-hf.Q2_K.gguf"): "mamba",
         ("tiiuae/Falcon-H1-Tiny-90M-Instruct-GGUF", "Falcon-H1-Tiny-90M-Instruct-Q2_K.gguf"): "falcon-h1"}


def _hf_hub_download(repo_id: str, filename: str, **kwargs: object) -> str:
    if (repo_id, filename) in _TINY:
        return str(_tiny_model(_TINY[repo_id, filename]))
    path = _local_models().get((repo_id, filename))
    if path is None or not path.is_file():
        raise FileNotFoundError(f"no local copy of {repo_id}/{filename} (the suite's hub download)")
    return str(path)


def pytest_configure(config: pytest.Config) -> None:
    hub = types.ModuleType("huggingface_hub")
    hub.hf_hub_download = _hf_hub_download
    sys.modules["huggingface_hub"] = hub
    if config.getoption("--backend") == "gguflm":
        import gguflm.llama_cpp as ours

        sys.modules["llama_cpp"] = ours
        for name in ("llama", "llama_types", "llama_chat_format", "llama_speculative", "llama_grammar",
                     "llama_cache", "llama_tokenizer"):
            sys.modules[f"llama_cpp.{name}"] = getattr(ours, name)
        # the C API (llama_cpp._internals, llama_cpp.llama_*) is out of gguflm's scope; test_real_model,
        # which uses it, is the suite's one exclusion (docs/compat.md)
        internals = types.ModuleType("llama_cpp._internals")
        internals.__getattr__ = _no_c_api
        # `import llama_cpp._internals as x` falls back to sys.modules under the module's own name
        sys.modules["llama_cpp._internals"] = sys.modules["gguflm.llama_cpp._internals"] = internals


def _no_c_api(name: str) -> object:
    raise AttributeError(f"llama_cpp._internals.{name}: llama.cpp's C API is not part of gguflm.llama_cpp")
