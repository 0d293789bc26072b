/* kernels.cuh: the GPU kernels of one layer and of the head, for backend.cu.
 *
 * Products (y[n, rows] = x[n, k] . W[rows, k]^T):
 *   quantized W: the input rows are quantized once to act_q8_1 (k_quantize),
 *   then read as units of 32 (quant_units.h) with dp4a:
 *     k_mmv_q   decode, n <= LI_MMV_MAX tokens: a warp per weight row, its
 *               lanes over the row's units, every token of the batch against
 *               each unpacked unit;
 *     k_mm_q    prefill: 64 x 64 tiles of (rows, tokens), four units of k at a
 *               step unpacked into shared memory.
 *   F16 / F32 W: k_mmv_f and k_mm_f, on float inputs.
 * Row-wise steps: k_rmsnorm (optionally over selected rows), k_prepare_heads
 * (biases, q/k norms, RoPE from the host's cos/sin table, the f16 rounding of
 * queries and the KV cache write), k_attn_part / k_attn_combine (attention
 * over the paged F16 cache, split into spans of LI_ATTN_SPAN positions and
 * combined in span order, as attention.c does), k_gate, k_residual.
 * Everything runs on one stream; nothing here synchronizes with the host.
 */
#ifndef LLMINFER_CUDA_KERNELS_CUH
#define LLMINFER_CUDA_KERNELS_CUH

#include "gpu_compat.h"
#include "quant_units.h"

#define LI_MMV_MAX 8     /* most tokens of a batch the mat-vec kernel takes */
#define LI_TILE 64       /* rows and tokens of a prefill tile */
#define LI_TILE_UNITS 4  /* units of k per prefill step */

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += li_shfl_xor(v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, li_shfl_xor(v, o));
    return v;
}

/* the sum (or max) over a block of up to 1024 threads; every thread gets it */
static __device__ float block_reduce(float v, bool is_max, float *shared32) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads(); /* shared32 may still be read by a previous call */
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    v = lane < nw ? shared32[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(v) : warp_sum(v);
}

/* ---- activations ---- */

/* y: rows of units act_q8_1 from x [n, k]; one thread per unit */
__global__ void k_quantize(const float *x, int64_t k, int64_t n, act_q8_1 *y) {
    const int64_t units = k / LI_UNIT, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * units) return;
    li_quantize_q8_1(x + (i / units) * k + (i % units) * LI_UNIT, y + i);
}

/* ---- quantized products ---- */

template <int TYPE, int NT>
__global__ void k_mmv_q(const uint8_t *w, size_t row_bytes, int64_t rows, int64_t units, const act_q8_1 *xq, int n,
                        float *y, int64_t ldy) {
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int upb = li_u_per_block(TYPE), bb = li_u_block_bytes(TYPE);
    const uint8_t *wr = w + (size_t)row * row_bytes;
    float acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t u = lane; u < units; u += 32) {
        li_unit unit;
        li_unpack_unit(TYPE, wr + (size_t)(u / upb) * bb, (int)(u % upb), &unit);
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const act_q8_1 *a = xq + (size_t)t * units + u;
            acc[t] += li_unit_dot_words(&unit, (const int32_t *)a->qs, a->d, a->s);
        }
    }
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
        const float s = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * ldy + row] = s;
    }
}

