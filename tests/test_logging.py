"""The library reports through `logging` only: no prints, no writes to stdout or stderr (an
application embedding it owns its output); the command line installs the handler."""

from __future__ import annotations

import ast
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import gguflm

PACKAGE = Path(gguflm.__file__).resolve().parent
# the command line, its benchmarks, the README generator (a command) and the progress bar the
# command line draws (only when asked) own a stream
STREAM_OWNERS = {"cli.py", "progress.py", "readme.py", "bench"}


def _is_main_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _stream_uses(tree: ast.AST) -> list[int]:
    lines = []
    skip: set[int] = set()
    for node in ast.walk(tree):
        if _is_main_guard(node):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            lines.append(node.lineno)
        if (isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr", "__stdout__", "__stderr__")
                and isinstance(node.value, ast.Name) and node.value.id == "sys"):
            lines.append(node.lineno)
        if isinstance(node, ast.Attribute) and node.attr == "warn" and isinstance(node.value, ast.Name) \
                and node.value.id == "warnings":
            lines.append(node.lineno)
    return lines


def test_no_module_of_the_library_writes_to_a_stream():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in STREAM_OWNERS or rel.name == "__main__.py":
            continue
        for line in _stream_uses(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{rel}:{line}")
    assert offenders == []


_RUN = r"""
import logging, sys
import gguflm
if sys.argv[2] == "handler":
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(name)s %(levelname)s %(message)s")
llm = gguflm.LLM(sys.argv[1], n_ctx=256, n_threads=1, seed=1)
llm("Hello", max_tokens=3)
ctx = llm.ctx if hasattr(llm, "ctx") else None
bad = gguflm.Batch.get_one([10**9])
model = gguflm.Model.load(sys.argv[1])
c = gguflm.Context(model, n_ctx=256, n_threads=1)
assert c.decode(bad) == -1                                  # logs an error
assert c.decode(gguflm.Batch.get_one(list(range(10, 266)))) == 0
assert c.decode(gguflm.Batch.get_one([5])) == 1             # no room: logs a warning
"""


def _run_on_a_terminal(smollm_path, mode: str) -> bytes:
    """Run _RUN with stdout and stderr on a pseudo-terminal (where progress bars would draw)."""
    leader, follower = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", _RUN, str(smollm_path), mode], stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, env=env)
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # the follower closed
            break
        if not data:
            break
        out += data
    os.close(leader)
    assert proc.wait(timeout=120) == 0, out.decode(errors="replace")
    return out


def test_a_run_prints_nothing_and_logs_through_logging(smollm_path):
    assert _run_on_a_terminal(smollm_path, "silent") == b""
    logged = _run_on_a_terminal(smollm_path, "handler").decode()
    assert "LOG gguflm ERROR decode: invalid token" in logged
    assert "LOG gguflm WARNING decode: failed to find a memory slot" in logged
    assert "LOG gguflm INFO" in logged


def test_the_command_line_installs_a_handler(smollm_path, capfd):
    from gguflm.cli import main

    assert main(["tokenize", "-m", str(smollm_path), "-p", "Hi"]) == 0
    import logging

    logger = logging.getLogger("gguflm")
    handlers = [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]
    try:
        assert handlers and handlers[0].stream is sys.stderr
        logger.warning("a warning for the command line")
        assert "gguflm: WARNING: a warning for the command line" in capfd.readouterr().err
    finally:
        for h in handlers:
            logger.removeHandler(h)
        logger.setLevel(logging.NOTSET)
