/* sgemm.c: float products over weight panels packed once (sgemm.h), and
 * the full (non-causal) attention of one sequence built on them: the dense
 * path of the vision encoder, whose products are [4096 x 1152] by
 * [1152 x 1152 / 4304], compute-bound.
 *
 * li_gemm cuts C into units of MB_STRIPS strips of rows x a block of at most
 * NB_PANELS panels, handed to the team one at a time (dynamic: a slow core
 * takes fewer). A unit walks k in blocks of KC: the block of its A rows is
 * packed into strips ([kk][MR], in L2), then each panel's KC values (in L1)
 * meet every strip through the level's register tile, accumulating in a
 * unit-sized buffer that the last block adds the bias (and a residual) to on
 * the way out. An element's bits depend on its row, its column and KC
 * alone, not on the units (whose number is fitted to the team), so they are
 * the same at any thread count, and, the tiles agreeing to the bit, at every
 * level.
 *
 * li_attention_full packs each head's keys and values into strips once,
 * then takes units of (head, NR queries): their scores through the tile
 * (keys down, queries across: q scaled first), the softmax's exponentials
 * in place down each column (the level's softmax_panel), and the values
 * times them through the tile over key blocks of KC; each query's row is
 * divided by its sum at the end.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/kernels.h"
#include "llminfer.h"
#include "sgemm.h"
#include "util.h"

#define MR LI_SGEMM_MR
#define NR LI_SGEMM_NR
#define KC 256          /* values of k per block: a panel's block (16 KiB as F32) stays in L1 */
/* A unit packs its rows' block of A once per block of k and takes it past
 * up to NB_PANELS panels: the packing (a scalar copy) is 1/NB_PANELS of the
 * tile work per element of A, and the unit's C (MB_STRIPS*MR x NB_PANELS*NR
 * floats, 324 KiB) is met one tile at a time. NB_PANELS is the vision
 * tower's width (1152 = 72 panels): its square products take each row
 * block's A once, with no narrow remainder block whose packing costs as
 * much as a full one's. */
#define MB_STRIPS 12    /* strips of MR rows per unit: 72 rows, their block of A 72 KiB */
#define NB_PANELS 72    /* panels per unit: 1152 columns */

struct li_gemm_weight {
    int elem;       /* enum li_sgemm_elem */
    int64_t rows, k;
    int64_t panels; /* ceil(rows / NR) */
    void *p;        /* [panels][k][NR] of float or F16 bits */
};

static int team_size(int n_threads) { return n_threads <= 0 ? li_max_threads() : n_threads; }

static size_t elem_bytes(int elem) { return elem == LI_SGEMM_F16 ? 2 : 4; }

size_t li_gemm_weight_bytes(const li_gemm_weight *w) {
    return w ? (size_t)w->panels * (size_t)w->k * NR * elem_bytes(w->elem) : 0;
}

void li_gemm_weight_free(li_gemm_weight *w) {
    if (!w) return;
    li_free_aligned(w->p);
    free(w);
}

/* panel pi of w from the stored rows (row_bytes apart); tmp: k floats */
static void pack_panel(li_gemm_weight *w, int type, const char *src, size_t row_bytes, int64_t pi, float *tmp) {
    const int64_t k = w->k, r0 = pi * NR;
    if (w->elem == LI_SGEMM_F16) {
        uint16_t *dst = (uint16_t *)w->p + (size_t)pi * (size_t)k * NR;
        for (int c = 0; c < NR; c++) {
            const int64_t row = r0 + c;
            if (row >= w->rows) {
                for (int64_t kk = 0; kk < k; kk++) dst[kk * NR + c] = 0;
                continue;
            }
            const uint16_t *s = (const uint16_t *)(src + (size_t)row * row_bytes);
            for (int64_t kk = 0; kk < k; kk++) dst[kk * NR + c] = s[kk];
        }
        return;
    }
    float *dst = (float *)w->p + (size_t)pi * (size_t)k * NR;
    for (int c = 0; c < NR; c++) {
        const int64_t row = r0 + c;
        if (row >= w->rows) {
            for (int64_t kk = 0; kk < k; kk++) dst[kk * NR + c] = 0.0f;
            continue;
        }
        li_K->dequant[type](src + (size_t)row * row_bytes, tmp, k);
        for (int64_t kk = 0; kk < k; kk++) dst[kk * NR + c] = tmp[kk];
    }
}