/* 256 threads: a 64 x 64 tile, each thread 4 rows x 4 tokens (strided by 16) */
template <int TYPE>
__global__ void k_mm_q(const uint8_t *w, size_t row_bytes, int64_t rows, int64_t units, const act_q8_1 *xq, int64_t n,
                       float *y, int64_t ldy) {
    __shared__ int32_t wq[LI_TILE][LI_TILE_UNITS * 8 + 1];
    __shared__ float wsc[LI_TILE][LI_TILE_UNITS][2], wmn[LI_TILE][LI_TILE_UNITS];
    __shared__ int32_t aq[LI_TILE][LI_TILE_UNITS * 8 + 1];
    __shared__ float ad[LI_TILE][LI_TILE_UNITS], as_[LI_TILE][LI_TILE_UNITS];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t r0 = (int64_t)blockIdx.x * LI_TILE, t0 = (int64_t)blockIdx.y * LI_TILE;
    const int upb = li_u_per_block(TYPE), bb = li_u_block_bytes(TYPE);
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int64_t u0 = 0; u0 < units; u0 += LI_TILE_UNITS) {
        { /* one unit of one weight row per thread */
            const int r = tid / LI_TILE_UNITS, uu = tid % LI_TILE_UNITS;
            const int64_t row = r0 + r, u = u0 + uu;
            li_unit unit;
            if (row < rows && u < units) {
                li_unpack_unit(TYPE, w + (size_t)row * row_bytes + (size_t)(u / upb) * bb, (int)(u % upb), &unit);
            } else {
                for (int i = 0; i < 8; i++) unit.q[i] = 0;
                unit.sc[0] = unit.sc[1] = unit.mn = 0.0f;
            }
            for (int i = 0; i < 8; i++) wq[r][uu * 8 + i] = unit.q[i];
            wsc[r][uu][0] = unit.sc[0];
            wsc[r][uu][1] = unit.sc[1];
            wmn[r][uu] = unit.mn;
        }
        for (int idx = tid; idx < LI_TILE * LI_TILE_UNITS; idx += blockDim.x) {
            const int tt = idx / LI_TILE_UNITS, uu = idx % LI_TILE_UNITS;
            const int64_t tok = t0 + tt, u = u0 + uu;
            if (tok < n && u < units) {
                const act_q8_1 *a = xq + (size_t)tok * units + u;
                const int32_t *q = (const int32_t *)a->qs;
                for (int i = 0; i < 8; i++) aq[tt][uu * 8 + i] = q[i];
                ad[tt][uu] = a->d;
                as_[tt][uu] = a->s;
            } else {
                for (int i = 0; i < 8; i++) aq[tt][uu * 8 + i] = 0;
                ad[tt][uu] = as_[tt][uu] = 0.0f;
            }
        }
        __syncthreads();
        for (int uu = 0; uu < LI_TILE_UNITS; uu++)
            for (int i = 0; i < 4; i++) {
                const int r = ty + 16 * i;
                for (int j = 0; j < 4; j++) {
                    const int tt = tx + 16 * j;
                    int s0 = 0, s1 = 0;
                    for (int q = 0; q < 4; q++) s0 = li_dp4a(wq[r][uu * 8 + q], aq[tt][uu * 8 + q], s0);
                    for (int q = 4; q < 8; q++) s1 = li_dp4a(wq[r][uu * 8 + q], aq[tt][uu * 8 + q], s1);
                    acc[i][j] += ad[tt][uu] * (wsc[r][uu][0] * (float)s0 + wsc[r][uu][1] * (float)s1) +
                                 wmn[r][uu] * as_[tt][uu];
                }
            }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            const int64_t row = r0 + ty + 16 * i, tok = t0 + tx + 16 * j;
            if (row < rows && tok < n) y[(size_t)tok * ldy + row] = acc[i][j];
        }
}

/* ---- float weights (F16, F32) on float inputs ---- */

template <int F16>
static __device__ __forceinline__ float wload(const void *w, size_t i) {
    return F16 ? li_h2f(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

template <int F16, int NT>
__global__ void k_mmv_f(const void *w, int64_t rows, int64_t k, const float *x, int n, float *y, int64_t ldy) {
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t i = lane; i < k; i += 32) {
        const float wv = wload<F16>(w, (size_t)row * k + i);
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            acc[t] += wv * x[(size_t)t * k + i];
        }
    }
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
        const float s = warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * ldy + row] = s;
    }
}

template <int F16>
__global__ void k_mm_f(const void *w, int64_t rows, int64_t k, const float *x, int64_t n, float *y, int64_t ldy) {
    __shared__ float ws[LI_TILE][17], xs[LI_TILE][17];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t r0 = (int64_t)blockIdx.x * LI_TILE, t0 = (int64_t)blockIdx.y * LI_TILE;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
        for (int idx = tid; idx < LI_TILE * 16; idx += blockDim.x) {
            const int r = idx / 16, kk = idx % 16;
            const int64_t row = r0 + r, tok = t0 + r, kc = k0 + kk;
            ws[r][kk] = row < rows && kc < k ? wload<F16>(w, (size_t)row * k + kc) : 0.0f;
            xs[r][kk] = tok < n && kc < k ? x[(size_t)tok * k + kc] : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < 16; kk++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += ws[ty + 16 * i][kk] * xs[tx + 16 * j][kk];
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            const int64_t row = r0 + ty + 16 * i, tok = t0 + tx + 16 * j;
            if (row < rows && tok < n) y[(size_t)tok * ldy + row] = acc[i][j];
        }
}

/* ---- row-wise steps ---- */

