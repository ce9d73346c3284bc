"""`gguflm serve` on a free loopback port, driven by the official `openai` client and by raw HTTP.

Greedy replies are compared with gguflm.LLM's and llama-cpp-python's for the same request (and
the server's f32 KV cache); streams with the same request unstreamed; four concurrent streams
with each request run alone (f32 attention runs token by token: see
gguflm.server.app.create_app); every bad request gets its 4xx and the server keeps serving.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')
openai = pytest.importorskip("openai")
import uvicorn  # noqa: E402

from _llama import require_peer  # noqa: E402
from gguflm import LLM  # noqa: E402
from gguflm.server import create_app  # noqa: E402

KEY = "sekret"
MINILM = Path(__file__).resolve().parent / "data" / "models" / "all-MiniLM-L6-v2-Q8_0.gguf"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "max_tokens": 24}
# llama-cpp-python's server defaults to repeat_penalty 1.1, its Llama methods to 1.0
NO_PENALTY = {"repeat_penalty": 1.0}
# one thread per engine: the results do not depend on it, and a shared machine stays responsive
THREADS = 1


class Served:
    """An app running under uvicorn in a thread, on a free loopback port."""

    def __init__(self, app) -> None:
        self.app = app
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.time() < deadline, "the server did not start"
            time.sleep(0.02)

    @property
    def scheduler(self):
        return self.app.state.server.scheduler

    def client(self, key: str = KEY):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0,
                             timeout=120)

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                key: str | None = KEY) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, body: bytes | dict | None = None, **kw) -> tuple[int, dict]:
        status, data = self.request(method, path, body, **kw)
        return status, json.loads(data)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def served(smollm_path) -> Iterator[Served]:
    s = Served(create_app(smollm_path, parallel=2, n_ctx=1024, api_key=KEY, n_threads=THREADS))
    yield s
    s.close()


@pytest.fixture(scope="module")
def smol(smollm_path) -> Iterator[LLM]:
    # the server's KV cache type
    with LLM(smollm_path, n_ctx=1024, n_threads=THREADS, type_k="f32", type_v="f32", progress=False) as llm:
        yield llm


def sse_events(data: bytes) -> list[str]:
    """The data fields of a server-sent event stream."""
    return [line[len("data: "):] for line in data.decode().splitlines() if line.startswith("data: ")]


def test_health_models_and_api_key(served):
    assert served.json("GET", "/health", key=None) == (200, {"status": "ok"})
    status, body = served.json("GET", "/v1/models", key=None)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = served.json("GET", "/v1/models", key="wrong")
    assert status == 401 and set(body["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError):
        served.client("wrong").chat.completions.create(model="m", messages=MESSAGES, **GREEDY)
    models = served.client().models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]


def test_greedy_chat_and_completion_equal_llm_and_llama_cpp_python(served, smol, smollm_path):
    client = served.client()
    chat = client.chat.completions.create(model="m", messages=MESSAGES, extra_body=NO_PENALTY, **GREEDY)
    ours = smol.create_chat_completion(MESSAGES, **GREEDY)
    assert chat.choices[0].message.content == ours["choices"][0]["message"]["content"]
    assert chat.choices[0].finish_reason == ours["choices"][0]["finish_reason"]
    assert chat.usage.model_dump() == {**ours["usage"], "completion_tokens_details": None,
                                       "prompt_tokens_details": None}
    text = client.completions.create(model="m", prompt="The capital of France is",
                                     extra_body=NO_PENALTY, **GREEDY)
    ours_text = smol.create_completion("The capital of France is", **GREEDY)["choices"][0]["text"]
    assert text.choices[0].text == ours_text

    llama_cpp = require_peer()
    ref = llama_cpp.Llama(str(smollm_path), n_ctx=1024, n_threads=THREADS, n_threads_batch=THREADS,
                          type_k=0, type_v=0, verbose=False)     # ggml's F32 cache, as the server's
    try:
        theirs = ref.create_chat_completion(MESSAGES, **GREEDY)
        assert chat.choices[0].message.content == theirs["choices"][0]["message"]["content"]
        assert text.choices[0].text == ref.create_completion("The capital of France is", **GREEDY)["choices"][0]["text"]
    finally:
        ref.close()


def test_streaming_equals_non_streaming(served):
    client = served.client()
    whole = client.chat.completions.create(model="m", messages=MESSAGES, **GREEDY)
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage

    text = client.completions.create(model="m", prompt="Once upon a time", **GREEDY)
    pieces = list(client.completions.create(model="m", prompt="Once upon a time", stream=True, **GREEDY))
    assert "".join(p.choices[0].text for p in pieces) == text.choices[0].text

    # raw HTTP: one data line per chunk, then [DONE]
    status, data = served.request("POST", "/v1/chat/completions",
                                  {"messages": MESSAGES, "stream": True, **GREEDY})
    events = sse_events(data)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        whole.choices[0].message.content


def test_logprobs_stop_seed_and_sampling(served):
    client = served.client()
    text = client.completions.create(model="m", prompt="The capital of France is", logprobs=2,
                                     extra_body=NO_PENALTY, **GREEDY)
    lp = text.choices[0].logprobs
    assert "".join(lp.tokens) == text.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert all(len(top) >= 2 for top in lp.top_logprobs)
    assert all(lp.token_logprobs[i] == max(lp.top_logprobs[i].values()) for i in range(len(lp.tokens)))

    chat = client.chat.completions.create(model="m", messages=MESSAGES, logprobs=True,
                                          top_logprobs=3, extra_body=NO_PENALTY, **GREEDY)
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob for t in content)

    stopped = client.completions.create(model="m", prompt="The capital of France is", stop=["."],
                                        extra_body=NO_PENALTY, **GREEDY)
    cut = text.choices[0].text.index(".")
    assert stopped.choices[0].text == text.choices[0].text[:cut]
    assert stopped.choices[0].finish_reason == "stop"

    sampled = [client.chat.completions.create(model="m", messages=MESSAGES, temperature=1.5, seed=seed,
                                              max_tokens=16, extra_body={"top_k": 0, "min_p": 0}
                                              ).choices[0].message.content
               for seed in (7, 7, 8)]
    assert sampled[0] == sampled[1] != sampled[2]


def test_response_format_and_forced_tool(served, smol):
    client = served.client()
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    reply = client.chat.completions.create(
        model="m", messages=MESSAGES, temperature=0, max_tokens=48,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    assert "city" in json.loads(reply.choices[0].message.content)
    ours = smol.create_chat_completion(MESSAGES, temperature=0, max_tokens=48, repeat_penalty=1.1,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "c", "schema": schema}})
    assert reply.choices[0].message.content == ours["choices"][0]["message"]["content"]

    tools = [{"type": "function", "function": {"name": "weather", "parameters": schema}}]
    call = client.chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=48,
                                          tools=tools,
                                          tool_choice={"type": "function", "function": {"name": "weather"}})
    assert call.choices[0].finish_reason == "tool_calls"
    tool_call = call.choices[0].message.tool_calls[0]
    assert tool_call.function.name == "weather" and "city" in json.loads(tool_call.function.arguments)


def test_tokenize_detokenize(served, smol):
    text = "Hello <|im_start|> world"
    status, body = served.json("POST", "/tokenize", {"content": text})
    assert status == 200 and body["tokens"] == smol.tokenize(text.encode(), add_bos=False, special=True)
    status, body = served.json("POST", "/tokenize", {"content": text, "with_pieces": True})
    assert "".join(t["piece"] for t in body["tokens"]) == text
    status, body = served.json("POST", "/detokenize", {"tokens": smol.tokenize(b"Hello world", add_bos=False)})
    assert (status, body) == (200, {"content": "Hello world"})


BAD_REQUESTS = [
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", b"[1, 2]", None),
    ("/v1/chat/completions", {"messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": "10"}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MESSAGES, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"messages": "hello"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, "messages[0]"),
    ("/v1/chat/completions", {"temperature": 0}, "messages"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": -3}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": {"a": 1}}, "prompt"),
    ("/v1/completions", {"prompt": "Hi", "stop": [1, 2]}, "stop"),
    ("/v1/completions", {"prompt": "Hi", "n": 3}, "n"),
    ("/v1/completions", {"prompt": "Hi", "n": 2, "best_of": 1}, "best_of"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": [10**9]}, None),
    ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {"type": "yaml"}}, None),
    ("/v1/completions", {"prompt": "Hi", "grammar": "root ::= ("}, None),
    ("/tokenize", {"content": 5}, "content"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
]


@pytest.mark.parametrize("path,body,param", BAD_REQUESTS, ids=[f"{i}" for i in range(len(BAD_REQUESTS))])
def test_bad_requests_get_400_and_the_server_keeps_serving(served, path, body, param):
    status, error = served.json("POST", path, body)
    assert status == 400, error
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["param"] == param
    status, ok = served.json("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert status == 200 and ok["usage"]["completion_tokens"] <= 2


def test_prompt_longer_than_a_slot_and_unknown_paths(served):
    n_ctx_slot = served.scheduler.n_ctx_slot          # 1024 / 2 slots
    status, error = served.json("POST", "/v1/completions", {"prompt": "word " * n_ctx_slot})
    assert status == 400 and error["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        served.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "word " * 2000}], max_tokens=4)
    status, error = served.json("GET", "/v1/nothing")
    assert status == 404 and error["error"]["type"] == "not_found_error"
    status, error = served.json("POST", "/v1/embeddings", {"input": "x"})
    assert status == 501
    assert served.client().completions.create(model="m", prompt="Hi", max_tokens=2).choices[0].text


def test_follow_up_turn_reuses_the_slot_cache(served):
    client = served.client()
    first = client.chat.completions.create(model="m", messages=MESSAGES, **GREEDY)
    steps = served.scheduler.stats.prompt_tokens
    follow_up = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                            {"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(model="m", messages=follow_up, **GREEDY)
    decoded = served.scheduler.stats.prompt_tokens - steps
    # only the new turn was decoded: far fewer tokens than the whole conversation
    assert 0 < decoded < second.usage.prompt_tokens - first.usage.prompt_tokens + 8


def test_a_new_request_does_not_wait_for_a_running_one(served):
    scheduler = served.scheduler
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Count: 1, 2, 3,", "max_tokens": 300, "temperature": 0, "stream": True,
         "logit_bias": {str(served.app.state.server.llm.token_eos()): -100}}),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    response.read(1)                      # the long stream is generating
    short = served.client().completions.create(model="m", prompt="Hi", max_tokens=3, temperature=0)
    assert short.usage.completion_tokens == 3
    assert scheduler.slots_busy == 1      # finished while the long one still runs
    body = response.read()
    assert sse_events(b"d" + body)[-1] == "[DONE]"
    conn.close()


def test_dropped_stream_frees_its_slot_within_one_step(served):
    scheduler = served.scheduler
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "temperature": 0, "stream": True}),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    response.fp.readline()                 # the first event arrives: the slot is generating
    running = [s.task for s in scheduler._slots if s.task is not None]
    assert len(running) == 1
    task = running[0]
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.time() + 30
    while task.freed_step is None:
        assert time.time() < deadline, "the dropped stream's slot was never freed"
        time.sleep(0.01)
    assert task.cancel_step is not None and task.freed_step - task.cancel_step <= 1
    assert scheduler.slots_busy == 0
    status, text = served.request("GET", "/metrics")
    assert b"llamacpp:requests_processing 0" in text and b"gguflm:requests_cancelled_total" in text


def test_metrics_count_requests_and_tokens(served):
    def value(text: str, name: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))

    before = served.request("GET", "/metrics")[1].decode()
    reply = served.client().completions.create(model="m", prompt="Hello there", max_tokens=5, temperature=0)
    status, after = served.request("GET", "/metrics")
    after = after.decode()
    assert status == 200 and "# TYPE gguflm:kv_cache_tokens gauge" in after
    assert value(after, "gguflm:requests_total") == value(before, "gguflm:requests_total") + 1
    assert value(after, "llamacpp:tokens_predicted_total") >= \
        value(before, "llamacpp:tokens_predicted_total") + reply.usage.completion_tokens - 1
    assert value(after, "gguflm:slots_total") == 2 and value(after, "gguflm:kv_cache_tokens") > 0


def test_four_concurrent_streams_equal_their_sequential_results(smollm_path):
    """The server's f32 KV cache, a region per slot: a slot's one token per step attends over its
    own cells as a lone token does, and its prompt as a lone prompt does, so its greedy tokens are
    those it gets alone, whatever shares the batch (at any arithmetic: the lane orders of AVX2's
    and AVX-512's sums differ, and each must be the same alone and together). Each phase runs on
    a fresh server: a prompt a slot has fully cached re-evaluates its last token alone, as
    llama-server's cache_prompt does, which may round differently from the first run."""
    prompts = ["The capital of France is", "Once upon a time there was", "def fibonacci(n):",
               "List three colors:"]
    s = Served(create_app(smollm_path, parallel=4, n_ctx=2048, n_threads=THREADS))
    try:
        client = s.client()
        t0 = time.perf_counter()
        alone = [client.completions.create(model="m", prompt=p, max_tokens=48, temperature=0,
                                           extra_body=NO_PENALTY) for p in prompts]
        t_alone = time.perf_counter() - t0
    finally:
        s.close()
    s = Served(create_app(smollm_path, parallel=4, n_ctx=2048, n_threads=THREADS))
    try:
        client = s.client()
        results: dict[int, str] = {}

        def stream(i: int) -> None:
            results[i] = "".join(c.choices[0].text for c in client.completions.create(
                model="m", prompt=prompts[i], max_tokens=48, temperature=0, stream=True,
                extra_body=NO_PENALTY))

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_together = time.perf_counter() - t0
        for i, reply in enumerate(alone):
            assert results[i] == reply.choices[0].text, prompts[i]
        n = sum(r.usage.completion_tokens for r in alone)
        print(f"\n4 streams: {n / t_together:.1f} tokens/s together, {n / t_alone:.1f} one at a time "
              f"({t_alone / t_together:.2f}x)")
        assert max(s.scheduler.stats.batch_tokens) >= 4    # they did share batches
    finally:
        s.close()


def test_embeddings_endpoint():
    if not MINILM.is_file():
        pytest.skip(f"{MINILM} missing")
    s = Served(create_app(MINILM, embedding=True, n_threads=THREADS))
    try:
        reply = s.client().embeddings.create(model="m", input=["A man is eating.", "A cat sleeps."])
        with LLM(MINILM, embedding=True, progress=False) as llm:
            ours = llm.create_embedding(["A man is eating.", "A cat sleeps."])
        assert [d.embedding for d in reply.data] == [d["embedding"] for d in ours["data"]]
        assert reply.usage.prompt_tokens == ours["usage"]["prompt_tokens"]
        status, error = s.json("POST", "/v1/chat/completions", {"messages": MESSAGES})
        assert status == 501 and "error" in error
        status, error = s.json("POST", "/v1/embeddings", {"input": [1.5]})
        assert status == 400 and error["error"]["param"] == "input"
    finally:
        s.close()


def serve_process(*args: str) -> tuple[subprocess.Popen, int]:
    """``gguflm serve *args`` in a child process on a free loopback port: (process, port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", "serve", *args, "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, port


def test_serve_command_stops_gracefully_on_sigterm(smollm_path, tmp_path):
    proc, port = serve_process("-m", str(smollm_path), "-c", "1024", "-np", "2", "-t", str(THREADS),
                               "--shutdown-timeout", "20")
    try:
        deadline = time.time() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
                time.sleep(0.2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": True}),
            headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read(1)                 # the stream has begun
        proc.send_signal(signal.SIGTERM)
        body += response.read()
        # uvicorn ends by raising the signal again, once the shutdown is complete
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert b"Finished server process" in proc.stdout.read()
        # the stream in flight was finished before the exit
        events = sse_events(body)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bench_server_rounds(served, smol, capsys):
    """gguflm bench server's measurement against the running server (the command itself starts
    its own in a child process)."""
    from gguflm.bench import server as bench

    rounds = bench.measure(served.port, [1, 2], 4, smol.token_eos(), 1, api_key=KEY)
    assert [(r.clients, r.tokens) for r in rounds] == [(1, 4), (2, 8)]   # EOS suppressed: full length
    assert all(r.tokens_per_second > 0 and len(r.ttft) == r.clients for r in rounds)
    bench.report({"gguflm": rounds})
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gguflm |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]
