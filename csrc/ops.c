/* ops.c: the operations of llminfer.h on caller-owned buffers, and the
 * parallel pieces (matmul.h) that the model's forward pass reuses.
 *
 * Each public function checks its arguments, then runs on an OpenMP team of
 * the requested size (one thread without OpenMP). Kernels come from the
 * active table li_K (dispatch.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "util.h"
#include "kernels/kernels.h"
#include "matmul.h"
#include "quantize.h"
#include "repack.h"
#include "share.h"

/* ---- parallel pieces ---- */

void li_quantize_acts(int type, const float *x, int64_t x_stride, int64_t n, int64_t k, void *xq,
                      int ith, int nth) {
    const int act = li_types[type].act_type;
    const size_t row = li_act_row_bytes(act, k);
    int64_t lo, hi;
    li_split(n, ith, nth, &lo, &hi);
    for (int64_t c = lo; c < hi; c++)
        li_K->quant_act[act](x + c * x_stride, (char *)xq + (size_t)c * row, k);
}

/* rows a thread works through before moving to the next group of columns:
 * its weight bytes stay in L1 while every column group passes over them */
#define ROW_BLOCK 16

/* rows [lo, hi) of y = xq . W^T */
static void matmul_rows(const li_weight *w, const void *xq, int64_t n, float *y, int64_t y_stride, int64_t lo,
                        int64_t hi) {
    const li_dot_fn dot = li_K->dot[w->type];
    const li_dot_rows_fn dot_rows = li_K->dot_rows[w->type];
    const size_t xs = li_act_row_bytes(li_types[w->type].act_type, w->k);
    const char *wd = (const char *)w->data;
    float s[LI_DOT_MAX_NC];
    for (int64_t r0 = lo; r0 < hi; r0 += ROW_BLOCK) {
        const int64_t r1 = LI_MIN(hi, r0 + ROW_BLOCK);
        for (int64_t c0 = 0; c0 < n; c0 += LI_DOT_MAX_NC) {
            const int nc = (int)LI_MIN(LI_DOT_MAX_NC, n - c0);
            const char *xc = (const char *)xq + (size_t)c0 * xs;
            if (dot_rows) {
                for (int64_t r = r0; r < r1; r += LI_DOT_MAX_NR)
                    dot_rows(w->k, wd + (size_t)r * w->row_bytes, w->row_bytes,
                             (int)LI_MIN(LI_DOT_MAX_NR, r1 - r), xc, xs, nc,
                             y + c0 * y_stride + r, (size_t)y_stride);
                continue;
            }
            for (int64_t r = r0; r < r1; r++) {
                dot(w->k, wd + (size_t)r * w->row_bytes, xc, xs, nc, s);
                for (int c = 0; c < nc; c++) y[(c0 + c) * y_stride + r] = s[c];
            }
        }
    }
}

void li_matmul_q(const li_weight *w, const void *xq, int64_t n, float *y, int64_t y_stride,
                 int ith, int nth) {
    int64_t lo, hi;
    li_split(w->rows, ith, nth, &lo, &hi);
    matmul_rows(w, xq, n, y, y_stride, lo, hi);
}

void li_matmul_q_shared(const li_weight *w, const void *xq, int64_t n, float *y, int64_t y_stride,
                        li_share *share, int ith, int nth) {
    const int64_t units = (w->rows + ROW_BLOCK - 1) / ROW_BLOCK;
    if (!share || nth < 2 || units > LI_SHARE_MAX_UNITS) { /* the same test for every thread */
        li_matmul_q(w, xq, n, y, y_stride, ith, nth);
        return;
    }
    li_share_turn t;
    int64_t u0, u1;
    li_share_open(share, units, ith, nth, &t);
    while (li_share_next(share, &t, &u0, &u1))
        matmul_rows(w, xq, n, y, y_stride, u0 * ROW_BLOCK, LI_MIN(w->rows, u1 * ROW_BLOCK));
}

void li_rope_params_init(li_rope_params *r, int64_t n_rot, float freq_base, float freq_scale,
                         const float *factors) {
    r->theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    r->freq_scale = freq_scale;
    r->factors = factors;
    r->sect[0] = r->sect[1] = r->sect[2] = r->sect[3] = 0;
    r->n_sect = 0;
    r->interleave = 0;
}

