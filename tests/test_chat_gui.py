"""The reference chat app: its controller without a display, and the real window under Xvfb
(skipped where no Xvfb binary is installed: `apt-get install xvfb x11-apps netpbm`)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguflm.apps.chat_gui import ChatController


class Recorder:
    """A stand-in for the window: records what the controller tells it."""

    def __init__(self):
        self.events: list[tuple] = []

    def __getattr__(self, name):
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *args: self.events.append((name[3:], *args))

    def named(self, name):
        return [e[1:] for e in self.events if e[0] == name]


class UIThread:
    """What the window's queue does: run posted work later, on the test's thread."""

    def __init__(self):
        self.posted: queue.SimpleQueue = queue.SimpleQueue()

    def run_until(self, condition, timeout=300.0):
        end = time.monotonic() + timeout
        while not condition():
            try:
                self.posted.get(timeout=0.05)()
            except queue.Empty:
                pass
            assert time.monotonic() < end, "timed out"


@pytest.fixture(scope="module")
def loaded(smollm_path):
    ui, view = UIThread(), Recorder()
    c = ChatController(ui.posted.put, view)
    c.apply_settings(n_ctx=1024, n_threads=1, max_tokens=300, temperature=0.0)
    c.choose_model(smollm_path)
    c.load()
    ui.run_until(lambda: view.named("loaded"))
    yield c, ui, view
    c.close()


def test_estimate_progress_and_load(loaded, smollm_path):
    c, ui, view = loaded
    ui.run_until(lambda: view.named("estimate"))
    (est,) = view.named("estimate")[-1]   # the chosen model's (the default one's came first)
    assert est.n_ctx == 1024 and est.weights == smollm_path.stat().st_size
    progress = [f for (f,) in view.named("load_progress")]
    assert progress[0] == 0.0 and progress[-1] == 1.0 and progress == sorted(progress)
    assert view.named("loaded") == [(True, None)] and c.llm is not None


def test_reply_streams_and_stop_ends_it(loaded):
    c, ui, view = loaded
    view.events.clear()
    assert c.send("Tell me a long story about a dragon.")
    assert not c.send("another message while the reply runs")   # one reply at a time
    ui.run_until(lambda: len(view.named("reply_text")) >= 3)
    c.stop()
    ui.run_until(lambda: view.named("reply_done"))
    (completion,) = view.named("reply_done")[0]
    assert completion.finish_reason == "cancelled"
    streamed = "".join(t for (t,) in view.named("reply_text"))
    assert streamed == completion.text and len(completion.token_ids) < 300
    assert [m["role"] for m in c.messages] == ["user", "assistant"]
    c.new_chat()
    assert c.messages == []


def test_errors_are_messages_not_tracebacks(loaded, tmp_path):
    c, ui, view = loaded
    view.events.clear()
    c.apply_settings(max_tokens=5)
    with pytest.raises(ValueError):
        c.apply_settings(top_p=0.0)
    assert not c.send("   ")
    assert not c.send("x " * 1100)              # longer than the 1024-token context
    ui.run_until(lambda: view.named("error"))
    assert any("context window" in msg for (msg,) in view.named("error"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    c.choose_model(bad)
    ui.run_until(lambda: len(view.named("error")) == 2)
    assert "Cannot read bad.gguf" in view.named("error")[-1][0]


def test_load_cancel_and_failure(smollm_path, tmp_path):
    view = Recorder()
    # post runs at once (on the loading thread): the first progress report cancels the load
    c = ChatController(lambda fn: fn(), view)

    def on_load_progress(fraction):
        view.events.append(("load_progress", fraction))
        c.cancel_load()

    view.on_load_progress = on_load_progress
    c.choose_model(smollm_path)
    c.load()
    deadline = time.monotonic() + 120
    while not view.named("loaded") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert view.named("loaded") == [(False, "Loading cancelled.")] and c.llm is None
    assert len(view.named("load_progress")) == 1
    missing = Recorder()
    c2 = ChatController(lambda fn: fn(), missing)
    c2.model_path = tmp_path / "nowhere.gguf"
    c2.load()
    while not missing.named("loaded") and time.monotonic() < deadline:
        time.sleep(0.02)
    ok, message = missing.named("loaded")[0]
    assert not ok and message.startswith("Cannot load nowhere.gguf") and "Traceback" not in message


# -- the real window under Xvfb

_DRIVER = r"""
import json, sys, time, tkinter as tk
from gguflm.apps.chat_gui import ChatWindow