int li_gemm_weight_create(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, int f32_panels,
                          int n_threads, li_gemm_weight **out) {
    li_init();
    if (!out) return li_fail(LI_E_ARG, "no place for the result");
    *out = NULL;
    if (!w || rows <= 0 || k <= 0)
        return li_fail(LI_E_ARG, "no weights, or rows %lld / k %lld not positive", (long long)rows, (long long)k);
    if (li_type_sizes(type, NULL, NULL) != LI_OK || !li_K->dequant[type])
        return li_fail(LI_E_TYPE, "type %d has no dequantizer", type);
    const size_t row = li_row_bytes(type, k);
    if (row == 0 || w_bytes != row * (size_t)rows)
        return li_fail(LI_E_SHAPE, "%zu bytes of weights for [%lld, %lld]", w_bytes, (long long)rows, (long long)k);
    li_gemm_weight *m = calloc(1, sizeof(*m));
    if (!m) return li_fail(LI_E_NOMEM, "gemm weight");
    m->elem = type == LI_TYPE_F16 && !f32_panels ? LI_SGEMM_F16 : LI_SGEMM_F32;
    m->rows = rows;
    m->k = k;
    m->panels = (rows + NR - 1) / NR;
    /* 4 KiB pages: advised huge pages can make each fault wait on the
     * kernel's compaction, and the tiles read a panel 8-16 KiB at a time */
    m->p = li_alloc_aligned(li_gemm_weight_bytes(m), 64);
    if (!m->p) {
        const size_t bytes = li_gemm_weight_bytes(m);
        free(m);
        return li_fail(LI_E_NOMEM, "%zu bytes of panels", bytes);
    }
    int failed = 0;
    const int64_t np = m->panels;
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(LI_MAX(1, LI_MIN(team_size(n_threads), (int)LI_MIN(np, 1024))))
#endif
    {
        float *tmp = malloc((size_t)k * sizeof(float));
        if (!tmp) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
        int64_t pi;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 4)
#endif
        for (pi = 0; pi < np; pi++)
            if (tmp) pack_panel(m, type, (const char *)w, row, pi, tmp);
        free(tmp);
    }
    if (failed) {
        li_gemm_weight_free(m);
        return li_fail(LI_E_NOMEM, "packing scratch");
    }
    *out = m;
    return LI_OK;
}

/* rows [r0, r0 + ns*MR) of x (rows past r1 zero), values [kb, kb + kc),
 * into strips ap[s][kk][MR]; x rows x_ld floats apart, scaled by `scale` */
static void pack_strips(const float *x, size_t x_ld, int64_t r0, int64_t r1, int64_t ns, int64_t kb, int64_t kc,
                        float scale, float *ap) {
    for (int64_t s = 0; s < ns; s++) {
        float *dst = ap + (size_t)s * (size_t)kc * MR;
        for (int r = 0; r < MR; r++) {
            const int64_t row = r0 + s * MR + r;
            if (row >= r1) {
                for (int64_t kk = 0; kk < kc; kk++) dst[kk * MR + r] = 0.0f;
                continue;
            }
            const float *src = x + (size_t)row * x_ld + kb;
            if (scale == 1.0f)
                for (int64_t kk = 0; kk < kc; kk++) dst[kk * MR + r] = src[kk];
            else
                for (int64_t kk = 0; kk < kc; kk++) dst[kk * MR + r] = src[kk] * scale;
        }
    }
}

