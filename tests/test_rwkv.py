"""RWKV-6 and RWKV-7 against llama.cpp (through llama-cpp-python) on tiny random models.

Every comparison is bit for bit, as Mamba's (tests/test_recurrent.py): the logits of every
position, the whole prompt at once and one token at a time, at 1 and 2 threads, several sequences
in one batch (equal-split ubatches of several sequences and of one, some of one token), after the
memory's sequence operations, and after a state saved in the middle and restored.
"""

from __future__ import annotations

import numpy as np
import pytest

from _llama import LlamaDecoder, import_peer
from _memory_pair import MemoryPair, check_state_saved_in_the_middle, decode_entries, interleaved, random_tokens
from gguflm import Context, Model
from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from tiny_models import TinyRwkv, write_tiny_rwkv

L = import_peer("llama_cpp")

SPECS = {
    "rwkv6": TinyRwkv(rescale_every_n_layers=1),
    "rwkv6_mixed": TinyRwkv(n_embd=128, n_layer=3, head_size=64, n_ff=256,
                            types={"token_embd": GGMLType.Q8_0, "time_mix": GGMLType.Q4_0,
                                   "channel_mix": GGMLType.Q5_1, "output": GGMLType.Q4_1, "lora": GGMLType.F32}),
    "rwkv7": TinyRwkv(arch="rwkv7", n_embd=128, head_size=64, n_ff=256),
    "rwkv7_mixed": TinyRwkv(arch="rwkv7", n_embd=128, n_layer=3, head_size=64, n_ff=256,
                            types={"token_embd": GGMLType.Q5_0, "time_mix": GGMLType.Q8_0,
                                   "channel_mix": GGMLType.IQ4_NL, "output": GGMLType.Q4_0, "lora": GGMLType.F32}),
    "arwkv7": TinyRwkv(arch="arwkv7", n_embd=128, head_size=64, n_ff=256,
                       types={"time_mix": GGMLType.Q4_0, "channel_mix": GGMLType.Q8_0}),
    "arwkv7_no_gate": TinyRwkv(arch="arwkv7", n_embd=128, n_layer=3, head_size=64, n_ff=256, gate=False),
    "rwkv6qwen2": TinyRwkv(arch="rwkv6qwen2", n_embd=128, head_size=32, n_ff=256, n_head_kv=2,
                           types={"time_mix": GGMLType.Q8_0, "channel_mix": GGMLType.Q4_1}),
}

# each architecture at 1 and at 2-4 threads, in ubatches of several sequences and of one
N_THREADS = {"rwkv6": 1, "rwkv6_mixed": 2, "rwkv7": 4, "rwkv7_mixed": 1, "arwkv7": 3, "arwkv7_no_gate": 1,
             "rwkv6qwen2": 2}
N_UBATCH = {"rwkv6": 3, "rwkv6_mixed": 64, "rwkv7": 64, "rwkv7_mixed": 3, "arwkv7": 3, "arwkv7_no_gate": 64,
            "rwkv6qwen2": 3}


@pytest.fixture(scope="module", params=list(SPECS))
def rwkv(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("rwkv") / f"{request.param}.gguf"
    write_tiny_rwkv(SPECS[request.param], path, np.random.default_rng(len(request.param)))
    return path


def test_prompt_and_steps_equal_llama(rwkv) -> None:
    """Every position's logits: a prompt in ubatches of 5, then one token at a time."""
    tokens, n_threads = random_tokens(17, 1), N_THREADS[rwkv.stem]
    ref = LlamaDecoder(rwkv, n_ctx=256, n_threads=n_threads, n_batch=64, n_ubatch=5)
    try:
        want = np.concatenate([ref.decode(tokens[:11], 0)] + [ref.decode([t], 11 + k) for k, t in enumerate(tokens[11:])])
    finally:
        ref.close()
    with Model.load(rwkv) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=5, n_threads=n_threads,
                                            n_threads_batch=n_threads) as ctx:
        got = [decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(tokens[:11])])]
        got += [decode_entries(ctx, [(t, 11 + k, 0, True)]) for k, t in enumerate(tokens[11:])]
    np.testing.assert_array_equal(np.concatenate(got), want)