void li_rope_set_sections(li_rope_params *r, const int sect[4], int interleave) {
    r->n_sect = 0;
    r->interleave = interleave != 0;
    for (int j = 0; j < 4; j++) {
        r->sect[j] = sect[j] > 0 ? sect[j] : 0;
        r->n_sect += r->sect[j];
    }
}

/* the section (0..3) of rotated pair i: ggml's M-RoPE (mrope), or its
 * interleaved form (imrope) */
static int rope_section(const li_rope_params *r, int64_t i) {
    const int64_t s = i % r->n_sect;
    if (r->interleave) {
        if (s % 3 == 1 && s < 3 * (int64_t)r->sect[1]) return 1;
        if (s % 3 == 2 && s < 3 * (int64_t)r->sect[2]) return 2;
        if (s % 3 == 0 && s < 3 * (int64_t)r->sect[0]) return 0;
        return 3;
    }
    if (s < r->sect[0]) return 0;
    if (s < r->sect[0] + r->sect[1]) return 1;
    if (s < r->sect[0] + r->sect[1] + r->sect[2]) return 2;
    return 3;
}

void li_rope_cache(const int32_t *pos, const int32_t *pos4, int64_t n_tok, int64_t n_rot, const li_rope_params *r,
                   float *cs) {
    const int64_t half = n_rot / 2;
    for (int64_t t = 0; t < n_tok; t++) {
        /* each section's angle advances by theta_scale at every pair, as ggml's
         * mrope cache does, so a pair's angle is its own section's position
         * times the same power whichever section it is in */
        float theta[4];
        for (int j = 0; j < 4; j++)
            theta[j] = (float)(!r->n_sect ? pos[t] : pos4 ? pos4[t * 4 + j] : j < 3 ? pos[t] : 0);
        for (int64_t i = 0; i < half; i++) {
            const float th = theta[r->n_sect ? rope_section(r, i) : 0];
            const float angle = r->freq_scale * (r->factors ? th / r->factors[i] : th);
            cs[(t * half + i) * 2] = cosf(angle);
            cs[(t * half + i) * 2 + 1] = sinf(angle);
            for (int j = 0; j < 4; j++) theta[j] *= r->theta_scale;
        }
    }
}

void li_rope_head(float *x, const float *cs, int64_t n_rot, int mode) {
    const int64_t half = n_rot / 2;
    /* NORM pairs (2i, 2i+1); NEOX pairs (i, i + half) */
    const int64_t step = mode == LI_ROPE_NEOX ? 1 : 2, off = mode == LI_ROPE_NEOX ? half : 1;
    for (int64_t i = 0; i < half; i++) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        float *a = x + i * step, *b = a + off;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
    }
}

/* ---- public operations ---- */

static int team_size(int n_threads) {
    if (n_threads <= 0) return li_max_threads();
    return n_threads;
}

int li_dequantize(int type, const void *src, size_t src_bytes, int64_t rows, int64_t k, float *dst,
                  int n_threads) {
    li_init();
    if (!src || !dst || rows < 0 || k <= 0) return LI_E_ARG;
    if (li_type_sizes(type, NULL, NULL) != LI_OK) return LI_E_TYPE;
    const size_t row = li_row_bytes(type, k);
    if (row == 0 || src_bytes != row * (size_t)rows) return LI_E_SHAPE;
    const li_dequant_fn f = li_K->dequant[type];
    int64_t r; /* declared outside the loop: MSVC's OpenMP 2.0 wants it so in C */
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team_size(n_threads)) schedule(static)
#endif
    for (r = 0; r < rows; r++) f((const char *)src + (size_t)r * row, dst + r * k, k);
    return LI_OK;
}

int li_quantize(int type, const float *src, int64_t rows, int64_t k, void *dst, size_t dst_bytes,
                int n_threads) {
    li_init();
    if (!src || !dst || rows < 0 || k <= 0) return LI_E_ARG;
    const li_quantize_fn f = li_weight_quantizer(type);
    if (!f) return LI_E_TYPE;
    const size_t row = li_row_bytes(type, k);
    if (row == 0 || dst_bytes != row * (size_t)rows) return LI_E_SHAPE;
    int64_t r; /* declared outside the loop: MSVC's OpenMP 2.0 wants it so in C */
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team_size(n_threads)) schedule(dynamic, 16)
#endif
    for (r = 0; r < rows; r++) f(src + r * k, (char *)dst + (size_t)r * row, k);
    return LI_OK;
}

