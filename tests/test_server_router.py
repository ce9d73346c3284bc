"""`gguflm serve --models-dir` / repeated `-m`: requests pick a model by name, each loaded on first
use, the least recently used unloaded to stay within `--models-max` / `--memory-budget`;
`/v1/models` lists their states in llama-server's router shape; an unknown name gets 404."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
pytest.importorskip("openai")

from _llama import require_peer  # noqa: E402
from gguflm.memory import estimate_memory  # noqa: E402
from gguflm.server import create_app  # noqa: E402
from test_server import KEY, NO_PENALTY, THREADS, Served, sse_events  # noqa: E402

SMOL, GEMMA = "SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m"
MESSAGES = [{"role": "user", "content": "List three colours."}]
PROMPT = "The three primary colours are"
GREEDY = {"temperature": 0, "max_tokens": 8, **NO_PENALTY}
N_CTX, PARALLEL = 512, 2


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, smollm_path, gemma_path):
    d = tmp_path_factory.mktemp("models")
    for path in (smollm_path, gemma_path):
        (d / path.name).symlink_to(path)
    (d / "notes.txt").write_text("not a model")
    return d


@pytest.fixture(scope="module")
def served(models_dir) -> Iterator[Served]:
    s = Served(create_app(models_dir=models_dir, models_max=1, parallel=PARALLEL, n_ctx=N_CTX,
                          api_key=KEY, n_threads=THREADS))
    yield s
    s.close()


def _states(served: Served) -> dict[str, str]:
    status, body = served.json("GET", "/v1/models")
    assert status == 200 and body["object"] == "list"
    return {m["id"]: m["status"]["value"] for m in body["data"]}


def _chat(served: Served, model: str) -> str:
    status, body = served.json("POST", "/v1/completions", {"model": model, "prompt": PROMPT, **GREEDY})
    assert status == 200, body
    assert body["model"] == model
    return body["choices"][0]["text"]


def test_models_load_on_first_use_and_the_least_recent_is_unloaded(served, smollm_path, gemma_path):
    assert _states(served) == {SMOL: "unloaded", GEMMA: "unloaded"}
    status, body = served.json("GET", "/v1/models")
    assert all(m["object"] == "model" and set(m["status"]) >= {"value", "args"} for m in body["data"])
    smol_text = _chat(served, SMOL)
    assert _states(served) == {SMOL: "loaded", GEMMA: "unloaded"}
    gemma_text = _chat(served, GEMMA)
    assert _states(served) == {SMOL: "unloaded", GEMMA: "loaded"}     # --models-max 1
    assert _chat(served, SMOL) == smol_text                         # reloaded, same reply
    llama_cpp = require_peer()
    for path, text in ((smollm_path, smol_text), (gemma_path, gemma_text)):
        ref = llama_cpp.Llama(str(path), n_ctx=N_CTX // PARALLEL, n_threads=THREADS,
                              n_threads_batch=THREADS, type_k=0, type_v=0, verbose=False)
        try:
            assert ref.create_completion(PROMPT, **GREEDY)["choices"][0]["text"] == text
        finally:
            ref.close()


def test_unknown_model_gets_404_with_a_body(served):
    for body in ({"model": "nope", "messages": MESSAGES}, {"messages": MESSAGES}):
        status, error = served.json("POST", "/v1/chat/completions", body)
        assert status == 404 and error["error"]["code"] == "model_not_found"
        assert SMOL in error["error"]["message"]
    status, error = served.json("POST", "/v1/messages", {"model": "nope", "max_tokens": 4,
                                                         "messages": MESSAGES})
    assert status == 404 and error["type"] == "error"          # Anthropic's shape there
    status, props = served.json("GET", f"/props?model={GEMMA}")
    assert status == 200 and props["model_alias"] == GEMMA


def test_a_stream_in_flight_finishes_before_its_model_is_unloaded(served):
    """A request for the other model waits for the running stream (models-max 1) instead of
    cutting it; both answer in full."""
    _chat(served, SMOL)
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": SMOL, "prompt": "Once upon a time", "stream": True, "max_tokens": 24,
         "temperature": 0, "logit_bias": {"2": -100}}),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    response = conn.getresponse()
    first = response.read(1)
    other: dict = {}
    t = threading.Thread(target=lambda: other.update(text=_chat(served, GEMMA)))
    t.start()
    events = sse_events(first + response.read())
    t.join(120)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("length", "stop")
    assert other["text"] and _states(served)[GEMMA] == "loaded"


def test_memory_budget_keeps_the_estimates_within_it(models_dir, smollm_path, gemma_path):
    sizes = [estimate_memory(p, N_CTX, "f32", "f32", n_seq_max=PARALLEL, n_ubatch=512, n_batch=512,
                             kv_unified=False).total for p in (smollm_path, gemma_path)]
    s = Served(create_app(models=[smollm_path, gemma_path], memory_budget=max(sizes) + min(sizes) // 2,
                          parallel=PARALLEL, n_ctx=N_CTX, api_key=KEY, n_threads=THREADS))
    try:
        _chat(s, GEMMA)
        _chat(s, SMOL)
        assert _states(s) == {SMOL: "loaded", GEMMA: "unloaded"}
    finally:
        s.close()
    with pytest.raises(ValueError, match="memory budget"):
        create_app(models_dir=models_dir, memory_budget=min(sizes) - 1, parallel=PARALLEL, n_ctx=N_CTX)
