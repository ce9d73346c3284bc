"""Thread counts, resolved once in Python; kernels receive the number and never ask OpenMP.

llama.cpp keeps two pools: ``n_threads`` for single-token decode and ``n_threads_batch`` for
prompt processing. Here both are OpenMP team sizes passed explicitly to each kernel call.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_n_threads(n_threads: int | None) -> int:
    """``None`` → usable cores (capped by ``OMP_NUM_THREADS`` when set); ``n >= 1`` → ``n``."""
    if n_threads is None:
        cores = usable_cores()
        env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
        if env.isdigit() and int(env) > 0:
            return min(cores, int(env))
        return cores
    n_threads = int(n_threads)
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1 or None, got {n_threads}")
    return n_threads