int li_matmul(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, const float *x,
              int64_t n, float *y, int n_threads) {
    li_init();
    if (!w || !x || !y || rows <= 0 || k <= 0 || n < 0) return LI_E_ARG;
    if (li_type_sizes(type, NULL, NULL) != LI_OK) return LI_E_TYPE;
    const size_t row = li_row_bytes(type, k);
    if (row == 0 || w_bytes != row * (size_t)rows) return LI_E_SHAPE;
    if (n == 0) return LI_OK;
    const int act = li_types[type].act_type;
    if (k % li_act_block_size(act) != 0) return LI_E_SHAPE;
    const int nt = team_size(n_threads);
    const int gemm = li_gemm_applies(type, n, rows, k);
    const size_t per_thread = gemm ? li_gemm_scratch_bytes(type, k, n) : 0;
    void *xq = malloc(li_act_row_bytes(act, k) * (size_t)n);
    char *scratch = gemm ? malloc(per_thread * (size_t)nt) : NULL;
    if (!xq || (gemm && !scratch)) {
        free(xq);
        free(scratch);
        return LI_E_NOMEM;
    }
    const li_weight wt = {w, type, rows, k, row};
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        const int ith = li_thread_index(), nth = li_thread_count();
        li_quantize_acts(type, x, k, n, k, xq, ith, nth);
        LI_BARRIER();
        if (gemm)
            li_gemm_q(&wt, xq, n, y, rows, scratch + per_thread * (size_t)ith, ith, nth);
        else
            li_matmul_q(&wt, xq, n, y, rows, ith, nth);
    }
    free(xq);
    free(scratch);
    return LI_OK;
}

/* a matrix repacked once (repack.h), for the kernel benchmark and tests */
struct li_repacked {
    int type;
    int64_t rows, k;
    void *packed;
};

int li_repacked_create(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, int n_threads,
                       li_repacked **out) {
    li_init();
    if (!out) return li_fail(LI_E_ARG, "no place for the result");
    *out = NULL;
    if (!w || rows <= 0 || k <= 0) return li_fail(LI_E_ARG, "no weights, or rows %lld / k %lld not positive", (long long)rows, (long long)k);
    if (li_type_sizes(type, NULL, NULL) != LI_OK || !li_x16_available(type))
        return li_fail(LI_E_TYPE, "the active kernel level has no repacked kernel for type %d", type);
    const size_t row = li_row_bytes(type, k);
    if (row == 0 || w_bytes != row * (size_t)rows)
        return li_fail(LI_E_SHAPE, "%zu bytes of weights for [%lld, %lld]", w_bytes, (long long)rows, (long long)k);
    if (k % li_act_block_size(li_types[type].act_type) != 0 || li_x16_group_bytes(type, k) == 0)
        return li_fail(LI_E_SHAPE, "rows of %lld values are not whole blocks of the type", (long long)k);
    li_repacked *m = calloc(1, sizeof(*m));
    const int64_t ng = li_x16_groups(rows);
    /* in the pages a model's repacked weights get, so that bench/kernels.py
     * streams them as decode does (4 KiB pages cost it a TLB walk per page) */
    void *packed = li_x16_alloc(li_x16_group_bytes(type, k) * (size_t)ng);
    if (!m || !packed) {
        free(m);
        li_free_aligned(packed);
        return LI_E_NOMEM;
    }
    m->type = type;
    m->rows = rows;
    m->k = k;
    m->packed = packed;
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(team_size(n_threads))
#endif
    {
        int64_t lo, hi;
        li_split(ng, li_thread_index(), li_thread_count(), &lo, &hi);
        li_x16_pack(type, w, row, rows, k, packed, lo, hi);
    }
    *out = m;
    return LI_OK;
}

void li_repacked_free(li_repacked *m) {
    if (!m) return;
    li_free_aligned(m->packed);
    free(m);
}

