"""Forward-pass kernels other than matmul: RMS norm, LayerNorm, RoPE, gated linear units, GELU and
tanh, attention, mean pooling.

Thin ``def`` wrappers check shapes and dtypes, then run C kernels (``ops.h``, ``ops_rows.inc``)
with the GIL released, rows spread over ``n_threads`` OpenMP threads. Numerics follow ggml's CPU
backend (see the headers); results do not depend on the thread count, and the AVX2 and scalar
variants agree bit for bit.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint16_t, uint64_t
from dispatch cimport GGUFLM_ISA_AVX2, bind_dispatch, dispatch_names, gguflm_dispatch
from ops_kernels cimport (GGUFLM_GLU_GEGLU, GGUFLM_GLU_SWIGLU, GGUFLM_UNARY_GELU, GGUFLM_UNARY_TANH, ggml_half,
                          gguflm_attention, gguflm_attn_args, gguflm_gelu_table_init, gguflm_glu_rows, gguflm_hadamard_rows,
                          gguflm_layer_norm_rows, gguflm_pool_mean, gguflm_rms_norm_rows, gguflm_rope_apply,
                          gguflm_rope_corr_dims, gguflm_rope_params, gguflm_unary_rows)

cnp.import_array()


cdef ggml_half GELU_TABLE[65536 + 1]   # + 1: the AVX2 lookup gathers 4 bytes for the last entry too
GELU_TABLE[65536] = 0
gguflm_gelu_table_init(GELU_TABLE)

# the ISA and arithmetic of every call, read when it starts (gguflm.system sets them); the ops
# kernels have a scalar and an AVX2 variant, which the avx512 ISA runs too
cdef const gguflm_dispatch *_switch = bind_dispatch()


def dispatch() -> dict:
    """The ISA and arithmetic this module's kernels would run now, read through its binding."""
    return dispatch_names(_switch)


cdef inline int _check_threads(int n_threads) except -1:
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    return 0


def rms_norm(const float[:, ::1] x, const float[::1] weight, float eps, float[:, ::1] out,
             int n_threads=1):
    """``out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight`` for every row (``weight`` may be None)."""
    cdef Py_ssize_t n_rows = x.shape[0], n = x.shape[1]
    if out.shape[0] != n_rows or out.shape[1] != n:
        raise ValueError(f"out has shape ({out.shape[0]}, {out.shape[1]}), expected ({n_rows}, {n})")
    if weight is not None and weight.shape[0] != n:
        raise ValueError(f"weight has {weight.shape[0]} values, rows have {n}")
    _check_threads(n_threads)
    cdef const float *w = &weight[0] if weight is not None else NULL
    if n_rows:
        with nogil:
            gguflm_rms_norm_rows(n_rows, <int>n, &x[0, 0], n, w, eps, &out[0, 0], n, n_threads)


def layer_norm(const float[:, ::1] x, const float[::1] weight, const float[::1] bias, float eps,
               float[:, ::1] out, int n_threads=1):
    """``out[i] = (x[i] - mean) / sqrt(var + eps) * weight + bias`` (ggml_norm, then ggml_mul and
    ggml_add; ``weight`` and ``bias`` may be None)."""
    cdef Py_ssize_t n_rows = x.shape[0], n = x.shape[1]
    if out.shape[0] != n_rows or out.shape[1] != n:
        raise ValueError(f"out has shape ({out.shape[0]}, {out.shape[1]}), expected ({n_rows}, {n})")
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None and v.shape[0] != n:
            raise ValueError(f"{name} has {v.shape[0]} values, rows have {n}")
    _check_threads(n_threads)
    cdef const float *w = &weight[0] if weight is not None else NULL
    cdef const float *b = &bias[0] if bias is not None else NULL
    cdef int arith = _switch.arith, use_avx2 = _switch.isa >= GGUFLM_ISA_AVX2
    if n_rows and n:
        with nogil:
            gguflm_layer_norm_rows(n_rows, <int>n, &x[0, 0], n, w, b, eps, &out[0, 0], n, arith, use_avx2, n_threads)


cdef _unary(int kind, const float[:, ::1] x, float[:, ::1] out, int n_threads):
    if out.shape[0] != x.shape[0] or out.shape[1] != x.shape[1]:
        raise ValueError("x and out must have the same shape")
    _check_threads(n_threads)
    cdef Py_ssize_t n_rows = x.shape[0], n = x.shape[1]
    cdef int use_avx2 = _switch.isa >= GGUFLM_ISA_AVX2
    if n_rows and n:
        with nogil:
            gguflm_unary_rows(kind, GELU_TABLE, n_rows, <int>n, &x[0, 0], n, &out[0, 0], n, use_avx2, n_threads)


