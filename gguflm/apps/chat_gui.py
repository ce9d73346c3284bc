"""A reference desktop chat app in Tkinter, built only on gguflm's public API (``gguflm chat --gui``).

Copy it as a starting point. It shows what a desktop app needs from an inference library:

- the memory a model will take, before loading it (:func:`gguflm.estimate_memory`);
- a load with a progress bar and Cancel (``LLM(progress=callback)``: the callback returning
  False cancels);
- replies that stream without ever blocking the UI thread, and Stop
  (:meth:`gguflm.LLM.chat_async`, :meth:`Generation.cancel`);
- errors shown in the window, never as a traceback.

Two parts: :class:`ChatController` holds the state and does the work (no widget in it, so it is
tested without a display); :class:`ChatWindow` draws it. Work runs on background threads; every
result comes back to the UI thread through one queue the window polls (Tk must only be touched
from the thread that runs ``mainloop``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguflm
from gguflm.default_model import DEFAULT_MODEL_FILE, models_dir
from gguflm.generate import FINISH_CANCELLED

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """What the settings panel edits. Context size and threads apply at the next load."""

    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512
    n_threads: int = 0          # 0: every usable core
    n_ctx: int = 4096


class ChatController:
    """The app without its widgets.

    ``post(fn)`` must run ``fn`` on the UI thread later (the window passes its queue; tests pass
    a list or a direct call). The view is told about changes through ``listener``, an object
    with the ``on_*`` methods of :class:`ChatWindow` (missing ones are skipped).
    """

    def __init__(self, post: Callable[[Callable[[], None]], None], listener: Any) -> None:
        self.post = post
        self.listener = listener
        self.settings = Settings()
        default = models_dir() / DEFAULT_MODEL_FILE
        self.model_path: Path | None = default if default.is_file() else None
        self.llm: gguflm.LLM | None = None
        self.messages: list[dict[str, str]] = []
        self.generation: gguflm.background.Generation | None = None
        self._load_cancel = threading.Event()
        self._loading = False

    # -- telling the view (always on the UI thread)

    def _tell(self, event: str, *args: Any) -> None:
        handler = getattr(self.listener, f"on_{event}", None)
        if handler is not None:
            self.post(lambda: handler(*args))

    # -- the model

    def choose_model(self, path: str | Path) -> None:
        """A new model file: show its memory estimate (nothing is loaded yet)."""
        self.model_path = Path(path)
        self.estimate()

    def estimate(self) -> gguflm.MemoryEstimate | None:
        """The chosen model's memory at the chosen context size (header only: fast)."""
        if self.model_path is None:
            return None
        try:
            est = gguflm.estimate_memory(self.model_path, n_ctx=self.settings.n_ctx)
        except (gguflm.Error, OSError, ValueError) as exc:
            self._tell("error", f"Cannot read {self.model_path.name}: {exc}")
            return None
        self._tell("estimate", est)
        return est

    def load(self) -> None:
        """Load the chosen model on a worker thread; progress and the outcome come back posted."""
        if self.model_path is None:
            self._tell("error", "Choose a model file first.")
            return
        if self._loading:
            return
        self.stop()
        self._loading = True
        self._load_cancel.clear()
        path, settings = self.model_path, self.settings

        def progress(fraction: float) -> bool:
            self._tell("load_progress", fraction)
            return not self._load_cancel.is_set()   # False cancels the load

        def work() -> None:
            try:
                llm = gguflm.LLM(path, n_ctx=settings.n_ctx, n_threads=settings.n_threads or None,
                                 progress=progress)
            except gguflm.LoadCancelled:
                self.post(lambda: self._loaded(None, "Loading cancelled."))
            except Exception as exc:  # any failure is shown in the window
                message = f"Cannot load {path.name}: {exc}"
                self.post(lambda: self._loaded(None, message))
            else:
                self.post(lambda: self._loaded(llm, None))

        threading.Thread(target=work, name="gguflm-load", daemon=True).start()

    def _loaded(self, llm: gguflm.LLM | None, error: str | None) -> None:
        self._loading = False
        if llm is not None:
            if self.llm is not None:
                self.llm.close()
            self.llm = llm
            self.messages = []
        self.listener.on_loaded(llm is not None, error)

    def cancel_load(self) -> None:
        self._load_cancel.set()

    # -- chatting

    def send(self, text: str) -> bool:
        """Ask the model; the reply streams to ``on_reply_text`` and ends with ``on_reply_done``."""
        text = text.strip()
        if not text:
            return False
        if self.llm is None:
            self._tell("error", "Load a model first.")
            return False
        if self.generation is not None and not self.generation.done:
            return False
        self.messages.append({"role": "user", "content": text})
        s = self.settings
        try:
            self.generation = self.llm.chat_async(
                self.messages, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                # called on the worker thread: hand the text to the UI thread
                on_chunk=lambda chunk: self._tell("reply_text", chunk.text),
                on_done=lambda gen: self.post(lambda: self._reply_done(gen)))
        except Exception as exc:  # e.g. the conversation no longer fits the context
            self.messages.pop()
            self._tell("error", str(exc))
            return False
        return True

    def _reply_done(self, gen: gguflm.background.Generation) -> None:
        try:
            completion = gen.result()
        except Exception as exc:
            self.messages.pop()
            self.listener.on_error(f"Generation failed: {exc}")
            self.listener.on_reply_done(None)
            return
        # keep the reply in the conversation (also a stopped one: the model sees what it said)
        self.messages.append({"role": "assistant", "content": completion.text})
        self.listener.on_reply_done(completion)

    def stop(self) -> None:
        """Stop the reply being generated (within one decode step)."""
        if self.generation is not None:
            self.generation.cancel()

    def new_chat(self) -> None:
        self.stop()
        self.messages = []

    def apply_settings(self, **changes: Any) -> None:
        """Validate and store settings; a changed context size shows a new estimate."""
        new = replace(self.settings, **changes)
        if not 0 <= new.temperature <= 5 or not 0 < new.top_p <= 1:
            raise ValueError("temperature must be in [0, 5] and top-p in (0, 1]")
        if new.max_tokens < 1 or new.n_threads < 0 or new.n_ctx < 256:
            raise ValueError("max tokens >= 1, threads >= 0 and context size >= 256")
        old, self.settings = self.settings, new
        if new.n_ctx != old.n_ctx:
            self.estimate()

    def close(self) -> None:
        self.stop()
        self.cancel_load()
        if self.generation is not None:
            self.generation.wait(5)
        if self.llm is not None:
            self.llm.close()
            self.llm = None


