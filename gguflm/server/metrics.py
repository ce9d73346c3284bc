"""``GET /metrics``: Prometheus text (exposition format 0.0.4), named like llama.cpp's server's
metrics under a ``gguflm:`` prefix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["render"]


def render(scheduler: Any, http_requests: Mapping[tuple[str, int], int]) -> str:
    """The metrics of ``scheduler`` (None when the server only embeds) and the HTTP counts."""
    lines: list[str] = []

    def metric(name: str, kind: str, help: str, value: float, labels: str = "") -> None:
        if not lines or not lines[-1].startswith(f"gguflm:{name}"):
            lines.append(f"# HELP gguflm:{name} {help}")
            lines.append(f"# TYPE gguflm:{name} {kind}")
        lines.append(f"gguflm:{name}{labels} {value:g}" if isinstance(value, float)
                     else f"gguflm:{name}{labels} {value}")

    for (path, status), n in sorted(http_requests.items()):
        metric("http_requests_total", "counter", "HTTP requests answered, by path and status", n,
               f'{{path="{path}",status="{status}"}}')
    if scheduler is not None:
        s = scheduler.stats
        metric("requests_total", "counter", "Generation requests submitted.", s.requests)
        metric("requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).",
               s.requests_cancelled)
        metric("prompt_tokens_total", "counter", "Prompt tokens decoded (cached ones not counted).",
               s.prompt_tokens)
        metric("prompt_seconds_total", "counter", "Decode time of steps carrying prompt tokens.",
               float(s.prompt_seconds))
        metric("tokens_predicted_total", "counter", "Generated tokens decoded.", s.generated_tokens)
        metric("tokens_predicted_seconds_total", "counter",
               "Decode time of steps carrying only generated tokens.", float(s.generation_seconds))
        metric("predicted_tokens_seconds", "gauge", "Generated tokens per second of decode time.",
               float(s.generated_tokens / s.busy_seconds) if s.busy_seconds else 0.0)
        metric("decode_steps_total", "counter", "Batches decoded.", s.steps)
        metric("slots_total", "gauge", "Parallel slots.", scheduler.n_slots)
        metric("slots_busy", "gauge", "Slots running a request.", scheduler.slots_busy)
        metric("requests_deferred", "gauge", "Requests waiting for a free slot.", scheduler.queued)
        used, total = scheduler.kv_cells_used(), scheduler.kv_cells_total()
        metric("kv_cache_tokens", "gauge", "KV cache cells in use.", used)
        metric("kv_cache_usage_ratio", "gauge", "KV cache cells in use / all cells.",
               float(used / total) if total else 0.0)
    return "\n".join(lines) + "\n"