def test_several_sequences_equal_llama(rwkv) -> None:
    """Three sequences of unequal lengths (one of a single token) interleaved in one batch, then a
    step of each in one batch."""
    n_ubatch = N_UBATCH[rwkv.stem]
    first = interleaved([6, 1, 4], 2)
    step = [(t, p, s, True) for t, p, s in ((11, 6, 0), (12, 1, 1), (13, 4, 2))]
    ref = LlamaDecoder(rwkv, n_ctx=256, n_seq_max=3, n_batch=64, n_ubatch=n_ubatch)
    try:
        want = [ref.decode_batch(first), ref.decode_batch(step)]
    finally:
        ref.close()
    with Model.load(rwkv) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=n_ubatch, n_seq_max=3,
                                            n_threads=2) as ctx:
        got = [decode_entries(ctx, first), decode_entries(ctx, step)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.fixture(scope="module", params=["rwkv6", "rwkv7"])
def rwkv_small(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("rwkv") / f"{request.param}_small.gguf"
    write_tiny_rwkv(SPECS[request.param], path, np.random.default_rng(5))
    return path


def test_sequence_operations_equal_llama(rwkv_small) -> None:
    """seq_rm's answers (a partial range refused, a whole sequence dropped), then seq_cp and
    seq_keep: the positions and the logits that follow, as llama.cpp's."""
    with MemoryPair(rwkv_small, n_seq=3) as both:
        both.decode(interleaved([5, 3, 1], 5))
        for seq, p0, p1 in ((0, 2, -1), (1, 0, -1), (2, 1, -1)):
            both.seq_rm(seq, p0, p1)
        both.decode([(40, 0, 1, True), (41, 1, 1, True)])           # sequence 1 dropped: starts afresh
        both.seq_cp(0, 2)
        both.decode([(50, 5, 0, True), (51, 5, 2, True), (52, 6, 2, True), (53, 6, 0, True)])   # both go on from the copy
        both.seq_keep(2)
        both.decode([(60, 7, 2, True)])


def test_state_saved_in_the_middle_continues(rwkv_small, tmp_path) -> None:
    """A whole state, and one sequence's state put into another sequence, saved after a prompt
    and restored into fresh contexts: the continuation is llama.cpp's uninterrupted run."""
    check_state_saved_in_the_middle(rwkv_small, random_tokens(12, 7), 8, tmp_path / "state.bin")


def test_rwkv7_head_size_refused(tmp_path) -> None:
    """RWKV-7 heads must be whole steps of ggml's wkv7 loops (64 floats): a clear error otherwise."""
    path = tmp_path / "rwkv7_h32.gguf"
    write_tiny_rwkv(TinyRwkv(arch="rwkv7", n_embd=64, head_size=32), path, np.random.default_rng(0))
    with pytest.raises(ModelLoadError, match="head_size 32"):
        Model.load(path)


def test_llm_greedy_text_equals_llama(tmp_path) -> None:
    """gguflm.llama_cpp.Llama on an RWKV-7 with RWKV's own tokenizer: recurrent, and its greedy
    tokens (prompts reusing the state's prefix or not) and their bytes are llama-cpp-python's."""
    from gguflm.llama_cpp import Llama

    path = tmp_path / "rwkv7_vocab.gguf"
    write_tiny_rwkv(TinyRwkv(arch="rwkv7", n_embd=128, head_size=64, n_ff=256, vocab="rwkv"), path,
                    np.random.default_rng(11))
    theirs = L.Llama(str(path), n_ctx=256, n_threads=2, verbose=False)
    ours = Llama(str(path), n_ctx=256, n_threads=2, verbose=False)
    try:
        assert ours._is_recurrent and not ours._is_hybrid
        for prompt in (b"hello the", b"hello the abc", b"You where\n\n"):
            tokens = theirs.tokenize(prompt, add_bos=False)
            assert ours.tokenize(prompt, add_bos=False) == tokens
            runs = []
            for llm in (theirs, ours):
                gen = llm.generate(tokens, temp=0.0, reset=True)
                runs.append([next(gen) for _ in range(8)])
            assert runs[0] == runs[1]
            assert ours.detokenize(runs[0]) == theirs.detokenize(runs[0])
    finally:
        theirs.close()
        ours.close()
