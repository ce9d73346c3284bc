"""RoPE scaling as a context resolves it (llama.cpp's llama_context constructor): the scaling type
(the file's unless the context names one: ``none``, ``linear``, ``yarn``, ``longrope``), the
frequency scale (1 with ``none``), YaRN's extrapolation mix and the attention factor that YaRN's
rotation multiplies back out, computed in float32 with libm's ``logf`` as llama.cpp computes them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass

import numpy as np

from gguflm.hparams import HParams

# llama.cpp's enum llama_rope_scaling_type (-1: unspecified, take the file's)
SCALING_TYPES = {"none": 0, "linear": 1, "yarn": 2, "longrope": 3}
_NAMES = {v: k for k, v in SCALING_TYPES.items()}


@functools.cache
def _logf() -> ctypes._CFuncPtr:
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    libm.logf.argtypes, libm.logf.restype = [ctypes.c_float], ctypes.c_float
    return libm.logf


def logf(x: float) -> np.float32:
    return np.float32(_logf()(float(np.float32(x))))


@functools.cache
def _powf() -> ctypes._CFuncPtr:
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    libm.powf.argtypes, libm.powf.restype = [ctypes.c_float, ctypes.c_float], ctypes.c_float
    return libm.powf


def powf(x: float, y: float) -> np.float32:
    """libm's powf, as llama.cpp's float code calls it."""
    return np.float32(_powf()(float(np.float32(x)), float(np.float32(y))))


def scaling_type_name(value: int | str | None, default: str) -> str:
    """A scaling type given by name, by llama.cpp's number, or None / -1 (the file's: ``default``)."""
    if value is None or value == -1 or value == "unspecified":
        return default
    if isinstance(value, str):
        if value not in SCALING_TYPES:
            raise ValueError(f"rope scaling type must be one of {sorted(SCALING_TYPES)}, got {value!r}")
        return value
    if int(value) not in _NAMES:
        raise ValueError(f"rope scaling type must be -1..3 (llama_rope_scaling_type), got {value!r}")
    return _NAMES[int(value)]


@dataclass(frozen=True)
class RopeParams:
    """RoPE parameters: a context's (those of its global layers, without frequency factors), or
    one layer's in a context (``Context.rope_config``: sliding-window layers may have their own
    base and scale, and the model's frequency factors are added)."""

    scaling_type: str
    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float
    n_ctx_orig: int
    freq_factors: np.ndarray | None = None   # per-pair divisors of theta (Llama 3.1, Phi 3 long/short)


def _mscale(scale: np.float32, mscale: np.float32) -> np.float32:
    """get_mscale: 1 for scale <= 1, else 0.1 * mscale * logf(scale) + 1 (float32)"""
    if scale <= 1:
        return np.float32(1)
    return np.float32(np.float32(np.float32(0.1) * mscale) * logf(scale)) + np.float32(1)


def rope_params(hp: HParams, scaling_type: int | str | None, freq_scale: float, yarn_ext_factor: float = -1.0,
                yarn_attn_factor: float = -1.0, yarn_beta_fast: float = -1.0, yarn_beta_slow: float = -1.0,
                yarn_orig_ctx: int = 0, freq_base: float = 0.0) -> RopeParams:
    """The context's RoPE parameters from the file's and the context's (negative or 0: unset)."""
    f32 = np.float32
    scaling = scaling_type_name(scaling_type, hp.rope_scaling_type)
    if scaling == "none":
        freq_scale = 1.0   # never scale if the scaling type is none
    ext = yarn_ext_factor if yarn_ext_factor >= 0 else hp.yarn_ext_factor
    if ext < 0:
        ext = 1.0 if scaling == "yarn" else 0.0
    attn = f32(yarn_attn_factor if yarn_attn_factor >= 0 else 1.0)
    if ext != 0:
        factor = f32(1) / f32(freq_scale)
        if hp.rope_yarn_log_mul:
            attn = _mscale(factor, f32(hp.rope_yarn_mscale)) / _mscale(factor, f32(hp.rope_yarn_log_mul))
        else:
            attn = _mscale(factor, f32(1))
        # YaRN's rotation multiplies by 1 + 0.1 logf(factor): cancelled here, as llama.cpp does
        attn = f32(attn * (f32(1) / (f32(1) + f32(f32(0.1) * logf(factor)))))
    attn = f32(attn * f32(hp.yarn_attn_factor))   # the file's rope.scaling.attn_factor
    return RopeParams(
        scaling_type=scaling, freq_base=freq_base or hp.rope_freq_base_train, freq_scale=float(freq_scale), ext_factor=float(ext), attn_factor=float(attn),
        beta_fast=yarn_beta_fast if yarn_beta_fast >= 0 else hp.yarn_beta_fast,
        beta_slow=yarn_beta_slow if yarn_beta_slow >= 0 else hp.yarn_beta_slow,
        n_ctx_orig=yarn_orig_ctx or hp.n_ctx_orig_yarn or hp.n_ctx_train)
