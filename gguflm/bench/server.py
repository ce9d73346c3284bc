"""Server throughput under concurrent clients: ``gguflm bench server [-m FILE] [-n 64]
[--clients 1,2,4,8] [-c 4096] [-t N] [-r 2] [--compare llama-cpp]``.

Starts ``gguflm serve`` (in a child process, with as many slots as the most clients) on a free
loopback port; for each client count, that many threads each stream one greedy completion of
``-n`` tokens (a different prompt each, end-of-text suppressed through ``logit_bias`` so every
reply has its full length). Prints the aggregate generated tokens per second (tokens of all
clients / wall time of the round) and the median and worst time to first token, best round of
``-r``. With ``--compare llama-cpp``, llama-cpp-python's server (``python -m llama_cpp.server``,
one request at a time) answers the same rounds, side by side, when it and its server extra
(FastAPI, sse-starlette, ...) are installed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROMPTS = ["Write a long story about a lighthouse keeper.", "Explain how a steam engine works.",
           "Describe a walk through a busy market.", "List the planets and describe each one.",
           "Write a letter to a friend about a trip to the mountains.",
           "Explain the rules of chess to a beginner.", "Describe the history of the bicycle.",
           "Write a poem about the sea, then explain it."]


@dataclass
class Round:
    clients: int
    tokens: int
    seconds: float
    ttft: list[float]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, path: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {proc.stdout.read().decode()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.2)


def stream_one(port: int, prompt: str, n_tokens: int, eos: int, api_key: str | None = None
               ) -> tuple[int, float]:
    """Stream one completion; (chunks with text, seconds to the first of them)."""
    body = {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "stream": True,
            "logit_bias": {str(eos): -100}}
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:500]!r}")
    n, ttft = 0, float("nan")
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk["choices"] and chunk["choices"][0].get("text"):
            if n == 0:
                ttft = time.perf_counter() - start
            n += 1
    conn.close()
    return n, ttft


def one_round(port: int, clients: int, n_tokens: int, eos: int, api_key: str | None = None) -> Round:
    results: list[tuple[int, float] | BaseException] = [None] * clients  # type: ignore[list-item]

    def client(i: int) -> None:
        try:
            results[i] = stream_one(port, PROMPTS[i % len(PROMPTS)], n_tokens, eos, api_key)
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return Round(clients, sum(r[0] for r in results), seconds, [r[1] for r in results])


def measure(port: int, counts: Sequence[int], n_tokens: int, eos: int, repeat: int,
            api_key: str | None = None) -> list[Round]:
    """The best of ``repeat`` rounds for each client count, after a warm-up request."""
    one_round(port, 1, 4, eos, api_key)
    best = []
    for k in counts:
        rounds = [one_round(port, k, n_tokens, eos, api_key) for _ in range(repeat)]
        best.append(max(rounds, key=lambda r: r.tokens_per_second))
    return best


def start_gguflm(args: argparse.Namespace, port: int, slots: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gguflm.cli", "serve", "--port", str(port), "-np", str(slots),
           "-c", str(args.ctx_size), "-q"]
    if args.model:
        cmd += ["-m", str(args.model)]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    for flag, value in (("-ctk", args.cache_type_k), ("-ctv", args.cache_type_v)):
        cmd += [flag, value]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def start_llama_cpp(args: argparse.Namespace, path: str, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", path, "--port", str(port),
           "--n_ctx", str(args.ctx_size), "--verbose", "False"]
    if args.threads:
        cmd += ["--n_threads", str(args.threads), "--n_threads_batch", str(args.threads)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def llama_cpp_problem() -> str | None:
    try:
        import fastapi  # noqa: F401
        import llama_cpp.server.app  # noqa: F401
    except ImportError as exc:
        return f"llama-cpp-python's server is not installed ({exc}); pip install 'llama-cpp-python[server]'"
    return None


def run(args: argparse.Namespace) -> int:
    from gguflm.default_model import load_model

    counts = [int(c) for c in args.clients.split(",")]
    with load_model(args.model, False, vocab_only=True) as model:
        path, eos = str(model.path), model.vocab.eos
    engines = {"gguflm": lambda port: start_gguflm(args, port, max(counts))}
    if args.compare == "llama-cpp":
        problem = llama_cpp_problem()
        if problem:
            print(f"note: {problem}", file=sys.stderr)
        else:
            engines["llama.cpp (llama-cpp-python server)"] = lambda port: start_llama_cpp(args, path, port)
    results: dict[str, list[Round]] = {}
    for name, start in engines.items():
        port = free_port()
        proc = start(port)
        try:
            wait_healthy(port, proc, "/v1/models")
            results[name] = measure(port, counts, args.n_tokens, -1 if eos is None else eos, args.repeat)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"{Path(path).name}: {args.n_tokens} tokens per client, greedy, n_ctx {args.ctx_size}, "
          f"threads {args.threads or 'default'}, best of {args.repeat}")
    report(results)
    return 0


def report(results: dict[str, list[Round]]) -> None:
    """The table: one row per engine and client count."""
    print("| engine | clients | aggregate tokens/s | vs 1 client | TTFT median | TTFT max |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, rounds in results.items():
        base = rounds[0].tokens_per_second if rounds and rounds[0].clients == 1 else None
        for r in rounds:
            ratio = f"{r.tokens_per_second / base:.2f}x" if base else ""
            print(f"| {name} | {r.clients} | {r.tokens_per_second:.1f} | {ratio} | "
                  f"{statistics.median(r.ttft) * 1e3:.0f} ms | {max(r.ttft) * 1e3:.0f} ms |")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", help="GGUF file (default: the default model)")
    parser.add_argument("-n", "--n-tokens", type=int, default=64, help="tokens each client streams")
    parser.add_argument("--clients", default="1,2,4,8", help="comma-separated client counts")
    parser.add_argument("-c", "--ctx-size", type=int, default=4096,
                        help="context (gguflm shares it among max(clients) slots)")
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("-ctk", "--cache-type-k", default="f32", help="gguflm's KV cache (gguflm serve's default)")
    parser.add_argument("-ctv", "--cache-type-v", default="f32")
    parser.add_argument("-r", "--repeat", type=int, default=2, help="rounds per client count (best kept)")
    parser.add_argument("--compare", choices=("llama-cpp",), help="also run llama-cpp-python's server")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gguflm bench server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
