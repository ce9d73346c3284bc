"""What deploying `gguflm serve` relies on: CORS only when asked (`--cors-origins`), one structured
access log line per request, and SIGTERM ending a subprocess server (serving two models) with a
stream in flight cancelled cleanly (its last event, then `[DONE]`) as `--shutdown-timeout` ends."""

from __future__ import annotations

import http.client
import json
import logging
import signal
import time

import pytest

pytest.importorskip("starlette", reason='the server extra: pip install "gguflm[server]"')

from gguflm.server import create_app  # noqa: E402
from test_server import KEY, THREADS, Served, serve_process, sse_events  # noqa: E402

ORIGIN = "http://app.example"


def _call(port: int, method: str, path: str, headers: dict[str, str], body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _preflight(port: int, origin: str):
    return _call(port, "OPTIONS", "/v1/chat/completions", {
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_cors_only_with_cors_origins_and_access_log(smollm_path, caplog):
    plain = Served(create_app(smollm_path, parallel=1, n_ctx=256, api_key=KEY, n_threads=THREADS))
    try:
        status, headers, _ = _preflight(plain.port, ORIGIN)
        assert "access-control-allow-origin" not in headers and status in (401, 405)
        status, headers, _ = _call(plain.port, "GET", "/health", {"Origin": ORIGIN})
        assert status == 200 and "access-control-allow-origin" not in headers
    finally:
        plain.close()

    s = Served(create_app(smollm_path, parallel=1, n_ctx=256, api_key=KEY, n_threads=THREADS,
                          cors_origins=[ORIGIN]))
    try:
        status, headers, _ = _preflight(s.port, ORIGIN)     # no API key on a preflight
        assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in headers["access-control-allow-methods"]
        assert "authorization" in headers["access-control-allow-headers"].lower()
        status, headers, _ = _preflight(s.port, "http://other.example")
        assert status == 400 and "access-control-allow-origin" not in headers
        with caplog.at_level(logging.INFO, logger="gguflm.server.access"):
            status, headers, body = _call(s.port, "GET", "/v1/models",
                                          {"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
            assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
            status, headers, _ = _call(s.port, "GET", "/v1/models", {"Origin": ORIGIN})
            assert status == 401 and headers["access-control-allow-origin"] == ORIGIN
            deadline = time.time() + 10       # the line is written as the response ends
            while len([r for r in caplog.records if hasattr(r, "access")]) < 2 and time.time() < deadline:
                time.sleep(0.05)
        lines = [r for r in caplog.records if hasattr(r, "access")]
        assert [(r.access["method"], r.access["path"], r.access["status"]) for r in lines] == [
            ("GET", "/v1/models", 200), ("GET", "/v1/models", 401)]
        assert lines[0].access["bytes"] == len(body) and lines[0].access["ms"] >= 0
        assert lines[0].getMessage().startswith("method=GET path=/v1/models status=200 ")
    finally:
        s.close()


def test_sigterm_cancels_a_long_stream_cleanly_after_the_timeout(smollm_path, gemma_path):
    proc, port = serve_process("-m", str(smollm_path), "-m", str(gemma_path), "--models-max", "1",
                               "-c", "512", "-np", "2", "-t", str(THREADS), "--shutdown-timeout", "1")
    try:
        deadline = time.time() + 60
        while True:
            try:
                if _call(port, "GET", "/health", {})[0] == 200:
                    break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
                time.sleep(0.2)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        # far longer than the shutdown timeout: EOS banned, 200 tokens
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Once upon a time", "max_tokens": 200,
             "temperature": 0, "stream": True, "logit_bias": {"2": -100}}),
            headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read(1)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        body += response.read()
        assert time.time() - t0 < 30
        assert proc.wait(60) in (0, -signal.SIGTERM)
        log = proc.stdout.read().decode()
        assert "Finished server process" in log, log
        assert "path=/health status=200" in log and "path=/v1/completions status=200" in log, log
        # cancelled before uvicorn's deadline: the stream ends whole, as cancelled
        events = sse_events(body)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
        assert chunks[-1]["finish_reason"] == "cancelled"
        assert all(c["finish_reason"] is None for c in chunks[:-1]) and len(chunks) < 200
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