def gelu(const float[:, ::1] x, float[:, ::1] out, int n_threads=1):
    """``out = gelu(x)`` through ggml's fp16 lookup table (ggml_vec_gelu_f32)."""
    _unary(GGUFLM_UNARY_GELU, x, out, n_threads)


def tanh(const float[:, ::1] x, float[:, ::1] out, int n_threads=1):
    """``out = tanhf(x)`` element by element (ggml_vec_tanh_f32)."""
    _unary(GGUFLM_UNARY_TANH, x, out, n_threads)


def hadamard(float[:, ::1] x, int chunk, int n_threads=1):
    """Rotate every ``chunk`` values of each row of ``x`` in place by the orthonormal
    Walsh-Hadamard matrix (llama.cpp's rotation of Q and K for a quantized K cache, of V and the
    attention output for a quantized V cache), as ggml-cpu's fast transform rounds it."""
    _check_threads(n_threads)
    if chunk < 1 or chunk & (chunk - 1) or x.shape[1] % chunk:
        raise ValueError(f"the chunk must be a power of two dividing the row length {x.shape[1]}, got {chunk}")
    if x.shape[0]:
        with nogil:
            gguflm_hadamard_rows(x.shape[0], x.shape[1], chunk, &x[0, 0], x.strides[0] // sizeof(float), n_threads)


def pool_mean(const float[:, ::1] x, const float[:, ::1] mean, float[:, ::1] out, int n_threads=1):
    """``out = mean @ x`` ([n_seqs, n_tokens] by [n_tokens, n]) in the order ggml's F32 mul_mat of
    llama.cpp's mean pooling sums it."""
    cdef Py_ssize_t n_tok = x.shape[0], n = x.shape[1], n_seqs = mean.shape[0]
    if mean.shape[1] != n_tok:
        raise ValueError(f"mean has {mean.shape[1]} columns for {n_tok} tokens")
    if out.shape[0] != n_seqs or out.shape[1] != n:
        raise ValueError(f"out must be ({n_seqs}, {n})")
    _check_threads(n_threads)
    cdef int rc = 0, arith = _switch.arith, use_avx2 = _switch.isa >= GGUFLM_ISA_AVX2
    if n_seqs and n:
        with nogil:
            rc = gguflm_pool_mean(<int>n_tok, <int>n, <int>n_seqs, &x[0, 0] if n_tok else NULL, n, &mean[0, 0],
                                  &out[0, 0], n, arith, use_avx2, n_threads)
    if rc:
        raise MemoryError("pooling scratch allocation failed")


def rope(float[:, ::1] x, const int32_t[::1] pos, int n_heads, int head_dim, int n_dims, bint neox,
         float freq_base, float freq_scale=1.0, float ext_factor=0.0, float attn_factor=1.0,
         float beta_fast=32.0, float beta_slow=1.0, int n_ctx_orig=0, const float[::1] freq_factors=None,
         int n_threads=1):
    """Rotate ``x`` ([n_tokens, n_heads * head_dim]) in place by each token's position ``pos``.

    Parameters mirror ggml_rope_ext: the first ``n_dims`` of each head are rotated, ``neox``
    selects the pairing, ``freq_scale``/``ext_factor``/``beta_*``/``n_ctx_orig`` are YaRN's.
    """
    cdef Py_ssize_t n_tok = x.shape[0], t
    if pos.shape[0] != n_tok:
        raise ValueError(f"{pos.shape[0]} positions for {n_tok} rows")
    if x.shape[1] != <Py_ssize_t>n_heads * head_dim:
        raise ValueError(f"rows hold {x.shape[1]} values, expected {n_heads} x {head_dim}")
    if n_dims <= 0 or n_dims > head_dim or n_dims % 2:
        raise ValueError(f"n_dims must be even and in (0, {head_dim}], got {n_dims}")
    if freq_factors is not None and freq_factors.shape[0] < n_dims // 2:
        raise ValueError(f"freq_factors needs {n_dims // 2} values")
    cdef gguflm_rope_params p
    p.n_dims = n_dims
    p.neox = neox
    p.freq_base = freq_base
    p.freq_scale = freq_scale
    p.ext_factor = ext_factor
    p.attn_factor = attn_factor
    p.freq_factors = &freq_factors[0] if freq_factors is not None else NULL
    gguflm_rope_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, &p.corr_low, &p.corr_high)
    _check_threads(n_threads)
    cdef int rc = 0
    if n_tok:
        with nogil:
            rc = gguflm_rope_apply(&p, &pos[0], n_tok, n_heads, head_dim, &x[0, 0], x.shape[1], n_threads)
    if rc:
        raise MemoryError("rope scratch allocation failed")


