"""The server's slots on recurrent and hybrid models (a state per slot, as llama-server's): two
requests at once give what each gives alone, and a prompt that extends all a slot's state holds
decodes only the rest (a state is reused only so)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
from gguflm import LLM  # noqa: E402
from gguflm.server import create_app  # noqa: E402
from test_server import NO_PENALTY, Served  # noqa: E402
from tiny_models import TinyHybrid, TinyMamba, write_tiny_hybrid, write_tiny_mamba  # noqa: E402

PROMPTS = ["p1 p2 p3 p4 p5 p6", "p9 p8 p7"]
GREEDY = {"max_tokens": 10, "temperature": 0, **NO_PENALTY}
GREEDY_OPENAI = {"max_tokens": 10, "temperature": 0, "extra_body": NO_PENALTY}


@pytest.fixture(scope="module", params=["mamba2", "falcon-h1"])
def model_path(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("server-recurrent") / f"{request.param}.gguf"
    rng = np.random.default_rng(5)
    if request.param == "mamba2":
        write_tiny_mamba(TinyMamba(arch="mamba2"), path, rng)
    else:
        write_tiny_hybrid(TinyHybrid("falcon-h1", layout="AA"), path, rng)
    return path


def alone(path: Path, prompt: str | list[int]) -> str:
    with LLM(path, n_ctx=256, n_threads=1, type_k="f32", type_v="f32", progress=False) as llm:
        return llm.create_completion(prompt, **GREEDY)["choices"][0]["text"]


def test_slots_keep_a_state_each(model_path):
    expected = [alone(model_path, p) for p in PROMPTS]
    s = Served(create_app(model_path, parallel=2, n_ctx=512, n_threads=1))
    try:
        client = s.client()
        got: dict[int, str] = {}

        def ask(i: int) -> None:
            got[i] = client.completions.create(model="m", prompt=PROMPTS[i], **GREEDY_OPENAI).choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [got[0], got[1]] == expected
        assert max(s.scheduler.stats.batch_tokens) >= 2
        # a prompt that extends all a slot's state holds (one prompt, its one token never decoded):
        # the slot decodes only the rest; token ids, as text would not tokenize back the same
        first = [1, 30, 31, 32, 33]
        client.completions.create(model="m", prompt=first, max_tokens=1, temperature=0)
        cached_before = s.scheduler.stats.prompt_tokens_cached
        follow = first + [40, 41, 42]
        reply = client.completions.create(model="m", prompt=follow, **GREEDY_OPENAI).choices[0].text
        assert reply == alone(model_path, follow)
        assert s.scheduler.stats.prompt_tokens_cached - cached_before == len(first)
    finally:
        s.close()
