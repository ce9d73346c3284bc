"""Recorded forward passes: a :class:`Plan` is the node list a Graph records for one ubatch shape,
run segment by segment with the GIL released and replayed for every later ubatch of that shape.

Recording methods take numpy arrays and keep references to them, so every pointer a node holds
stays valid for the plan's life. Nothing here checks shapes beyond what recording needs: the
Graph (``gguflm/graph.py``) is the only caller.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memset
from dispatch cimport bind_dispatch, dispatch_names, gguflm_dispatch
from ops_kernels cimport ggml_half, gguflm_attn_args, gguflm_gelu_table_init, gguflm_rope_corr_dims, gguflm_rope_params
from ssm_kernels cimport gguflm_ssm_args
from delta_net_kernels cimport gguflm_gdn_args
from wkv_kernels cimport gguflm_wkv_args

cnp.import_array()

cdef extern from "plan.h" nogil:
    enum:
        GGUFLM_OP_LAYER
        GGUFLM_OP_GET_ROWS
        GGUFLM_OP_COPY
        GGUFLM_OP_TAKE_ROWS
        GGUFLM_OP_SCALE
        GGUFLM_OP_HADAMARD
        GGUFLM_OP_ADD
        GGUFLM_OP_ADD_ROW
        GGUFLM_OP_RMS_NORM
        GGUFLM_OP_QUANTIZE
        GGUFLM_OP_MATMUL
        GGUFLM_OP_ROPE
        GGUFLM_OP_KV_STORE
        GGUFLM_OP_ATTENTION
        GGUFLM_OP_GLU
        GGUFLM_OP_SOFTCAP
        GGUFLM_OP_LAYER_NORM
        GGUFLM_OP_UNARY
        GGUFLM_OP_POOL_MEAN
        GGUFLM_OP_MOE_ROUTE
        GGUFLM_OP_MOE_GATHER
        GGUFLM_OP_MATMUL_ID
        GGUFLM_OP_MOE_COMBINE
        GGUFLM_OP_MOE_SHARED_GATE
        GGUFLM_OP_SWIGLU_OAI
        GGUFLM_OP_MOE_ADD_ID
        GGUFLM_OP_MUL_ROW
        GGUFLM_OP_MOE_ONE
        GGUFLM_OP_RS_MOVES
        GGUFLM_OP_SSM_CONV
        GGUFLM_OP_SSM_SCAN
        GGUFLM_OP_SSM_SCAN_GROUPED
        GGUFLM_OP_MUL
        GGUFLM_OP_GATED_DELTA_NET
        GGUFLM_OP_GDN_GATES
        GGUFLM_OP_SIGMOID_MUL
        GGUFLM_OP_WKV
        GGUFLM_OP_CLAMP
        GGUFLM_OP_ATTN_TEMP
        GGUFLM_OP_XIELU
        GGUFLM_OP_ALTUP
        GGUFLM_ALTUP_RESCALE
        GGUFLM_ALTUP_TOPK
        GGUFLM_ALTUP_PREDICT
        GGUFLM_ALTUP_CORRECT
        GGUFLM_ALTUP_N
        GGUFLM_MAX_JOBS
    ctypedef struct gguflm_moe_args:
        int32_t n_expert, n_used, gating, norm_w
        float w_scale
        int32_t n_group, n_group_used
        int32_t *ids
        float *weights
        int32_t *offsets
        int32_t *src
        int32_t *slot
    ctypedef struct gguflm_matmul_job:
        int wtype, repacked
        const uint8_t *w
        int64_t w_stride, n_rows
        const uint8_t *xq
        float *out
        int64_t out_stride
    ctypedef gguflm_matmul_job gguflm_matmul_id_job
    ctypedef struct gguflm_moe_one_args:
        const float *bias
        const float *x
        uint8_t *xr
        gguflm_matmul_job router
        uint8_t *xq
        gguflm_matmul_id_job gate_up[2]
        float *act
        uint8_t *act_q
        gguflm_matmul_id_job down
        float *out
        int64_t n_embd, n_ff
    ctypedef struct gguflm_altup_args:
        int32_t kind
        int64_t n_rows, n, slice
        float f
        const float *x
        int64_t x_stride
        const float *y
        int64_t y_stride
        const float *w
        int64_t w_stride
        float *out
        int64_t out_stride
    ctypedef struct gguflm_node:
        int32_t op
        int32_t n_threads
        int64_t n_rows, n
        int64_t x_stride, y_stride, out_stride
        int32_t type, aux
        int32_t group
        int32_t per_token
        int64_t aux64
        float f, f2
        const void *w
        int64_t w_stride
        const float *x
        const float *y
        void *out
        const int32_t *i32
        const int64_t *i64
        gguflm_rope_params rope
        gguflm_attn_args attn
        gguflm_moe_args moe
        gguflm_ssm_args ssm
        gguflm_gdn_args gdn
        gguflm_wkv_args wkv
        gguflm_altup_args altup
    ctypedef struct gguflm_guards:
        uint8_t *const *at
        const int64_t *len
        const int64_t *fill_ptr
        const int64_t *fill
        const int64_t *check_ptr
        const int64_t *check
    int64_t gguflm_plan_run(const gguflm_node *nodes, int64_t start, int64_t n_nodes,
                            const ggml_half *gelu_table, int arith, int isa,
                            const gguflm_guards *guards, int64_t *bad_node, int64_t *bad_zone)

_OP_NAMES = {GGUFLM_OP_LAYER: "LAYER", GGUFLM_OP_GET_ROWS: "GET_ROWS", GGUFLM_OP_COPY: "COPY",
             GGUFLM_OP_TAKE_ROWS: "TAKE_ROWS", GGUFLM_OP_SCALE: "SCALE", GGUFLM_OP_HADAMARD: "HADAMARD", GGUFLM_OP_ADD: "ADD",
             GGUFLM_OP_ADD_ROW: "ADD_ROW", GGUFLM_OP_RMS_NORM: "RMS_NORM", GGUFLM_OP_QUANTIZE: "QUANTIZE",
             GGUFLM_OP_MATMUL: "MATMUL", GGUFLM_OP_ROPE: "ROPE", GGUFLM_OP_KV_STORE: "KV_STORE",
             GGUFLM_OP_ATTENTION: "ATTENTION", GGUFLM_OP_GLU: "GLU", GGUFLM_OP_SOFTCAP: "SOFTCAP",
             GGUFLM_OP_LAYER_NORM: "LAYER_NORM", GGUFLM_OP_UNARY: "UNARY", GGUFLM_OP_POOL_MEAN: "POOL_MEAN",
             GGUFLM_OP_MOE_ROUTE: "MOE_ROUTE", GGUFLM_OP_MOE_GATHER: "MOE_GATHER", GGUFLM_OP_MATMUL_ID: "MATMUL_ID",
             GGUFLM_OP_MOE_COMBINE: "MOE_COMBINE", GGUFLM_OP_MOE_SHARED_GATE: "MOE_SHARED_GATE",
             GGUFLM_OP_SWIGLU_OAI: "SWIGLU_OAI", GGUFLM_OP_MOE_ADD_ID: "MOE_ADD_ID",
             GGUFLM_OP_MUL_ROW: "MUL_ROW", GGUFLM_OP_MOE_ONE: "MOE_ONE", GGUFLM_OP_RS_MOVES: "RS_MOVES",
             GGUFLM_OP_SSM_CONV: "SSM_CONV", GGUFLM_OP_SSM_SCAN: "SSM_SCAN",
             GGUFLM_OP_SSM_SCAN_GROUPED: "SSM_SCAN_GROUPED", GGUFLM_OP_MUL: "MUL",
             GGUFLM_OP_GATED_DELTA_NET: "GATED_DELTA_NET", GGUFLM_OP_GDN_GATES: "GDN_GATES",
             GGUFLM_OP_SIGMOID_MUL: "SIGMOID_MUL", GGUFLM_OP_WKV: "WKV",
             GGUFLM_OP_CLAMP: "CLAMP", GGUFLM_OP_ATTN_TEMP: "ATTN_TEMP", GGUFLM_OP_XIELU: "XIELU",
             GGUFLM_OP_ALTUP: "ALTUP"}

cdef ggml_half GELU_TABLE[65536 + 1]   # + 1: the AVX2 lookup gathers 4 bytes for the last entry too
GELU_TABLE[65536] = 0
gguflm_gelu_table_init(GELU_TABLE)

# every run reads the ISA and arithmetic in force when it starts (gguflm.system sets them) and
# keeps them to its last node: a plan follows the switch, and one forward pass never mixes ISAs
cdef const gguflm_dispatch *_switch = bind_dispatch()


def dispatch() -> dict:
    """The ISA and arithmetic a plan run would start with now, read through this module's binding."""
    return dispatch_names(_switch)

