"""`gguflm serve`'s slots: `GET /slots`, `POST /slots/{id}?action=save|restore|erase` with
`--slot-save-path` (a restored slot continues as if never saved, and as llama.cpp's greedy reply),
file names refused as llama.cpp refuses them, and `--cache-reuse`'s KV shifting, replayed on
llama.cpp's memory to the same logits and cell positions."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
pytest.importorskip("openai")

from _llama import LlamaDecoder, require_peer  # noqa: E402
from gguflm import LLM  # noqa: E402
from gguflm.batch import Batch  # noqa: E402
from gguflm.generate import Session  # noqa: E402
from gguflm.server import create_app  # noqa: E402
from gguflm.server.cache_reuse import keep_cached  # noqa: E402
from gguflm.server.slots import valid_filename  # noqa: E402
from test_server import KEY, NO_PENALTY, THREADS, Served  # noqa: E402

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0, "max_tokens": 8, **NO_PENALTY}


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots") / "saved"


@pytest.fixture(scope="module")
def served(smollm_path, save_dir) -> Iterator[Served]:
    s = Served(create_app(smollm_path, parallel=2, n_ctx=1024, api_key=KEY, n_threads=THREADS,
                          slot_save_path=save_dir, cache_reuse=4))
    yield s
    s.close()


def _complete(served: Served, prompt: str) -> str:
    return _choice(served, prompt)["text"]


def _choice(served: Served, prompt: str) -> dict:
    status, body = served.json("POST", "/v1/completions", {"prompt": prompt, **GREEDY})
    assert status == 200, body
    return body["choices"][0]


def _slots(served: Served) -> list[dict]:
    status, body = served.json("GET", "/slots")
    assert status == 200
    return body


def test_slots_list_each_slot_in_llama_servers_shape(served):
    for slot in _slots(served):     # before any request: no task yet
        assert set(slot) == {"id", "n_ctx", "speculative", "is_processing"}
    choice = _choice(served, "Name a colour:")
    listed = _slots(served)
    assert [s["id"] for s in listed] == [0, 1] and all(s["n_ctx"] == 512 for s in listed)
    used = [s for s in listed if "id_task" in s]
    assert len(used) >= 1 and not any(s["is_processing"] for s in listed)
    last = max(used, key=lambda s: s["id_task"])
    vocab = served.app.state.server.llm.model.vocab
    prompt_tokens = vocab.tokenize("Name a colour:", add_special=True, parse_special=True)
    assert last["prompt"] == vocab.detokenize(prompt_tokens, unparse_special=True)
    assert last["generated"] == choice["text"]
    step = last["next_token"][0]
    assert not step["has_next_token"] and step["n_remain"] == GREEDY["max_tokens"] - step["n_decoded"]
    # the cache holds the prompt and the reply, but for a reply cut at its length the last
    # token (sampled, never decoded)
    cut = choice["finish_reason"] == "length"
    assert step["n_decoded"] == GREEDY["max_tokens"] or not cut
    assert last["n_prompt_tokens"] == len(prompt_tokens) + step["n_decoded"] - cut
    assert last["n_prompt_tokens_processed"] + last["n_prompt_tokens_cache"] == len(prompt_tokens)


def test_restored_slot_continues_as_if_never_saved(served, save_dir, smollm_path):
    first = _complete(served, PROMPT)
    slot = max((s for s in _slots(served) if "id_task" in s), key=lambda s: s["id_task"])
    n_cached = slot["n_prompt_tokens"]
    status, saved = served.json("POST", f"/slots/{slot['id']}?action=save", {"filename": "fr.slot"})
    assert status == 200 and saved["n_saved"] == n_cached and saved["filename"] == "fr.slot"
    assert saved["n_written"] == (save_dir / "fr.slot").stat().st_size > 0

    follow = PROMPT + first + " The capital of Italy is"
    kept = _complete(served, follow)                  # on the cache, never saved
    reused = max(_slots(served), key=lambda s: s.get("id_task", -1))["n_prompt_tokens_cache"]
    assert len(served.app.state.server.llm.tokenize(PROMPT.encode())) < reused <= n_cached

    for s in _slots(served):                         # forget everything, then bring it back
        status, erased = served.json("POST", f"/slots/{s['id']}?action=erase")
        assert status == 200 and erased["id_slot"] == s["id"]
    assert all(s["n_prompt_tokens"] == 0 for s in _slots(served) if "id_task" in s)
    other = 1 - slot["id"]                            # any slot takes it
    status, restored = served.json("POST", f"/slots/{other}?action=restore", {"filename": "fr.slot"})
    assert status == 200 and restored["n_restored"] == n_cached and restored["id_slot"] == other
    assert restored["n_read"] == saved["n_written"]

    again = _complete(served, follow)
    last = max(_slots(served), key=lambda s: s.get("id_task", -1))
    assert last["id"] == other and last["n_prompt_tokens_cache"] == reused
    assert again == kept

    llama_cpp = require_peer()
    ref = llama_cpp.Llama(str(smollm_path), n_ctx=512, n_threads=THREADS, n_threads_batch=THREADS,
                          type_k=0, type_v=0, verbose=False)
    try:
        assert ref.create_completion(PROMPT, **GREEDY)["choices"][0]["text"] == first
        assert ref.create_completion(follow, **GREEDY)["choices"][0]["text"] == kept
    finally:
        ref.close()


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "", "x\\y", "trail.", " lead",
                                  "a\x00b", "a:b", "x" * 256, 7, None])
def test_bad_file_names_are_refused(served, save_dir, name):
    assert not valid_filename(name)
    for action in ("save", "restore"):
        body = {} if name is None else {"filename": name}
        status, error = served.json("POST", f"/slots/0?action={action}", body)
        assert status == 400 and error["error"]["message"] == "Invalid filename"
    assert not (save_dir.parent / "escape").exists()


def test_slot_action_errors(served, save_dir, smollm_path):
    assert valid_filename("ok-name_1.bin") and valid_filename("été")
    for path, status, param in [("/slots/9?action=erase", 400, "id_slot"),
                                ("/slots/x?action=erase", 400, "id_slot"),
                                ("/slots/0?action=dump", 400, "action"),
                                ("/slots/0", 400, "action")]:
        code, error = served.json("POST", path, {"filename": "a"})
        assert (code, error["error"]["param"]) == (status, param)
    status, error = served.json("POST", "/slots/0?action=restore", {"filename": "missing"})
    assert status == 404 and "missing" in error["error"]["message"]
    (save_dir / "junk").write_bytes(b"not a state")
    status, error = served.json("POST", "/slots/0?action=restore", {"filename": "junk"})
    assert status == 400 and error["error"]["message"].startswith("Unable to restore slot")
    assert _complete(served, PROMPT)           # the server keeps serving
    status, _ = served.json("POST", "/slots/0?action=erase", key=None)
    assert status == 401
    plain = Served(create_app(smollm_path, parallel=1, n_ctx=256, api_key=KEY, n_threads=THREADS))
    try:
        status, error = plain.json("POST", "/slots/0?action=save", {"filename": "a"})
        assert status == 501 and "--slot-save-path" in error["error"]["message"]
        assert plain.json("GET", "/slots")[0] == 200
    finally:
        plain.close()


def test_cache_reuse_shifts_chunks_as_llama_cpp(smollm_path, monkeypatch):
    """A cached A+B+C and a prompt A+C+D: C's cells move back by len(B) (seq_rm + seq_add, as
    llama-server), only D is decoded, and the logits after it and the cells' positions equal
    llama.cpp's after the same memory operations."""
    with LLM(smollm_path, n_ctx=512, n_threads=THREADS, type_k="f32", type_v="f32",
             progress=False) as llm:
        tok = llm.tokenize
        a, b = tok(b"The quick brown fox"), tok(b" (a small animal)", add_bos=False)
        c = tok(b" jumps over the lazy dog near the river bank", add_bos=False)
        d = tok(b" and then it", add_bos=False)
        cached, prompt = a + b + c, a + c + d
        session = Session(llm.context)
        session.ingest(cached)
        ops: list[tuple] = []
        memory = llm.context.memory
        for name in ("seq_rm", "seq_add"):
            real = getattr(memory, name)
            monkeypatch.setattr(memory, name, lambda *args, _f=real, _n=name: (ops.append((_n, *args)), _f(*args))[1])
        n_past = keep_cached(session, prompt, n_cache_reuse=len(c))
        assert n_past == len(a) + len(c) and session.tokens == prompt[:n_past]
        assert ("seq_add", 0, len(a + b), len(a + b + c), -len(b)) in ops
        ours_pos = (memory.seq_pos_min(0), memory.seq_pos_max(0))
        rest = prompt[n_past:]
        batch = Batch(len(rest))
        for k, t in enumerate(rest):
            batch.add(t, n_past + k, [0], k == len(rest) - 1)
        assert llm.context.decode(batch) == 0
        ours = llm.context.get_logits_ith(-1).copy()

    peer = LlamaDecoder(smollm_path, n_ctx=512, type_k=0, type_v=0, n_threads=THREADS)
    try:
        peer.decode(cached, 0)
        for name, *args in ops:
            getattr(peer, name)(*args)
        assert (peer.seq_pos_min(0), peer.seq_pos_max(0)) == ours_pos
        theirs = peer.decode(rest, n_past)[-1]
    finally:
        peer.close()
    np.testing.assert_array_equal(ours, theirs)