int li_repacked_matmul_joint(const li_repacked *const *ms, const float *const *xs, const int64_t *ns, float *const *ys,
                             int count, int n_threads) {
    li_init();
    if (!ms || !xs || !ns || !ys || count < 1 || count > LI_X16_MAX_PARTS)
        return li_fail(LI_E_ARG, "a joint product of %d matrices (1 to %d)", count, LI_X16_MAX_PARTS);
    li_x16_part_desc parts[LI_X16_MAX_PARTS];
    size_t at[LI_X16_MAX_PARTS + 1];
    const float *src[LI_X16_MAX_PARTS];
    int np = 0;
    at[0] = 0;
    for (int i = 0; i < count; i++) {
        const li_repacked *m = ms[i];
        if (!m || !xs[i] || !ys[i] || ns[i] < 0) return li_fail(LI_E_ARG, "product %d: no matrix, input or output", i);
        if (!li_x16_available(m->type)) /* the kernel level changed since it was packed */
            return li_fail(LI_E_TYPE, "the active kernel level has no repacked kernel for type %d", m->type);
        if (ns[i] == 0) continue;
        parts[np] = (li_x16_part_desc){m->type, m->packed, m->rows, m->k, NULL, ns[i], ys[i], m->rows};
        src[np] = xs[i];
        at[np + 1] = at[np] + (li_act_row_bytes(li_types[m->type].act_type, m->k) * (size_t)ns[i] + 63) / 64 * 64;
        np++;
    }
    if (np == 0) return LI_OK;
    const int nt = team_size(n_threads);
    /* no context here: the process's default for new contexts (li_stream_hint_select) */
    const unsigned hints = li_stream_hint_current() == LI_STREAM_L2 ? LI_X16_HINT_L2 : 0u;
    const size_t per_thread = li_x16_parts_scratch_ints(parts, np) + 1;
    char *xq = li_alloc_aligned(at[np], 64);
    int32_t *scratch = malloc(per_thread * sizeof(int32_t) * (size_t)nt);
    li_share *share = li_share_new(nt);
    if (!xq || !scratch || !share) {
        li_free_aligned(xq);
        free(scratch);
        li_share_free(share);
        return LI_E_NOMEM;
    }
    for (int i = 0; i < np; i++) parts[i].xq = xq + at[i];
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        const int ith = li_thread_index(), nth = li_thread_count();
        li_share_begin(share, ith);
        for (int i = 0; i < np; i++)
            li_quantize_acts(parts[i].type, src[i], parts[i].k, parts[i].n, parts[i].k, xq + at[i], ith, nth);
        LI_BARRIER();
        (void)li_x16_matmul_parts(parts, np, scratch + per_thread * (size_t)ith, share, ith, nth, hints); /* np in range */
    }
    li_free_aligned(xq);
    free(scratch);
    li_share_free(share);
    return LI_OK;
}

int li_repacked_matmul(const li_repacked *m, const float *x, int64_t n, float *y, int n_threads) {
    if (!m || !x || !y || n < 0) return li_fail(LI_E_ARG, "no matrix, input or output");
    return li_repacked_matmul_joint(&m, &x, &n, &y, 1, n_threads);
}

int li_matmul_repacked(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, const float *x,
                       int64_t n, float *y, int n_threads) {
    if (!x || !y || n < 0) return LI_E_ARG;
    li_repacked *m = NULL;
    int st = li_repacked_create(type, w, w_bytes, rows, k, n_threads, &m);
    if (st == LI_OK) st = li_repacked_matmul(m, x, n, y, n_threads);
    li_repacked_free(m);
    return st;
}

int li_rms_norm(const float *x, const float *w, int64_t rows, int64_t k, float eps, float *y,
                int n_threads) {
    li_init();
    if (!x || !y || rows < 0 || k <= 0 || !(eps >= 0.0f)) return LI_E_ARG;
    int64_t r; /* declared outside the loop: MSVC's OpenMP 2.0 wants it so in C */
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team_size(n_threads)) schedule(static)
#endif
    for (r = 0; r < rows; r++) li_K->rms_norm(x + r * k, w, y + r * k, k, eps);
    return LI_OK;
}

/* ggml's order: the mean and the sum of squared deviations in double, the
 * deviations scaled in float, then the weight and the bias */
