"""`gguflm serve` as operators run it: API keys from `--api-key` and `--api-key-file` (401
without one, `/health` open), request body and `max_tokens` limits (413 and 400 with error bodies),
and `/metrics` in Prometheus text under llama-server's metric names. One server, started by the
command line on a free loopback port."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')

from gguflm.bench.server import free_port, wait_healthy  # noqa: E402
from test_server import THREADS  # noqa: E402

KEYS = ("first-key", "second-key")
# llama-server's /metrics (tools/server/server-task.cpp, server_task_result_metrics::to_metrics)
LLAMA_SERVER_COUNTERS = ("prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
                         "tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total",
                         "n_tokens_max")
LLAMA_SERVER_GAUGES = ("prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing",
                       "requests_deferred", "n_busy_slots_per_decode")
MAX_TOKENS = 8
MAX_BODY = 4096


class Cli:
    def __init__(self, port: int) -> None:
        self.port = port

    def request(self, method: str, path: str, body: bytes | dict | Iterator[bytes] | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict | str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        try:
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})},
                         encode_chunked=data is not None and not isinstance(data, bytes))
            response = conn.getresponse()
            raw = response.read().decode()
            kind = response.getheader("Content-Type", "")
            return response.status, json.loads(raw) if kind.startswith("application/json") else raw
        finally:
            conn.close()


@pytest.fixture(scope="module")
def cli(smollm_path, tmp_path_factory) -> Iterator[Cli]:
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"{KEYS[1]}\n\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "gguflm.cli", "serve", "-m", str(smollm_path),
                             "--port", str(port), "-c", "1024", "-np", "2", "-t", str(THREADS),
                             "--api-key", KEYS[0], "--api-key-file", str(key_file),
                             "--max-tokens", str(MAX_TOKENS), "--max-body-bytes", str(MAX_BODY), "--quiet"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    server = Cli(port)
    try:
        wait_healthy(port, proc, "/health", timeout=60)
        yield server
    finally:     # graceful stops are test_server.py's
        proc.kill()
        proc.wait()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_api_keys_from_the_option_and_the_file(cli):
    assert cli.request("GET", "/health") == (200, {"status": "ok"})
    for headers in ({}, bearer("wrong"), {"X-Api-Key": "wrong"}, bearer(KEYS[0] + ",")):
        status, body = cli.request("GET", "/v1/models", headers=headers)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    for headers in (bearer(KEYS[0]), bearer(KEYS[1]), {"X-Api-Key": KEYS[1]}):
        assert cli.request("GET", "/v1/models", headers=headers)[0] == 200
    assert cli.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})[0] == 401


def test_max_tokens_limit(cli):
    body = {"messages": [{"role": "user", "content": "Count from one to fifty."}], "temperature": 0}
    status, error = cli.request("POST", "/v1/chat/completions", {**body, "max_tokens": MAX_TOKENS + 1},
                                bearer(KEYS[0]))
    assert status == 400 and error["error"]["param"] == "max_tokens"
    status, reply = cli.request("POST", "/v1/chat/completions", body, bearer(KEYS[0]))
    assert status == 200 and reply["usage"]["completion_tokens"] == MAX_TOKENS
    assert reply["choices"][0]["finish_reason"] == "length"
    # a completion's default (16 tokens, llama-cpp-python's) is capped, not refused
    status, reply = cli.request("POST", "/v1/completions", {"prompt": "Count: 1, 2, 3,", "temperature": 0},
                                bearer(KEYS[0]))
    assert status == 200 and reply["usage"]["completion_tokens"] == MAX_TOKENS
    status, error = cli.request("POST", "/v1/chat/completions", {**body, "max_completion_tokens": 99},
                                bearer(KEYS[0]))
    assert status == 400 and error["error"]["param"] == "max_completion_tokens"
    status, error = cli.request("POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 100},
                                bearer(KEYS[0]))
    assert status == 400 and error["error"]["param"] == "max_tokens"


def test_body_limit(cli):
    big = {"prompt": "x" * MAX_BODY, "max_tokens": 1}
    status, error = cli.request("POST", "/v1/completions", big, bearer(KEYS[0]))
    assert status == 413 and error["error"]["code"] == "request_too_large"
    # without a Content-Length the body is counted as it arrives
    data = json.dumps(big).encode()
    chunks = iter([data[i:i + 1000] for i in range(0, len(data), 1000)])
    status, error = cli.request("POST", "/v1/completions", chunks, bearer(KEYS[0]))
    assert status == 413 and error["error"]["code"] == "request_too_large"
    assert cli.request("POST", "/tokenize", {"content": "Hi"}, bearer(KEYS[0]))[0] == 200


def test_metrics_under_llama_server_names(cli):
    def values(text: str) -> dict[str, float]:
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    status, before = cli.request("GET", "/metrics", headers=bearer(KEYS[0]))
    assert status == 200
    body = {"prompt": "The capital of France is Paris. The capital of Italy is", "max_tokens": 4, "temperature": 0}
    for _ in range(2):       # the second one finds the prompt cached
        assert cli.request("POST", "/v1/completions", body, bearer(KEYS[0]))[0] == 200
    status, after = cli.request("GET", "/metrics", headers=bearer(KEYS[0]))
    for name, kind in [(n, "counter") for n in LLAMA_SERVER_COUNTERS] + [(n, "gauge") for n in LLAMA_SERVER_GAUGES]:
        assert f"# TYPE llamacpp:{name} {kind}\n" in after and f"# HELP llamacpp:{name} " in after
    old, new = values(before), values(after)
    assert new["llamacpp:tokens_predicted_total"] >= old.get("llamacpp:tokens_predicted_total", 0) + 6
    assert new["llamacpp:prompt_tokens_cached_total"] > old.get("llamacpp:prompt_tokens_cached_total", 0)
    assert new["llamacpp:n_decode_total"] > old.get("llamacpp:n_decode_total", 0)
    assert new["llamacpp:predicted_tokens_seconds"] > 0 and new["llamacpp:requests_processing"] == 0
    # the throughput gauges cover the time since the previous scrape
    assert values(cli.request("GET", "/metrics", headers=bearer(KEYS[0]))[1])["llamacpp:predicted_tokens_seconds"] == 0
    assert new['gguflm:http_requests_total{path="/v1/completions",status="200"}'] >= 2
