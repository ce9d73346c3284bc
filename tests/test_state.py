"""Saved states and session files: the whole memory or one sequence's, with the tokens they hold.

As llama.cpp restores them: a whole state puts each region's cells back from its first cell on and
its head there; a sequence's state goes where a batch of its positions would (after the sequence's
old cells are freed). Cell indices decide the lanes of attention's float sums, so the logits after
a restore are llama.cpp's only if the cells land where llama.cpp puts them: checked bit for bit
against llama.cpp's own ``llama_state_*`` on a real model. A file of another model, truncated or
corrupt, raises and leaves the context as it was; a new process continues from a session file as
the first would have.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _llama import L, LlamaDecoder, require_peer
from gguflm import LLM, Batch, Context, Model
from gguflm.errors import StateError

ARCH_DIR = Path(__file__).resolve().parent / "data" / "arch"


def _batch(entries) -> Batch:
    b = Batch(len(entries), n_seq_max=1)
    for tok, pos, seq, out in entries:
        b.add(int(tok), pos, [seq], out)
    return b


def _prompt(tokens, seq=0, start=0):
    return [(int(t), start + i, seq, i == len(tokens) - 1) for i, t in enumerate(tokens)]


@pytest.fixture(scope="module")
def tiny():
    model = Model.load(ARCH_DIR / "gemma3.gguf")   # two caches: global layers and a window
    yield model
    model.close()


def test_files_carry_their_tokens_and_bad_ones_change_nothing(tiny, llama_model_path, tmp_path):
    rng = np.random.default_rng(0)
    with Context(tiny, n_ctx=256, n_seq_max=2) as ctx:
        ctx.decode(_batch(_prompt(rng.integers(3, 200, 20))))
        ctx.decode(_batch(_prompt(rng.integers(3, 200, 9), seq=1)))
        path = tmp_path / "session.bin"
        saved = ctx.state_save(path, tokens=[7, 8, 9])
        assert path.read_bytes() == saved and ctx.state_load(path) == [7, 8, 9]
        seq_state = ctx.state_seq_save(1, tokens=[4])
        before = ctx.state_save()
        other = Model.load(llama_model_path)
        with other, Context(other, n_ctx=256, n_seq_max=2) as foreign:
            foreign.decode(_batch(_prompt([5, 6])))
            wrong_model = foreign.state_save()
        bad = {"garbage": b"not a state", "truncated": saved[: len(saved) // 2], "another model": wrong_model,
               "a sequence's state": seq_state, "missing file": tmp_path / "nothing.bin"}
        for what, source in bad.items():
            with pytest.raises(StateError):
                ctx.state_load(source)
            assert ctx.state_save() == before, what          # cells, rows, heads and outputs as they were
        with pytest.raises(StateError):
            ctx.state_seq_load(saved, 0)                      # a whole state is not a sequence's
        with pytest.raises(StateError):
            ctx.state_seq_load(seq_state[:100], 0)
        assert ctx.state_save() == before
        assert ctx.state_seq_load(seq_state, 0) == [4]        # into another sequence
        assert ctx.memory.seq_pos_max(0) == 8 and ctx.memory.seq_pos_max(1) == 8


@pytest.fixture(scope="module")
def llama_model_path():
    return ARCH_DIR / "llama.gguf"


def _llama_state(peer: LlamaDecoder, seq: int | None = None) -> bytes:
    if seq is None:
        size = L.llama_state_get_size(peer._ctx)
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_get_data(peer._ctx, buf, size)
    else:
        size = L.llama_state_seq_get_size(peer._ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_seq_get_data(peer._ctx, buf, size, seq)
    return bytes(buf[:n])


def _llama_restore(peer: LlamaDecoder, data: bytes, seq: int | None = None) -> None:
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    if seq is None:
        assert L.llama_state_set_data(peer._ctx, buf, len(data)) == len(data)
    else:
        assert L.llama_state_seq_set_data(peer._ctx, buf, len(data), seq) == len(data)


@pytest.mark.parametrize("cache_type", [0, 1], ids=["f32", "f16"])
def test_restored_cells_give_llama_cpps_logits(smollm_path, cache_type):
    """A cache with a hole (an unrelated prompt's cells freed in the middle), saved whole and
    restored (its cells come back from cell 0), and one sequence saved and restored into another
    (its cells where a batch of its positions goes): the next steps' logits, bit for bit, are
    llama.cpp's after its own restores."""
    require_peer()
    rng = np.random.default_rng(4)
    a, b, c = (list(rng.integers(3, 40000, n)) for n in (21, 33, 17))
    kinds = {0: "f32", 1: "f16"}
    model = Model.load(smollm_path)
    peer = LlamaDecoder(smollm_path, n_ctx=512, n_batch=256, type_k=cache_type, type_v=cache_type, n_seq_max=3)
    ctx = Context(model, n_ctx=512, n_batch=256, n_ubatch=256, n_seq_max=3, type_k=kinds[cache_type],
                  type_v=kinds[cache_type], n_threads=2)

    def both(entries):
        ours = ctx.decode(_batch(entries)) == 0 and np.stack(
            [ctx.get_logits_ith(i) for i, e in enumerate(entries) if e[3]])
        theirs = peer.decode_batch(entries)
        assert (ours.view(np.uint32) == theirs.view(np.uint32)).all(), np.abs(ours - theirs).max()

    try:
        both(_prompt(a, seq=0))
        both(_prompt(b, seq=1))
        both(_prompt(c, seq=2))
        for s in (0, 2):                           # steps of sequences 0 and 2 after the others
            both([(11, len(a) if s == 0 else len(c), s, True)])
        ctx.memory.seq_rm(1, -1, -1)               # a hole where sequence 1 was
        peer.seq_rm(1, -1, -1)
        ours_whole, theirs_whole = ctx.state_save(), _llama_state(peer)
        ours_seq, theirs_seq = ctx.state_seq_save(2), _llama_state(peer, 2)
        ctx.memory.clear()
        L.llama_memory_clear(peer._mem, True)
        ctx.state_load(ours_whole)
        _llama_restore(peer, theirs_whole)
        both([(12, len(a) + 1, 0, True), (13, len(c) + 1, 2, True)])
        ctx.state_seq_load(ours_seq, 1)            # sequence 2 again, as sequence 1
        _llama_restore(peer, theirs_seq, 1)
        both([(14, len(c) + 1, 1, True)])
    finally:
        peer.close()
        ctx.close()
        model.close()


_CONTINUE = """
import json, sys
import gguflm
llm = gguflm.LLM(sys.argv[1], n_ctx=512, n_threads=2, progress=False)
assert llm.session_load(sys.argv[2]) > 0
out = llm.create_completion(json.loads(sys.argv[3]), max_tokens=12, logprobs=3, **json.loads(sys.argv[4]))
print(json.dumps([out["choices"][0]["text"], out["choices"][0]["logprobs"]["token_logprobs"], out["usage"]]))
"""


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 42}],
                         ids=["greedy", "seeded"])