cdef int _check_glu(const float[:, ::1] gate, const float[:, ::1] up, float[:, ::1] out) except -1:
    if up.shape[0] != gate.shape[0] or up.shape[1] != gate.shape[1] \
            or out.shape[0] != gate.shape[0] or out.shape[1] != gate.shape[1]:
        raise ValueError("gate, up and out must have the same shape")
    return 0


cdef _glu(int kind, const float[:, ::1] gate, const float[:, ::1] up, float[:, ::1] out, int n_threads):
    _check_glu(gate, up, out)
    _check_threads(n_threads)
    cdef Py_ssize_t n_rows = gate.shape[0], n = gate.shape[1]
    cdef int arith = _switch.arith, use_avx2 = _switch.isa >= GGUFLM_ISA_AVX2
    if n_rows:
        with nogil:
            gguflm_glu_rows(kind, GELU_TABLE, n_rows, <int>n, &gate[0, 0], n, &up[0, 0], n, &out[0, 0], n,
                            arith, use_avx2, n_threads)


def swiglu(const float[:, ::1] gate, const float[:, ::1] up, float[:, ::1] out, int n_threads=1):
    """``out = silu(gate) * up`` (SwiGLU, ggml's vector SiLU)."""
    _glu(GGUFLM_GLU_SWIGLU, gate, up, out, n_threads)


def geglu(const float[:, ::1] gate, const float[:, ::1] up, float[:, ::1] out, int n_threads=1):
    """``out = gelu(gate) * up`` with ggml's tanh-GELU fp16 lookup table."""
    _glu(GGUFLM_GLU_GEGLU, gate, up, out, n_threads)


def gelu_table() -> np.ndarray:
    """The fp16 GELU lookup table, as float16 (for tests)."""
    return np.asarray(<ggml_half[:65536]>GELU_TABLE).view(np.float16).copy()


# ggml type ids of the cache formats, and the bytes of one row of n values in each
_CACHE_TYPES = {"f32": (0, np.float32), "f16": (1, np.float16), "q8_0": (8, np.uint8)}


cdef int64_t _cache_row_bytes(int type_id, int64_t n):
    if type_id == 8:
        return n // 32 * 34
    return n * (2 if type_id == 1 else 4)


cdef int _check_cache(cnp.ndarray cache, str cache_type, int64_t n_values, str name) except -1:
    if cache_type not in _CACHE_TYPES:
        raise ValueError(f"{name} cache type must be f32, f16 or q8_0, got {cache_type!r}")
    type_id, dtype = _CACHE_TYPES[cache_type]
    if cache.ndim != 2 or not cache.flags.c_contiguous:
        raise ValueError(f"{name} cache must be a C-contiguous 2-D array")
    if cache.dtype != dtype:
        raise TypeError(f"a {cache_type} {name} cache must be a {np.dtype(dtype).name} array, got {cache.dtype}")
    if cache.shape[1] * cache.itemsize < _cache_row_bytes(type_id, n_values):
        raise ValueError(f"{name} cache rows are too short for their heads")
    return type_id