/* one unit of li_gemm: rows [r0, r1), panels [p0, p1) */
static void gemm_unit(const li_gemm_weight *w, const float *x, int64_t r0, int64_t r1, int64_t p0, int64_t p1,
                      const float *bias, const float *res, float *y, float *ap, float *cs) {
    const li_sgemm_tile_fn tile = li_K->sgemm_tile[w->elem];
    const int64_t k = w->k, ns = (r1 - r0 + MR - 1) / MR;
    const size_t ldc = (size_t)(p1 - p0) * NR, eb = elem_bytes(w->elem);
    for (int64_t kb = 0; kb < k; kb += KC) {
        const int64_t kc = LI_MIN(KC, k - kb);
        pack_strips(x, (size_t)k, r0, r1, ns, kb, kc, 1.0f, ap);
        for (int64_t p = p0; p < p1; p++) {
            const char *b = (const char *)w->p + ((size_t)p * (size_t)k + (size_t)kb) * NR * eb;
            for (int64_t s = 0; s < ns; s++)
                tile(kc, ap + (size_t)s * (size_t)kc * MR, b, cs + (size_t)s * MR * ldc + (size_t)(p - p0) * NR, ldc,
                     kb > 0);
        }
    }
    const int64_t c0 = p0 * NR, c1 = LI_MIN(w->rows, p1 * NR);
    for (int64_t row = r0; row < r1; row++) {
        const float *src = cs + (size_t)(row - r0) * ldc;
        float *dst = y + (size_t)row * (size_t)w->rows;
        const float *rr = res ? res + (size_t)row * (size_t)w->rows : NULL;
        for (int64_t c = c0; c < c1; c++) {
            float v = src[c - c0];
            if (bias) v += bias[c];
            if (rr) v += rr[c];
            dst[c] = v;
        }
    }
}

int li_gemm(const li_gemm_weight *w, const float *x, int64_t m, const float *bias, const float *res, float *y,
            int n_threads) {
    li_init();
    if (!w || !x || !y || m < 0) return li_fail(LI_E_ARG, "gemm: a null argument or m < 0");
    if (m == 0) return LI_OK;
    /* the fewest blocks of at most NB_PANELS panels, all of one size but the
     * last: 72 panels are one block, 269 three of 68 and one of 65 */
    const int64_t nnb = (w->panels + NB_PANELS - 1) / NB_PANELS, per = (w->panels + nnb - 1) / nnb;
    /* row blocks of at most MB_STRIPS strips, one or a few more of them where
     * that makes the units a whole number per thread (4096 rows: 58 blocks of
     * 11 or 12 strips for two threads, not 57 of 12, whose last round leaves
     * one thread idle for a whole unit) */
    const int64_t strips = (m + MR - 1) / MR, team = team_size(n_threads);
    int64_t nmb = (strips + MB_STRIPS - 1) / MB_STRIPS;
    for (int64_t more = nmb; more < nmb + team && more <= strips; more++)
        if ((more * nnb) % team == 0) {
            nmb = more;
            break;
        }
    const int64_t units = nmb * nnb;
    const int nt = (int)LI_MAX(1, LI_MIN(team, units));
    const size_t ap_n = (size_t)MB_STRIPS * MR * KC, cs_n = (size_t)MB_STRIPS * MR * (size_t)per * NR;
    float *scratch = li_alloc_aligned((ap_n + cs_n) * sizeof(float) * (size_t)nt, 64);
    if (!scratch) return li_fail(LI_E_NOMEM, "gemm scratch");
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        float *ap = scratch + (ap_n + cs_n) * (size_t)li_thread_index(), *cs = ap + ap_n;
        int64_t u;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (u = 0; u < units; u++) {
            const int64_t mb = u / nnb, nb = u % nnb;
            const int64_t s0 = mb * strips / nmb, s1 = (mb + 1) * strips / nmb;
            gemm_unit(w, x, s0 * MR, LI_MIN(m, s1 * MR), nb * per, LI_MIN(w->panels, (nb + 1) * per), bias, res, y,
                      ap, cs);
        }
    }
    li_free_aligned(scratch);
    return LI_OK;
}

