"""``GET /metrics``: Prometheus text (exposition format 0.0.4).

llama-server's metrics under its names (``llamacpp:prompt_tokens_total``, ...), so dashboards
made for it read gguflm's; the throughput gauges cover the window since the previous scrape, as
llama-server's do. What llama-server does not report (HTTP requests by path and status, requests
and cancels, slots, KV cells) is under ``gguflm:``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["render"]


def render(scheduler: Any, http_requests: Mapping[tuple[str, int], int]) -> str:
    """The metrics of ``scheduler`` (None when the server only embeds) and the HTTP counts;
    starts a new window of the throughput gauges."""
    lines: list[str] = []

    def metric(name: str, kind: str, help: str, value: float, labels: str = "") -> None:
        if not lines or not lines[-1].startswith(f"{name}{{") and not lines[-1].startswith(f"{name} "):
            lines.append(f"# HELP {name} {help}")
            lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}")

    if scheduler is not None:
        s = scheduler.stats
        window = s.take_window()

        def per_second(tokens: str, seconds: str) -> float:
            return float(window[tokens] / window[seconds]) if window[seconds] else 0.0

        # llama-server's
        for name, help, value in (
                ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens.",
                 s.prompt_tokens),
                ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache.",
                 s.prompt_tokens_cached),
                ("prompt_seconds_total", "Total time spent processing prompts.", float(s.prompt_seconds)),
                ("tokens_predicted_total", "Number of generation tokens processed.", s.generated_tokens),
                ("tokens_predicted_seconds_total", "Total time spent generating tokens.",
                 float(s.generation_seconds)),
                ("n_decode_total", "Total number of decode calls.", s.steps),
                ("n_tokens_max", "Largest observed sequence length (prompt + generation).",
                 s.n_tokens_max)):
            metric(f"llamacpp:{name}", "counter", help, value)
        for name, help, value in (
                ("prompt_tokens_seconds", "Average prompt throughput in tokens/s since the last scrape.",
                 per_second("prompt_tokens", "prompt_seconds")),
                ("predicted_tokens_seconds",
                 "Average generation throughput in tokens/s since the last scrape.",
                 per_second("generated_tokens", "generation_seconds")),
                ("requests_processing", "Number of requests processing.", scheduler.slots_busy),
                ("requests_deferred", "Number of requests deferred.", scheduler.queued),
                ("n_busy_slots_per_decode", "Average number of busy slots per decode call.",
                 float(s.busy_slot_steps / max(s.steps, 1)))):
            metric(f"llamacpp:{name}", "gauge", help, value)
    # gguflm's own
    for (path, status), n in sorted(http_requests.items()):
        metric("gguflm:http_requests_total", "counter", "HTTP requests answered, by path and status", n,
               f'{{path="{path}",status="{status}"}}')
    if scheduler is not None:
        metric("gguflm:requests_total", "counter", "Generation requests (choices) submitted.",
               s.requests)
        metric("gguflm:requests_cancelled_total", "counter",
               "Requests cancelled (client gone, shutdown).", s.requests_cancelled)
        metric("gguflm:slots_total", "gauge", "Parallel slots.", scheduler.n_slots)
        used, total = scheduler.kv_cells_used(), scheduler.kv_cells_total()
        metric("gguflm:kv_cache_tokens", "gauge", "KV cache cells in use.", used)
        metric("gguflm:kv_cache_usage_ratio", "gauge", "KV cache cells in use / all cells.",
               float(used / total) if total else 0.0)
    return "\n".join(lines) + "\n"