# what Plan.altup computes (altup.h), and the number of AltUp streams it mixes
ALTUP_KINDS = {"rescale": GGUFLM_ALTUP_RESCALE, "topk": GGUFLM_ALTUP_TOPK, "predict": GGUFLM_ALTUP_PREDICT,
               "correct": GGUFLM_ALTUP_CORRECT}
ALTUP_N = GGUFLM_ALTUP_N

# ggml type ids of the KV cache formats
_CACHE_TYPE_IDS = {"f32": 0, "f16": 1, "q8_0": 8}
# the most matmuls group_matmuls (and group_matmul_ids) puts in one parallel region
MAX_GROUP = GGUFLM_MAX_JOBS


cdef inline void *_ptr(cnp.ndarray a):
    return cnp.PyArray_DATA(a)


cdef inline int64_t _stride(cnp.ndarray a):
    """Row stride of a 2-D array in elements (float32 rows)."""
    return a.strides[0] // a.itemsize


cdef class Plan:
    """Nodes recorded for one ubatch shape, and the per-ubatch inputs they read."""

    cdef gguflm_node *nodes
    cdef int64_t n_nodes, capacity
    cdef gguflm_dispatch ran  # the ISA and arithmetic of the last run (isa < 0: never run)
    cdef list keep          # per step (node or group), the arrays it points into
    cdef list step_nodes    # per step, the index of its first node
    cdef gguflm_guards guards
    cdef readonly bint guarded
    cdef object guard_arrays   # what self.guards points into
    cdef public object tokens, pos, seq_first, output_rows, n_kv, cells, embd, results
    cdef public object pool_mean_weights, pool_rows   # pooling inputs: [n_seqs, n_tokens] weights, [n_seqs] rows
    cdef object n_self          # [1] int32: n_tokens, the cells of attention without a cache
    cdef readonly bint per_token   # matmuls and attention round each token as a one-token pass does

    def __cinit__(self):
        self.nodes = NULL
        self.n_nodes = self.capacity = 0
        self.ran.isa = -1

    def __init__(self, int n_tokens, int n_outputs, int n_caches, int n_embd_input=0, int n_seqs=0,
                 bint per_token=False):
        self.per_token = per_token
        self.keep = []
        self.step_nodes = []
        self.guarded = False
        self.tokens = np.zeros(n_tokens, np.int32)
        self.pos = np.zeros(n_tokens, np.int32)
        self.seq_first = np.zeros(n_tokens, np.int32)
        self.output_rows = np.zeros(n_outputs, np.int64)
        self.n_kv = np.zeros(max(n_caches, 1), np.int32)
        self.cells = [np.zeros(n_tokens, np.int64) for _ in range(n_caches)]
        self.embd = np.zeros((n_tokens, n_embd_input), np.float32) if n_embd_input else None
        self.pool_mean_weights = np.zeros((n_seqs, n_tokens), np.float32)
        self.pool_rows = np.zeros(n_seqs, np.int64)
        self.n_self = np.array([n_tokens], np.int32)
        self.results = None

    def __dealloc__(self):
        free(self.nodes)

    @property
    def last_run(self):
        """``{"isa", "arithmetic"}`` the last :meth:`run` took from the switch (None before one)."""
        return dispatch_names(&self.ran) if self.ran.isa >= 0 else None

    @property
    def size(self):
        return self.n_nodes

    @property
    def step_arrays(self):
        """For each step the executor takes, in order (a node, or the matmuls of a group, which
        run together), the tuple of arrays it reads or writes."""
        return self.keep

    cdef gguflm_node *_add(self, int op, int n_threads, tuple arrays=()) except NULL:
        if self.n_nodes == self.capacity:
            self.capacity = max(64, 2 * self.capacity)
            new = <gguflm_node *>realloc(self.nodes, self.capacity * sizeof(gguflm_node))
            if new == NULL:
                raise MemoryError()
            self.nodes = new
        cdef gguflm_node *nd = &self.nodes[self.n_nodes]
        memset(nd, 0, sizeof(gguflm_node))
        nd.op = op
        nd.n_threads = n_threads
        self.keep.append(arrays)
        self.step_nodes.append(self.n_nodes)
        self.n_nodes += 1
        return nd

    # -- recording (arrays are C-contiguous float32 unless said otherwise)

    def layer(self):
        self._add(GGUFLM_OP_LAYER, 1)

    def get_rows(self, int wtype, cnp.ndarray w, int64_t n_in, cnp.ndarray out, bint by_position=False):
        """out[i] = row tokens[i] (or, ``by_position``, row pos[i]) of w, as floats."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_GET_ROWS, 1, (w, out,))
        nd.type, nd.w, nd.w_stride, nd.n = wtype, _ptr(w), w.strides[0], n_in
        nd.i32 = <const int32_t *>_ptr(self.pos if by_position else self.tokens)
        nd.n_rows, nd.out, nd.out_stride = out.shape[0], _ptr(out), _stride(out)

    def copy(self, cnp.ndarray x, int64_t col0, cnp.ndarray out):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_COPY, 1, (x, out,))
        nd.x, nd.x_stride, nd.aux = <const float *>_ptr(x), _stride(x), col0
        nd.n_rows, nd.n, nd.out, nd.out_stride = out.shape[0], out.shape[1], _ptr(out), _stride(out)

    def take_output_rows(self, cnp.ndarray x, cnp.ndarray out):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_TAKE_ROWS, 1, (x, out,))
        nd.x, nd.x_stride = <const float *>_ptr(x), _stride(x)
        nd.i64 = <const int64_t *>_ptr(self.output_rows)
        nd.n_rows, nd.n, nd.out, nd.out_stride = out.shape[0], out.shape[1], _ptr(out), _stride(out)

    def take_pool_rows(self, cnp.ndarray x, cnp.ndarray out):
        """out[s] = x[pool_rows[s]]: each sequence's first or last token (CLS, LAST, RANK pooling)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_TAKE_ROWS, 1, (x, out,))
        nd.x, nd.x_stride = <const float *>_ptr(x), _stride(x)
        nd.i64 = <const int64_t *>_ptr(self.pool_rows)
        nd.n_rows, nd.n, nd.out, nd.out_stride = out.shape[0], out.shape[1], _ptr(out), _stride(out)

    def pool_mean(self, cnp.ndarray x, cnp.ndarray out, int n_threads):
        """out[s] = the sum over tokens t of pool_mean_weights[s][t] * x[t] (MEAN pooling)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_POOL_MEAN, n_threads, (x, out, self.pool_mean_weights))
        nd.x, nd.x_stride, nd.n_rows, nd.n = <const float *>_ptr(x), _stride(x), x.shape[0], x.shape[1]
        nd.y, nd.aux = <const float *>_ptr(self.pool_mean_weights), out.shape[0]
        nd.out, nd.out_stride = _ptr(out), _stride(out)

    def layer_norm(self, cnp.ndarray x, cnp.ndarray w, cnp.ndarray b, float eps, cnp.ndarray out, int n_threads):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_LAYER_NORM, n_threads, (x, w, b, out,))
        nd.x, nd.x_stride, nd.f = <const float *>_ptr(x), _stride(x), eps
        nd.w = _ptr(w) if w is not None else NULL
        nd.y = <const float *>_ptr(b) if b is not None else NULL
        nd.n_rows, nd.n, nd.out, nd.out_stride = out.shape[0], out.shape[1], _ptr(out), _stride(out)

    def unary(self, int kind, cnp.ndarray x, cnp.ndarray out, int n_threads):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_UNARY, n_threads, (x, out,))
        nd.aux, nd.x, nd.x_stride = kind, <const float *>_ptr(x), _stride(x)
        nd.n_rows, nd.n, nd.out, nd.out_stride = out.shape[0], out.shape[1], _ptr(out), _stride(out)

    def scale(self, cnp.ndarray x, float s):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_SCALE, 1, (x,))
        nd.n_rows, nd.n, nd.out, nd.out_stride, nd.f = x.shape[0], x.shape[1], _ptr(x), _stride(x), s

    def hadamard(self, cnp.ndarray x, int chunk, int n_threads):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_HADAMARD, n_threads, (x,))
        nd.n_rows, nd.n, nd.out, nd.out_stride, nd.aux = x.shape[0], x.shape[1], _ptr(x), _stride(x), chunk

    def softcap(self, cnp.ndarray x, float cap):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_SOFTCAP, 1, (x,))
        nd.n_rows, nd.n, nd.out, nd.out_stride, nd.f = x.shape[0], x.shape[1], _ptr(x), _stride(x), cap

    def clamp(self, cnp.ndarray x, float lo, float hi):
        """x = max(min(x, hi), lo) in place, as ggml_clamp."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_CLAMP, 1, (x,))
        nd.n_rows, nd.n, nd.out, nd.out_stride, nd.f, nd.f2 = x.shape[0], x.shape[1], _ptr(x), _stride(x), lo, hi

    def attn_temp(self, cnp.ndarray x, float scale, float offset, int floor_scale):
        """Row i of x (the ubatch's token i) times llama.cpp's attention temperature of its
        position: log(floor((pos + offset) / floor_scale) + 1) * scale + 1."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_ATTN_TEMP, 1, (x,))
        nd.n_rows, nd.n, nd.out, nd.out_stride = x.shape[0], x.shape[1], _ptr(x), _stride(x)
        nd.f, nd.f2, nd.aux64, nd.i32 = scale, offset, floor_scale, <const int32_t *>_ptr(self.pos)

    def xielu(self, cnp.ndarray x, cnp.ndarray params):
        """x = xIELU(x) in place; params: float32 [alpha_n, alpha_p, beta, eps] as the file gives them."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_XIELU, 1, (x, params))
        nd.n_rows, nd.n, nd.out, nd.out_stride, nd.w = x.shape[0], x.shape[1], _ptr(x), _stride(x), _ptr(params)

    def add(self, cnp.ndarray x, cnp.ndarray y):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_ADD, 1, (x, y,))
        nd.n_rows, nd.n, nd.out, nd.out_stride = x.shape[0], x.shape[1], _ptr(x), _stride(x)
        nd.y, nd.y_stride = <const float *>_ptr(y), _stride(y)

    def add_row(self, cnp.ndarray x, cnp.ndarray b):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_ADD_ROW, 1, (x, b,))
        nd.n_rows, nd.n, nd.out, nd.out_stride, nd.w = x.shape[0], x.shape[1], _ptr(x), _stride(x), _ptr(b)

    def mul_row(self, cnp.ndarray x, cnp.ndarray w):
        """x[i] *= w for every row i, in place."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MUL_ROW, 1, (x, w,))
        nd.n_rows, nd.n, nd.out, nd.out_stride, nd.w = x.shape[0], x.shape[1], _ptr(x), _stride(x), _ptr(w)

    def rms_norm(self, cnp.ndarray x, cnp.ndarray w, float eps, cnp.ndarray out, int n_threads):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_RMS_NORM, n_threads, (x, w, out,))
        nd.x, nd.x_stride, nd.w, nd.f = <const float *>_ptr(x), _stride(x), (_ptr(w) if w is not None else NULL), eps
        nd.n_rows, nd.n, nd.out, nd.out_stride = out.shape[0], out.shape[1], _ptr(out), _stride(out)

    def quantize(self, int vec_dot_type, cnp.ndarray x, cnp.ndarray xq, int n_threads):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_QUANTIZE, n_threads, (x, xq,))
        nd.type, nd.x, nd.x_stride = vec_dot_type, <const float *>_ptr(x), _stride(x)
        nd.n_rows, nd.n, nd.out = x.shape[0], x.shape[1], _ptr(xq)

    def matmul(self, int wtype, cnp.ndarray w, int64_t n_in, cnp.ndarray xq, cnp.ndarray out, int repacked,
               int n_threads, bint per_token=False):
        """out = w . xq; ``repacked``: how w is held (gguflm.quants.matmul_storage); ``per_token``:
        every token's products round as a one-token matmul's (as the whole plan's may)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MATMUL, n_threads, (w, xq, out,))
        nd.type, nd.w, nd.w_stride, nd.aux64, nd.n = wtype, _ptr(w), w.strides[0], w.shape[0], n_in
        nd.aux, nd.per_token = repacked, self.per_token or per_token
        nd.x, nd.n_rows = <const float *>_ptr(xq), xq.shape[0]
        nd.out, nd.out_stride = _ptr(out), _stride(out)

    def group_matmuls(self, int n):
        """Run the last n recorded nodes, matmuls of one input, in one parallel region."""
        if not 1 < n <= GGUFLM_MAX_JOBS or n > self.n_nodes:
            raise ValueError(f"can group 2 to {GGUFLM_MAX_JOBS} matmuls, not {n}")
        cdef gguflm_node *first = &self.nodes[self.n_nodes - n]
        for i in range(n):
            if first[i].op != GGUFLM_OP_MATMUL or first[i].n != first.n or first[i].n_rows != first.n_rows:
                raise ValueError("only matmuls of one input can be grouped")
        first.group = n
        # the group is one step of the executor: each member's buffers are in use while any runs
        self.keep[-n:] = [sum(self.keep[-n:], ())]
        del self.step_nodes[-n + 1:]

    def group_matmul_ids(self, int n):
        """Run the last n recorded nodes, expert matmuls of one routing, in one parallel region."""
        if not 1 < n <= GGUFLM_MAX_JOBS or n > self.n_nodes:
            raise ValueError(f"can group 2 to {GGUFLM_MAX_JOBS} expert matmuls, not {n}")
        cdef gguflm_node *first = &self.nodes[self.n_nodes - n]
        for i in range(n):
            if first[i].op != GGUFLM_OP_MATMUL_ID or first[i].n != first.n or first[i].moe.offsets != first.moe.offsets:
                raise ValueError("only expert matmuls of one input and routing can be grouped")
        first.group = n
        self.keep[-n:] = [sum(self.keep[-n:], ())]
        del self.step_nodes[-n + 1:]

    # -- mixture of experts (src/moe.h); a routing is the tuple (ids, weights, offsets, src, slot)
    # of int32/float32 arrays moe_route fills

    cdef void _set_route(self, gguflm_node *nd, tuple route, int n_expert, int n_used):
        cdef cnp.ndarray ids = route[0], weights = route[1], offsets = route[2], src = route[3], slot = route[4]
        nd.moe.n_expert, nd.moe.n_used = n_expert, n_used
        nd.moe.ids, nd.moe.weights = <int32_t *>_ptr(ids), <float *>_ptr(weights)
        nd.moe.offsets, nd.moe.src, nd.moe.slot = <int32_t *>_ptr(offsets), <int32_t *>_ptr(src), <int32_t *>_ptr(slot)

    def moe_route(self, cnp.ndarray logits, int n_expert, int n_used, int gating, bint norm_w, float w_scale,
                  tuple route, cnp.ndarray bias=None, tuple groups=(0, 0)):
        """Select n_used of n_expert experts per row of ``logits`` and group the rows by expert;
        ``bias`` ([n_expert] F32), where given, is added to the probabilities for the selection only;
        ``groups`` (n_group, n_group_used), n_group > 1: only the n_group_used best of n_group equal
        groups of experts may be selected."""
        if bias is not None and (bias.dtype != np.float32 or bias.size != n_expert or not bias.flags.c_contiguous):
            raise ValueError(f"the selection bias must be {n_expert} contiguous float32 values")
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MOE_ROUTE, 1, (logits,) + route + ((bias,) if bias is not None else ()))
        self._set_route(nd, route, n_expert, n_used)
        nd.moe.gating, nd.moe.norm_w, nd.moe.w_scale = gating, norm_w, w_scale
        nd.moe.n_group, nd.moe.n_group_used = groups
        nd.w = _ptr(bias) if bias is not None else NULL
        nd.x, nd.x_stride, nd.n_rows = <const float *>_ptr(logits), _stride(logits), logits.shape[0]

    def moe_gather(self, cnp.ndarray xq, tuple route, cnp.ndarray out):
        """out[r] = xq[src[r]]: quantized input rows in expert order (uint8 rows)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MOE_GATHER, 1, (xq, out) + route)
        self._set_route(nd, route, 0, 0)
        nd.x, nd.n, nd.n_rows, nd.out = <const float *>_ptr(xq), xq.shape[1], out.shape[0], _ptr(out)

    def moe_gather_weighted(self, cnp.ndarray x, tuple route, int n_expert, int n_used, cnp.ndarray out):
        """out[r] = x[src[r]] times the routing weight with which that token chose r's expert: float
        input rows in expert order, each weighed before the experts (Llama 4)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MOE_GATHER, 1, (x, out) + route)
        self._set_route(nd, route, n_expert, n_used)
        nd.aux, nd.x, nd.x_stride, nd.n, nd.n_rows = 1, <const float *>_ptr(x), _stride(x), x.shape[1], out.shape[0]
        nd.out, nd.out_stride = _ptr(out), _stride(out)

    def matmul_id(self, int wtype, cnp.ndarray w, int64_t n_rows, int64_t n_in, cnp.ndarray xq, cnp.ndarray out,
                  tuple route, int n_expert, bint repacked, int n_threads):
        """out[r] = W[e] . xq[r] for the expert e of every sorted row r; w holds the n_expert
        matrices of n_rows rows one after the other."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MATMUL_ID, n_threads, (w, xq, out) + route)
        self._set_route(nd, route, n_expert, 0)
        nd.type, nd.w, nd.w_stride, nd.aux64, nd.n, nd.aux = wtype, _ptr(w), w.strides[0], n_rows, n_in, repacked
        nd.x, nd.n_rows = <const float *>_ptr(xq), xq.shape[0]
        nd.out, nd.out_stride = _ptr(out), _stride(out)

    def moe_one(self, cnp.ndarray x, cnp.ndarray bias, int n_expert, int n_used, int gating, bint norm_w,
                float w_scale, tuple route, cnp.ndarray xr, cnp.ndarray xq, tuple weights, tuple outs, cnp.ndarray act,
                cnp.ndarray act_q, cnp.ndarray out, int n_threads, tuple groups=(0, 0)):
        """One token's router and routed SwiGLU experts in one parallel region: the router's
        logits of x, routed as :meth:`moe_route` does, then out = the weighted sum over the
        selected experts of down . swiglu(gate . x, up . x). ``weights``: the router's (as
        :meth:`matmul` takes it, ``(wtype, w, repacked)``) then the experts' gate, up and down, each
        ``(wtype, w, n_rows)`` as :meth:`matmul_id` takes them (gate and up of one partner type);
        ``outs``: their outputs, router logits [1, n_expert] then [n_used, n_rows] each; ``xr``: x
        in the router's partner; ``xq``: [n_used] rows of x in the gate's; ``act_q``: [n_used]
        rows of ``act`` in down's."""
        if x.shape[0] != 1:
            raise ValueError("moe_one takes one token")
        args = np.zeros(sizeof(gguflm_moe_one_args), np.uint8)   # kept with the node
        cdef gguflm_moe_one_args *a = <gguflm_moe_one_args *>_ptr(args)
        cdef cnp.ndarray w, o
        cdef gguflm_matmul_id_job *job
        a.bias, a.x = (<const float *>_ptr(bias) if bias is not None else NULL), <const float *>_ptr(x)
        a.xr, a.xq, a.act, a.act_q = <uint8_t *>_ptr(xr), <uint8_t *>_ptr(xq), <float *>_ptr(act), <uint8_t *>_ptr(act_q)
        a.out, a.n_embd, a.n_ff = <float *>_ptr(out), x.shape[1], act.shape[1]
        w, o = weights[0][1], outs[0]
        a.router.wtype, a.router.repacked, a.router.w, a.router.w_stride = weights[0][0], weights[0][2], \
            <const uint8_t *>_ptr(w), w.strides[0]
        a.router.n_rows, a.router.xq, a.router.out, a.router.out_stride = w.shape[0], <const uint8_t *>_ptr(xr), \
            <float *>_ptr(o), _stride(o)
        for i in range(1, 4):
            job = &a.gate_up[i - 1] if i < 3 else &a.down
            w, o = weights[i][1], outs[i]
            job.wtype, job.repacked, job.w, job.w_stride = weights[i][0], 1, <const uint8_t *>_ptr(w), w.strides[0]
            job.n_rows = weights[i][2]
            job.xq = <const uint8_t *>_ptr(xq if i < 3 else act_q)
            job.out, job.out_stride = <float *>_ptr(o), _stride(o)
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MOE_ONE, n_threads,
                                         (x, xr, xq, act, act_q, out, args) + tuple(e[1] for e in weights) + outs
                                         + route + ((bias,) if bias is not None else ()))
        self._set_route(nd, route, n_expert, n_used)
        nd.moe.gating, nd.moe.norm_w, nd.moe.w_scale = gating, norm_w, w_scale
        nd.moe.n_group, nd.moe.n_group_used = groups
        nd.w = a

    def swiglu_oai(self, cnp.ndarray gate, cnp.ndarray up, float alpha, float limit, cnp.ndarray out, int n_threads):
        """gpt-oss's clamped SwiGLU: out = min(gate, limit) * sigmoid(alpha * it) * (clamp(up) + 1)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_SWIGLU_OAI, n_threads, (gate, up, out))
        nd.x, nd.x_stride, nd.y, nd.y_stride = <const float *>_ptr(gate), _stride(gate), <const float *>_ptr(up), _stride(up)
        nd.f, nd.f2 = alpha, limit
        nd.n_rows, nd.n, nd.out, nd.out_stride = out.shape[0], out.shape[1], _ptr(out), _stride(out)

    def moe_add_id(self, cnp.ndarray x, cnp.ndarray b, tuple route):
        """x[r] += b[e] for every sorted row r of expert e (b: [n_expert, n], F32)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MOE_ADD_ID, 1, (x, b) + route)
        self._set_route(nd, route, b.shape[0], 0)
        nd.w, nd.w_stride = _ptr(b), b.strides[0] // 4
        nd.n_rows, nd.n, nd.out, nd.out_stride = x.shape[0], x.shape[1], _ptr(x), _stride(x)

    def moe_scale_id(self, cnp.ndarray x, cnp.ndarray s, tuple route):
        """x[r] *= s[e] for every sorted row r of expert e (s: [n_expert], F32)."""
        if s.dtype != np.float32 or not s.flags.c_contiguous:
            raise ValueError("the expert scales must be contiguous float32 values")
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MOE_ADD_ID, 1, (x, s) + route)
        self._set_route(nd, route, s.size, 0)
        nd.aux, nd.w = 1, _ptr(s)
        nd.n_rows, nd.n, nd.out, nd.out_stride = x.shape[0], x.shape[1], _ptr(x), _stride(x)

    def moe_shared_gate(self, cnp.ndarray g, cnp.ndarray x):
        """x[t] *= silu(g[t]) / g[t] (g: [n_rows, 1])."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MOE_SHARED_GATE, 1, (g, x))
        nd.y, nd.y_stride = <const float *>_ptr(g), _stride(g)
        nd.n_rows, nd.n, nd.out, nd.out_stride = x.shape[0], x.shape[1], _ptr(x), _stride(x)

    def moe_combine(self, cnp.ndarray experts, tuple route, int n_used, cnp.ndarray out, bint weighted=True):
        """out[t] = the weighted sum of token t's expert outputs (rows of ``experts``); without
        ``weighted`` their plain sum (the inputs were weighed, :meth:`moe_gather_weighted`)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MOE_COMBINE, 1, (experts, out) + route)
        self._set_route(nd, route, 0, n_used)
        if not weighted:
            nd.moe.weights = NULL
        nd.x, nd.x_stride, nd.n_rows, nd.n = <const float *>_ptr(experts), _stride(experts), out.shape[0], out.shape[1]
        nd.out, nd.out_stride = _ptr(out), _stride(out)

    def rope(self, cnp.ndarray x, int n_heads, int n_dims, bint neox, float freq_base, float freq_scale,
             float ext_factor, float attn_factor, float beta_fast, float beta_slow, int n_ctx_orig,
             cnp.ndarray freq_factors, int n_threads, cnp.ndarray positions=None, int head_stride=0):
        """Rotate x in place by the plan's positions (or by ``positions``, for K shifts): the first
        n_dims of each of n_heads heads, which follow each other ``head_stride`` values apart
        (0: x's rows are the heads back to back; else x may be a view that starts at the first head's
        rotated part, as in MLA's heads, whose rotated part comes last)."""
        cdef cnp.ndarray pos = self.pos if positions is None else positions
        cdef gguflm_node *nd = self._add(GGUFLM_OP_ROPE, n_threads, (x, freq_factors, pos,))
        nd.rope.n_dims, nd.rope.neox = n_dims, neox
        nd.rope.freq_base, nd.rope.freq_scale = freq_base, freq_scale
        nd.rope.ext_factor, nd.rope.attn_factor = ext_factor, attn_factor
        nd.rope.freq_factors = <const float *>_ptr(freq_factors) if freq_factors is not None else NULL
        gguflm_rope_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow,
                              &nd.rope.corr_low, &nd.rope.corr_high)
        nd.i32 = <const int32_t *>_ptr(pos)
        nd.n_rows, nd.n, nd.aux = x.shape[0], (head_stride * n_heads if head_stride else x.shape[1]), n_heads
        nd.out, nd.out_stride = _ptr(x), _stride(x)

    def kv_store(self, str cache_type, cnp.ndarray data, int cache_index, cnp.ndarray x):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_KV_STORE, 1, (data, x,))
        nd.type, nd.out, nd.w_stride = _CACHE_TYPE_IDS[cache_type], _ptr(data), data.strides[0]
        nd.i64 = <const int64_t *>_ptr(self.cells[cache_index])
        nd.x, nd.x_stride, nd.n_rows, nd.n = <const float *>_ptr(x), _stride(x), x.shape[0], x.shape[1]

    def attention(self, cnp.ndarray q, str type_k, cnp.ndarray k_data, str type_v, cnp.ndarray v_data,
                  int cache_index, cnp.ndarray cell_pos, cnp.ndarray cell_seq, int n_head, int n_head_kv,
                  int head_dim_k, int head_dim_v, float kq_scale, bint causal, int n_swa, float softcap,
                  cnp.ndarray out, int n_threads, cnp.ndarray sinks=None, bint per_stream=False,
                  float max_bias=0.0, cnp.ndarray rel_bias=None, bint rel_bidirectional=False,
                  bint swa_chunked=False):
        """Attention of q over the cache's cells [0, n_kv) (the plan's n_kv of ``cache_index``),
        with ALiBi biases from each cell's position when ``max_bias`` > 0, T5's relative
        position biases where ``rel_bias`` ([n_buckets, n_head] float32) is given; ``swa_chunked``:
        the window of ``n_swa`` is the token's chunk of n_swa positions."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_ATTENTION, n_threads, (q, k_data, v_data, cell_pos, cell_seq, out,
                                                                          sinks, rel_bias))
        self._set_rel_bias(nd, rel_bias, n_head, rel_bidirectional)
        nd.attn.sinks = <const float *>_ptr(sinks) if sinks is not None else NULL
        nd.attn.q, nd.attn.q_stride, nd.attn.n_tok = <const float *>_ptr(q), _stride(q), q.shape[0]
        nd.attn.n_head, nd.attn.n_head_kv = n_head, n_head_kv
        nd.attn.head_dim_k, nd.attn.head_dim_v = head_dim_k, head_dim_v
        nd.attn.k, nd.attn.v = _ptr(k_data), _ptr(v_data)
        nd.attn.cache_type_k, nd.attn.cache_type_v = _CACHE_TYPE_IDS[type_k], _CACHE_TYPE_IDS[type_v]
        nd.attn.k_row_bytes, nd.attn.v_row_bytes = k_data.strides[0], v_data.strides[0]
        nd.attn.cell_pos = <const int32_t *>_ptr(cell_pos)
        nd.attn.cell_seq = <const uint64_t *>_ptr(cell_seq)
        nd.attn.tok_pos = <const int32_t *>_ptr(self.pos)
        nd.attn.tok_seq = <const int32_t *>_ptr(self.seq_first)
        nd.attn.causal, nd.attn.n_swa, nd.attn.kq_scale, nd.attn.softcap = causal, n_swa, kq_scale, softcap
        nd.attn.max_bias, nd.attn.swa_chunked = max_bias, swa_chunked
        nd.attn.per_stream, nd.attn.per_token = per_stream, self.per_token
        nd.attn.out, nd.attn.out_stride = <float *>_ptr(out), _stride(out)
        nd.i32 = <const int32_t *>_ptr(self.n_kv) + cache_index

    def attention_self(self, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, int n_head, int n_head_kv, int head_dim_k,
                       int head_dim_v, float kq_scale, bint causal, float max_bias, cnp.ndarray out, int n_threads,
                       int n_swa=0, bint swa_symmetric=False, cnp.ndarray rel_bias=None):
        """Attention of the ubatch's tokens over the ubatch's own F32 K and V rows (no cache: one cell
        per token, visible within its first sequence), with ALiBi when ``max_bias`` > 0, within a
        sliding window of ``n_swa`` positions (0: none; ``swa_symmetric``: n_swa / 2 either way),
        with T5's bidirectional relative position biases where ``rel_bias`` is given."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_ATTENTION, n_threads, (q, k, v, out, rel_bias))
        self._set_rel_bias(nd, rel_bias, n_head, True)
        nd.attn.q, nd.attn.q_stride, nd.attn.n_tok = <const float *>_ptr(q), _stride(q), q.shape[0]
        nd.attn.n_head, nd.attn.n_head_kv = n_head, n_head_kv
        nd.attn.head_dim_k, nd.attn.head_dim_v = head_dim_k, head_dim_v
        nd.attn.k, nd.attn.v = _ptr(k), _ptr(v)
        nd.attn.cache_type_k = nd.attn.cache_type_v = _CACHE_TYPE_IDS["f32"]
        nd.attn.k_row_bytes, nd.attn.v_row_bytes = k.strides[0], v.strides[0]
        nd.attn.cell_pos = nd.attn.tok_pos = <const int32_t *>_ptr(self.pos)
        nd.attn.cell_seq_id = nd.attn.tok_seq = <const int32_t *>_ptr(self.seq_first)
        nd.attn.n_cols = q.shape[0]
        nd.attn.causal, nd.attn.kq_scale, nd.attn.max_bias = causal, kq_scale, max_bias
        nd.attn.n_swa, nd.attn.swa_symmetric = n_swa, swa_symmetric
        nd.attn.out, nd.attn.out_stride = <float *>_ptr(out), _stride(out)
        nd.i32 = <const int32_t *>_ptr(self.n_self)

    def attention_cross(self, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, cnp.ndarray cell_pos,
                        cnp.ndarray cell_seq_id, cnp.ndarray n_cells, int n_head, int n_head_kv, int head_dim,
                        float kq_scale, cnp.ndarray out, int n_threads):
        """Attention of the ubatch's tokens over other F32 K and V rows (T5's cross-attention over
        the encoder's outputs): cell c, at ``cell_pos[c]`` in sequence ``cell_seq_id[c]``, is visible
        to the tokens of that sequence; ``n_cells`` ([1] int32) says how many rows there are, which
        is also the length of ggml's score rows (no padding)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_ATTENTION, n_threads, (q, k, v, cell_pos, cell_seq_id, n_cells, out))
        nd.attn.q, nd.attn.q_stride, nd.attn.n_tok = <const float *>_ptr(q), _stride(q), q.shape[0]
        nd.attn.n_head, nd.attn.n_head_kv = n_head, n_head_kv
        nd.attn.head_dim_k = nd.attn.head_dim_v = head_dim
        nd.attn.k, nd.attn.v = _ptr(k), _ptr(v)
        nd.attn.cache_type_k = nd.attn.cache_type_v = _CACHE_TYPE_IDS["f32"]
        nd.attn.k_row_bytes, nd.attn.v_row_bytes = k.strides[0], v.strides[0]
        nd.attn.cell_pos = <const int32_t *>_ptr(cell_pos)
        nd.attn.tok_pos = <const int32_t *>_ptr(self.pos)
        nd.attn.cell_seq_id = <const int32_t *>_ptr(cell_seq_id)
        nd.attn.tok_seq = <const int32_t *>_ptr(self.seq_first)
        nd.attn.n_cols = k.shape[0]
        nd.attn.kq_scale = kq_scale
        nd.attn.out, nd.attn.out_stride = <float *>_ptr(out), _stride(out)
        nd.i32 = <const int32_t *>_ptr(n_cells)

    cdef void _set_rel_bias(self, gguflm_node *nd, cnp.ndarray rel_bias, int n_head, bint bidirectional) except *:
        if rel_bias is None:
            return
        if rel_bias.dtype != np.float32 or rel_bias.ndim != 2 or rel_bias.shape[1] != n_head \
                or not rel_bias.flags.c_contiguous:
            raise ValueError(f"rel_bias must be float32 [n_buckets, {n_head}], contiguous")
        nd.attn.rel_bias = <const float *>_ptr(rel_bias)
        nd.attn.rel_buckets, nd.attn.rel_bidirectional = rel_bias.shape[0], bidirectional

    def glu(self, int kind, cnp.ndarray gate, cnp.ndarray up, cnp.ndarray out, int n_threads):
        cdef gguflm_node *nd = self._add(GGUFLM_OP_GLU, n_threads, (gate, up, out,))
        nd.aux, nd.x, nd.x_stride, nd.y, nd.y_stride = kind, <const float *>_ptr(gate), _stride(gate), \
            <const float *>_ptr(up), _stride(up)
        nd.n_rows, nd.n, nd.out, nd.out_stride = out.shape[0], out.shape[1], _ptr(out), _stride(out)

    # -- recurrent states (ssm.h)

    def rs_moves(self, cnp.ndarray moves, cnp.ndarray r_all, cnp.ndarray s_all):
        """Make the recurrent memory's staged state moves (``moves``: int32 count, then (dst, src)
        pairs; r_all, s_all: [n_layer, size, width] states), once: the count is cleared."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_RS_MOVES, 1, (moves, r_all, s_all))
        nd.i32, nd.out, nd.w = <const int32_t *>_ptr(moves), _ptr(r_all), _ptr(s_all)
        nd.n, nd.aux64, nd.n_rows, nd.x_stride = r_all.shape[2], s_all.shape[2], r_all.shape[0], r_all.shape[1]

    cdef void _set_ssm(self, gguflm_node *nd, int cache_index, cnp.ndarray x, cnp.ndarray out):
        nd.ssm.cells = <const int64_t *>_ptr(self.cells[cache_index])
        nd.ssm.n_tokens, nd.ssm.d_inner = x.shape[0], x.shape[1]
        nd.ssm.x, nd.ssm.x_stride = <const float *>_ptr(x), _stride(x)
        nd.ssm.out, nd.ssm.out_stride = <float *>_ptr(out), _stride(out)

    def ssm_conv(self, cnp.ndarray r, int cache_index, cnp.ndarray x, cnp.ndarray conv_w, conv_b,
                 cnp.ndarray out, int n_threads, bint silu=True):
        """out = silu(conv(state ++ x) + conv_b) per sequence, the conv states ``r`` ([size,
        d_inner * (d_conv - 1)]) of the tokens' cells moved on; conv_w: [d_inner, d_conv];
        conv_b None: no bias; ``silu`` False: no SiLU."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_SSM_CONV, n_threads, (r, x, conv_w, conv_b, out))
        self._set_ssm(nd, cache_index, x, out)
        nd.ssm.r, nd.ssm.d_conv = <float *>_ptr(r), conv_w.shape[1]
        nd.ssm.conv_w = <const float *>_ptr(conv_w)
        nd.ssm.conv_b = NULL if conv_b is None else <const float *>_ptr(conv_b)
        nd.ssm.conv_linear = not silu

    def ssm_scan(self, cnp.ndarray s, int cache_index, cnp.ndarray x, cnp.ndarray dt, cnp.ndarray A,
                 cnp.ndarray B, cnp.ndarray C, cnp.ndarray D, cnp.ndarray out, int n_threads):
        """Mamba-1's selective scan over the SSM states ``s`` ([size, d_inner * d_state]) of the
        tokens' cells: out = y + x * D; dt [n, d_inner], A [d_inner, d_state], B and C [n, d_state]
        (one row stride)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_SSM_SCAN, n_threads, (s, x, dt, A, B, C, D, out))
        self._set_ssm(nd, cache_index, x, out)
        nd.ssm.s, nd.ssm.d_state = <float *>_ptr(s), A.shape[1]
        nd.ssm.dt, nd.ssm.dt_stride = <const float *>_ptr(dt), _stride(dt)
        nd.ssm.A, nd.ssm.D = <const float *>_ptr(A), <const float *>_ptr(D)
        nd.ssm.B, nd.ssm.C, nd.ssm.bc_stride = <const float *>_ptr(B), <const float *>_ptr(C), _stride(B)

    def ssm_scan_grouped(self, cnp.ndarray s, int cache_index, cnp.ndarray x, cnp.ndarray dt, cnp.ndarray dt_b,
                         cnp.ndarray A, cnp.ndarray B, cnp.ndarray C, cnp.ndarray D, int n_group, cnp.ndarray out,
                         int n_threads):
        """Mamba-2's selective scan over the SSM states ``s`` ([size, d_inner * d_state]) of the
        tokens' cells: out = y + x * D[head]; dt [n, n_head] (+ dt_b), A and D [n_head], B and C
        [n, n_group * d_state] (one row stride)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_SSM_SCAN_GROUPED, n_threads, (s, x, dt, dt_b, A, B, C, D, out))
        self._set_ssm(nd, cache_index, x, out)
        nd.ssm.s, nd.ssm.n_head, nd.ssm.n_group = <float *>_ptr(s), A.shape[0], n_group
        nd.ssm.d_state = B.shape[1] // n_group
        nd.ssm.dt, nd.ssm.dt_stride, nd.ssm.dt_b = <const float *>_ptr(dt), _stride(dt), <const float *>_ptr(dt_b)
        nd.ssm.A, nd.ssm.D = <const float *>_ptr(A), <const float *>_ptr(D)
        nd.ssm.B, nd.ssm.C, nd.ssm.bc_stride = <const float *>_ptr(B), <const float *>_ptr(C), _stride(B)

    # -- gated delta-net, short convolutions (delta_net.h)

    def mul(self, cnp.ndarray x, cnp.ndarray y):
        """x *= y, elementwise (rows may be strided)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_MUL, 1, (x, y))
        nd.out, nd.out_stride, nd.y, nd.y_stride = _ptr(x), _stride(x), <const float *>_ptr(y), _stride(y)
        nd.n_rows, nd.n = x.shape[0], x.shape[1]

    def sigmoid_mul(self, cnp.ndarray x, cnp.ndarray gate):
        """x *= sigmoid(gate), elementwise, or by one gate per row where gate has one column (rows
        may be strided)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_SIGMOID_MUL, 1, (x, gate))
        nd.out, nd.out_stride, nd.y, nd.y_stride = _ptr(x), _stride(x), <const float *>_ptr(gate), _stride(gate)
        nd.aux = 0 if gate.shape[1] == 1 else 1
        nd.n_rows, nd.n = x.shape[0], x.shape[1]

    def gdn_gates(self, cnp.ndarray alpha, cnp.ndarray dt_b, cnp.ndarray A, cnp.ndarray beta):
        """In place: alpha = softplus(alpha + dt_b) * A, beta = sigmoid(beta) ([n, n_head] each)."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_GDN_GATES, 1, (alpha, dt_b, A, beta))
        nd.x, nd.x_stride, nd.w, nd.y = <const float *>_ptr(alpha), _stride(alpha), _ptr(dt_b), <const float *>_ptr(A)
        nd.out, nd.out_stride, nd.n_rows, nd.n = _ptr(beta), _stride(beta), alpha.shape[0], alpha.shape[1]

    def gated_delta_net(self, cnp.ndarray s, int cache_index, cnp.ndarray q, cnp.ndarray k, cnp.ndarray v,
                        cnp.ndarray g, cnp.ndarray beta, int n_head_v, cnp.ndarray out, int n_threads):
        """The gated delta-net over the states ``s`` ([size, n_head_v * d * d]) of the tokens'
        cells: q, k [n, n_head_k * d], v and out [n, n_head_v * d], g and beta [n, n_head_v]."""
        cdef gguflm_node *nd = self._add(GGUFLM_OP_GATED_DELTA_NET, n_threads, (s, q, k, v, g, beta, out))
        cdef int64_t d = v.shape[1] // n_head_v
        nd.gdn.s, nd.gdn.cells = <float *>_ptr(s), <const int64_t *>_ptr(self.cells[cache_index])
        nd.gdn.n_tokens, nd.gdn.d, nd.gdn.n_head_k, nd.gdn.n_head_v = v.shape[0], d, q.shape[1] // d, n_head_v
        nd.gdn.q, nd.gdn.q_stride = <const float *>_ptr(q), _stride(q)
        nd.gdn.k, nd.gdn.k_stride = <const float *>_ptr(k), _stride(k)
        nd.gdn.v, nd.gdn.v_stride = <const float *>_ptr(v), _stride(v)
        nd.gdn.g, nd.gdn.g_stride = <const float *>_ptr(g), _stride(g)
        nd.gdn.beta, nd.gdn.beta_stride = <const float *>_ptr(beta), _stride(beta)
        nd.gdn.out, nd.gdn.out_stride = <float *>_ptr(out), _stride(out)
    # -- RWKV (wkv.h)

    def wkv(self, int kind, tuple xs, tuple outs, int n_threads, tuple params=(), int64_t head_size=0,
            cnp.ndarray state=None, int cache_index=-1, int64_t state_offset=0, float scale=0.0):
        """One of wkv.h's kinds over rows of n = outs[0].shape[1] values: inputs ``xs`` (None:
        absent), outputs ``outs``, parameter rows ``params``; the WKV kinds and SHIFT read and
        write the rows ``state`` of the tokens' cells in cache ``cache_index`` (SHIFT: n values
        from ``state_offset`` on in each row); GLA's ``scale``."""
        arrays = tuple(a for a in xs + outs + params if a is not None) + ((state,) if state is not None else ())
        cdef gguflm_node *nd = self._add(GGUFLM_OP_WKV, n_threads, arrays)
        cdef cnp.ndarray a
        cdef int i
        nd.wkv.kind, nd.wkv.n_out, nd.wkv.head_size = kind, len(outs), head_size
        nd.wkv.n_tokens, nd.wkv.n, nd.wkv.scale = outs[0].shape[0], outs[0].shape[1], scale
        nd.wkv.n_in = xs[0].shape[1] if xs and xs[0] is not None else 0
        for i, a in enumerate(xs):
            if a is not None:
                nd.wkv.x[i], nd.wkv.x_stride[i] = <const float *>_ptr(a), _stride(a)
        for i, a in enumerate(outs):
            nd.wkv.out[i], nd.wkv.out_stride[i] = <float *>_ptr(a), _stride(a)
        for i, a in enumerate(params):
            nd.wkv.p[i] = <const float *>_ptr(a)
        if state is not None:
            nd.wkv.state, nd.wkv.state_width, nd.wkv.state_offset = <float *>_ptr(state), state.shape[1], state_offset
            nd.wkv.cells = <const int64_t *>_ptr(self.cells[cache_index])

    # -- Gemma 3n (altup.h)

    def altup(self, int kind, cnp.ndarray out, int n_threads, cnp.ndarray x=None, cnp.ndarray y=None,
              cnp.ndarray w=None, int64_t n_rows=-1, int64_t slice=0, float f=0.0):
        """One of altup.h's kinds over n_rows rows (default: out's) of n = out.shape[-1] values:
        ``out`` the rows written (in place for RESCALE and TOPK) or, with ``x``, the first slice
        of a stack ``slice`` floats apart; ``x`` the target rows or input stack, ``y`` the
        coefficients, ``w`` CORRECT's activated rows; ``f`` TOPK's std multiplier."""
        arrays = tuple(a for a in (x, y, w, out) if a is not None)
        cdef gguflm_node *nd = self._add(GGUFLM_OP_ALTUP, n_threads, arrays)
        nd.altup.kind, nd.altup.n_rows, nd.altup.n = kind, out.shape[0] if n_rows < 0 else n_rows, out.shape[out.ndim - 1]
        nd.altup.slice, nd.altup.f = slice, f
        nd.altup.out, nd.altup.out_stride = <float *>_ptr(out), _stride(out)
        if x is not None:
            nd.altup.x, nd.altup.x_stride = <const float *>_ptr(x), _stride(x)
        if y is not None:
            nd.altup.y, nd.altup.y_stride = <const float *>_ptr(y), _stride(y)
        if w is not None:
            nd.altup.w, nd.altup.w_stride = <const float *>_ptr(w), _stride(w)

    # -- guard mode

    def set_guards(self, cnp.ndarray at, cnp.ndarray length, first_step, last_step):
        """Check, after every step, the zones at ``at`` (addresses, int64) of ``length`` bytes:
        zone z is filled with the canary byte before step ``first_step[z]`` and must still hold
        it after every step up to ``last_step[z]`` (inclusive)."""
        nodes = np.asarray(self.step_nodes, np.int64)
        n_steps = len(nodes)
        first, last = np.asarray(first_step, np.int64), np.asarray(last_step, np.int64)
        if not (len(at) == len(length) == len(first) == len(last)) or (first < 0).any() or (last >= n_steps).any():
            raise ValueError("one first and last step per zone, within the plan's steps")
        # by node: the zones a step fills before it and checks after it, as offsets into flat lists
        fill = [np.flatnonzero(first == s) for s in range(n_steps)]
        check = [np.flatnonzero((first <= s) & (s <= last)) for s in range(n_steps)]
        arrays = {"at": np.ascontiguousarray(at, np.int64), "len": np.ascontiguousarray(length, np.int64)}
        for name, lists in (("fill", fill), ("check", check)):
            ptr = np.zeros(self.n_nodes + 1, np.int64)
            np.add.at(ptr, nodes + 1, [len(z) for z in lists])
            arrays[name + "_ptr"] = np.cumsum(ptr)
            arrays[name] = np.concatenate(lists + [np.zeros(0, np.int64)]).astype(np.int64)
        self.guard_arrays = arrays
        self.guards.at = <uint8_t *const *>_ptr(arrays["at"])
        self.guards.len = <const int64_t *>_ptr(arrays["len"])
        self.guards.fill_ptr = <const int64_t *>_ptr(arrays["fill_ptr"])
        self.guards.fill = <const int64_t *>_ptr(arrays["fill"])
        self.guards.check_ptr = <const int64_t *>_ptr(arrays["check_ptr"])
        self.guards.check = <const int64_t *>_ptr(arrays["check"])
        self.guarded = True

    # -- running

    def run(self, check_abort=None):
        """Run every node; ``check_abort()`` is called before each segment (it raises to stop).
        In guard mode (:meth:`set_guards`) a kernel that wrote outside its buffers raises
        :class:`gguflm.errors.BufferOverrunError`."""
        cdef int64_t k = 0, n = self.n_nodes, bad_node = -1, bad_zone = -1
        self.ran = _switch[0]
        cdef int isa = self.ran.isa, arith = self.ran.arith
        cdef const gguflm_guards *guards = &self.guards if self.guarded else NULL
        while k < n:
            if check_abort is not None:
                check_abort()
            with nogil:
                k = gguflm_plan_run(self.nodes, k, n, GELU_TABLE, arith, isa, guards, &bad_node, &bad_zone)
            if k == -1:
                raise MemoryError("a kernel could not allocate its scratch memory")
            if k == -2:
                from gguflm.errors import BufferOverrunError
                raise BufferOverrunError(f"node {bad_node} ({_OP_NAMES[self.nodes[bad_node].op]}) wrote into "
                                         f"guard zone {bad_zone}, outside the buffers it was given", bad_zone)
