"""LoRA adapters and control vectors through LLM, gguflm.llama_cpp.Llama and the CLI: llama-cpp-
python's ``lora_path``/``lora_scale`` give llama.cpp's logits and greedy text, and every surface
computes what Context.set_adapters_lora / set_adapter_cvec compute (tests/test_lora.py holds those
to llama.cpp's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import _ggml
import gguflm
from _llama import require_peer
from gguflm.cli import adapter_options, build_parser
from gguflm.control_vector import ControlVectorError
from gguflm.llama_cpp import Llama
from gguflm.lora import LoraAdapter, LoraAdapterError
from gguflm.llm import LLM
from lora_files import write_control_vector, write_lora

TINY = Path(__file__).resolve().parent / "data" / "arch" / "llama.gguf"
CLI = [sys.executable, "-m", "gguflm.cli"]
TOKENS = [1, 40, 77, 300, 5, 9]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    out, rng = tmp_path_factory.mktemp("adapters"), np.random.default_rng(7)
    n_embd = gguflm.Model.load(TINY, vocab_only=True).metadata["llama.embedding_length"]
    return {"a": write_lora(out / "a.gguf", TINY, rng, rank=16, strength=3.0),
            "b": write_lora(out / "b.gguf", TINY, rng, rank=32, strength=3.0, kinds=("attn_v", "ffn_down")),
            "cv1": write_control_vector(out / "cv1.gguf", n_embd, [1], rng, size=6.0),
            "cv2": write_control_vector(out / "cv2.gguf", n_embd, [1], rng, size=6.0)}


def greedy(llm, n: int = 8) -> list[int]:
    """n greedy tokens after TOKENS through Llama.generate (ids: the tiny vocabulary's byte
    pieces detokenize differently in the two libraries, which is not what is tested here)."""
    out = []
    for tok in llm.generate(TOKENS, temp=0.0):
        out.append(tok)
        if len(out) == n:
            return out
    return out


def logits(ctx: gguflm.Context, tokens: list[int]) -> np.ndarray:
    ctx.memory.clear()
    batch = gguflm.Batch(len(tokens))
    for pos, tok in enumerate(tokens):
        batch.add(tok, pos, [0], True)
    assert ctx.decode(batch) == 0
    return ctx.get_logits().copy()


def test_lora_path_gives_llama_cpp_logits_and_text(files):
    """llama-cpp-python's Llama(lora_path=, lora_scale=): its logits to the bit and its greedy tokens."""
    llama_cpp = require_peer()
    theirs = llama_cpp.Llama(str(TINY), lora_path=str(files["a"]), lora_scale=0.7, logits_all=True, n_ctx=256,
                             n_threads=2, verbose=False)
    try:
        theirs.eval(TOKENS)
        their_logits = np.array(theirs.scores[:len(TOKENS)], np.float32)
        theirs.reset()
        their_tokens = greedy(theirs)
    finally:
        theirs.close()
    with _ggml.same_arithmetic():
        with Llama(str(TINY), lora_path=str(files["a"]), lora_scale=0.7, logits_all=True, n_ctx=256, n_threads=2,
                   verbose=False) as ours:
            assert [a.path for a in ours.lora_adapters] == [files["a"]]
            ours.eval(TOKENS)
            np.testing.assert_array_equal(ours.scores[:len(TOKENS)].view(np.uint32), their_logits.view(np.uint32))
            ours.reset()
            assert greedy(ours) == their_tokens
        with LLM(str(TINY), n_ctx=256, n_threads=2, progress=False) as plain:
            assert plain.lora_adapters == []
            assert not np.array_equal(logits(plain.context, TOKENS), their_logits)


