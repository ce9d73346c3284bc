"""gguflm's context and llama.cpp's side by side through batches, the memory's sequence operations
and state files, checking at every step that the two agree (bit for bit where logits are compared).

Shared by the recurrent, hybrid, delta-net and RWKV tests, whose memories differ but whose
contract with llama.cpp's `llama_memory_*` API is the same.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _llama import LlamaDecoder, import_peer
from gguflm import Batch, Context, Model
from tiny_models import N_VOCAB

L = import_peer("llama_cpp")

Entry = tuple[int, int, int, bool]   # token, position, sequence, output


def random_tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, N_VOCAB, n).tolist()


def decode_entries(ctx: Context, entries: list[Entry]) -> np.ndarray:
    """Decode (token, pos, seq, output) entries as one batch; the outputs' logits, in batch order."""
    batch = Batch(len(entries), n_seq_max=1)
    for tok, pos, seq, out in entries:
        batch.add(tok, pos, [seq], out)
    assert ctx.decode(batch) == 0
    return np.stack([ctx.get_logits_ith(k) for k, e in enumerate(entries) if e[3]])


def interleaved(lengths: list[int], seed: int, start: list[int] | None = None) -> list[Entry]:
    """Tokens of sequences 0, 1, ... of these lengths, interleaved in a shuffled order (each
    sequence's own order kept), every token an output."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(np.repeat(np.arange(len(lengths)), lengths))
    nxt = list(start or [0] * len(lengths))
    entries = []
    for s in order.tolist():
        entries.append((int(rng.integers(3, N_VOCAB)), nxt[s], s, True))
        nxt[s] += 1
    return entries


class MemoryPair:
    """One model opened in gguflm and in llama.cpp with the same context sizes; each call does one
    thing to both and asserts that the answers, the sequences' positions and the logits agree."""

    def __init__(self, path: Path, n_seq: int, n_threads: int = 2) -> None:
        self.n_seq = n_seq
        self.ref = LlamaDecoder(path, n_ctx=256, n_seq_max=n_seq, n_batch=64)
        self.model = Model.load(path)
        self.ctx = Context(self.model, n_ctx=256, n_batch=64, n_seq_max=n_seq, n_threads=n_threads)

    def __enter__(self) -> MemoryPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ctx.close()
        self.model.close()
        self.ref.close()

    def decode(self, entries: list[Entry]) -> None:
        np.testing.assert_array_equal(decode_entries(self.ctx, entries), self.ref.decode_batch(entries))

    def check_positions(self) -> None:
        ours = [(self.ctx.memory.seq_pos_min(s), self.ctx.memory.seq_pos_max(s)) for s in range(self.n_seq)]
        assert ours == [(self.ref.seq_pos_min(s), self.ref.seq_pos_max(s)) for s in range(self.n_seq)]

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        assert self.ctx.memory.seq_rm(seq, p0, p1) == self.ref.seq_rm(seq, p0, p1), (seq, p0, p1)
        self.check_positions()

    def seq_cp(self, src: int, dst: int) -> None:
        self.ctx.memory.seq_cp(src, dst)
        L.llama_memory_seq_cp(self.ref._mem, src, dst, -1, -1)
        self.check_positions()

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.ctx.memory.seq_add(seq, p0, p1, delta)
        self.ref.seq_add(seq, p0, p1, delta)
        self.check_positions()

    def seq_keep(self, seq: int) -> None:
        self.ctx.memory.seq_keep(seq)
        self.ref.seq_keep(seq)
        self.check_positions()


def check_state_saved_in_the_middle(path: Path, tokens: list[int], split: int, state_file: Path) -> None:
    """A whole state and one sequence's state, saved after tokens[:split]: loaded into a fresh
    context, into one that had decoded something else, and (the sequence's) into another sequence,
    the continuation's logits are llama.cpp's uninterrupted run's."""
    ref = LlamaDecoder(path, n_ctx=256, n_threads=2, n_seq_max=2)
    try:
        want = np.concatenate([ref.decode(tokens[:split], 0), ref.decode(tokens[split:], split)])[split:]
    finally:
        ref.close()

    def continuation(seq: int) -> list[Entry]:
        return [(t, split + k, seq, True) for k, t in enumerate(tokens[split:])]

    with Model.load(path) as model:
        with Context(model, n_ctx=256, n_seq_max=2, n_threads=2) as ctx:
            decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(tokens[:split])])
            whole = ctx.state_save(state_file, tokens=tokens[:split])
            seq0 = ctx.state_seq_save(0)
        with Context(model, n_ctx=256, n_seq_max=2, n_threads=2) as ctx:
            assert ctx.state_load(whole) == tokens[:split]
            np.testing.assert_array_equal(decode_entries(ctx, continuation(0)), want)
        with Context(model, n_ctx=256, n_seq_max=2, n_threads=1) as ctx:
            decode_entries(ctx, [(5, 0, 0, True)])
            assert ctx.state_load(state_file) == tokens[:split]
            np.testing.assert_array_equal(decode_entries(ctx, continuation(0)), want)
        with Context(model, n_ctx=256, n_seq_max=2, n_threads=1) as ctx:
            decode_entries(ctx, [(5, 0, 1, True), (6, 1, 1, True)])
            ctx.state_seq_load(seq0, 1)
            # a recurrent state is one cell: the sequence holds the last position only
            assert (ctx.memory.seq_pos_min(1), ctx.memory.seq_pos_max(1)) == (split - 1, split - 1)
            np.testing.assert_array_equal(decode_entries(ctx, continuation(1)), want)


def check_session_file_continues(path: Path, session_file: Path) -> None:
    """gguflm.LLM: a session file continues where it was saved, with llama-cpp-python's greedy
    text; recurrent states cannot be cut back to a shorter prefix."""
    import gguflm
    from gguflm.errors import Error

    with gguflm.LLM(str(path), n_ctx=256, n_threads=2) as llm:
        text = llm.complete("p1 p2 p3", max_tokens=5, temperature=0.0).text
        with pytest.raises(Error, match="recurrent state"):
            llm.session_save(session_file.with_suffix(".cut"), n_tokens=2)
        n = llm.session_save(session_file)
    with gguflm.LLM(str(path), n_ctx=256, n_threads=2) as llm:
        assert llm.session_load(session_file) == n
        assert llm.complete("p1 p2 p3", max_tokens=5, temperature=0.0).text == text
    theirs = L.Llama(str(path), n_ctx=256, n_threads=2, verbose=False)
    try:
        assert theirs.create_completion("p1 p2 p3", max_tokens=5, temperature=0.0)["choices"][0]["text"] == text
    finally:
        theirs.close()
