# The nogil C API of the quantization kernels, for other Cython modules:
#     from quants_kernels cimport gguflm_matmul_q, gguflm_act_buffer_bytes, ...
# The kernels are static functions in headers (each importing extension compiles its own copy) and
# keep no state: the ones that pick kernels take the ISA (and matmuls the arithmetic), which a caller
# reads from the one switch (dispatch.pxd) when its call starts. Arguments are not checked at this
# level.
#
# A projection that shares its input (Q, K, V; gate, up), as tests/test_quants_pxd.py does:
#     from dispatch cimport bind_dispatch, gguflm_dispatch
#     cdef const gguflm_dispatch *switch = bind_dispatch()     # once, at import
#     vdt = gguflm_traits[wtype].vec_dot_type
#     xq = <buffer of gguflm_act_buffer_bytes(vdt, n_tok, n_embd) bytes, owned by the caller>
#     isa, arith = switch.isa, switch.arith
#     with nogil:
#         gguflm_quantize_act(vdt, &x[0, 0], n_embd, n_tok, n_embd, xq, isa, n_threads)
#         gguflm_matmul_q(wtype, wq, wq_row_bytes, n_q, n_embd, xq, n_tok, &q[0, 0], n_q, 1, isa, arith, n_threads)
#         gguflm_matmul_q(wtype, wk, wk_row_bytes, n_k, n_embd, xq, n_tok, &k[0, 0], n_k, 1, isa, arith, n_threads)
# Weights of different types need activations in their own partner types (one buffer each).
# n_threads: the context's n_threads for one token, n_threads_batch for more.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

cdef extern from "quants_kernels.h" nogil:
    enum:
        GGUFLM_TYPE_COUNT
        GGUFLM_PATH_DOT
        # a matmul's `repacked` (quants_dot.h): llama.cpp's plain buffer, its CPU_REPACK one (the
        # file's layout here), the same in gguflm's rows-16 layout
        GGUFLM_PLAIN
        GGUFLM_REPACKED
        GGUFLM_REPACKED_ROWS16
        GGUFLM_ROWS16
        # a single token's matrix of legacy blocks this large (bytes) is streamed row by row
        # (quants_recipe.h: DOT_STREAM)
        GGUFLM_STREAM_BYTES
        GGUFLM_TQ1_0
        GGUFLM_TQ2_0

    # out[t * out_stride + r] = W_r . Y_t for r < nr, t < nt in arithmetic arith (see quants_dot.h)
    ctypedef void (*gguflm_gemm_fn)(int64_t n, const uint8_t *w, int64_t w_stride, int64_t nr, const uint8_t *y,
                                    int64_t y_stride, int64_t nt, float *out, int64_t out_stride, int arith)
    ctypedef void (*gguflm_to_float_fn)(const void *x, float *y, int64_t k)
    ctypedef void (*gguflm_from_float_fn)(const float *x, void *y, int64_t k)

    ctypedef struct gguflm_type_traits:
        const char *name
        int block_size          # 0: a type the kernels do not handle
        int type_size
        int vec_dot_type        # -1: no dot kernel (Q8_1, Q8_K)
        gguflm_to_float_fn to_float
        gguflm_from_float_fn from_float        # weights: ggml's reference quantizer
        gguflm_from_float_fn from_float_act    # activations: ggml's CPU from_float

    const gguflm_type_traits gguflm_traits[]

    int gguflm_type_known(int type)
    int64_t gguflm_row_bytes(int type, int64_t n)
    int64_t gguflm_act_buffer_bytes(int vec_dot_type, int64_t n_tok, int64_t n_in)

    # isa's kernel of recipe path for a weight type (NULL: none); isa is a GGUFLM_ISA_* (dispatch.pxd)
    gguflm_gemm_fn gguflm_kernel(int isa, int path, int type)
    int gguflm_amx_batch(int isa, int wtype, int64_t n_rows, int64_t w_stride, int64_t n_in, int repacked, int arith)
    # isa's row conversions of a type (the traits' ones, but F16C for F16 rows in the SIMD ISAs);
    # activation: the quantizer ggml's CPU backend uses for src1
    gguflm_to_float_fn gguflm_to_float(int isa, int type)
    gguflm_from_float_fn gguflm_from_float(int isa, int type, int activation)
    # ggml's quantizer with importance weights qw [k] (one per column), NULL when ggml ignores them
    ctypedef void (*gguflm_quantize_w_fn)(const float *x, void *y, int64_t k, const float *qw)
    gguflm_quantize_w_fn gguflm_quantize_weighted(int type)

    # x [n_tok, n_in] (row stride x_stride floats) -> xq [n_tok, row_bytes(vec_dot_type, n_in)]
    void gguflm_quantize_act(int vec_dot_type, const float *x, int64_t x_stride, int64_t n_tok, int64_t n_in,
                             void *xq, int isa, int n_threads)
    # out [n_tok, n_rows] (row stride out_stride floats) = W [n_rows, n_in] . xq, with the recipes
    # llama.cpp takes for this shape in arithmetic arith (GGUFLM_ARITH_*), on isa's kernels;
    # repacked: GGUFLM_PLAIN for a token embedding used as the output matrix, GGUFLM_REPACKED_ROWS16
    # for a weight in the rows-16 layout (quants_rows16.h)
    void gguflm_matmul_q(int wtype, const void *w, int64_t w_stride, int64_t n_rows, int64_t n_in,
                         const void *xq, int64_t n_tok, float *out, int64_t out_stride, int repacked,
                         int isa, int arith, int n_threads)
    # the same from float x, quantized into scratch (act_buffer_bytes) inside the one parallel region
    void gguflm_matmul_f32(int wtype, const void *w, int64_t w_stride, int64_t n_rows, int64_t n_in,
                           const float *x, int64_t x_stride, int64_t n_tok, void *scratch, float *out,
                           int64_t out_stride, int repacked, int isa, int arith, int n_threads)
    # rows-16 layout (quants_rows16.h): its types, and n_rows (a multiple of 16) rows converted to it
    # (to_rows16 1) or back (0); dst may be src (then tmp takes 16 x row_bytes), else n_threads copy
    int gguflm_rows16_type(int type)
    void gguflm_rows16_convert(int type, int to_rows16, const uint8_t *src, uint8_t *dst, int64_t n_rows,
                               int64_t row_bytes, uint8_t *tmp, int n_threads)
    # TQ1_0 blocks rewritten as TQ2_0 blocks (quants_tq_held.h: how a loaded model holds its TQ1_0
    # matmul weights; the kernels' outputs do not change)
    void gguflm_tq1_as_tq2(const uint8_t *src, uint8_t *dst, int64_t n_blocks, int n_threads)
    # out[i] = row ids[i] of W as floats
    void gguflm_get_rows(int type, const void *w, int64_t w_stride, int64_t n_in, const int32_t *ids,
                         int64_t n_ids, float *out, int64_t out_stride, int isa)
    uint64_t gguflm_read_sum(const uint64_t *buf, int64_t n_words, int n_threads)
    # int8 operations of isa's peak loop run iters rounds on n_threads threads (0: no such loop)
    int64_t gguflm_int8_peak(int isa, int amx, int64_t iters, int n_threads, int64_t *checksum)
