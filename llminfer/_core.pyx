# cython: language_level=3, boundscheck=False, wraparound=False
"""The boundary between Python and the C core (csrc/). Thin on purpose: the
callers in llminfer.ops check shapes and types and name the problem; here
arrays become pointers, the GIL is released around every kernel, and C
status codes become llminfer.errors exceptions."""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

cimport llminfer._clib as C

import numpy as np

from llminfer import errors


cdef int check(int status, str what) except -1:
    if status != C.LI_OK:
        raise errors.from_status(status, C.li_status_name(status).decode(), what)
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


def matmul(int qtype, const uint8_t[::1] w, int64_t rows, int64_t k, const float[:, ::1] x,
           int n_threads):
    cdef int64_t n = x.shape[0]
    out = np.empty((n, rows), dtype=np.float32)
    if n == 0:
        return out
    cdef float[:, ::1] y = out
    cdef int st
    with nogil:
        st = C.li_matmul(qtype, &w[0], w.shape[0], rows, k, &x[0, 0], n, &y[0, 0], n_threads)
    check(st, "matmul")
    return out


def rms_norm(const float[:, ::1] x, const float[::1] w, float eps, int n_threads):
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


def softmax(const float[:, ::1] x):
    out = np.empty((x.shape[0], x.shape[1]), dtype=np.float32)
    cdef float[:, ::1] y = out
    cdef int st
    with nogil:
        st = C.li_softmax(&x[0, 0], x.shape[0], x.shape[1], &y[0, 0])
    check(st, "softmax")
    return out


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


def rope(float[:, :, ::1] x, const int32_t[::1] pos, int64_t n_rot, float freq_base,
         float freq_scale, int mode):
    cdef int st
    with nogil:
        st = C.li_rope(&x[0, 0, 0], x.shape[0], x.shape[1], x.shape[2], n_rot, &pos[0],
                       freq_base, freq_scale, mode)
    check(st, "rope")


# ---- benchmark and test helpers (csrc/bench.c) ----

def bench_read(const uint8_t[::1] buf, int n_threads):
    """Reads every byte of buf on n_threads threads; returns a checksum."""
    cdef uint64_t r
    with nogil:
        r = C.li_bench_read(&buf[0], buf.shape[0], n_threads)
    return r


# element sizes (bytes) of (a, b) per vector op, for the size checks below
_VEC_OPS = {
    "dot_f32": (C.LI_VEC_DOT_F32, 4, 4), "dot_f32_f16": (C.LI_VEC_DOT_F32_F16, 4, 2),
    "axpy_f32": (C.LI_VEC_AXPY_F32, 4, 4), "axpy_f16": (C.LI_VEC_AXPY_F16, 2, 4),
    "scale_f32": (C.LI_VEC_SCALE_F32, 4, 4), "f32_to_f16": (C.LI_VEC_F32_TO_F16, 4, 2),
    "f16_to_f32": (C.LI_VEC_F16_TO_F32, 2, 4),
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