/* y[i] = rmsnorm(x[rows ? rows[i] : i]) * w, a block per output row */
__global__ void k_rmsnorm(const float *x, const int32_t *rows, const float *w, float *y, int64_t k, float eps) {
    __shared__ float red[32];
    const int64_t src = rows ? rows[blockIdx.x] : blockIdx.x;
    const float *xr = x + (size_t)src * k;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_reduce(ss, false, red);
    const float scale = rsqrtf(ss / (float)k + eps);
    float *yr = y + (size_t)blockIdx.x * k;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}

/* x += o (o first normed by post_norm when given), a block per row */
__global__ void k_residual(float *x, float *o, const float *post_norm, int64_t k, float eps) {
    __shared__ float red[32];
    float *xr = x + (size_t)blockIdx.x * k, *orow = o + (size_t)blockIdx.x * k;
    float scale = 1.0f;
    if (post_norm) {
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < k; i += blockDim.x) ss += orow[i] * orow[i];
        ss = block_reduce(ss, false, red);
        scale = rsqrtf(ss / (float)k + eps);
    }
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
        xr[i] += post_norm ? orow[i] * scale * post_norm[i] : orow[i];
}

/* g = fn(g) * u over count values; fn 0 SiLU, 1 GELU (tanh form) */
__global__ void k_gate(float *g, const float *u, int64_t count, int fn) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float x = g[i];
    float a;
    if (fn == 0) {
        a = x / (1.0f + expf(-x));
    } else {
        a = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
    g[i] = a * u[i];
}

struct li_heads_args {
    float *q, *k, *v;                 /* [n, n_head|n_head_kv, hd|hdv] */
    const float *bq, *bk, *bv;        /* biases or NULL */
    const float *q_norm, *k_norm;     /* [hd] or NULL */
    const float *cs;                  /* [n, n_rot] cos/sin pairs of this layer's table */
    const int32_t *kv_row;            /* [n] pool row each token writes */
    uint16_t *kc, *vc;                /* the layer's cache: [rows, n_head_kv, hd|hdv] f16 */
    int n_head, n_head_kv, hd, hdv, n_rot, neox;
    float eps;
};

/* one block per (token, head item): items < n_head are query heads, the rest
 * key/value heads, as li_prepare_head orders them */
__global__ void k_prepare_heads(li_heads_args a) {
    __shared__ float red[32];
    __shared__ float buf[1024];
    const int t = blockIdx.x, item = blockIdx.y;
    const bool is_q = item < a.n_head;
    const int h = is_q ? item : item - a.n_head, hd = a.hd;
    float *x = is_q ? a.q + ((size_t)t * a.n_head + h) * hd : a.k + ((size_t)t * a.n_head_kv + h) * hd;
    const float *bias = is_q ? a.bq : a.bk, *norm = is_q ? a.q_norm : a.k_norm;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = x[i] + (bias ? bias[(size_t)h * hd + i] : 0.0f);
    __syncthreads();
    if (norm) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += buf[i] * buf[i];
        ss = block_reduce(ss, false, red);
        const float scale = rsqrtf(ss / (float)hd + a.eps);
        __syncthreads();
        for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = buf[i] * scale * norm[i];
        __syncthreads();
    }
    /* RoPE: pair i of n_rot/2 is (2i, 2i+1) (normal) or (i, i + n_rot/2) (NEOX) */
    const int half = a.n_rot / 2;
    const float *cs = a.cs + (size_t)t * a.n_rot;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1], x0 = buf[i0], x1 = buf[i1];
        buf[i0] = x0 * c - x1 * s;
        buf[i1] = x0 * s + x1 * c;
    }
    __syncthreads();
    if (is_q) { /* queries meet an F16 cache rounded to f16, as on the CPU */
        for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] = li_h2f(li_f2h(buf[i]));
        return;
    }
    const size_t row = (size_t)a.kv_row[t] * a.n_head_kv + h;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) a.kc[row * hd + i] = li_f2h(buf[i]);
    const float *v = a.v + ((size_t)t * a.n_head_kv + h) * a.hdv;
    for (int i = threadIdx.x; i < a.hdv; i += blockDim.x)
        a.vc[row * a.hdv + i] = li_f2h(v[i] + (a.bv ? a.bv[(size_t)h * a.hdv + i] : 0.0f));
}

struct li_attn_args {
    const float *q;                   /* [n, n_head, hd], rounded to f16 */
    const uint16_t *kc, *vc;          /* the layer's cache */
    const int32_t *pos;               /* [n] */
    const int32_t *tab_off, *tab_len; /* [n] each token's block table in tables (this layer's group) */
    const int32_t *tables;
    float *parts;                     /* [n, n_head, max_spans, 2 + hdv] */
    int n_head, n_head_kv, hd, hdv, block_size, window, span, max_spans;
    float scale;
};