/* ---- full attention ---- */

/* Scores and outputs are computed transposed, queries across: s^T = K q^T
 * takes key strips as its A side and a panel of NR scaled queries as its B
 * side, so the scores land keys down, queries across -- a panel of
 * exponentials for o^T = V^T p^T, whose A side is the head's value
 * dimensions in strips. The softmax runs down the panel's columns, lane by
 * lane (softmax_panel), and nothing is transposed but each unit's NR output
 * rows on the way out. */
typedef struct {
    const float *q;
    size_t ld;
    int64_t n, d, nks, nvs;
    float scale;
    const float *ks; /* [head][nks][d][MR]: keys in strips of MR */
    const float *vs; /* [head][nvs][n][MR]: value dimensions in strips of MR, keys down */
    float *out;
    size_t out_ld;
} attn_job;

/* queries [i0, i1) (at most NR) of head h; qp: d x NR, p: nks*MR x NR, o:
 * nvs*MR x NR, sum: NR */
static void attn_unit(const attn_job *j, int64_t h, int64_t i0, int64_t i1, float *qp, float *p, float *o,
                      float *sum) {
    const li_sgemm_tile_fn tile = li_K->sgemm_tile[LI_SGEMM_F32];
    const int64_t n = j->n, d = j->d;
    for (int c = 0; c < NR; c++) {
        const int64_t i = i0 + c;
        if (i >= i1) {
            for (int64_t kk = 0; kk < d; kk++) qp[kk * NR + c] = 0.0f;
            continue;
        }
        const float *src = j->q + (size_t)i * j->ld + h * d;
        for (int64_t kk = 0; kk < d; kk++) qp[kk * NR + c] = src[kk] * j->scale;
    }
    const float *ks = j->ks + (size_t)h * (size_t)j->nks * (size_t)d * MR;
    for (int64_t s = 0; s < j->nks; s++)
        tile(d, ks + (size_t)s * (size_t)d * MR, qp, p + (size_t)s * MR * NR, NR, 0);
    li_K->softmax_panel(p, n, sum);
    const float *vs = j->vs + (size_t)h * (size_t)j->nvs * (size_t)n * MR;
    for (int64_t kb = 0; kb < n; kb += KC) {
        const int64_t kc = LI_MIN(KC, n - kb);
        for (int64_t s = 0; s < j->nvs; s++)
            tile(kc, vs + ((size_t)s * (size_t)n + (size_t)kb) * MR, p + (size_t)kb * NR, o + (size_t)s * MR * NR, NR,
                 kb > 0);
    }
    for (int64_t c = 0; c < i1 - i0; c++) {
        const float inv = 1.0f / sum[c];
        float *dst = j->out + (size_t)(i0 + c) * j->out_ld + h * d;
        for (int64_t e = 0; e < d; e++) dst[e] = o[e * NR + c] * inv;
    }
}

/* the floats li_attention_full's packed keys and values take, and those
 * one thread's unit takes */
static void attn_sizes(int64_t n, int n_head, int64_t d, size_t *packed, size_t *per_thread) {
    const int64_t nks = (n + MR - 1) / MR, nvs = (d + MR - 1) / MR;
    *packed = (size_t)n_head * ((size_t)nks * (size_t)d + (size_t)nvs * (size_t)n) * MR;
    *per_thread = (size_t)d * NR + (size_t)nks * MR * NR + (size_t)nvs * MR * NR + NR;
}

static int attn_team(int64_t n, int n_head, int n_threads) {
    const int64_t units = (int64_t)n_head * ((n + NR - 1) / NR);
    return (int)LI_MAX(1, LI_MIN((int64_t)team_size(n_threads), units));
}

