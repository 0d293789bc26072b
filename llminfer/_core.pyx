# cython: language_level=3, boundscheck=False, wraparound=False
"""The boundary between Python and the C core (csrc/). Thin on purpose: the
callers in llminfer.core.ops check shapes and types and name the problem; here
arrays become pointers, the GIL is released around every kernel, and C
status codes become llminfer.errors exceptions."""

from libc.math cimport isfinite
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t, uintptr_t

cimport llminfer._clib as C

import os

import numpy as np

from llminfer import errors


cdef int check(int status, str what) except -1:
    if status != C.LI_OK:
        detail = C.li_last_error().decode(errors="replace")
        name = C.li_status_name(status).decode()
        raise errors.from_status(status, f"{name}: {detail}" if detail else name, what)
    return 0


def type_sizes(int qtype):
    """(block_size, type_size) of a supported type, else None."""
    cdef int bs = 0, ts = 0
    if C.li_type_sizes(qtype, &bs, &ts) != C.LI_OK:
        return None
    return bs, ts


def isa_name(int isa):
    return C.li_isa_name(isa).decode()


def isa_count():
    return C.LI_ISA_COUNT


def cpu_features():
    cdef char buf[512]
    C.li_cpu_features(buf, sizeof(buf))
    return buf.decode().split()


def isa_available(int isa):
    return bool(C.li_isa_available(isa))


def isa_best():
    return C.li_isa_best()


def isa_current():
    return C.li_isa_current()


def isa_select(int isa):
    check(C.li_isa_select(isa), f"selecting kernel level {isa_name(isa)!r}")


def stream_hint_name(int kind):
    return C.li_stream_hint_name(kind).decode()


def stream_hint_count():
    return C.LI_STREAM_COUNT


def stream_hint_default():
    return C.li_stream_hint_default()


def stream_hint_current():
    return C.li_stream_hint_current()


def stream_hint_select(int kind):
    check(C.li_stream_hint_select(kind), f"selecting stream hint {kind}")


def openmp_enabled():
    return bool(C.li_openmp_enabled())


def max_threads():
    return C.li_max_threads()


def dequantize(int qtype, const uint8_t[::1] src, int64_t rows, int64_t k, int n_threads):
    out = np.empty((rows, k), dtype=np.float32)
    cdef float[:, ::1] y = out
    cdef int st
    with nogil:
        st = C.li_dequantize(qtype, &src[0], src.shape[0], rows, k, &y[0, 0], n_threads)
    check(st, "dequantize")
    return out


def quantize(int qtype, const float[:, ::1] x, int n_threads):
    cdef int64_t rows = x.shape[0], k = x.shape[1]
    cdef size_t nbytes = C.li_row_bytes(qtype, k) * rows
    out = np.empty(nbytes, dtype=np.uint8)
    cdef uint8_t[::1] dst = out
    cdef int st
    with nogil:
        st = C.li_quantize(qtype, &x[0, 0], rows, k, &dst[0], nbytes, n_threads)
    check(st, "quantize")
    return out


def repacked_types():
    """Names of the types the active kernel level has repacked kernels for."""
    return [C.li_type_name(t).decode() for t in range(C.LI_TYPE_COUNT) if C.li_x16_available(t)]


cdef class RepackedMatrix:
    """A weight matrix repacked once into the kernels' interleaved layout
    (csrc/repack.h), then multiplied many times: what a loaded model does,
    for the kernel benchmark and tests."""

    cdef C.li_repacked *m
    cdef readonly int64_t rows, k

    def __cinit__(self, int qtype, const uint8_t[::1] w, int64_t rows, int64_t k, int n_threads=1):
        cdef int st
        with nogil:
            st = C.li_repacked_create(qtype, &w[0], w.shape[0], rows, k, n_threads, &self.m)
        check(st, "repack")
        self.rows = rows
        self.k = k

    def matmul(self, const float[:, ::1] x, int n_threads=1):
        cdef int64_t n = x.shape[0]
        if x.shape[1] != self.k:
            raise errors.ShapeError(f"x has {x.shape[1]} columns, the matrix has k={self.k}")
        out = np.empty((n, self.rows), dtype=np.float32)
        if n == 0:
            return out
        cdef float[:, ::1] y = out
        cdef int st
        with nogil:
            st = C.li_repacked_matmul(self.m, &x[0, 0], n, &y[0, 0], n_threads)
        check(st, "repacked matmul")
        return out

    def __dealloc__(self):
        C.li_repacked_free(self.m)


def repacked_matmul_joint(products, int n_threads=1):
    """[x_i W_i^T] for the (RepackedMatrix W_i, float32 x_i [n_i, k_i]) pairs
    of `products` (1 to 32), shared by the team as one product, as a model's
    q, k and v projections are: each result bitwise W_i.matmul(x_i)."""
    cdef int count = len(products), i
    if not 1 <= count <= 32:
        raise errors.InvalidArgumentError(f"a joint product takes 1 to 32 products, got {count}")
    cdef const C.li_repacked *ms[32]
    cdef const float *xs[32]
    cdef int64_t ns[32]
    cdef float *ys[32]
    cdef RepackedMatrix w
    cdef uintptr_t xp, yp
    keep, outs = [], []
    for i, (w_, x) in enumerate(products):
        if not isinstance(w_, RepackedMatrix):
            raise errors.InvalidArgumentError(f"product {i}: a RepackedMatrix is needed, got {type(w_).__name__}")
        w = w_
        xa = np.ascontiguousarray(x, dtype=np.float32)
        if xa.ndim != 2 or xa.shape[1] != w.k:
            raise errors.ShapeError(f"product {i}: x of shape {xa.shape}, the matrix has k={w.k}")
        out = np.empty((xa.shape[0], w.rows), dtype=np.float32)
        keep.append(xa)
        outs.append(out)
        xp = xa.ctypes.data
        yp = out.ctypes.data
        ms[i] = w.m
        xs[i] = <const float *>xp
        ns[i] = xa.shape[0]
        ys[i] = <float *>yp
    cdef int st
    with nogil:
        st = C.li_repacked_matmul_joint(ms, xs, ns, ys, count, n_threads)
    check(st, "joint repacked matmul")
    return outs


def bench_int8_peak():
    """int8 multiply-adds per second one thread of the active level reaches
    with vpdpbusd on independent chains (0.0 where the level has none)."""
    cdef double r
    with nogil:
        r = C.li_bench_int8_peak()
    return r


def matmul(int qtype, const uint8_t[::1] w, int64_t rows, int64_t k, const float[:, ::1] x,
           int n_threads, bint repacked=False):
    cdef int64_t n = x.shape[0]
    out = np.empty((n, rows), dtype=np.float32)
    if n == 0:
        return out
    cdef float[:, ::1] y = out
    cdef int st
    with nogil:
        if repacked:
            st = C.li_matmul_repacked(qtype, &w[0], w.shape[0], rows, k, &x[0, 0], n, &y[0, 0], n_threads)
        else:
            st = C.li_matmul(qtype, &w[0], w.shape[0], rows, k, &x[0, 0], n, &y[0, 0], n_threads)
    check(st, "matmul")
    return out


cdef class GemmWeight:
    """A weight matrix packed once into the float GEMM's panels
    (csrc/sgemm.h), multiplied many times: F16 panels for F16 weights
    (unless f32_panels), float panels for every other type."""

    cdef C.li_gemm_weight *w
    cdef readonly int64_t rows, k

    def __cinit__(self, int qtype, const uint8_t[::1] w, int64_t rows, int64_t k, bint f32_panels=False,
                  int n_threads=1):
        cdef int st
        with nogil:
            st = C.li_gemm_weight_create(qtype, &w[0], w.shape[0], rows, k, f32_panels, n_threads, &self.w)
        check(st, "packing a gemm weight")
        self.rows = rows
        self.k = k

    @property
    def nbytes(self):
        """Bytes the panels take."""
        return C.li_gemm_weight_bytes(self.w)

    def gemm(self, const float[:, ::1] x, const float[::1] bias, const float[:, ::1] res, int n_threads, out=None):
        cdef int64_t m = x.shape[0]
        if out is None:
            out = np.empty((m, self.rows), dtype=np.float32)
        if m == 0:
            return out
        cdef float[:, ::1] y = out
        cdef const float *bp = &bias[0] if bias is not None else NULL
        cdef const float *rp = &res[0, 0] if res is not None else NULL
        cdef int st
        with nogil:
            st = C.li_gemm(self.w, &x[0, 0], m, bp, rp, &y[0, 0], n_threads)
        check(st, "gemm")
        return out

    def __dealloc__(self):
        C.li_gemm_weight_free(self.w)