class ChatWindow:
    """The widgets: model bar, settings panel, chat view, input line."""

    POLL_MS = 15        # how often the UI thread drains the queue of posted work
    HEARTBEAT_MS = 20   # how often the heartbeat measures the event loop's stalls

    def __init__(self, root: Any, model: str | None = None) -> None:
        import tkinter as tk
        from tkinter import ttk

        self.tk, self.root = tk, root
        self._posted: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.controller = ChatController(self._posted.put, self)
        if model:
            self.controller.model_path = Path(model)
        root.title("gguflm chat")
        root.protocol("WM_DELETE_WINDOW", self.close)

        # model bar: file, estimate, Load / Cancel, progress
        bar = ttk.Frame(root, padding=4)
        bar.pack(fill="x")
        self.model_label = ttk.Label(bar, text=self._model_text(), width=40)
        self.model_label.pack(side="left")
        ttk.Button(bar, text="Choose…", command=self.choose_model).pack(side="left")
        self.load_button = ttk.Button(bar, text="Load", command=self.load)
        self.load_button.pack(side="left")
        self.cancel_button = ttk.Button(bar, text="Cancel", command=self.controller.cancel_load, state="disabled")
        self.cancel_button.pack(side="left")
        self.progress = ttk.Progressbar(bar, length=160, maximum=1.0)
        self.progress.pack(side="left", padx=4)
        self.estimate_label = ttk.Label(root, text="", padding=(4, 0))
        self.estimate_label.pack(fill="x")

        # settings panel
        panel = ttk.LabelFrame(root, text="Settings", padding=4)
        panel.pack(fill="x", padx=4)
        self.fields: dict[str, tk.StringVar] = {}
        for i, (name, label) in enumerate([("temperature", "Temperature"), ("top_p", "Top-p"),
                                           ("max_tokens", "Max tokens"), ("n_threads", "Threads"),
                                           ("n_ctx", "Context")]):
            ttk.Label(panel, text=label).grid(row=0, column=2 * i, sticky="e")
            var = tk.StringVar(value=str(getattr(self.controller.settings, name)))
            ttk.Entry(panel, textvariable=var, width=7).grid(row=0, column=2 * i + 1, padx=(2, 8))
            self.fields[name] = var
        ttk.Button(panel, text="Apply", command=self.apply_settings).grid(row=0, column=10)

        # chat view, status line and input
        self.view = tk.Text(root, wrap="word", height=20, state="disabled")
        self.view.pack(fill="both", expand=True, padx=4, pady=4)
        self.view.tag_configure("user", foreground="#1a4f8b")
        self.view.tag_configure("error", foreground="#b00020")
        self.status = ttk.Label(root, text="Choose a model and press Load.", padding=(4, 0))
        self.status.pack(fill="x")
        entry_row = ttk.Frame(root, padding=4)
        entry_row.pack(fill="x")
        self.entry = ttk.Entry(entry_row)
        self.entry.pack(side="left", fill="x", expand=True)
        self.entry.bind("<Return>", lambda _e: self.send())
        self.send_button = ttk.Button(entry_row, text="Send", command=self.send, state="disabled")
        self.send_button.pack(side="left")
        self.stop_button = ttk.Button(entry_row, text="Stop", command=self.controller.stop, state="disabled")
        self.stop_button.pack(side="left")
        ttk.Button(entry_row, text="New chat", command=self.new_chat).pack(side="left")

        # the heartbeat: the longest gap between two ticks is the longest the UI froze
        self.max_stall = 0.0
        self._last_beat = time.perf_counter()
        root.after(self.POLL_MS, self._poll)
        root.after(self.HEARTBEAT_MS, self._heartbeat)
        self.controller.estimate()

    # -- the UI thread's loop

    def _poll(self) -> None:
        """Run what worker threads posted (a bounded batch, so a flood cannot freeze the UI)."""
        for _ in range(200):
            try:
                fn = self._posted.get_nowait()
            except queue.Empty:
                break
            fn()
        self.root.after(self.POLL_MS, self._poll)

    def _heartbeat(self) -> None:
        now = time.perf_counter()
        self.max_stall = max(self.max_stall, now - self._last_beat - self.HEARTBEAT_MS / 1000)
        self._last_beat = now
        self.root.after(self.HEARTBEAT_MS, self._heartbeat)

    # -- actions

    def _model_text(self) -> str:
        path = self.controller.model_path
        return path.name if path else "(no model chosen)"

    def choose_model(self) -> None:
        from tkinter import filedialog

        name = filedialog.askopenfilename(title="Choose a GGUF model", initialdir=str(models_dir()),
                                          filetypes=[("GGUF models", "*.gguf"), ("All files", "*")])
        if name:
            self.controller.choose_model(name)
            self.model_label.configure(text=self._model_text())

    def load(self) -> None:
        self.load_button.configure(state="disabled")
        self.cancel_button.configure(state="normal")
        self.send_button.configure(state="disabled")
        self.status.configure(text=f"Loading {self._model_text()}…")
        self.controller.load()

    def send(self) -> None:
        text = self.entry.get()
        if self.controller.send(text):
            self.entry.delete(0, "end")
            self._append(f"\nYou: {text.strip()}\n", "user")
            self._append("Model: ")
            self.send_button.configure(state="disabled")
            self.stop_button.configure(state="normal")
            self.status.configure(text="Generating… (Stop ends the reply)")

    def new_chat(self) -> None:
        self.controller.new_chat()
        self.view.configure(state="normal")
        self.view.delete("1.0", "end")
        self.view.configure(state="disabled")
        self.status.configure(text="New chat.")

    def apply_settings(self) -> None:
        try:
            values = {name: (float if name in ("temperature", "top_p") else int)(var.get())
                      for name, var in self.fields.items()}
            self.controller.apply_settings(**values)
        except ValueError as exc:
            self.on_error(f"Settings not applied: {exc}")
            return
        self.status.configure(text="Settings applied (context and threads at the next Load).")

    def close(self) -> None:
        self.controller.close()
        self.root.destroy()

    def _append(self, text: str, tag: str | None = None) -> None:
        self.view.configure(state="normal")
        self.view.insert("end", text, (tag,) if tag else ())
        self.view.see("end")
        self.view.configure(state="disabled")

    # -- what the controller tells us (on the UI thread)

    def on_estimate(self, est: gguflm.MemoryEstimate) -> None:
        mib = lambda n: f"{n / 2**20:.0f} MiB"
        self.estimate_label.configure(
            text=f"Memory at n_ctx {est.n_ctx}: {mib(est.total)} (weights {mib(est.weights)}, "
                 f"KV cache {mib(est.kv_cache)}, compute {mib(est.compute)}, vocab {mib(est.vocab)})")

    def on_load_progress(self, fraction: float) -> None:
        self.progress.configure(value=fraction)

    def on_loaded(self, ok: bool, error: str | None) -> None:
        self.load_button.configure(state="normal")
        self.cancel_button.configure(state="disabled")
        self.progress.configure(value=1.0 if ok else 0.0)
        if ok:
            self.send_button.configure(state="normal")
            self.status.configure(text=f"{self._model_text()} loaded. Type a message.")
        else:
            self.on_error(error or "Loading failed.")

    def on_reply_text(self, text: str) -> None:
        self._append(text)

    def on_reply_done(self, completion: Any) -> None:
        self.send_button.configure(state="normal")
        self.stop_button.configure(state="disabled")
        self._append("\n")
        if completion is not None:
            self.status.configure(text=("Stopped. " if completion.finish_reason == FINISH_CANCELLED else "")
                                  + completion.timings.line())

    def on_error(self, message: str) -> None:
        self._append(f"\n[{message}]\n", "error")
        self.status.configure(text=message)


def main(model: str | None = None) -> int:
    """Open the window (``gguflm chat --gui [-m MODEL]``); returns when it is closed."""
    import tkinter as tk

    try:
        root = tk.Tk()
    except tk.TclError as exc:
        raise gguflm.Error(f"cannot open a window: {exc} (is DISPLAY set?)") from None
    ChatWindow(root, model)
    root.mainloop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
