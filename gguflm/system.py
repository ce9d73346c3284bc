"""What this build and this machine offer: compiler, OpenMP, threads, CPU features."""

from __future__ import annotations

import os
import platform
from typing import Any

from gguflm._ext import ops as _ops
from gguflm._ext import system as _system
from gguflm.threads import resolve_n_threads, usable_cores


def system_info() -> dict[str, Any]:
    """Describe the build and the CPU, as llama.cpp's ``llama_print_system_info`` does.

    Keys: ``compiler``, ``openmp``, ``omp_max_threads``, ``usable_cores``, ``default_threads``,
    ``cpu_features`` (``avx2``, ``f16c``, ``avx512``, ``avx512_vnni``), ``machine``, ``isa_override``
    (the value of ``GGUFLM_ISA`` if set), ``arithmetic`` (the ggml x86 build whose float rounding
    is reproduced: ``avx2`` or ``avx512``).
    """
    info: dict[str, Any] = dict(_system.build_info())
    info["usable_cores"] = usable_cores()
    info["default_threads"] = resolve_n_threads(None)
    info["cpu_features"] = _system.cpu_features()
    info["machine"] = platform.machine()
    info["isa_override"] = os.environ.get("GGUFLM_ISA")
    info["arithmetic"] = _ops.current_arithmetic()
    return info


def guard_mode() -> bool:
    """Debug switch ``GGUFLM_GUARD=1``: forward passes recorded afterwards put guard zones around
    every activation buffer, fill them with a canary byte and check them after every step, raising
    :class:`gguflm.errors.BufferOverrunError` when a kernel wrote outside its buffers. Slower;
    meant for test runs (``GGUFLM_GUARD=1 python -m pytest tests``)."""
    return os.environ.get("GGUFLM_GUARD", "") == "1"