def attention_full(const float[:, :] q, const float[:, :] k, const float[:, :] v, int n_head, float scale,
                   int n_threads, out=None, uint8_t[::1] scratch=None):
    """q, k, v: rows of contiguous floats, the three a common whole number
    of floats apart (ops.attention checks)."""
    cdef int64_t n = q.shape[0], width = q.shape[1]
    cdef Py_ssize_t f = sizeof(float)
    cdef Py_ssize_t rs = q.strides[0]
    if q.strides[1] != f or k.strides[1] != f or v.strides[1] != f or k.strides[0] != rs or v.strides[0] != rs \
            or rs % f or rs < width * f:
        raise errors.ShapeError("attention: q, k, v rows must be contiguous and one whole number of floats apart")
    if out is None:
        out = np.empty((n, width), dtype=np.float32)
    cdef float[:, ::1] y = out
    cdef void *sp = &scratch[0] if scratch is not None else NULL
    cdef size_t sb = scratch.shape[0] if scratch is not None else 0
    cdef int st
    with nogil:
        st = C.li_attention_full(&q[0, 0], &k[0, 0], &v[0, 0], <size_t>(rs // f), n, n_head, width // n_head, scale,
                                 &y[0, 0], width, sp, sb, n_threads)
    check(st, "attention")
    return out


def attention_full_scratch(int64_t n, int n_head, int64_t d, int n_threads):
    return C.li_attention_full_scratch(n, n_head, d, n_threads)


def layer_norm(const float[:, ::1] x, const float[::1] w, const float[::1] b, float eps, int n_threads, out=None):
    if out is None:
        out = np.empty((x.shape[0], x.shape[1]), dtype=np.float32)
    cdef float[:, ::1] y = out
    cdef const float *wp = &w[0] if w is not None else NULL
    cdef const float *bp = &b[0] if b is not None else NULL
    cdef int st
    with nogil:
        st = C.li_layer_norm(&x[0, 0], x.shape[0], x.shape[1], wp, bp, eps, &y[0, 0], n_threads)
    check(st, "layer_norm")
    return out


def activation_mt(int act, const float[::1] x, int n_threads, out=None):
    if out is None:
        out = np.empty(x.shape[0], dtype=np.float32)
    cdef float[::1] y = out
    cdef int st
    with nogil:
        st = C.li_activation_mt(act, &x[0], x.shape[0], &y[0], n_threads)
    check(st, "activation")
    return out


def rms_norm(const float[:, ::1] x, const float[::1] w, float eps, int n_threads, out=None):
    if out is None:
        out = np.empty((x.shape[0], x.shape[1]), dtype=np.float32)
    cdef float[:, ::1] y = out
    cdef const float *wp = &w[0] if w is not None else NULL
    cdef int st
    with nogil:
        st = C.li_rms_norm(&x[0, 0], wp, x.shape[0], x.shape[1], eps, &y[0, 0], n_threads)
    check(st, "rms_norm")
    return out


def activation(int act, const float[::1] x, const float[::1] u):
    out = np.empty(x.shape[0], dtype=np.float32)
    cdef float[::1] y = out
    cdef int st
    with nogil:
        if u is None:
            st = C.li_activation(act, &x[0], x.shape[0], &y[0])
        else:
            st = C.li_gated_activation(act, &x[0], &u[0], x.shape[0], &y[0])
    check(st, "activation")
    return out


def gated_activation_mt(int act, const float[::1] g, const float[::1] u, int n_threads, out=None):
    if out is None:
        out = np.empty(g.shape[0], dtype=np.float32)
    cdef float[::1] y = out
    cdef int st
    with nogil:
        st = C.li_gated_activation_mt(act, &g[0], &u[0], g.shape[0], &y[0], n_threads)
    check(st, "activation")
    return out


def softmax(const float[:, ::1] x):
    out = np.empty((x.shape[0], x.shape[1]), dtype=np.float32)
    cdef float[:, ::1] y = out
    cdef int st
    with nogil:
        st = C.li_softmax(&x[0, 0], x.shape[0], x.shape[1], &y[0, 0])
    check(st, "softmax")
    return out


def value_range(const float[::1] x):
    """(least, greatest) of x, both NaN when x holds a NaN: the kernel that
    checks each pass's logits (Context.logit_range)."""
    cdef float lo = 0, hi = 0
    cdef int st
    if x.shape[0] == 0:
        raise errors.ShapeError("the range of no values")
    with nogil:
        st = C.li_value_range(&x[0], x.shape[0], &lo, &hi)
    check(st, "value range")
    return lo, hi


def top_k(const float[::1] x, int64_t k):
    """The ids (int64) of the k largest of x (no NaN), largest value first
    and lowest id first among equals (so of values equal to the k-th
    largest, the lowest ids): sampling's top-k, csrc/ops.c."""
    out = np.empty(k if k > 0 else 0, dtype=np.int32)
    cdef int32_t[::1] ids = out
    cdef int st
    if k <= 0 or k > x.shape[0]:
        raise errors.InvalidArgumentError(f"top_k: k must be in [1, {x.shape[0]}], got {k}")
    with nogil:
        st = C.li_top_k_f32(&x[0], x.shape[0], k, &ids[0])
    check(st, "top-k")
    return out.astype(np.int64)


def top_p_cut(const float[::1] x, const float[::1] e, double target, float floor_x, float[::1] scratch):
    """Top-p's cut (csrc/ops.c li_top_p_cut): (logit, how many tokens of that
    logit are kept) or None when the tokens at or above floor_x weigh less
    than target. e: the weights exp(x - max); scratch: 3 * len(x) floats."""
    cdef int64_t n = x.shape[0]
    cdef float v = 0
    cdef int64_t r = 0
    cdef int st
    if n == 0 or e.shape[0] != n or scratch.shape[0] < 3 * n:
        raise errors.InvalidArgumentError(f"top_p_cut: {n} logits, {e.shape[0]} weights, "
                                          f"{scratch.shape[0]} scratch floats (3 per logit)")
    with nogil:
        st = C.li_top_p_cut(&x[0], &e[0], n, target, floor_x, &scratch[0], &v, &r)
    check(st, "top-p cut")
    return (v, r) if r > 0 else None


def binary(str op, const float[::1] a, const float[::1] b):
    out = np.empty(a.shape[0], dtype=np.float32)
    cdef float[::1] y = out
    cdef int st
    cdef bint add = op == "add"
    with nogil:
        st = C.li_add(&a[0], &b[0], a.shape[0], &y[0]) if add else \
             C.li_mul(&a[0], &b[0], a.shape[0], &y[0])
    check(st, op)
    return out


def rope_mt(float[:, :, :] x, const int32_t[:, ::1] pos, int64_t n_rot, float freq_base, float freq_scale,
            int mode, int n_threads):
    """In place on x (n_tok, n_head, head_dim): each token's heads
    contiguous, tokens any whole number of floats apart (ops.rope checks)."""
    cdef int st
    cdef Py_ssize_t f = sizeof(float)
    cdef int64_t ld = x.strides[0] // f
    if x.strides[2] != f or x.strides[1] != x.shape[2] * f or x.strides[0] % f or \
            ld < x.shape[1] * x.shape[2] or pos.shape[0] != x.shape[0]:
        raise errors.ShapeError("rope: each token's heads must be contiguous, the tokens apart by whole rows")
    with nogil:
        st = C.li_rope_mt(&x[0, 0, 0], x.shape[0], ld, x.shape[1], x.shape[2], n_rot, &pos[0, 0], pos.shape[1],
                          freq_base, freq_scale, mode, n_threads)
    check(st, "rope")


# ---- models ----

from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memset
from cpython.pycapsule cimport PyCapsule_GetPointer


cdef class _Watched:
    """A description over a memory-mapped file: once the watched mapping lost
    a page under a pass (the file truncated), every pass is refused."""

    cdef int64_t _fault  # watch_faults's token, or -1
    cdef str _fault_path

    def __cinit__(self, *args, **kwargs):
        self._fault = -1

    def watch_faults(self, int64_t token, str path):
        """Refuse every pass once the watched mapping of path (token:
        fault_watch's) lost a page under a pass (the file truncated)."""
        self._fault = token
        self._fault_path = path

    cdef int check_faults(self) except -1:
        if self._fault >= 0 and C.li_fault_hit(self._fault):
            raise _truncated(self._fault_path)
        return 0


cdef class ModelDesc(_Watched):
    """The C description of a model (li_model_desc), built from a
    llminfer.models.ModelSpec. It borrows the weight arrays (memory-mapped
    views) and keeps references to them for as long as it lives."""

    cdef C.li_model_desc desc
    cdef C.li_layer_desc *layers
    cdef list _keep
    cdef int _embd_fd  # embedding_file's duplicate, or -1

    def __cinit__(self, spec):
        self._embd_fd = -1
        self._keep = []
        n_layer = len(spec.layers)
        self.layers = <C.li_layer_desc *>calloc(max(1, n_layer), sizeof(C.li_layer_desc))
        if self.layers == NULL:
            raise MemoryError()
        d = &self.desc
        spec.check_vectors()  # the C core reads each vector's length from the sizes: they must agree
        _fill_model(self, d, spec)  # every field by its name on the spec (_desc.pxi)
        d.n_layer = n_layer
        for i, ls in enumerate(spec.layers):
            _fill_layer(self, &self.layers[i], ls)
        d.layers = self.layers
        check(C.li_model_check(d), "model description")

    cdef const float *_vector(self, arr) except? NULL:
        if arr is None:
            return NULL
        if arr.ndim != 1:  # a 2-D vector of weights (a convolution's taps), read flat
            arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
        cdef const float[::1] v = arr
        self._keep.append(arr)
        return &v[0]

    cdef int _matrix(self, C.li_matrix *m, mat) except -1:
        if mat is None:  # absent (a MoE layer's dense weights, a dense layer's experts)
            memset(m, 0, sizeof(C.li_matrix))
            return 0
        cdef const uint8_t[::1] data = mat.data
        self._keep.append(mat.data)
        m.data = &data[0]
        m.type = mat.qtype
        m.rows = mat.rows
        m.k = mat.k
        m.nbytes = data.shape[0]
        return 0

    def repack_size(self, int first_layer=0, bint with_output=True):
        """The bytes repack() would allocate now for the same layers: the
        packed copies of the matrices this CPU has repacked kernels for."""
        return C.li_model_repack_size(&self.desc, first_layer, with_output)

    def repack(self, int first_layer=0, bint with_output=True, int n_threads=1, bint release=False):
        """Repack the weights of layers first_layer.. (and the output head)
        into the kernels' interleaved layout where this CPU has kernels for
        it (csrc/repack.h); release: hand the mapped file's pages of the
        original rows back (only for a file-backed map). Returns the bytes
        the repacked copies hold."""
        cdef size_t nbytes = 0
        cdef int st
        with nogil:
            st = C.li_model_repack(&self.desc, first_layer, with_output, n_threads, release, &nbytes)
        check(st, "repack")
        return nbytes

    def embedding_file(self, int fd, int64_t offset):
        """Read the token embedding's rows from the open file descriptor fd,
        where its bytes start at `offset`, once repack(release=True) has
        handed its mapped pages back: a lookup is then one pread, with no
        page fault and no madvise per token. The description keeps a
        duplicate of fd, closed when it goes."""
        if offset < 0 or offset + <int64_t>self.desc.tok_embd.nbytes > os.fstat(fd).st_size:
            raise errors.InvalidArgumentError(
                f"the token embedding ({self.desc.tok_embd.nbytes} bytes from offset {offset}) "
                f"does not lie within the file ({os.fstat(fd).st_size} bytes)")
        own = os.dup(fd)
        try:
            check(C.li_model_embd_file(&self.desc, own, offset), "embedding file")
        except BaseException:
            os.close(own)
            raise
        if self._embd_fd >= 0:
            os.close(self._embd_fd)
        self._embd_fd = own

    def __dealloc__(self):
        C.li_model_unpack(&self.desc)
        free(self.layers)
        if self._embd_fd >= 0:
            os.close(self._embd_fd)


include "_desc.pxi"


cdef class Context:
    """The KV pools and the scratch of a model (li_context), for batches of
    tokens from many sequences. The block tables live in Python
    (llminfer.runtime.kv_cache); each call hands them in."""

    cdef C.li_context *ctx
    cdef readonly ModelDesc model
    cdef readonly int n_batch, max_threads, n_vocab, n_embd, kv_type, block_size, n_state_slots
    cdef readonly tuple n_blocks
    # step()'s block tables: each group's Python list copied here, grown as it grows
    cdef int32_t *table[2]
    cdef Py_ssize_t table_room[2]
    # LoRA adapters (set_loras): the C descriptions and the arrays they point into
    cdef C.li_lora *loras
    cdef C.li_lora_layer *lora_layers
    cdef list lora_keep

    def __cinit__(self, ModelDesc model, int kv_type, int block_size, n_blocks, int n_batch,
                  int max_threads, backend=None, int n_backend_layers=0, bint backend_output=False,
                  int device=0, int n_state_slots=0):
        """backend: a capsule holding a li_backend_ops table (llminfer.core.gpu),
        running layers [0, n_backend_layers) (and the output head when
        backend_output) on `device`; None: every layer on the CPU.
        n_state_slots: slots of the state pool (a hybrid model's recurrent
        layers), 0 for a model without them."""
        cdef C.li_kv_config kv
        kv.kv_type = kv_type
        kv.block_size = block_size
        kv.n_blocks[0] = n_blocks[0]
        kv.n_blocks[1] = n_blocks[1]
        kv.n_state_slots = n_state_slots
        self.n_state_slots = n_state_slots
        self.model = model
        cdef const C.li_backend_ops *ops = NULL
        if backend is not None:
            ops = <const C.li_backend_ops *>PyCapsule_GetPointer(backend, b"llminfer.li_backend_ops")
        cdef int st
        with nogil:  # a backend uploads the weights here: seconds, not worth holding the GIL
            st = C.li_context_create_offload(&model.desc, &kv, n_batch, max_threads, ops, n_backend_layers,
                                             backend_output, device, &self.ctx)
        check(st, "creating the context")
        self.n_batch = n_batch
        self.max_threads = max_threads
        self.n_vocab = model.desc.n_vocab
        self.n_embd = model.desc.n_embd * (1 + model.desc.n_deepstack)  # an input row's width
        self.kv_type = kv_type
        self.block_size = block_size
        self.n_blocks = (int(n_blocks[0]), int(n_blocks[1]))

    def decode(self, tokens, embd, const int32_t[::1] pos, const int32_t[::1] seq,
               const signed char[::1] want, list tables, float[::1] logits, int n_threads, rope_pos=None):
        """Run one batch. tokens: int32 [n] (or None with embd: float32 [n, n_embd]);
        pos, seq: int32 [n]; want: int8 [n], nonzero where logits are wanted;
        rope_pos: None, or int32 [n, 4], each row's M-RoPE positions (li_batch);
        tables: per sequence index, (full-group table, sliding-window table),
        each an int32 array (or None), and for a model with recurrent layers
        a third item, the sequence's state slot. logits: float32, filled with
        the rows asked for in batch order."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        cdef int n = pos.shape[0]
        if seq.shape[0] != n or want.shape[0] != n:
            raise errors.ShapeError(f"batch arrays disagree: {n} positions, {seq.shape[0]} sequences, "
                                    f"{want.shape[0]} logit flags")
        cdef const int32_t[::1] tok
        cdef const float[:, ::1] emb
        cdef C.li_batch b
        b.n = n
        b.token = NULL
        b.embd = NULL
        if tokens is not None:
            tok = tokens
            if tok.shape[0] != n:
                raise errors.ShapeError(f"{tok.shape[0]} tokens for {n} positions")
            b.token = &tok[0] if n else NULL
        elif embd is not None:
            emb = embd
            if emb.shape[0] != n or emb.shape[1] != self.n_embd:
                raise errors.ShapeError(f"embeddings of shape {tuple(embd.shape)}, expected ({n}, {self.n_embd})")
            b.embd = &emb[0, 0] if n else NULL
        else:
            raise errors.InvalidArgumentError("a batch needs tokens or embeddings")
        b.pos = &pos[0] if n else NULL
        b.seq = &seq[0] if n else NULL
        b.logits = &want[0] if n else NULL
        b.rope_pos = NULL
        cdef const int32_t[:, ::1] rp
        if rope_pos is not None:
            rp = rope_pos
            if rp.shape[0] != n or rp.shape[1] != 4:
                raise errors.ShapeError(f"rope positions of shape {tuple(rope_pos.shape)}, expected ({n}, 4)")
            b.rope_pos = &rp[0, 0] if n else NULL
        cdef int nv = len(tables)
        cdef C.li_seq_view *views = <C.li_seq_view *>calloc(max(1, nv), sizeof(C.li_seq_view))
        if views == NULL:
            raise MemoryError()
        cdef const int32_t[::1] t
        cdef int i, g
        cdef int st
        cdef float *out = &logits[0] if logits.shape[0] else NULL
        self.model.check_faults()
        keep = []
        try:
            for i in range(nv):
                views[i].state_slot = tables[i][2] if len(tables[i]) > 2 and tables[i][2] is not None else -1
                if len(tables[i]) > 3 and tables[i][3] is not None:
                    self._lora_view(tables[i][3], &views[i], keep)
                for g in range(2):
                    arr = tables[i][g]
                    if arr is None or len(arr) == 0:
                        continue
                    t = arr
                    keep.append(arr)
                    views[i].blocks[g] = &t[0]
                    views[i].n_blocks[g] = t.shape[0]
            with nogil:
                st = C.li_context_decode(self.ctx, &b, views, nv, out, logits.shape[0], n_threads)
        finally:
            free(views)
        self.model.check_faults()  # a page of the file lost under the pass: its results are zeros' work
        check(st, "forward pass")

    cdef int _table_view(self, int g, list blocks, C.li_seq_view *view) except -1:
        """blocks (a sequence's table of group g, Python ints) into table[g], for view"""
        cdef Py_ssize_t n = len(blocks), i
        cdef int32_t *grown
        if n > self.table_room[g]:
            grown = <int32_t *>realloc(self.table[g], <size_t>n * sizeof(int32_t))
            if grown == NULL:
                raise MemoryError()
            self.table[g] = grown
            self.table_room[g] = n
        for i in range(n):
            self.table[g][i] = blocks[i]
        view.blocks[g] = self.table[g] if n else NULL
        view.n_blocks[g] = <int>n
        return 0

    cdef int _lora_view(self, scales, C.li_seq_view *view, list keep) except -1:
        """a sequence's LoRA scales (float32 [n_lora]) into its view"""
        cdef const float[::1] sc = scales
        keep.append(scales)
        view.n_lora = <int>sc.shape[0]
        view.lora_scale = &sc[0] if sc.shape[0] else NULL
        return 0

    def set_loras(self, list adapters):
        """Hold these LoRA adapters (li_context_set_loras), [] none: each
        (alpha, layers, output[, tok_embd]), layers a list of n_layer dicts from a
        projection's name (wq, wk, wv, wo, w_gate, w_up, w_down) to its (a, b)
        float32 C-contiguous arrays ([rank, k], [rows, rank]), output such a
        pair or None, tok_embd the embedding's flipped pair ([n_vocab, rank],
        [n_embd, rank]) or None. The arrays are kept while the context holds them; the
        caller (llminfer.runtime.lora) has checked their shapes."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        cdef int n = len(adapters), nl = self.model.desc.n_layer, j, il
        cdef C.li_lora *L = NULL
        cdef C.li_lora_layer *LL = NULL
        if n:
            L = <C.li_lora *>calloc(n, sizeof(C.li_lora))
            LL = <C.li_lora_layer *>calloc(<size_t>n * <size_t>max(nl, 1), sizeof(C.li_lora_layer))
            if L == NULL or LL == NULL:
                free(L)
                free(LL)
                raise MemoryError()
        keep = []
        cdef int st
        try:
            for j in range(n):
                alpha, layers, output = adapters[j][:3]
                embd = adapters[j][3] if len(adapters[j]) > 3 else None
                L[j].alpha = alpha
                L[j].layers = &LL[<size_t>j * nl]
                if len(layers) != nl:
                    raise errors.ShapeError(f"adapter {j}: {len(layers)} layers, the model has {nl}")
                for il in range(nl):
                    for name, pair in layers[il].items():
                        _lora_pair(_lora_slot(&LL[<size_t>j * nl + il], name),
                                   _lora_base(&self.model.desc.layers[il], name), pair, keep)
                if output is not None:
                    _lora_pair(&L[j].output, &self.model.desc.output, output, keep)
                if embd is not None:
                    _lora_embd_pair(&L[j].tok_embd, &self.model.desc.tok_embd, embd, keep)
            st = C.li_context_set_loras(self.ctx, L, n)
            check(st, "setting the LoRA adapters")
        except BaseException:
            free(L)
            free(LL)
            raise
        free(self.loras)
        free(self.lora_layers)
        self.loras = L
        self.lora_layers = LL
        self.lora_keep = keep

    def step(self, int token, int pos, full, swa, float[::1] logits, int width, int n_threads, int slot=-1,
             lora=None, int rope_shift=0):
        """One token of one sequence (sequence index 0), its logits into
        logits: decode for a generation step without its arrays. full, swa:
        the sequence's block tables (lists of ints, or None for a group the
        model does not use). Returns what logit_range would for the row (1:
        sound, 0: not, -1: no figures), or -2 without running anything when
        logits is not `width` long. Right after a pass, on caches it left
        cold, the block tables made int32 arrays for decode and the separate
        logit_range call cost a 135M model's token 4.6 and 6.8 us. rope_shift
        (M-RoPE models after an image): the token's rope positions are
        (pos + rope_shift) in the first three sections, 0 in the fourth."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        if logits.shape[0] != width:
            return -2
        cdef int32_t tok = token, p = pos, sq = 0
        cdef signed char want = 1
        cdef C.li_batch b
        b.n = 1
        b.token = &tok
        b.embd = NULL
        b.pos = &p
        b.seq = &sq
        b.logits = &want
        cdef int32_t rp[4]
        b.rope_pos = NULL
        if rope_shift != 0:
            rp[0] = rp[1] = rp[2] = pos + rope_shift
            rp[3] = 0
            b.rope_pos = rp
        cdef C.li_seq_view view
        view.blocks[0] = view.blocks[1] = NULL
        view.n_blocks[0] = view.n_blocks[1] = 0
        view.state_slot = slot
        view.lora_scale = NULL
        view.n_lora = 0
        keep = []
        if lora is not None:
            self._lora_view(lora, &view, keep)
        if full is not None:
            self._table_view(0, full, &view)
        if swa is not None:
            self._table_view(1, swa, &view)
        self.model.check_faults()
        cdef int st
        cdef float r[2]
        with nogil:
            st = C.li_context_decode(self.ctx, &b, &view, 1, &logits[0], logits.shape[0], n_threads)
            if st == C.LI_OK:
                st = C.li_context_logit_range(self.ctx, r, 1)
        self.model.check_faults()
        if st < 0:
            check(st, "forward pass")
        if st == 0:
            return -1
        return 1 if self._sound(r[0], r[1]) else 0

    cdef bint _sound(self, float lo, float hi) noexcept:
        """whether a logits row of least lo and greatest hi passes: finite, and not all one value"""
        return isfinite(lo) and isfinite(hi) and (self.n_vocab <= 1 or lo != hi)

    def logit_range(self, float[:, ::1] out):
        """After a decode: each logits row's least and greatest value into
        out ([rows, 2], both NaN for a row with a NaN), computed by the team
        as the pass ended. Returns 1 when every row is finite and not all one
        value (wider than 1), 0 when some row is not (out then says which),
        -1 (out untouched) when the pass left no figures for that many rows
        (a backend's head, hidden-state output). The verdict is worked out
        here, not with numpy: right after a pass that streamed the weights
        through the caches, each numpy call on the way cost tens of
        microseconds."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        if out.shape[1] != 2:
            raise errors.ShapeError(f"logit ranges need 2 columns, got {out.shape[1]}")
        cdef int st = C.li_context_logit_range(self.ctx, &out[0, 0] if out.shape[0] else NULL, out.shape[0])
        if st < 0:
            check(st, "logit range")
        if st == 0:
            return -1
        cdef Py_ssize_t i
        for i in range(out.shape[0]):
            if not self._sound(out[i, 0], out[i, 1]):
                return 0
        return 1

    # ---- the state pool (hybrid models) ----

    def copy_state(self, int src, int dst):
        """Copy state slot src to dst (fork, snapshot, restore)."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        check(C.li_state_copy(self.ctx, src, dst), "copying a state slot")

    def clear_state(self, int slot):
        """Zero a state slot: the state before a sequence's first token."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        check(C.li_state_clear(self.ctx, slot), "clearing a state slot")

    def read_state(self, int slot):
        """A state slot's bytes (float32 values of every recurrent layer)."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        cdef size_t n = C.li_state_slot_bytes(&self.model.desc)
        out = bytearray(n)
        cdef unsigned char[::1] buf = out
        check(C.li_state_read(self.ctx, slot, &buf[0] if n else NULL, n), "reading a state slot")
        return bytes(out)

    def write_state(self, int slot, const unsigned char[::1] data):
        """Fill a state slot from read_state's bytes."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        check(C.li_state_write(self.ctx, slot, &data[0] if data.shape[0] else NULL, data.shape[0]),
              "writing a state slot")

    def copy_block(self, int group, int src, int dst):
        """Copy a block's keys and values in every layer of a group."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        check(C.li_kv_copy_block(self.ctx, group, src, dst), "copying a KV block")

    def block_bytes(self, int group):
        """Bytes one block of a group takes over all its layers (0: no layer uses the group)."""
        return C.li_kv_group_block_bytes(self.ctx, group) if self.ctx != NULL else 0

    def read_block(self, int group, int block):
        """The bytes of one block of a group, over all its layers (bytes)."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        return self.read_blocks(b"", [(group, block)])

    def read_blocks(self, bytes head, blocks):
        """head, then the bytes of each (group, block) of blocks in turn, as
        one bytes object filled in place: a saved state's bytes are made
        once, with no list of block copies to join (which took twice the
        state's size while it was made)."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        pairs = [(int(g), int(b)) for g, b in blocks]
        sizes = [C.li_kv_group_block_bytes(self.ctx, g) for g, _ in pairs]
        out = PyBytes_FromStringAndSize(NULL, len(head) + sum(sizes))
        cdef char *p = PyBytes_AS_STRING(out)
        cdef size_t at = len(head), size
        if at:
            memcpy(p, <const char *>head, at)
        cdef int group, block
        for (group, block), size in zip(pairs, sizes):
            check(C.li_kv_read_block(self.ctx, group, block, p + at if size else NULL, size),
                  "reading a KV block")
            at += size
        return out

    def write_block(self, int group, int block, const unsigned char[::1] data):
        """Overwrite one block of a group with bytes read_block gave."""
        if self.ctx == NULL:
            raise errors.LLMInferError("the context is closed")
        check(C.li_kv_write_block(self.ctx, group, block, &data[0] if data.shape[0] else NULL,
                                  data.shape[0]), "writing a KV block")

    def kv_bytes(self, int layer):
        return C.li_context_kv_bytes(self.ctx, layer) if self.ctx != NULL else 0

    def close(self):
        if self.ctx != NULL:
            C.li_context_free(self.ctx)
            self.ctx = NULL

    def __dealloc__(self):
        if self.ctx != NULL:
            C.li_context_free(self.ctx)
        free(self.table[0])
        free(self.table[1])
        free(self.loras)
        free(self.lora_layers)


cdef C.li_lora_pair *_lora_slot(C.li_lora_layer *P, str name) except NULL:
    if name == "wq":
        return &P.wq
    if name == "wk":
        return &P.wk
    if name == "wv":
        return &P.wv
    if name == "wo":
        return &P.wo
    if name == "w_gate":
        return &P.w_gate
    if name == "w_up":
        return &P.w_up
    if name == "w_down":
        return &P.w_down
    raise errors.InvalidArgumentError(f"no LoRA projection named {name!r}")


cdef int _lora_embd_pair(C.li_lora_pair *P, const C.li_matrix *w, pair, list keep) except -1:
    """the token embedding's (a, b), flipped: a [n_vocab, rank], b [n_embd, rank]"""
    cdef const float[:, ::1] a = pair[0]
    cdef const float[:, ::1] b = pair[1]
    if a.shape[1] != b.shape[1] or a.shape[1] < 1 or a.shape[0] != w.rows or b.shape[0] != w.k:
        raise errors.ShapeError(f"a token embedding LoRA pair of A {a.shape[0]}x{a.shape[1]} and B "
                                f"{b.shape[0]}x{b.shape[1]} for an embedding of {w.rows}x{w.k}")
    keep.append(pair[0])
    keep.append(pair[1])
    P.a = &a[0, 0]
    P.b = &b[0, 0]
    P.rank = <int>a.shape[1]
    return 0


cdef const C.li_matrix *_lora_base(const C.li_layer_desc *Ly, str name) except NULL:
    if name == "wq":
        return &Ly.wq
    if name == "wk":
        return &Ly.wk
    if name == "wv":
        return &Ly.wv
    if name == "wo":
        return &Ly.wo
    if name == "w_gate":
        return &Ly.w_gate
    if name == "w_up":
        return &Ly.w_up
    if name == "w_down":
        return &Ly.w_down
    raise errors.InvalidArgumentError(f"no LoRA projection named {name!r}")


cdef int _lora_pair(C.li_lora_pair *P, const C.li_matrix *w, pair, list keep) except -1:
    """(a, b) into P, checked against the base matrix w: a [rank, w.k], b [w.rows, rank]"""
    cdef const float[:, ::1] a = pair[0]
    cdef const float[:, ::1] b = pair[1]
    if a.shape[0] != b.shape[1] or a.shape[0] < 1 or a.shape[1] != w.k or b.shape[0] != w.rows:
        raise errors.ShapeError(f"a LoRA pair of A {a.shape[0]}x{a.shape[1]} and B {b.shape[0]}x{b.shape[1]} "
                                f"for a weight of {w.rows}x{w.k}")
    keep.append(pair[0])
    keep.append(pair[1])
    P.a = &a[0, 0]
    P.b = &b[0, 0]
    P.rank = <int>a.shape[0]
    return 0


cdef int _stamp(int fd, int64_t *size, int64_t *mtime) except -1:
    if C.li_file_stamp(fd, size, mtime) != C.LI_OK:
        raise OSError(f"the file's stamp: {C.li_last_error().decode('utf-8', 'replace')}")
    return 0


def file_stamp(int fd):
    """(size, modification time in ns) of the open file fd (csrc/file.c).
    Raises OSError when fd is not open."""
    cdef int64_t size = 0, mtime = 0
    _stamp(fd, &size, &mtime)
    return size, mtime


def file_stamp_is(int fd, int64_t size, int64_t mtime_ns):
    """Whether the open file fd's stamp is (size, mtime_ns), as file_stamp
    gave it: one fstat, no objects made, for a check before every pass
    (os.fstat's stat_result cost a 135M model's token 9 us on caches the
    pass before had left cold). Raises OSError when fd is not open."""
    cdef int64_t now_size = 0, now_mtime = 0
    _stamp(fd, &now_size, &now_mtime)
    return now_size == size and now_mtime == mtime_ns


def _truncated(path):
    return errors.GGUFError(
        f"{path}: the model file was truncated or changed on disk while in use: a forward pass read "
        f"pages of it that no longer exist, so its results were discarded, and the model refuses "
        f"further passes. Load it again, or load with mmap=False to keep a private copy")


def fault_watch(uintptr_t start, size_t length):
    """Watch a mapped file's address range [start, start + length) for the
    SIGBUS of a page lost to truncation (csrc/fault.c); returns the watch's
    token (-1 where watching is a no-op)."""
    cdef int64_t token = -1
    check(C.li_fault_watch(<const void *>start, length, &token), "watching a mapping")
    return token


def fault_unwatch(int64_t token):
    """End a watch, before its range is unmapped."""
    C.li_fault_unwatch(token)


def fault_hit(int64_t token):
    """Whether a fault in the watched range was caught."""
    return C.li_fault_hit(token) != 0


def first_nonfinite(int qtype, const uint8_t[::1] data, bint release=False):
    """The first block (an element for F32, F16, BF16) of stored tensor data
    whose scale is NaN or infinite, or -1; None for a type with no known
    layout. release: hand a mapped file's pages back as they are read."""
    cdef int64_t unit = -1
    cdef int st
    cdef size_t n = data.shape[0]
    cdef const uint8_t *p = &data[0] if n else NULL
    with nogil:
        st = C.li_first_nonfinite(qtype, p, n, release, &unit)
    if st == C.LI_E_TYPE:
        return None
    check(st, "checking scales")
    return unit


def layer_kv_group(ModelDesc model, int layer):
    """0 when layer's keys live in the full-attention pool, 1 in the sliding-window pool, 2 when it has
    none (a recurrent layer)."""
    return C.li_layer_kv_group(&model.desc, layer)


def state_slot_bytes(ModelDesc model):
    """Bytes of one state slot over every recurrent layer (0: none)."""
    return C.li_state_slot_bytes(&model.desc)


def state_layer_floats(ModelDesc model, int layer):
    """Floats of state one slot holds for a layer (0 for a layer that is not recurrent)."""
    return C.li_state_layer_floats(&model.desc, layer)


def kv_block_bytes(ModelDesc model, int kv_type, int block_size, int layer):
    """Bytes one block of block_size positions takes in a layer (keys and values)."""
    return C.li_kv_block_bytes(&model.desc, kv_type, block_size, layer)

# ---- benchmark and test helpers (csrc/bench.c) ----

def bench_read(const uint8_t[::1] buf, int n_threads):
    """Reads every byte of buf on n_threads threads; returns a checksum."""
    cdef uint64_t r
    with nogil:
        r = C.li_bench_read(&buf[0], buf.shape[0], n_threads)
    return r


def bench_sync(int n_threads, int rounds=100000):
    """Seconds per pass through the team's barrier (li_share_sync) for a team
    of n_threads, timed over `rounds` passes."""
    if n_threads < 1 or rounds < 1:
        raise errors.InvalidArgumentError("n_threads and rounds must be >= 1")
    cdef double r
    with nogil:
        r = C.li_bench_sync(n_threads, rounds)
    if r < 0:
        raise MemoryError("no memory for the team's barrier")
    return r


def share_trace(int64_t units, int products, int n_threads, int slow_thread=-1, int slow_spins=0,
                int64_t chunk=1):
    """How the repacked products' units are handed out (csrc/share.h), each
    owner taking at least `chunk` of its own at a time until its last few:
    (team size, taken_by [products, units], times_taken [products, units])."""
    if units < 0 or products < 0 or n_threads < 1 or slow_spins < 0 or chunk < 1:
        raise errors.InvalidArgumentError("units and products must be >= 0, n_threads >= 1, slow_spins >= 0, "
                                          "chunk >= 1")
    taken_by = np.empty((products, units), dtype=np.int32)
    times = np.empty((products, units), dtype=np.int32)
    cdef int32_t[::1] tb = taken_by.reshape(-1)
    cdef int32_t[::1] tt = times.reshape(-1)
    cdef int32_t dummy = 0
    cdef int r
    with nogil:
        r = C.li_share_trace(units, products, n_threads, slow_thread, slow_spins, chunk,
                             &tb[0] if tb.shape[0] else &dummy, &tt[0] if tt.shape[0] else &dummy)
    if r < 0:
        check(r, "share_trace")
    return r, taken_by, times


def share_barrier_check(int n_threads, int rounds, int slow_thread=-1, int slow_spins=0, int slow_every=1):
    """Runs the team's barrier (csrc/share.h: li_share_sync_ahead, hinting a
    buffer while it waits, then li_share_sync) `rounds` times,
    thread slow_thread late by slow_spins spins every slow_every rounds, in
    three parallel regions on one share (the second a thread short when
    there is one to spare): (team size, slots read stale after a barrier, 0
    when right)."""
    if n_threads < 1 or rounds < 0 or slow_spins < 0 or slow_every < 1:
        raise errors.InvalidArgumentError("n_threads must be >= 1, rounds and slow_spins >= 0, slow_every >= 1")
    cdef int64_t stale = 0
    cdef int r
    with nogil:
        r = C.li_share_barrier_check(n_threads, rounds, slow_thread, slow_spins, slow_every, &stale)
    if r < 0:
        check(r, "share_barrier_check")
    return r, stale


# element sizes (bytes) of (a, b) per vector op, for the size checks below
_VEC_OPS = {
    "dot_f32": (C.LI_VEC_DOT_F32, 4, 4), "dot_f32_f16": (C.LI_VEC_DOT_F32_F16, 4, 2),
    "axpy_f32": (C.LI_VEC_AXPY_F32, 4, 4), "axpy_f16": (C.LI_VEC_AXPY_F16, 2, 4),
    "scale_f32": (C.LI_VEC_SCALE_F32, 4, 4), "f32_to_f16": (C.LI_VEC_F32_TO_F16, 4, 2),
    "f16_to_f32": (C.LI_VEC_F16_TO_F32, 2, 4), "softcap_f32": (C.LI_VEC_SOFTCAP_F32, 4, 4),
}


def vec_kernel(str op, float alpha, a, b):
    """Runs the active level's vector kernel `op` (see li_vec_op) on numpy
    arrays a (read) and b (read and written, in place); returns the dot
    product for the dot ops, else None. For tests."""
    code, sa, sb = _VEC_OPS[op]
    cdef int64_t n = b.nbytes // sb
    if a.nbytes != n * sa or b.nbytes != n * sb or not (a.flags.c_contiguous and b.flags.c_contiguous):
        raise errors.ShapeError(f"{op}: a ({a.dtype}, {a.size}) and b ({b.dtype}, {b.size}) do not pair up")
    cdef const uint8_t[::1] av = a.reshape(-1).view(np.uint8) if n else np.zeros(1, np.uint8)
    cdef uint8_t[::1] bv = b.reshape(-1).view(np.uint8) if n else np.zeros(1, np.uint8)
    cdef float r = 0
    cdef int st
    cdef int c = code
    with nogil:
        st = C.li_vec_kernel(c, alpha, &av[0], &bv[0], n, &r)
    check(st, op)
    return r if op.startswith("dot") else None


def attn_kernel(bint accumulate, const float[:, ::1] a, const uint16_t[:, ::1] cache, int64_t d,
                float scale, float[:, ::1] out):
    """The active level's attention kernel for a.shape[0] query heads over the
    first d columns of each row of an F16 cache (rows = cache.shape[0],
    stride = cache.shape[1]): scores into out[h, :rows], or
    out[h, :d] += a[h, :rows] @ cache[:, :d]. For tests."""
    cdef int64_t n = cache.shape[0]
    cdef int nh = a.shape[0]
    if nh == 0 or d > cache.shape[1] or out.shape[0] < nh or \
            (accumulate and (a.shape[1] < n or out.shape[1] < d)) or \
            (not accumulate and (a.shape[1] < d or out.shape[1] < n)):
        raise errors.ShapeError("attn_kernel: sizes do not agree")
    cdef int st
    with nogil:
        st = C.li_attn_kernel(accumulate, &a[0, 0], a.shape[1], nh, &cache[0, 0], n, d, cache.shape[1],
                              scale, &out[0, 0], out.shape[1])
    check(st, "attn_kernel")


def _rows_in(const int32_t[::1] rows, Py_ssize_t T, str what):
    cdef Py_ssize_t i
    for i in range(rows.shape[0]):
        if rows[i] < 0 or rows[i] >= T:
            raise errors.ShapeError(f"{what}: row {rows[i]} is not one of the {T} rows")


def conv_kernel(const float[:, ::1] x, float[:, ::1] y, const int32_t[::1] rows, const float[:, ::1] w, bias,
                float[::1] state, int64_t c0, int64_t c1, bint act):
    """The active level's causal convolution (kernels.h, li_conv_rows_fn)
    over channels [c0, c1) of rows `rows` of x into y, w [channels, K], bias
    None or [channels], state [channels * (K - 1)] updated in place. For
    tests."""
    cdef int K = <int>w.shape[1]
    cdef const float[::1] bv
    cdef const float *bp = NULL
    if bias is not None:
        bv = bias
        if bv.shape[0] < c1:
            raise errors.ShapeError("conv_kernel: bias is shorter than c1")
        bp = &bv[0] if bv.shape[0] else NULL
    if not (0 <= c0 <= c1 <= w.shape[0]) or K < 1 or x.shape[1] < c1 or y.shape[1] < c1 or \
            y.shape[0] < x.shape[0] or state.shape[0] < c1 * (K - 1):
        raise errors.ShapeError("conv_kernel: sizes do not agree")
    _rows_in(rows, x.shape[0], "conv_kernel")
    cdef int64_t n = rows.shape[0]
    cdef float dummy = 0
    cdef float *sp = &state[0] if state.shape[0] else &dummy
    cdef int st
    if n == 0 or x.shape[0] == 0 or x.shape[1] == 0:
        return
    with nogil:
        st = C.li_conv_kernel(&x[0, 0], x.shape[1], &y[0, 0], y.shape[1], &rows[0], n, &w[0, 0], bp, K, sp,
                              c0, c1, act)
    check(st, "conv_kernel")


def gdn_kernel(float[:, ::1] S, const int32_t[::1] rows, const float[:, ::1] q, const float[:, ::1] k,
               const float[:, ::1] v, const float[::1] alpha, const float[::1] beta, float dt_b, float a,
               float[:, ::1] o):
    """The active level's Gated DeltaNet head (kernels.h, li_gdn_head_fn):
    state S [dv, dk] in place, rows `rows` of q, k [T, >= dk], v [T, >= dv],
    alpha, beta [T] into o [T, >= dv]. For tests."""
    cdef int64_t dv = S.shape[0], dk = S.shape[1], T = q.shape[0]
    if k.shape[0] != T or k.shape[1] != q.shape[1] or q.shape[1] < dk or v.shape[0] != T or v.shape[1] < dv or \
            alpha.shape[0] != T or beta.shape[0] != T or o.shape[0] != T or o.shape[1] < dv or dv * dk == 0:
        raise errors.ShapeError("gdn_kernel: sizes do not agree")
    _rows_in(rows, T, "gdn_kernel")
    cdef int64_t n = rows.shape[0]
    cdef int st
    if n == 0:
        return
    with nogil:
        st = C.li_gdn_kernel(&S[0, 0], dk, dv, &rows[0], n, &q[0, 0], &k[0, 0], q.shape[1], &v[0, 0], v.shape[1],
                             &alpha[0], &beta[0], 1, dt_b, a, &o[0, 0], o.shape[1])
    check(st, "gdn_kernel")


def mamba2_kernel(float[:, ::1] S, const int32_t[::1] rows, const float[:, ::1] x, const float[:, ::1] B,
                  const float[:, ::1] Cm, const float[::1] dt, float dt_b, float a, float d,
                  const float[:, ::1] z, float[:, ::1] y):
    """The active level's Mamba2 head (kernels.h, li_mamba2_head_fn): state
    S [hd, ds] in place, rows `rows` of x, B, Cm (one shape [T, ld], ld >=
    hd and ds), dt [T], z [T, >= hd] into y [T, >= hd]. For tests."""
    cdef int64_t hd = S.shape[0], ds = S.shape[1], T = x.shape[0]
    if B.shape[0] != T or Cm.shape[0] != T or B.shape[1] != x.shape[1] or Cm.shape[1] != x.shape[1] or \
            x.shape[1] < hd or x.shape[1] < ds or dt.shape[0] != T or z.shape[0] != T or z.shape[1] < hd or \
            y.shape[0] != T or y.shape[1] < hd or hd * ds == 0:
        raise errors.ShapeError("mamba2_kernel: sizes do not agree")
    _rows_in(rows, T, "mamba2_kernel")
    cdef int64_t n = rows.shape[0]
    cdef int st
    if n == 0:
        return
    with nogil:
        st = C.li_mamba2_kernel(&S[0, 0], hd, ds, &rows[0], n, &x[0, 0], x.shape[1], &B[0, 0], &Cm[0, 0], &dt[0], 1,
                                dt_b, a, d, &z[0, 0], z.shape[1], &y[0, 0], y.shape[1])
    check(st, "mamba2_kernel")


# ---- GGUF string arrays (llminfer.core.gguf_file) ----

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcpy


def read_strings(const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t count):
    """Gather `count` GGUF strings (uint64 length + bytes) starting at byte
    `pos` of buf. Returns (blob, offsets, end position, number read): the
    strings' bytes back to back and int64 offsets[count + 1] where each starts
    in blob. When the buffer ends early, blob is None and the position and
    count say where it stopped."""
    cdef Py_ssize_t end = buf.shape[0], i, p = pos, total = 0
    cdef uint64_t n
    for i in range(count):
        if end - p < 8:
            return None, None, p, i
        memcpy(&n, &buf[p], 8)
        p += 8
        if n > <uint64_t>(end - p):
            return None, None, p, i
        p += <Py_ssize_t>n
        total += <Py_ssize_t>n
    offsets = np.empty(count + 1, dtype=np.int64)
    cdef int64_t[::1] off = offsets
    blob = PyBytes_FromStringAndSize(NULL, total)  # filled here before anything sees it
    cdef char *dst = PyBytes_AS_STRING(blob)
    cdef Py_ssize_t at = 0
    p = pos
    for i in range(count):
        memcpy(&n, &buf[p], 8)
        p += 8
        off[i] = at
        if n:
            memcpy(dst + at, &buf[p], <size_t>n)
        at += <Py_ssize_t>n
        p += <Py_ssize_t>n
    off[count] = at
    return blob, offsets, p, count


cdef Py_ssize_t _items(const uint8_t[::1] blob, const int64_t[::1] offsets, str fn) except -1:
    """The number of items offsets delimits in blob (0 for no offsets), or
    InvalidArgumentError naming fn when they point outside it or go backwards."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, i
    if n < 0:
        return 0
    if offsets[0] < 0 or offsets[n] > blob.shape[0]:
        raise errors.InvalidArgumentError(f"{fn}: offsets past the blob")
    for i in range(n):
        if offsets[i + 1] < offsets[i]:
            raise errors.InvalidArgumentError(f"{fn}: offsets go backwards")
    return n


def decode_strings(const uint8_t[::1] blob, const int64_t[::1] offsets):
    """The str of each item of a read_strings blob, invalid UTF-8 as U+FFFD."""
    cdef Py_ssize_t n = _items(blob, offsets, "decode_strings"), i
    out = [None] * n
    cdef const char *base = <const char *>&blob[0] if blob.shape[0] else <const char *>""
    for i in range(n):
        out[i] = PyUnicode_DecodeUTF8(base + offsets[i], <Py_ssize_t>(offsets[i + 1] - offsets[i]), "replace")
    return out


cdef inline uint64_t _fnv1a(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = 0xcbf29ce484222325ULL
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ p[i]) * 0x100000001b3ULL
    return h


def hash_strings(const uint8_t[::1] blob, const int64_t[::1] offsets):
    """The 64-bit FNV-1a hash of each item of a read_strings blob, as uint64
    (hash_bytes of the item's bytes)."""
    cdef Py_ssize_t n = _items(blob, offsets, "hash_strings"), i
    out = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    cdef const uint8_t *base = &blob[0] if blob.shape[0] else <const uint8_t *>""
    with nogil:
        for i in range(n):
            o[i] = _fnv1a(base + offsets[i], <Py_ssize_t>(offsets[i + 1] - offsets[i]))
    return out


def hash_bytes(const uint8_t[::1] b):
    """The 64-bit FNV-1a hash of b, as hash_strings gives it for an item."""
    return _fnv1a(&b[0] if b.shape[0] else <const uint8_t *>"", b.shape[0])


# ---- encoders (embeddings) ----

cdef class EncoderDesc(_Watched):
    """The C description of a BERT-style encoder (li_encoder_desc), built from
    a llminfer.models.bert EncoderSpec; borrows its arrays like ModelDesc."""

    cdef C.li_encoder_desc desc
    cdef C.li_encoder_layer *layers
    cdef list _keep

    def __cinit__(self, spec):
        self._keep = []
        n_layer = len(spec.layers)
        self.layers = <C.li_encoder_layer *>calloc(max(1, n_layer), sizeof(C.li_encoder_layer))
        if self.layers == NULL:
            raise MemoryError()
        d = &self.desc
        d.n_vocab = spec.n_vocab
        d.n_embd = spec.n_embd
        d.n_layer = n_layer
        d.n_head = spec.n_head
        d.head_dim = spec.head_dim
        d.n_ff = spec.n_ff
        d.n_pos = spec.pos_embd.rows if spec.pos_embd is not None else 0
        d.n_types = spec.type_embd.rows if spec.type_embd is not None else 0
        d.n_rot = spec.n_rot
        d.rope_mode = spec.rope_mode
        d.rope_base = spec.rope_base
        d.norm_eps = spec.norm_eps
        self._matrix(&d.tok_embd, spec.tok_embd)
        self._matrix(&d.pos_embd, spec.pos_embd)
        self._matrix(&d.type_embd, spec.type_embd)
        d.embd_norm = self._vector(spec.embd_norm)
        d.embd_norm_b = self._vector(spec.embd_norm_b)
        cdef C.li_encoder_layer *L
        for i, ls in enumerate(spec.layers):
            L = &self.layers[i]
            self._matrix(&L.wq, ls.wq)
            self._matrix(&L.wk, ls.wk)
            self._matrix(&L.wv, ls.wv)
            L.bq = self._vector(ls.bq)
            L.bk = self._vector(ls.bk)
            L.bv = self._vector(ls.bv)
            self._matrix(&L.wo, ls.wo)
            L.bo = self._vector(ls.bo)
            L.attn_out_norm = self._vector(ls.attn_out_norm)
            L.attn_out_norm_b = self._vector(ls.attn_out_norm_b)
            self._matrix(&L.w_up, ls.w_up)
            L.b_up = self._vector(ls.b_up)
            self._matrix(&L.w_gate, ls.w_gate)
            self._matrix(&L.w_down, ls.w_down)
            L.b_down = self._vector(ls.b_down)
            L.out_norm = self._vector(ls.out_norm)
            L.out_norm_b = self._vector(ls.out_norm_b)
        d.layers = self.layers
        check(C.li_encoder_check(d), "encoder description")

    cdef const float *_vector(self, arr) except? NULL:
        if arr is None:
            return NULL
        if arr.ndim != 1:  # a 2-D vector of weights (a convolution's taps), read flat
            arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
        cdef const float[::1] v = arr
        self._keep.append(arr)
        return &v[0]

    cdef int _matrix(self, C.li_matrix *m, mat) except -1:
        if mat is None:
            m.data = NULL
            m.type = 0
            m.rows = 0
            m.k = 0
            m.nbytes = 0
            return 0
        cdef const uint8_t[::1] data = mat.data
        self._keep.append(mat.data)
        m.data = &data[0]
        m.type = mat.qtype
        m.rows = mat.rows
        m.k = mat.k
        m.nbytes = data.shape[0]
        return 0

    def encode(self, const int32_t[::1] tokens, types, int n_threads):
        """The last hidden states, float32 [n, n_embd], of one sequence."""
        cdef int n = tokens.shape[0]
        if n == 0:
            raise errors.InvalidArgumentError("an empty input has no embedding")
        cdef const int32_t[::1] ty
        cdef const int32_t *tp = NULL
        if types is not None:
            ty = types
            if ty.shape[0] != n:
                raise errors.ShapeError(f"{ty.shape[0]} token types for {n} tokens")
            tp = &ty[0]
        out = np.empty((n, self.desc.n_embd), dtype=np.float32)
        cdef float[:, ::1] o = out
        cdef int st
        self.check_faults()
        with nogil:
            st = C.li_encode(&self.desc, &tokens[0], tp, n, &o[0, 0], <size_t>o.shape[0] * o.shape[1], n_threads)
        self.check_faults()
        check(st, "encoder pass")
        return out

    def __dealloc__(self):
        free(self.layers)


def set_hidden_output(Context ctx, bint on):
    """Make ctx.decode write normed hidden rows ([n_embd]) instead of logits."""
    if ctx.ctx == NULL:
        raise errors.LLMInferError("the context is closed")
    check(C.li_context_set_hidden_output(ctx.ctx, on), "hidden output")


ATTN_NON_CAUSAL, ATTN_CAUSAL, ATTN_NON_CAUSAL_SWA = C.LI_ATTN_NON_CAUSAL, C.LI_ATTN_CAUSAL, C.LI_ATTN_NON_CAUSAL_SWA


def set_causal(Context ctx, int mode):
    """mode ATTN_NON_CAUSAL (or False): ctx.decode's rows see their
    sequence's positions up to the last one in the batch (an image's rows
    both ways) in every layer; ATTN_NON_CAUSAL_SWA: so in the sliding-window
    layers only; ATTN_CAUSAL (or True) goes back."""
    if ctx.ctx == NULL:
        raise errors.LLMInferError("the context is closed")
    check(C.li_context_set_causal(ctx.ctx, mode), "causal attention")


def set_tuning(Context ctx, int stream_hint, int placement):
    """The context's host tuning (llminfer.h's li_tuning), between passes."""
    if ctx.ctx == NULL:
        raise errors.LLMInferError("the context is closed")
    cdef C.li_tuning t
    t.stream_hint = stream_hint
    t.placement = placement
    check(C.li_context_set_tuning(ctx.ctx, &t), "tuning")


def get_tuning(Context ctx):
    """(stream_hint, placement, near) of the context."""
    if ctx.ctx == NULL:
        raise errors.LLMInferError("the context is closed")
    cdef C.li_tuning t
    cdef int near = 0
    check(C.li_context_get_tuning(ctx.ctx, &t, &near), "tuning")
    return t.stream_hint, t.placement, bool(near)


def placement_count():
    return C.LI_PLACEMENT_COUNT


PROBE_STEPS = {C.LI_PROBE_EMBED: "embedding", C.LI_PROBE_ATTN: "attention", C.LI_PROBE_FFN: "ffn",
               C.LI_PROBE_BACKEND: "backend", C.LI_PROBE_OUTPUT_NORM: "output_norm",
               C.LI_PROBE_LOGITS: "logits"}


def set_probe(Context ctx, bint on):
    """Make later ctx.decode calls check for NaN and infinities after each
    step of the pass (a diagnostic re-run; off, the checks cost nothing)."""
    if ctx.ctx == NULL:
        raise errors.LLMInferError("the context is closed")
    check(C.li_context_set_probe(ctx.ctx, on), "probe")


def probe_result(Context ctx):
    """Where the last decode with the probe on first held a non-finite
    value: (step, layer, batch row), step one of PROBE_STEPS' names (layer
    -1 where it has none); or None when every value was finite."""
    if ctx.ctx == NULL:
        raise errors.LLMInferError("the context is closed")
    cdef C.li_probe_result r
    check(C.li_context_probe_result(ctx.ctx, &r), "probe result")
    if r.step == C.LI_PROBE_NONE:
        return None
    layer = r.layer if r.step in (C.LI_PROBE_ATTN, C.LI_PROBE_FFN, C.LI_PROBE_BACKEND) else -1
    return PROBE_STEPS[r.step], layer, r.row