size_t li_attention_full_scratch(int64_t n, int n_head, int64_t d, int n_threads) {
    if (n <= 0 || n_head <= 0 || d <= 0) return 0;
    size_t packed, per;
    attn_sizes(n, n_head, d, &packed, &per);
    return (packed + per * (size_t)attn_team(n, n_head, n_threads)) * sizeof(float) + 64;
}

int li_attention_full(const float *q, const float *k, const float *v, size_t ld, int64_t n, int n_head, int64_t d,
                      float scale, float *out, size_t out_ld, void *scratch, size_t scratch_bytes, int n_threads) {
    li_init();
    if (!q || !k || !v || !out || n <= 0 || n_head <= 0 || d <= 0)
        return li_fail(LI_E_ARG, "attention: a null argument or a size not positive");
    if (ld < (size_t)n_head * (size_t)d || out_ld < (size_t)n_head * (size_t)d)
        return li_fail(LI_E_SHAPE, "attention: rows of %zu / %zu floats hold fewer than %d heads of %lld", ld, out_ld,
                       n_head, (long long)d);
    const int64_t nks = (n + MR - 1) / MR, nvs = (d + MR - 1) / MR;
    const size_t ks_n = (size_t)n_head * (size_t)nks * (size_t)d * MR;
    const int64_t nqb = (n + NR - 1) / NR, units = (int64_t)n_head * nqb;
    const int nt = attn_team(n, n_head, n_threads);
    const size_t qp_n = (size_t)d * NR, p_n = (size_t)nks * MR * NR, o_n = (size_t)nvs * MR * NR;
    size_t packed_n, per;
    attn_sizes(n, n_head, d, &packed_n, &per);
    const size_t need = li_attention_full_scratch(n, n_head, d, n_threads);
    void *own = NULL;
    if (scratch && scratch_bytes < need)
        return li_fail(LI_E_SHAPE, "attention: %zu bytes of scratch, %zu needed", scratch_bytes, need);
    if (!scratch && !(scratch = own = li_alloc_aligned(need, 64))) return li_fail(LI_E_NOMEM, "attention scratch");
    /* the caller's scratch rounded up to a 64-byte line */
    float *packed = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *per_thread = packed + packed_n;
    const attn_job job = {q, ld, n, d, nks, nvs, scale, packed, packed + ks_n, out, out_ld};
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        int64_t u;
        /* key strips: row r of strip s is key s*MR + r (zero past n) */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (u = 0; u < (int64_t)n_head * nks; u++) {
            const int64_t h = u / nks, s = u % nks;
            pack_strips(k + h * d, ld, s * MR, n, 1, 0, d, 1.0f, packed + (size_t)u * (size_t)d * MR);
        }
        /* value strips: column r of strip s is the head's value dimension s*MR + r (zero past d) */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (u = 0; u < (int64_t)n_head * nvs; u++) {
            const int64_t h = u / nvs, s = u % nvs, r1 = LI_MIN(MR, d - s * MR);
            float *dst = packed + ks_n + (size_t)u * (size_t)n * MR;
            for (int64_t key = 0; key < n; key++) {
                const float *src = v + (size_t)key * ld + h * d + s * MR;
                int64_t r = 0;
                for (; r < r1; r++) dst[key * MR + r] = src[r];
                for (; r < MR; r++) dst[key * MR + r] = 0.0f;
            }
        }
        float *qp = per_thread + per * (size_t)li_thread_index(), *p = qp + qp_n, *o = p + p_n, *sum = o + o_n;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (u = 0; u < units; u++) {
            const int64_t h = u / nqb, i0 = (u % nqb) * NR;
            attn_unit(&job, h, i0, LI_MIN(n, i0 + NR), qp, p, o, sum);
        }
    }
    li_free_aligned(own);
    return LI_OK;
}