static void layer_norm_row(const float *x, int64_t k, const float *w, const float *b, float eps, float *y) {
    double s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= k; i += 4)
        for (int j = 0; j < 4; j++) s[j] += x[i + j];
    for (; i < k; i++) s[0] += x[i];
    const float mean = (float)((s[0] + s[1] + s[2] + s[3]) / (double)k);
    double q[4] = {0, 0, 0, 0};
    for (i = 0; i + 4 <= k; i += 4)
        for (int j = 0; j < 4; j++) {
            const float dv = x[i + j] - mean;
            y[i + j] = dv;
            q[j] += (double)(dv * dv);
        }
    for (; i < k; i++) {
        const float dv = x[i] - mean;
        y[i] = dv;
        q[0] += (double)(dv * dv);
    }
    const float rstd = 1.0f / sqrtf((float)((q[0] + q[1] + q[2] + q[3]) / (double)k) + eps);
    for (i = 0; i < k; i++) {
        float v = y[i] * rstd;
        if (w) v *= w[i];
        if (b) v += b[i];
        y[i] = v;
    }
}

int li_layer_norm(const float *x, int64_t rows, int64_t k, const float *w, const float *b, float eps, float *y,
                  int n_threads) {
    li_init();
    if (!x || !y || rows < 0 || k <= 0 || !(eps >= 0.0f)) return LI_E_ARG;
    int64_t r; /* declared outside the loop: MSVC's OpenMP 2.0 wants it so in C */
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team_size(n_threads)) schedule(static)
#endif
    for (r = 0; r < rows; r++) layer_norm_row(x + r * k, k, w, b, eps, y + r * k);
    return LI_OK;
}

/* pieces of ACT_PIECE elements: the act kernels treat each element alone,
 * so the cut changes no value */
#define ACT_PIECE 16384

/* y = act(g), or act(g) * u when u is given, the pieces shared by the team */
static void act_pieces(int fn, const float *g, const float *u, int64_t n, float *y, int n_threads) {
    const int64_t pieces = (n + ACT_PIECE - 1) / ACT_PIECE;
    int64_t i;
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team_size(n_threads)) schedule(static)
#endif
    for (i = 0; i < pieces; i++)
        li_gate_apply(fn, g + i * ACT_PIECE, u ? u + i * ACT_PIECE : NULL, y + i * ACT_PIECE,
                      LI_MIN(ACT_PIECE, n - i * ACT_PIECE));
}

int li_activation_mt(int fn, const float *x, int64_t n, float *y, int n_threads) {
    li_init();
    if ((fn != LI_FN_SILU && fn != LI_FN_GELU) || !x || !y || n < 0) return LI_E_ARG;
    act_pieces(fn, x, NULL, n, y, n_threads);
    return LI_OK;
}

int li_gated_activation_mt(int fn, const float *g, const float *u, int64_t n, float *y, int n_threads) {
    li_init();
    if ((fn != LI_FN_SILU && fn != LI_FN_GELU && fn != LI_FN_SWIGLU_OAI) || !g || !u || !y || n < 0) return LI_E_ARG;
    act_pieces(fn, g, u, n, y, n_threads);
    return LI_OK;
}

int li_activation(int fn, const float *x, int64_t n, float *y) {
    li_init();
    if ((fn != LI_FN_SILU && fn != LI_FN_GELU) || !x || !y || n < 0) return LI_E_ARG;
    li_K->act_apply(fn, x, NULL, y, n);
    return LI_OK;
}

int li_gated_activation(int fn, const float *g, const float *u, int64_t n, float *y) {
    li_init();
    if ((fn != LI_FN_SILU && fn != LI_FN_GELU && fn != LI_FN_SWIGLU_OAI) || !g || !u || !y || n < 0) return LI_E_ARG;
    li_gate_apply(fn, g, u, y, n);
    return LI_OK;
}

int li_softmax(const float *x, int64_t rows, int64_t k, float *y) {
    li_init();
    if (!x || !y || rows < 0 || k <= 0) return LI_E_ARG;
    if (x != y) memcpy(y, x, (size_t)(rows * k) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) li_K->softmax(y + r * k, k);
    return LI_OK;
}

int li_value_range(const float *x, int64_t n, float *lo, float *hi) {
    li_init();
    if (!x || !lo || !hi || n <= 0) return LI_E_ARG;
    li_K->range_f32(x, n, lo, hi);
    return LI_OK;
}

