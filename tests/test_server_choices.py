"""`n > 1` and `best_of` on `gguflm serve`, through the official `openai` client.

The choices of one request share its prompt's cells (the parent slot reads the prompt, the
others get a copy, as llama-server's `n_cmpl`): each choice must be what a single request with
its seed (the request's seed + its index, llama-server's) gives, streamed or not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
openai = pytest.importorskip("openai")

from gguflm import LLM  # noqa: E402
from gguflm.server import create_app  # noqa: E402
from test_server import KEY, MESSAGES, NO_PENALTY, THREADS, Served, sse_events  # noqa: E402

SAMPLED = {"temperature": 0.9, "max_tokens": 12, "seed": 1234}


@pytest.fixture(scope="module")
def served(smollm_path) -> Iterator[Served]:
    s = Served(create_app(smollm_path, parallel=3, n_ctx=1536, api_key=KEY, n_threads=THREADS))
    yield s
    s.close()


@pytest.mark.parametrize("model", ["smollm_path", "gemma_path"])
def test_n3_chat_choices_equal_single_seeded_requests(model, request):
    """Each choice against a single request with its seed on an idle engine: LLM with a slot's
    context and the server's f32 cache, reset before each (its prompt decoded alone, as the
    choices' parent decodes it)."""
    path = request.getfixturevalue(model)
    s = Served(create_app(path, parallel=3, n_ctx=1536, api_key=KEY, n_threads=THREADS))
    try:
        reply = s.client().chat.completions.create(model="m", messages=MESSAGES, n=3,
                                                   extra_body=NO_PENALTY, **SAMPLED)
        # the prompt was decoded once for the three choices
        assert s.scheduler.stats.prompt_tokens == reply.usage.prompt_tokens
    finally:
        s.close()
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) > 1                       # the seeds differ, so do the choices
    with LLM(path, n_ctx=512, n_threads=THREADS, type_k="f32", type_v="f32", progress=False) as llm:
        singles = []
        for i in range(3):
            llm.reset()
            singles.append(llm.create_chat_completion(MESSAGES, **{**SAMPLED, "seed": SAMPLED["seed"] + i}))
    assert texts == [single["choices"][0]["message"]["content"] for single in singles]
    assert reply.usage.completion_tokens == sum(single["usage"]["completion_tokens"] for single in singles)
    assert reply.usage.prompt_tokens == singles[0]["usage"]["prompt_tokens"]


def test_n3_greedy_choices_equal_the_greedy_reply(served):
    client = served.client()
    greedy = client.chat.completions.create(model="m", messages=MESSAGES, n=3, temperature=0,
                                            max_tokens=12)
    alone = client.chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=12)
    assert [c.message.content for c in greedy.choices] == [alone.choices[0].message.content] * 3


def test_n2_completion_streamed_equals_unstreamed(served):
    client = served.client()
    no_end = {"logit_bias": {str(served.app.state.server.llm.token_eos()): -100}}
    whole = client.completions.create(model="m", prompt="Once upon a time", n=2, extra_body=no_end,
                                      **SAMPLED)
    texts, order = ["", ""], []
    usage = None
    for chunk in client.completions.create(model="m", prompt="Once upon a time", n=2, stream=True,
                                           stream_options={"include_usage": True}, extra_body=no_end,
                                           **SAMPLED):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            order.append(choice.index)
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens == 2 * SAMPLED["max_tokens"]
    assert order != sorted(order)       # the choices stream side by side


def test_best_of_returns_the_choice_with_the_best_mean_logprob(served, smollm_path):
    client = served.client()
    prompt, args = "My favourite animal is", {"temperature": 1.0, "max_tokens": 8, "seed": 77}
    with LLM(smollm_path, n_ctx=512, n_threads=THREADS, type_k="f32", type_v="f32", progress=False) as llm:
        candidates = []
        for i in range(3):       # each alone, as the choices' parent reads the prompt
            llm.reset()
            candidates.append(llm.create_completion(prompt, logprobs=0, **{**args, "seed": 77 + i})["choices"][0])
    means = [sum(c["logprobs"]["token_logprobs"]) / len(c["logprobs"]["token_logprobs"]) for c in candidates]
    ranked = sorted(range(3), key=lambda i: -means[i])
    best = client.completions.create(model="m", prompt=prompt, best_of=3, extra_body=NO_PENALTY, **args)
    assert best.choices[0].text == candidates[ranked[0]]["text"]
    assert best.choices[0].logprobs is None
    assert best.usage.completion_tokens == sum(len(c["logprobs"]["tokens"]) for c in candidates)
    two = client.completions.create(model="m", prompt=prompt, n=2, best_of=3, logprobs=0,
                                    extra_body=NO_PENALTY, **args)
    assert [c.text for c in two.choices] == [candidates[i]["text"] for i in ranked[:2]]
    assert two.choices[0].logprobs.token_logprobs == candidates[ranked[0]]["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("body,param", [({"n": 4}, "n"), ({"n": 0}, "n"),
                                        ({"best_of": 2, "stream": True}, "best_of")])
def test_too_many_choices_get_400(served, body, param):
    status, error = served.json("POST", "/v1/completions", {"prompt": "Hi", **body})
    assert status == 400 and error["error"]["param"] == param


def test_a_cancelled_n3_stream_frees_every_slot(served):
    import http.client
    import time

    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Count: 1, 2, 3,", "max_tokens": 300, "n": 3, "stream": True, "temperature": 0}),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert sse_events(response.fp.readline() + response.fp.readline())   # generating
    assert served.scheduler.slots_busy == 3
    conn.close()
    deadline = time.time() + 30
    while served.scheduler.slots_busy:
        assert time.time() < deadline, "the slots of the dropped stream were never freed"
        time.sleep(0.02)