def test_llm_adapters_and_control_vectors_are_the_contexts(files):
    """lora_adapters (with lora_path first), control_vectors summed with their strengths over
    control_vector_layer_range: what the Context calls give."""
    with LLM(str(TINY), n_ctx=256, n_threads=1, progress=False, lora_path=str(files["b"]),
             lora_adapters={files["a"]: -0.5}, control_vectors={files["cv1"]: 0.8, files["cv2"]: -1.5},
             control_vector_layer_range=(1, 1)) as llm:
        got = logits(llm.context, TOKENS)
        model = llm.model
        ctx = gguflm.Context(model, n_ctx=256, n_threads=1)
        assert not np.array_equal(logits(ctx, TOKENS), got)
        ctx.set_adapters_lora([LoraAdapter.load(model, files["b"]), LoraAdapter.load(model, files["a"])], [1.0, -0.5])
        from gguflm.control_vector import load_control_vectors
        data, n_embd = load_control_vectors({files["cv1"]: 0.8, files["cv2"]: -1.5})
        ctx.set_adapter_cvec(data, n_embd, 1, 1)
        np.testing.assert_array_equal(logits(ctx, TOKENS), got)
        ctx.set_adapter_cvec(None, 0, 0, 0)   # off: the adapters alone
        assert not np.array_equal(logits(ctx, TOKENS), got)


def test_llm_bad_adapters_raise(files, tmp_path):
    with pytest.raises(LoraAdapterError, match="absent.gguf"):
        LLM(str(TINY), n_ctx=256, progress=False, lora_adapters={tmp_path / "absent.gguf": 1.0})
    wide = write_control_vector(tmp_path / "wide.gguf", 24, [1], np.random.default_rng(0))
    with pytest.raises(ControlVectorError, match="n_embd"):
        LLM(str(TINY), n_ctx=256, progress=False, control_vectors={wide: 1.0})


def test_cli_flags(files):
    """llama.cpp's flags, each repeatable (comma-separated files too), into LLM's arguments."""
    args = build_parser().parse_args(["serve", "--lora", f"{files['a']},{files['b']}", "--lora-scaled", "c.gguf",
                                      "0.25",
                                      "--control-vector-scaled", "cv.gguf", "-2", "--control-vector",
                                      str(files["cv1"]), "--control-vector-layer-range", "3", "5"])
    assert adapter_options(args) == {
        "lora_adapters": {str(files["a"]): 1.0, str(files["b"]): 1.0, "c.gguf": 0.25},
        "control_vectors": {str(files["cv1"]): 1.0, "cv.gguf": -2.0}, "control_vector_layer_range": [3, 5]}
    assert adapter_options(build_parser().parse_args(["chat"])) == {"lora_adapters": {}}
    with pytest.raises(ValueError, match="number"):
        adapter_options(build_parser().parse_args(["run", "--lora-scaled", "a.gguf", "x"]))


def test_cli_run_with_adapters(files):
    """gguflm run --lora-scaled ... --control-vector ...: the text LLM gives with them."""
    flags = ["--lora-scaled", str(files["a"]), "0.7", "--control-vector", str(files["cv1"]),
             "--control-vector-layer-range", "1", "1"]
    done = subprocess.run([*CLI, "run", "-m", str(TINY), "-p", "p1 p2", "-n", "6", "--temp", "0", "-t", "1", "-c",
                           "256",
                           "--no-display-prompt", *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with LLM(str(TINY), n_ctx=256, n_threads=1, progress=False, lora_adapters={files["a"]: 0.7},
             control_vectors={files["cv1"]: 1.0}, control_vector_layer_range=(1, 1)) as llm:
        text = llm.create_completion("p1 p2", max_tokens=6, temperature=0)["choices"][0]["text"]
    with LLM(str(TINY), n_ctx=256, n_threads=1, progress=False) as plain:
        assert plain.create_completion("p1 p2", max_tokens=6, temperature=0)["choices"][0]["text"] != text
    assert done.stdout.strip() == text.strip()
    bad = subprocess.run([*CLI, "run", "-m", str(TINY), "-p", "p1", "-n", "1", "--lora", "absent.gguf"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "absent.gguf" in bad.stderr


def test_memory_estimate_counts_adapters(files):
    """The adapter's matrices as weights, its products in the compute buffers (which the
    planner may fit into gaps below the peak: no smaller, maybe not larger)."""
    base = gguflm.estimate_memory(TINY, n_ctx=256)
    both = gguflm.estimate_memory(TINY, n_ctx=256, lora_adapters=[files["a"], files["b"]])
    with gguflm.Model.load(TINY) as model:
        nbytes = sum(LoraAdapter.load(model, files[k]).nbytes for k in ("a", "b"))
    assert both.weights == base.weights + nbytes
    assert both.compute >= base.compute
    assert (both.kv_cache, both.vocab) == (base.kv_cache, base.vocab)