/* one block of LI_ATTN_THREADS per (token, query head, span): the span's max,
 * sum of exp(score - max) and the weighted sum of its values (weights
 * rounded to f16, as the CPU's F16 path rounds them) */
#define LI_ATTN_THREADS 128
__global__ void k_attn_part(li_attn_args a) {
    extern __shared__ float smem[]; /* q[hd], scores[span], rows as int[span] */
    __shared__ float red[32];
    float *qs = smem, *sc = smem + a.hd;
    int *rows = (int *)(sc + a.span);
    const int t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, kvh = h / (a.n_head / a.n_head_kv);
    const int pos = a.pos[t], first = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    const int s = first / a.span + blockIdx.y;
    float *part = a.parts + (((size_t)t * a.n_head + h) * a.max_spans + blockIdx.y) * (size_t)(2 + a.hdv);
    if (s > pos / a.span) {
        if (threadIdx.x == 0) {
            part[0] = -INFINITY;
            part[1] = 0.0f;
        }
        return;
    }
    const int p0 = max(first, s * a.span), p1 = min(pos + 1, (s + 1) * a.span), np = p1 - p0;
    for (int i = threadIdx.x; i < a.hd; i += blockDim.x) qs[i] = a.q[((size_t)t * a.n_head + h) * a.hd + i];
    const int32_t *table = a.tables + a.tab_off[t];
    const int n_blocks = a.tab_len[t];
    for (int j = threadIdx.x; j < np; j += blockDim.x) {
        const int p = p0 + j, b = p / a.block_size;
        const int id = b < n_blocks ? table[b] : -1;
        rows[j] = id < 0 ? -1 : id * a.block_size + p % a.block_size;
    }
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int j = warp; j < np; j += nw) {
        if (rows[j] < 0) {
            if (lane == 0) sc[j] = -INFINITY;
            continue;
        }
        const uint16_t *kr = a.kc + ((size_t)rows[j] * a.n_head_kv + kvh) * a.hd;
        float d = 0.0f;
        for (int i = lane; i < a.hd; i += 32) d += qs[i] * li_h2f(kr[i]);
        d = warp_sum(d);
        if (lane == 0) sc[j] = a.scale * d;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < np; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    mx = block_reduce(mx, true, red);
    if (mx == -INFINITY) { /* no key of this span is present */
        if (threadIdx.x == 0) {
            part[0] = -INFINITY;
            part[1] = 0.0f;
        }
        return;
    }
    float sum = 0.0f;
    for (int j = threadIdx.x; j < np; j += blockDim.x) {
        const float e = rows[j] < 0 ? 0.0f : expf(sc[j] - mx);
        sum += e;
        sc[j] = li_h2f(li_f2h(e));
    }
    sum = block_reduce(sum, false, red);
    __syncthreads();
    for (int d = threadIdx.x; d < a.hdv; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < np; j++)
            if (rows[j] >= 0) acc += sc[j] * li_h2f(a.vc[((size_t)rows[j] * a.n_head_kv + kvh) * a.hdv + d]);
        part[2 + d] = acc;
    }
    if (threadIdx.x == 0) {
        part[0] = mx;
        part[1] = sum;
    }
}

/* att[t, h] = the spans of (t, h) combined in span order, a block per (t, h) */
__global__ void k_attn_combine(const float *parts, int max_spans, int hdv, float *att) {
    const float *p = parts + (size_t)blockIdx.x * max_spans * (size_t)(2 + hdv);
    float best = -INFINITY;
    for (int s = 0; s < max_spans; s++)
        if (p[(size_t)s * (2 + hdv) + 1] > 0.0f) best = fmaxf(best, p[(size_t)s * (2 + hdv)]);
    float total = 0.0f;
    for (int s = 0; s < max_spans; s++) {
        const float *ps = p + (size_t)s * (2 + hdv);
        if (ps[1] > 0.0f) total += expf(ps[0] - best) * ps[1];
    }
    for (int d = threadIdx.x; d < hdv; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < max_spans; s++) {
            const float *ps = p + (size_t)s * (2 + hdv);
            if (ps[1] > 0.0f) acc += expf(ps[0] - best) * ps[2 + d];
        }
        att[(size_t)blockIdx.x * hdv + d] = total > 0.0f ? acc / total : 0.0f;
    }
}

#endif