def attention(const float[:, ::1] q, cnp.ndarray k_cache, str type_k, cnp.ndarray v_cache, str type_v, int n_kv,
              const int32_t[::1] cell_pos, const uint64_t[::1] cell_seq,
              const int32_t[::1] tok_pos, const int32_t[::1] tok_seq,
              int n_head, int n_head_kv, int head_dim_k, int head_dim_v,
              float kq_scale, float[:, ::1] out, bint causal=True, int n_swa=0, float softcap=0.0,
              int n_threads=1, const int32_t[::1] cell_seq_id=None, int n_cols=0, float max_bias=0.0,
              bint per_stream=False, bint swa_symmetric=False, bint swa_chunked=False):
    """Attention of ``q`` ([n_tokens, n_head * head_dim_k]) over cache cells ``[0, n_kv)``.

    ``k_cache``/``v_cache`` hold one row per cell of n_head_kv * head_dim values: float32 ("f32"),
    float16 ("f16") or uint8 Q8_0 blocks ("q8_0"), as ``type_k``/``type_v`` say; a cell
    is visible to a token when ``cell_seq`` has the token's sequence bit, its position is not in
    the token's future (``causal``) and within ``n_swa`` positions (0 = no window; with
    ``swa_symmetric``, within n_swa / 2 positions either way; with ``swa_chunked``, within the
    token's chunk of n_swa positions). Writes
    ``out`` ([n_tokens, n_head * head_dim_v]).

    Without a cache (encoders), ``cell_seq_id`` gives each cell's one sequence instead of
    ``cell_seq`` (which may then be empty), ``n_cols`` the length of ggml's score rows (n_kv,
    unpadded), and ``max_bias`` > 0 adds ALiBi biases. ``per_stream``: the cache has one region
    per sequence (llama.cpp's KV streams), so a token rounds as a batch only when its own sequence
    has two or more tokens here.
    """
    cdef Py_ssize_t n_tok = q.shape[0]
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise ValueError(f"n_head ({n_head}) must be a positive multiple of n_head_kv ({n_head_kv})")
    if head_dim_k % 32 or head_dim_v % 32 or head_dim_k <= 0 or head_dim_v <= 0:
        raise ValueError("head dimensions must be positive multiples of 32")
    if q.shape[1] != <Py_ssize_t>n_head * head_dim_k:
        raise ValueError(f"q rows hold {q.shape[1]} values, expected {n_head * head_dim_k}")
    if out.shape[0] != n_tok or out.shape[1] != <Py_ssize_t>n_head * head_dim_v:
        raise ValueError(f"out must be {(n_tok, n_head * head_dim_v)}")
    if tok_pos.shape[0] != n_tok or tok_seq.shape[0] != n_tok:
        raise ValueError("tok_pos and tok_seq need one entry per token")
    cdef int k_id = _check_cache(k_cache, type_k, <int64_t>n_head_kv * head_dim_k, "K")
    cdef int v_id = _check_cache(v_cache, type_v, <int64_t>n_head_kv * head_dim_v, "V")
    if n_kv < 0 or n_kv > k_cache.shape[0] or n_kv > v_cache.shape[0] or cell_pos.shape[0] < n_kv \
            or (cell_seq.shape[0] if cell_seq_id is None else cell_seq_id.shape[0]) < n_kv:
        raise ValueError(f"n_kv {n_kv} exceeds the cache")
    if n_cols and (n_cols != n_kv or type_k != "f32" or type_v != "f32"):
        raise ValueError("n_cols (no cache) must equal n_kv, with f32 K and V")
    cdef Py_ssize_t t
    for t in range(n_tok):
        if tok_seq[t] < 0 or (cell_seq_id is None and tok_seq[t] >= 64):
            raise ValueError(f"sequence id {tok_seq[t]} out of range [0, 64)")
    cdef gguflm_attn_args a
    a.q = &q[0, 0] if n_tok else NULL
    a.q_stride = q.shape[1]
    a.n_tok = <int>n_tok
    a.n_head = n_head
    a.n_head_kv = n_head_kv
    a.head_dim_k = head_dim_k
    a.head_dim_v = head_dim_v
    a.k = cnp.PyArray_DATA(k_cache)
    a.v = cnp.PyArray_DATA(v_cache)
    a.cache_type_k = k_id
    a.cache_type_v = v_id
    a.k_row_bytes = k_cache.shape[1] * k_cache.itemsize
    a.v_row_bytes = v_cache.shape[1] * v_cache.itemsize
    a.n_kv = n_kv
    a.cell_pos = &cell_pos[0] if cell_pos.shape[0] else NULL
    a.cell_seq = &cell_seq[0] if cell_seq is not None and cell_seq.shape[0] else NULL
    a.tok_pos = &tok_pos[0] if n_tok else NULL
    a.tok_seq = &tok_seq[0] if n_tok else NULL
    a.causal = causal
    a.n_swa = n_swa
    a.kq_scale = kq_scale
    a.softcap = softcap
    a.out = &out[0, 0] if n_tok else NULL
    a.out_stride = out.shape[1]
    a.arith = _switch.arith
    a.cell_seq_id = &cell_seq_id[0] if cell_seq_id is not None and cell_seq_id.shape[0] else NULL
    a.n_cols = n_cols
    a.max_bias = max_bias
    a.sinks = NULL
    a.per_stream = per_stream
    a.per_token = 0
    a.batched_seqs = 0
    a.swa_symmetric = swa_symmetric
    a.rel_bias = NULL
    a.rel_buckets = 0
    a.rel_bidirectional = 0
    a.swa_chunked = swa_chunked
    _check_threads(n_threads)
    cdef int rc, isa = _switch.isa
    with nogil:
        rc = gguflm_attention(&a, isa, n_threads)
    if rc != 0:
        raise MemoryError("attention scratch allocation failed")
