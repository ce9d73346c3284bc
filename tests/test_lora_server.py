"""The server's LoRA adapters, as llama.cpp's server: listed at GET /lora-adapters, their default
scales set with POST /lora-adapters, a request's ``lora`` for that request only; requests with
different adapters in flight together each give what they give alone."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
from gguflm import LLM  # noqa: E402
from gguflm.server import create_app  # noqa: E402
from lora_files import write_lora  # noqa: E402
from test_server import KEY, Served  # noqa: E402

TINY = Path(__file__).resolve().parent / "data" / "arch" / "llama.gguf"
PROMPT = "p1 p2 p3 p4"
GREEDY = {"temperature": 0, "max_tokens": 12, "repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[Path]:
    out, rng = tmp_path_factory.mktemp("server-lora"), np.random.default_rng(11)
    return [write_lora(out / "a.gguf", TINY, rng, rank=16, strength=4.0),
            write_lora(out / "b.gguf", TINY, rng, rank=32, strength=4.0, kinds=("attn_q", "ffn_up"))]


@pytest.fixture(scope="module")
def served(adapters) -> Iterator[Served]:
    s = Served(create_app(TINY, parallel=2, n_ctx=512, api_key=KEY, n_threads=1,
                          lora_adapters={adapters[0]: 1.0, adapters[1]: 0.5}))
    yield s
    s.close()


def alone(adapters: list[Path], scales: list[float]) -> str:
    """The greedy text of PROMPT with these adapter scales in an LLM of its own (the server's cache type)."""
    with LLM(TINY, n_ctx=256, n_threads=1, type_k="f32", type_v="f32", progress=False,
             lora_adapters={p: s for p, s in zip(adapters, scales) if s}) as llm:
        return llm.create_completion(PROMPT, **GREEDY)["choices"][0]["text"]


def post(served: Served, body: object) -> tuple[int, dict]:
    return served.json("POST", "/lora-adapters", json.dumps(body).encode())


def complete(served: Served, **extra) -> str:
    status, body = served.json("POST", "/v1/completions", {"prompt": PROMPT, **GREEDY, **extra})
    assert status == 200, body
    return body["choices"][0]["text"]


def test_requests_with_different_adapters_in_flight_together(served, adapters):
    sets = [[1.0, 0.0], [0.0, 0.7], [0.0, 0.0]]
    expected = [alone(adapters, s) for s in sets]
    assert len(set(expected)) == 3, "the adapters should change the text"
    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = complete(served, lora=[{"id": k, "scale": s} for k, s in enumerate(sets[i]) if s])

    steps = served.scheduler.stats.steps
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [results[i] for i in range(len(sets))] == expected
    assert served.scheduler.stats.steps > steps
    # no lora: the server's scales (1.0, 0.5)
    assert complete(served) == alone(adapters, [1.0, 0.5])


def test_get_and_post_lora_adapters(served, adapters):
    status, listed = served.json("GET", "/lora-adapters")
    assert status == 200
    assert [(e["id"], e["path"], e["scale"]) for e in listed] == [
        (0, str(adapters[0]), 1.0), (1, str(adapters[1]), 0.5)]
    try:
        assert post(served, [{"id": 1, "scale": 0.25}]) == (200, {"success": True})
        status, listed = served.json("GET", "/lora-adapters")
        assert [e["scale"] for e in listed] == [0.0, 0.25]      # the ones not named: 0
        assert complete(served) == alone(adapters, [0.0, 0.25])
    finally:
        post(served, [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])
    for bad in ([{"id": 2, "scale": 1.0}], [{"scale": 1.0}], {"id": 0}):
        status, body = post(served, bad)
        assert status == 400, body
    status, body = served.json("POST", "/v1/completions", {"prompt": PROMPT, "lora": [{"id": 7, "scale": 1}]})
    assert status == 400 and body["error"]["param"] == "lora"