/* a ranks below b: a smaller value, or the same value at a higher id */
static int ranks_below(const float *x, int32_t a, int32_t b) { return x[a] < x[b] || (x[a] == x[b] && a > b); }

/* restore the min-heap h[0..k) (root: the lowest ranked) from slot i down */
static void sift_down(const float *x, int32_t *h, int64_t k, int64_t i) {
    for (;;) {
        int64_t low = i;
        const int64_t l = 2 * i + 1, r = l + 1;
        if (l < k && ranks_below(x, h[l], h[low])) low = l;
        if (r < k && ranks_below(x, h[r], h[low])) low = r;
        if (low == i) return;
        const int32_t t = h[i];
        h[i] = h[low];
        h[low] = t;
        i = low;
    }
}

/* One pass keeping the k best so far in a min-heap: an element enters only
 * when it is greater than the heap's least (equal never enters: its id is
 * higher than every id kept), which over a vocabulary's logits is rare once
 * the first few thousand are seen, so the pass is mostly one compare an
 * element. Sampling's top-k in numpy took several passes over the logits a
 * forward pass had just written: a sampled SmolLM2 token's sample() went
 * from 142 to 109 us with this. */
int li_top_k_f32(const float *x, int64_t n, int64_t k, int32_t *ids) {
    if (!x || !ids || n <= 0 || n > INT32_MAX || k <= 0 || k > n) return LI_E_ARG;
    for (int64_t i = 0; i < k; i++) ids[i] = (int32_t)i;
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(x, ids, k, i);
    float least = x[ids[0]];
    enum { BLOCK = 32 };
    for (int64_t i = k; i < n; i += BLOCK) {
        const int64_t end = LI_MIN(n, i + BLOCK);
        if (end - i == BLOCK) {
            /* a whole block's compares with no branch and a constant count:
             * the compiler makes them a few vector compares */
            int any = 0;
            for (int j = 0; j < BLOCK; j++) any |= x[i + j] > least;
            if (!any) continue;
        }
        for (int64_t j = i; j < end; j++)
            if (x[j] > least) {
                ids[0] = (int32_t)j;
                sift_down(x, ids, k, 0);
                least = x[ids[0]];
            }
    }
    /* heap sort: the least ranked goes to the end each time, leaving the
     * ids best first (larger values first, lower ids first among equals) */
    for (int64_t m = k - 1; m > 0; m--) {
        const int32_t t = ids[0];
        ids[0] = ids[m];
        ids[m] = t;
        sift_down(x, ids, m, 0);
    }
    return LI_OK;
}

/* ---- top-p's cut ---- */

/* a token that may hold the cut: its logit, its weight, its id */
typedef struct {
    float x, e;
    int32_t id;
} cut_token;

/* the order top-p keeps tokens in: larger logits first, lower ids first among equals */
static int keeps_before(const cut_token *a, const cut_token *b) {
    return a->x > b->x || (a->x == b->x && a->id < b->id);
}

static void swap_tokens(cut_token *a, cut_token *b) {
    const cut_token t = *a;
    *a = *b;
    *b = t;
}

/* The token of a[0..m) (m >= 1) at which the running weight, in
 * keeps_before's order, first reaches need (> 0); the last when rounding
 * leaves it short. A quickselect by weight: each round splits the tokens
 * around a pivot (the median of three) and goes on in the side that holds
 * the point, so no more than the tokens around it are ever sorted. */
static cut_token cut_select(cut_token *a, int64_t m, double need) {
    while (m > 16) {
        cut_token *lo = &a[0], *mid = &a[m / 2], *hi = &a[m - 1];
        if (keeps_before(mid, lo)) swap_tokens(mid, lo);
        if (keeps_before(hi, mid)) swap_tokens(hi, mid);
        if (keeps_before(mid, lo)) swap_tokens(mid, lo);
        swap_tokens(mid, hi); /* the pivot goes last */
        const cut_token piv = a[m - 1];
        int64_t s = 0;
        double g = 0.0; /* the weight of the tokens before the pivot */
        for (int64_t i = 0; i < m - 1; i++)
            if (keeps_before(&a[i], &piv)) {
                g += a[i].e;
                swap_tokens(&a[i], &a[s++]);
            }
        swap_tokens(&a[s], &a[m - 1]);
        if (g >= need) { /* g >= need > 0: this side is not empty */
            m = s;
        } else if (g + piv.e >= need || s + 1 == m) {
            return piv;
        } else {
            need -= g + piv.e;
            a += s + 1;
            m -= s + 1;
        }
    }
    for (int64_t i = 1; i < m; i++) /* insertion sort of the last few */
        for (int64_t j = i; j > 0 && keeps_before(&a[j], &a[j - 1]); j--) swap_tokens(&a[j], &a[j - 1]);
    double acc = 0.0;
    for (int64_t i = 0; i < m; i++) {
        acc += a[i].e;
        if (acc >= need) return a[i];
    }
    return a[m - 1];
}