root = tk.Tk()
root.geometry("900x640")
w = ChatWindow(root, sys.argv[1])
for name, value in (("n_ctx", "1024"), ("max_tokens", "400"), ("temperature", "0"), ("n_threads", "1")):
    w.fields[name].set(value)
w.apply_settings()
out = {}
phase = {"t": time.monotonic()}

def after_load():
    if w.controller.llm is None:
        if time.monotonic() - phase["t"] > 240:
            out["error"] = "load timed out"; return finish()
        return root.after(100, after_load)
    out["estimate"] = w.estimate_label.cget("text")
    w.entry.insert(0, "Tell me a long story about a dragon.")
    w.send_button.invoke()
    w.max_stall = 0.0                      # the heartbeat during generation only
    phase["t"] = time.monotonic()
    root.after(100, wait_for_text)

def streamed():
    return w.view.get("1.0", "end").split("Model: ", 1)[-1].strip()

def wait_for_text():
    if len(streamed()) < 40 and time.monotonic() - phase["t"] < 240:
        return root.after(50, wait_for_text)
    out["stall_during_generation"] = w.max_stall
    out["text_before_stop"] = streamed()
    w.stop_button.invoke()
    root.after(50, wait_for_done)

def wait_for_done():
    if str(w.send_button.cget("state")) != "normal":
        return root.after(50, wait_for_done)
    out["status"] = w.status.cget("text")
    out["text_after_stop"] = streamed()
    root.update()
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    root.after(300, lambda: (input(), finish()))   # the test takes the screenshot, then says go

def finish():
    print(json.dumps(out), flush=True)
    w.close()

w.load_button.invoke()
root.after(200, after_load)
root.mainloop()
"""


def _free_display() -> int:
    for n in range(90, 140):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            return n
    pytest.skip("no free X display number")


def test_window_under_xvfb(smollm_path, tmp_path):
    if shutil.which("Xvfb") is None:
        pytest.skip("blocked on Xvfb: no Xvfb binary here (apt-get install xvfb; PyPI has only "
                    "wrappers around the system binary)")
    display = f":{_free_display()}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/tmp/.X11-unix/X{display[1:]}").exists():
            assert time.monotonic() < deadline and xvfb.poll() is None, "Xvfb did not start"
            time.sleep(0.05)
        env = dict(os.environ, DISPLAY=display)
        app = subprocess.Popen([sys.executable, "-c", _DRIVER, str(smollm_path)], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        line = app.stdout.readline()
        assert line, app.stderr.read()
        result = json.loads(line)
        shot = tmp_path / "chat_gui.png"
        if shutil.which("xwd") and shutil.which("xwdtopnm") and shutil.which("pnmtopng"):
            xwd = subprocess.run(["xwd", "-root", "-silent", "-display", display], capture_output=True, check=True)
            pnm = subprocess.run(["xwdtopnm"], input=xwd.stdout, capture_output=True, check=True)
            shot.write_bytes(subprocess.run(["pnmtopng"], input=pnm.stdout, capture_output=True, check=True).stdout)
            keep = os.environ.get("GGUFLM_GUI_SCREENSHOT")
            if keep:
                shutil.copy(shot, keep)
        app.stdin.write("\n")
        app.stdin.flush()
        app.communicate(timeout=60)
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    assert "Memory at n_ctx 1024" in result["estimate"] and "error" not in result
    assert len(result["text_before_stop"]) >= 40
    assert result["status"].startswith("Stopped.")
    # stopped during a long answer: far fewer than the 400 tokens asked for
    assert len(result["text_after_stop"]) < 1200
    assert result["stall_during_generation"] < 0.1
    if shot.exists():
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