def test_a_new_process_continues_from_a_session_file(real_model_path, sampling, tmp_path):
    """A request, its session saved; a second request after it in this process, and the same
    second request in a new process that loaded the file: the same text and log-probabilities,
    and the new process decoded only what the file did not hold."""
    import json

    first = "The three primary colours are"
    with LLM(real_model_path, n_ctx=512, n_threads=2, progress=False) as llm:
        reply = llm.create_completion(first, max_tokens=10, **sampling)["choices"][0]["text"]
        second = first + reply + " And the secondary ones are"
        assert llm.session_save(tmp_path / "s.bin") > 0
        here = llm.create_completion(second, max_tokens=12, logprobs=3, **sampling)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    run = subprocess.run([sys.executable, "-c", _CONTINUE, str(real_model_path), str(tmp_path / "s.bin"),
                          json.dumps(second), json.dumps(sampling)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    text, logprobs, usage = json.loads(run.stdout)
    assert text == here["choices"][0]["text"]
    assert logprobs == here["choices"][0]["logprobs"]["token_logprobs"]
    assert usage == here["usage"]


def test_run_reuses_its_prompt_cache(smollm_path, tmp_path):
    cache = tmp_path / "prompt.cache"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    args = [sys.executable, "-m", "gguflm.cli", "run", "-m", str(smollm_path), "-c", "512", "-n", "4",
            "--temp", "0", "--prompt-cache", str(cache), "-p"]
    prompt = "The history of the printing press begins in the fifteenth century, when"
    runs = [subprocess.run(args + [p], capture_output=True, text=True, env=env, timeout=600)
            for p in (prompt, prompt + " Gutenberg")]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert cache.is_file() and "prompt cache" not in runs[0].stderr
    n_cached = int(runs[1].stderr.split("prompt cache")[1].split(":")[1].split("tokens")[0])
    assert n_cached > 10 and f"{n_cached} cached" in runs[1].stderr   # the whole first prompt reused
    corrupt = tmp_path / "corrupt.cache"
    corrupt.write_bytes(cache.read_bytes()[:500])
    bad = subprocess.run(args[:-3] + ["--prompt-cache", str(corrupt), "-p", prompt], capture_output=True,
                         text=True, env=env, timeout=600)
    assert bad.returncode != 0 and "state" in bad.stderr and "Traceback" not in bad.stderr