/* A weight's bucket: its exponent and 5 bits of its mantissa (a bucket
 * spans about 2% of a binade); weights in [0, 1] fall in 4096 of them, and
 * larger weights in higher buckets, so the buckets go in the tokens' order */
#define CUT_BUCKETS 4096
static uint32_t cut_bucket(float e) {
    uint32_t b;
    memcpy(&b, &e, sizeof(b));
    return b >> 18;
}

/* The cut among candidates c[0..m) (weights in (0, 1]) that weigh target or
 * more in all: the weight of each bucket, the bucket where the running
 * weight from the top reaches target, and then a quickselect among that
 * bucket's tokens alone. Sets *v and returns how many tokens of that logit
 * are kept (all of them are in that bucket: equal logits, equal weights). */
static int64_t cut_among(cut_token *c, int64_t m, double target, float *v) {
    double mass[CUT_BUCKETS] = {0};
    for (int64_t i = 0; i < m; i++) mass[LI_MIN(cut_bucket(c[i].e), CUT_BUCKETS - 1)] += c[i].e;
    double above = 0.0;
    int64_t k = CUT_BUCKETS - 1;
    for (; k > 0; k--) {
        if (mass[k] > 0.0 && above + mass[k] >= target) break;
        above += mass[k];
    }
    int64_t mk = 0; /* the bucket's tokens to the front */
    for (int64_t i = 0; i < m; i++)
        if ((int64_t)LI_MIN(cut_bucket(c[i].e), CUT_BUCKETS - 1) == k) swap_tokens(&c[mk++], &c[i]);
    if (mk == 0) { /* rounding: no bucket reached target; the last token of all */
        cut_token last = c[0];
        for (int64_t i = 1; i < m; i++)
            if (keeps_before(&last, &c[i])) last = c[i];
        *v = last.x;
        int64_t tied = 0;
        for (int64_t i = 0; i < m; i++) tied += c[i].x == last.x;
        return tied;
    }
    const double need = target - above;
    cut_token cut = c[0];
    if (need > 0.0) {
        cut = cut_select(c, mk, need);
    } else { /* top-p 0: the bucket's first token */
        for (int64_t i = 1; i < mk; i++)
            if (keeps_before(&c[i], &cut)) cut = c[i];
    }
    int64_t tied = 0;
    for (int64_t i = 0; i < mk; i++) tied += c[i].x == cut.x && c[i].id <= cut.id;
    *v = cut.x;
    return tied;
}

/* The weights the candidates are taken down to, in turn, until they weigh
 * enough: real logits mostly reach top-p among the tokens of weight >= 2^-10
 * of the largest (a few hundred), and a pass that finds few candidates is
 * mostly vector compares */
static const float cut_floors[] = {0x1p-10f, 0x1p-20f, 0.0f};

