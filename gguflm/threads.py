"""Thread counts, resolved once in Python; kernels receive the number and never ask OpenMP.

llama.cpp keeps two pools: ``n_threads`` for single-token decode and ``n_threads_batch`` for
prompt processing. Here both are OpenMP team sizes passed explicitly to each kernel call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence


def usable_cores() -> int:
    """Physical cores this process may run on, at least 1: the CPUs of its affinity, each set of
    hyperthread siblings counted once (:func:`physical_cores`)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
    return physical_cores(cpus, _read_siblings)


def physical_cores(cpus: Sequence[int], siblings: Callable[[int], str | None]) -> int:
    """How many physical cores the logical ``cpus`` make up: ``siblings(cpu)`` is the CPU's
    ``thread_siblings_list`` (``"0,8"``, ``"0-1"``) or None when unknown (the CPU then counts as a
    core of its own). As llama.cpp's default thread count: a second hyperthread adds little to
    matmuls bound by memory or by the core's vector units, and leaves room for the rest of the
    machine (a team that spins at barriers suffers most when the OS has to share its cores)."""
    groups = set()
    for cpu in cpus:
        text = siblings(cpu)
        groups.add(text.strip() if text else f"cpu{cpu}")
    return max(1, len(groups))


def _read_siblings(cpu: int) -> str | None:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return f.read()
    except OSError:
        return None


def resolve_n_threads(n_threads: int | None) -> int:
    """``None`` → usable physical cores (capped by ``OMP_NUM_THREADS`` when set); ``n >= 1`` → ``n``."""
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
