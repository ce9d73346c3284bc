"""Soak ``gguflm serve``: many concurrent clients for a while against several models, loopback only.

``gguflm bench soak -m A.gguf -m B.gguf [--seconds 600] [--clients 32]`` starts a server of both
models with ``--models-max 1`` (so they take turns being loaded) and runs clients that mix greedy
chat, streamed completions, forced tool calls, JSON-schema output, streams cancelled part way
and requests whose connection is dropped. It checks that no request is lost (each answered in
full, or as a clean 4xx/5xx with an error body), none answered wrongly (a greedy reply of the
first model equals the one it gives alone; tool calls and schema output parse and match), the
server's resident memory grows less than 5% from after the warm-up to the end, and ``/health``
answers throughout; it prints the request and error counts and the p50/p99 latency.

The greedy replies of the first model are compared exactly: SmolLM2's Q4_1 weights give each
token the same floats at any batch width (docs/compat.md, KV cache types); Gemma 3's Q4_K do not,
so the second model's replies are checked for their shape only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gguflm.bench.server import free_port, wait_healthy

KINDS = ("chat", "stream", "tool", "schema", "cancel", "drop")
PROMPTS = ["The capital of France is", "List three colours:", "Once upon a time"]
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
COLOURS = ["red", "green", "blue"]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "colour", "schema": {
    "type": "object", "properties": {"colour": {"type": "string", "enum": COLOURS}},
    "required": ["colour"], "additionalProperties": False}}}
GREEDY = {"temperature": 0, "max_tokens": 8, "repeat_penalty": 1.0}
TIMEOUT = 300.0          # a request not answered by then is lost


@dataclass
class Outcome:
    kind: str
    model: str
    seconds: float
    status: int = 200
    problem: str | None = None     # why it was lost or wrong


@dataclass
class Report:
    outcomes: list[Outcome]
    health_failures: int
    health_max_seconds: float
    rss_baseline: int      # peak resident bytes early after the warm-up, with the same model(s)
    rss_final: int         # loaded as at the end, whose growth was the largest
    rss_state: str         # which model(s) were loaded
    seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status >= 400]

    @property
    def wrong(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.problem is not None]

    @property
    def rss_growth(self) -> float:
        return self.rss_final / self.rss_baseline - 1

    def latency(self, q: float) -> float:
        answered = sorted(o.seconds for o in self.outcomes
                          if o.kind not in ("cancel", "drop") and o.status < 400)
        return answered[min(len(answered) - 1, int(q * len(answered)))] if answered else float("nan")

    def describe(self) -> str:
        kinds = {k: sum(o.kind == k for o in self.outcomes) for k in KINDS}
        return (f"{len(self.outcomes)} requests in {self.seconds:.0f} s "
                f"({', '.join(f'{k} {n}' for k, n in kinds.items())}); {len(self.errors)} errors, "
                f"{len(self.wrong)} lost or wrong; latency p50 {self.latency(0.5):.2f} s, "
                f"p99 {self.latency(0.99):.2f} s; RSS {self.rss_baseline >> 20} -> "
                f"{self.rss_final >> 20} MiB after warm-up ({self.rss_growth:+.1%}, {self.rss_state} "
                f"loaded); /health "
                f"{self.health_failures} failures, slowest {self.health_max_seconds:.2f} s")


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class _Client:
    def __init__(self, port: int) -> None:
        self.port = port

    def post(self, path: str, body: dict, timeout: float = TIMEOUT) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def open_stream(self, path: str, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        conn.request("POST", path, body=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json"})
        return conn, conn.getresponse()

    def drop(self, path: str, body: dict) -> None:
        """Send a request and close the connection without reading the answer."""
        data = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(data)}\r\n\r\n".encode() + data)


def _events(response: http.client.HTTPResponse, limit: int | None = None) -> list[str]:
    events = []
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data: "):
            events.append(line[6:])
            if limit is not None and len(events) >= limit:
                break
    return events


def _one(client: _Client, kind: str, model: str, prompt: str, expected: dict[tuple[str, str, str], str],
         exact: bool) -> Outcome:
    """Run one request of ``kind``; its outcome, with a problem if it was lost or wrong."""
    t0 = time.perf_counter()
    out = Outcome(kind, model, 0.0)
    messages = [{"role": "user", "content": prompt}]
    try:
        if kind == "chat":
            out.status, data = client.post("/v1/chat/completions",
                                           {"model": model, "messages": messages, **GREEDY})
            if out.status == 200:
                choice = json.loads(data)["choices"][0]
                text = choice["message"]["content"]
                want = expected.get(("chat", model, prompt))
                if choice["finish_reason"] not in ("stop", "length") or (exact and text != want):
                    out.problem = f"chat reply {text!r}, alone {want!r}"
        elif kind == "stream":
            conn, response = client.open_stream("/v1/completions", {"model": model, "prompt": prompt, **GREEDY})
            out.status = response.status
            if out.status == 200:
                events = _events(response)
                chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
                text = "".join(c["text"] for c in chunks)
                want = expected.get(("stream", model, prompt))
                if events[-1:] != ["[DONE]"] or chunks[-1]["finish_reason"] not in ("stop", "length"):
                    out.problem = f"stream ended {events[-2:]!r}"
                elif exact and text != want:
                    out.problem = f"streamed {text!r}, alone {want!r}"
            else:
                data = response.read()
            conn.close()
        elif kind == "tool":
            out.status, data = client.post("/v1/chat/completions", {
                "model": model, "max_tokens": 32, "temperature": 0,
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
            if out.status == 200:
                call = json.loads(data)["choices"][0]["message"]["tool_calls"][0]["function"]
                if call["name"] != "get_weather" or not isinstance(json.loads(call["arguments"]).get("city"), str):
                    out.problem = f"tool call {call!r}"
        elif kind == "schema":
            out.status, data = client.post("/v1/chat/completions", {
                "model": model, "max_tokens": 24, "temperature": 0, "messages": messages,
                "response_format": SCHEMA})
            if out.status == 200:
                content = json.loads(data)["choices"][0]["message"]["content"]
                if json.loads(content).get("colour") not in COLOURS:
                    out.problem = f"schema output {content!r}"
        elif kind == "cancel":
            conn, response = client.open_stream("/v1/completions", {
                "model": model, "prompt": prompt, "max_tokens": 64, "temperature": 0.8})
            out.status = response.status
            if out.status == 200:
                _events(response, limit=2)
            else:
                data = response.read()
            conn.close()
        else:    # drop
            client.drop("/v1/chat/completions", {"model": model, "messages": messages, **GREEDY})
        if out.status >= 400:     # an error must be a clean one, with a body saying what
            error = json.loads(data).get("error")
            out.problem = None if error and error.get("message") else f"error {out.status} without a body"
    except Exception as exc:     # a request lost: the connection failed or the answer was malformed
        out.problem = f"{type(exc).__name__}: {exc}"
    out.seconds = time.perf_counter() - t0
    return out


def run(models: Sequence[str | os.PathLike[str]], seconds: float, clients: int = 32, threads: int = 2,
        parallel: int = 4, seed: int = 0, nice: int = 0) -> Report:
    """Start the server, soak it for ``seconds`` and stop it; the report."""
    names = [Path(m).name.removesuffix(".gguf") for m in models]
    port = free_port()
    cmd = [sys.executable, "-m", "gguflm.cli", "serve", "--port", str(port), "-np", str(parallel),
           "-c", str(512 * parallel), "-t", str(threads), "--models-max", "1", "-q"]
    for m in models:
        cmd += ["-m", str(m)]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=(lambda: os.nice(nice)) if nice else None)
    try:
        wait_healthy(port, proc, "/health")
        client = _Client(port)
        # the first model's greedy replies alone, one request at a time
        expected: dict[tuple[str, str, str], str] = {}
        for model in names[:1]:
            for prompt in PROMPTS:
                status, data = client.post("/v1/chat/completions", {
                    "model": model, "messages": [{"role": "user", "content": prompt}], **GREEDY})
                assert status == 200, data
                expected["chat", model, prompt] = json.loads(data)["choices"][0]["message"]["content"]
                status, data = client.post("/v1/completions", {"model": model, "prompt": prompt, **GREEDY})
                assert status == 200, data
                expected["stream", model, prompt] = json.loads(data)["choices"][0]["text"]
        for model in names:     # every kind of request once on each model, before the clock starts
            for kind in ("tool", "schema", "stream", "chat"):
                _one(client, kind, model, PROMPTS[0], expected, exact=False)
        return _soak(client, proc.pid, names, expected, seconds, clients, seed)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _soak(client: _Client, pid: int, names: list[str], expected: dict, seconds: float, clients: int,
          seed: int) -> Report:
    t_start = time.perf_counter()
    deadline = t_start + seconds
    warm_up = min(60.0, seconds * 0.3)
    outcomes: list[Outcome] = []
    rss: list[tuple[float, int, str]] = []
    health = {"failures": 0, "max": 0.0}
    lock = threading.Lock()
    done = threading.Event()       # every client's last request answered

    def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.perf_counter() < deadline:
            kind, model = rng.choice(KINDS), rng.choice(names)
            result = _one(client, kind, model, rng.choice(PROMPTS), expected, exact=model == names[0])
            with lock:
                outcomes.append(result)

    def monitor() -> None:      # until the requests in flight at the deadline are answered too
        while not done.is_set():
            t0 = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=10)
                conn.request("GET", "/health")
                ok = conn.getresponse().status == 200
                conn.close()
            except OSError:
                ok = False
            took = time.perf_counter() - t0
            health["failures"] += not ok
            health["max"] = max(health["max"], took)
            rss.append((t0 - t_start, _rss(pid), _loaded(client.port)))
            time.sleep(max(0.0, 0.5 - took))

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    watcher = threading.Thread(target=monitor, daemon=True)
    for t in (*workers, watcher):
        t.start()
    for t in workers:
        t.join(seconds + TIMEOUT + 60)
    done.set()
    watcher.join(30)
    # the loaded model changes all the time, so the peak resident memory with each set of loaded
    # models in the first third after the warm-up (or half, in a short run) is compared with its
    # peak in the last third (half)
    t_end = rss[-1][0]
    growth = []
    for parts in (3, 2):
        span = (t_end - warm_up) / parts
        for state in {s for _, _, s in rss} - {"none", "?"}:    # not mid-switch
            first = [r for t, r, s in rss if warm_up <= t < warm_up + span and s == state]
            last = [r for t, r, s in rss if t >= t_end - span and s == state]
            if first and last:
                growth.append((max(last) / max(first), max(first), max(last), state))
        if growth:
            break
    if not growth:       # no set of models seen in both: the two halves' peaks, whatever was loaded
        half = [r for t, r, _ in rss if t >= warm_up]
        growth.append((0, max(half[: len(half) // 2 or 1]), max(half), "any"))
    _, first_peak, last_peak, state = max(growth)
    return Report(outcomes, health["failures"], health["max"], first_peak, last_peak, state,
                  time.perf_counter() - t_start)


def _loaded(port: int) -> str:
    """The models loaded now, by ``/v1/models``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/v1/models")
        data = json.loads(conn.getresponse().read())["data"]
        return "+".join(m["id"] for m in data if m["status"]["value"] == "loaded") or "none"
    except OSError:
        return "?"
    finally:
        conn.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", action="append", required=True,
                        help="GGUF file (give two: the first one's greedy replies are checked exactly)")
    parser.add_argument("--seconds", type=float, default=600.0, help="how long to soak (default 600)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("-t", "--threads", type=int, default=2, help="the server's threads")
    parser.add_argument("-np", "--parallel", type=int, default=4, help="the server's slots")
    parser.add_argument("--nice", type=int, default=0, help="run the server at this niceness")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gguflm bench soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    report = run(args.model, args.seconds, args.clients, args.threads, args.parallel, nice=args.nice)
    print(report.describe())
    for o in report.wrong[:20]:
        print(f"  {o.kind} {o.model}: {o.problem}")
    healthy = (not report.wrong and report.health_failures == 0 and report.rss_growth < 0.05)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