int li_top_p_cut(const float *x, const float *e, int64_t n, double target, float floor_x, void *scratch,
                 float *v, int64_t *r) {
    if (!x || !e || !scratch || !v || !r || n <= 0 || n > INT32_MAX || !(target >= 0.0)) return LI_E_ARG;
    cut_token *c = (cut_token *)scratch;
    const int no_floor = isinf(floor_x) && floor_x < 0.0f;
    enum { BLOCK = 32 };
    for (size_t f = 0; f < sizeof(cut_floors) / sizeof(cut_floors[0]); f++) {
        const float t = cut_floors[f];
        int64_t m = 0;
        double mass = 0.0;
        int left_out = 0; /* tokens at or above floor_x that weigh less than t */
        for (int64_t i = 0; i < n; i += BLOCK) {
            const int64_t end = LI_MIN(n, i + BLOCK);
            if (end - i == BLOCK && no_floor) { /* the weights alone: one compare a token */
                int any = 0;
                for (int j = 0; j < BLOCK; j++) any |= e[i + j] >= t;
                if (!any) {
                    left_out |= t > 0.0f; /* (weights of 0 count as left out: one pass more at most) */
                    continue;
                }
            } else if (end - i == BLOCK) { /* most blocks hold no candidate: a few vector compares */
                int any = 0, out = 0;
                for (int j = 0; j < BLOCK; j++) {
                    const int above = x[i + j] >= floor_x;
                    any |= above & (e[i + j] >= t) & (e[i + j] > 0.0f);
                    out |= above & (e[i + j] < t) & (e[i + j] > 0.0f);
                }
                left_out |= out;
                if (!any) continue;
            }
            for (int64_t j = i; j < end; j++) {
                if (!(x[j] >= floor_x && e[j] > 0.0f)) continue;
                if (e[j] >= t) {
                    c[m++] = (cut_token){x[j], e[j], (int32_t)j};
                    mass += e[j];
                } else {
                    left_out = 1;
                }
            }
        }
        if (m > 0 && mass >= target) {
            *v = 0.0f;
            *r = cut_among(c, m, target, v);
            return LI_OK;
        }
        if (!left_out) break; /* a lower t would add nothing */
    }
    *r = 0; /* every weighted token at or above floor_x falls short */
    return LI_OK;
}

int li_add(const float *a, const float *b, int64_t n, float *y) {
    li_init();
    if (!a || !b || !y || n < 0) return LI_E_ARG;
    li_K->add_f32(a, b, y, n);
    return LI_OK;
}

int li_mul(const float *a, const float *b, int64_t n, float *y) {
    li_init();
    if (!a || !b || !y || n < 0) return LI_E_ARG;
    li_K->mul_f32(a, b, y, n);
    return LI_OK;
}

int li_rope_mt(float *x, int64_t n_tok, int64_t ld, int64_t n_head, int64_t head_dim, int64_t n_rot,
               const int32_t *pos, int n_pos, float freq_base, float freq_scale, int mode, int n_threads) {
    li_init();
    if (!x || !pos || n_tok < 0 || n_head <= 0 || head_dim <= 0 || n_pos <= 0) return LI_E_ARG;
    if (ld < n_head * head_dim) return LI_E_SHAPE;
    if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim) return LI_E_SHAPE;
    if (mode != LI_ROPE_NORM && mode != LI_ROPE_NEOX) return LI_E_ARG;
    if (!(freq_base > 0.0f) || !(freq_scale > 0.0f)) return LI_E_ARG;
    if (n_tok == 0) return LI_OK;
    /* the cos/sin pairs of every (token, position column): each token's own
     * slice is filled by the thread that turns it, so the values do not
     * depend on the split */
    float *cs = malloc(sizeof(float) * (size_t)(n_tok * n_pos * n_rot));
    if (!cs) return LI_E_NOMEM;
    li_rope_params r;
    li_rope_params_init(&r, n_rot, freq_base, freq_scale, NULL);
    int64_t t; /* declared outside the loop: MSVC's OpenMP 2.0 wants it so in C */
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team_size(n_threads)) schedule(static)
#endif
    for (t = 0; t < n_tok; t++) {
        float *ct = cs + t * n_pos * n_rot;
        for (int j = 0; j < n_pos; j++) li_rope_cache(pos + t * n_pos + j, NULL, 1, n_rot, &r, ct + j * n_rot);
        for (int64_t h = 0; h < n_head; h++)
            li_rope_head(x + t * ld + h * head_dim, ct + (h % n_pos) * n_rot, n_rot, mode);
    }
    free(cs);
    return LI_OK;
}

int li_rope(float *x, int64_t n_tok, int64_t n_head, int64_t head_dim, int64_t n_rot,
            const int32_t *pos, float freq_base, float freq_scale, int mode) {
    return li_rope_mt(x, n_tok, n_head * head_dim, n_head, head_dim, n_rot, pos, 1, freq_base, freq_scale, mode, 1);
}
