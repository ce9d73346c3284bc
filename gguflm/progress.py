"""Progress bars on stderr for model loading, default-model assembly, perplexity and bench runs.

A bar draws only when its stream is a terminal (or when forced), so pipes, logs and embedding
applications stay quiet. It redraws at most every ``min_interval`` seconds and on every whole
percent, and writes nothing at all while disabled.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class ProgressBar:
    """``label [#######-------]  45% suffix`` redrawn in place on one line.

    Parameters
    ----------
    label
        Text in front of the bar.
    enabled
        None: draw when ``stream`` is a terminal; True/False: always/never.
    stream
        Where to draw (default ``sys.stderr``, looked up when the bar is made).
    width
        Characters between the brackets.
    min_interval
        Seconds between redraws that do not change the whole percent.

    The bar is also a load-progress callback: ``bar(fraction)`` updates it and returns True.
    """

    def __init__(self, label: str, *, enabled: bool | None = None, stream: TextIO | None = None,
                 width: int = 30, min_interval: float = 0.1) -> None:
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_terminal(self.stream) if enabled is None else bool(enabled)
        self.width = width
        self.min_interval = min_interval
        self._last_draw = 0.0
        self._last_percent = -1
        self._drawn = False

    def update(self, fraction: float, suffix: str = "") -> None:
        """Show ``fraction`` (clamped to 0..1) with an optional ``suffix`` after the percent."""
        if not self.enabled:
            return
        fraction = min(1.0, max(0.0, float(fraction)))
        percent = int(fraction * 100)
        now = time.monotonic()
        if percent == self._last_percent and now - self._last_draw < self.min_interval:
            return
        self._last_percent, self._last_draw = percent, now
        filled = int(fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"\r{self.label} [{bar}] {percent:3d}%"
        if suffix:
            line += f" {suffix}"
        self.stream.write(line + "\x1b[K")  # clear what a longer previous line left
        self.stream.flush()
        self._drawn = True

    def __call__(self, fraction: float) -> bool:
        self.update(fraction)
        return True

    def close(self) -> None:
        """End the bar's line (only if something was drawn)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_callback(progress: bool | Callable[[float], object] | None, label: str
                      ) -> tuple[Callable[[float], bool] | None, ProgressBar | None]:
    """Turn a user's ``progress=`` argument into a load callback (and the bar to close after).

    True draws a bar on stderr, None and False draw nothing (the library writes to no stream
    unless asked: the command line passes True on a terminal); a callable is called with the
    fraction done and cancels the work by returning False (any other value continues).
    """
    if callable(progress):
        user = progress
        return (lambda fraction: user(fraction) is not False), None
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be None, a bool or a callable, "
                        f"not {type(progress).__name__}")
    bar = ProgressBar(label, enabled=bool(progress))
    return (bar if bar.enabled else None), bar
