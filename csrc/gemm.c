/* gemm.c: packing weight rows into panels (gemm.h) and the prefill driver.
 *
 * Packing is plain C over the unpackers of unpack.h: it runs once per group
 * of 8 rows and is then reused by every activation row of the batch, so its
 * cost is a few percent of the products it feeds.
 */
#include <string.h>

#include "common.h"
#include "gemm.h"
#include "kernels/kernels.h"
#include "kernels/unpack.h"
#include "kernels/unpack_iq.h"
#include "matmul.h"

#define R LI_PANEL_ROWS

int li_panel_kind(int type) {
    switch (type) {
    case LI_TYPE_Q4_0: case LI_TYPE_Q4_1: case LI_TYPE_Q5_0: case LI_TYPE_Q5_1: case LI_TYPE_Q8_0:
    case LI_TYPE_IQ4_NL: case LI_TYPE_MXFP4:
        return LI_PANEL_BLK32;
    case LI_TYPE_Q2_K: case LI_TYPE_Q3_K: case LI_TYPE_Q4_K: case LI_TYPE_Q5_K: case LI_TYPE_Q6_K:
    case LI_TYPE_IQ4_XS:
        return LI_PANEL_KSUPER;
    default:
        return LI_PANEL_NONE;
    }
}

/* the panel's arrays, carved from one scratch buffer (each 32-byte aligned
 * when the buffer is) */
static size_t layout(int kind, int64_t k, int sign, int q4k, void *base, li_panel *p) {
    char *at = (char *)base;
    size_t used = 0;
#define TAKE(ptr, type, count)                                     \
    do {                                                           \
        const size_t bytes_ = ((size_t)(count) * sizeof(type) + 31) & ~(size_t)31; \
        if (p) p->ptr = (type *)(void *)(at + used);                \
        used += bytes_;                                            \
    } while (0)
    if (kind == LI_PANEL_BLK32) {
        const int64_t nb = k / 32;
        TAKE(w, uint8_t, nb * 32 * R);
        if (sign) TAKE(wa, uint8_t, nb * 32 * R);
        TAKE(d, float, nb * R);
        TAKE(m, float, nb * R);
    } else {
        const int64_t nb = k / QK_K;
        TAKE(w, uint8_t, nb * QK_K * R);
        TAKE(d, float, nb * R);
        TAKE(m, float, nb * R);
        TAKE(sc, int16_t, nb * 16 * R * 2);
        TAKE(mc, int16_t, nb * 8 * R * 2);
        if (q4k) TAKE(mc32, int16_t, nb * 4 * R * 2);
    }
#undef TAKE
    return used;
}

/* BLK32 types whose values are signed bytes (their magnitudes ride beside them) */
static int panel_signed(int type) {
    return type == LI_TYPE_Q8_0 || type == LI_TYPE_IQ4_NL;
}

/* what a BLK32 type's stored values carry above the value they stand for */
static int panel_offset(int type) {
    switch (type) {
    case LI_TYPE_Q4_0: return 8;
    case LI_TYPE_Q5_0: return 16;
    case LI_TYPE_MXFP4: return LI_MXFP4_OFFSET;
    default: return 0;
    }
}

size_t li_panel_bytes(int type, int64_t k) {
    const int kind = li_panel_kind(type);
    return kind == LI_PANEL_NONE ? 0 : layout(kind, k, panel_signed(type), type == LI_TYPE_Q4_K, NULL, NULL);
}

/* values 4j..4j+3 of a row's block go to chunk j, lane r: scatter n values
 * of row r starting at dst (the block's first chunk), adding `off`. The
 * add runs over the whole run first (the compiler vectorizes it) and each
 * chunk's lane is then one 4-byte store: the packing of a batch's panels
 * is a cost of its own beside the products when the batch is short (a MoE
 * expert's few rows). */
static inline void put_chunks(uint8_t *dst, int r, const int8_t *q, int n, int off) {
    uint8_t u[QK_K];
    for (int i = 0; i < n; i++) u[i] = (uint8_t)(q[i] + off);
    for (int j = 0; j < n / 4; j++) memcpy(dst + ((size_t)j * R + (size_t)r) * 4, u + 4 * j, 4);
}

/* t[0] = lo, t[1] = hi in one store */
static inline void put_pair(int16_t *t, int lo, int hi) {
    const int16_t v[2] = {(int16_t)lo, (int16_t)hi};
    memcpy(t, v, sizeof(v));
}

static void pack_blk32(int type, const void *w, size_t row_bytes, int nr, int64_t nb, li_panel *p) {
    /* a level that writes this type's values with vectors leaves only the scales to this loop */
    const int values_done = li_K->panel_values && li_K->panel_values(type, w, row_bytes, nr, nb, p->w, p->wa);
    if (values_done && (type == LI_TYPE_Q8_0 || type == LI_TYPE_MXFP4)) {
        for (int r = 0; r < nr; r++) {
            const char *row = (const char *)w + (size_t)r * row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                p->d[b * R + r] = type == LI_TYPE_Q8_0 ? li_f16_to_f32(((const block_q8_0 *)row + b)->d)
                                                       : li_e8m0_half(((const block_mxfp4 *)row + b)->e);
                p->m[b * R + r] = 0.0f;
            }
        }
        return;
    }
    int8_t q[32];
    for (int r = 0; r < nr; r++) {
        const char *row = (const char *)w + (size_t)r * row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            float d = 0.0f, m = 0.0f;
            switch (type) {
            case LI_TYPE_Q4_0: {
                const block_q4_0 *x = (const block_q4_0 *)row + b;
                unpack_q4_0(x, q);
                for (int i = 0; i < 32; i++) q[i] = (int8_t)(q[i] + 8); /* 0..15, offset 8 */
                d = li_f16_to_f32(x->d);
                break;
            }
            case LI_TYPE_Q5_0: {
                const block_q5_0 *x = (const block_q5_0 *)row + b;
                unpack_5bit(x->qh, x->qs, q); /* 0..31, offset 16 */
                d = li_f16_to_f32(x->d);
                break;
            }
            case LI_TYPE_Q4_1: {
                const block_q4_1 *x = (const block_q4_1 *)row + b;
                unpack_q4_1(x, q);
                d = li_f16_to_f32(x->d);
                m = li_f16_to_f32(x->m);
                break;
            }
            case LI_TYPE_Q5_1: {
                const block_q5_1 *x = (const block_q5_1 *)row + b;
                unpack_5bit(x->qh, x->qs, q);
                d = li_f16_to_f32(x->d);
                m = li_f16_to_f32(x->m);
                break;
            }
            case LI_TYPE_Q8_0: {
                const block_q8_0 *x = (const block_q8_0 *)row + b;
                memcpy(q, x->qs, 32);
                d = li_f16_to_f32(x->d);
                break;
            }
            case LI_TYPE_IQ4_NL: {
                const block_iq4_nl *x = (const block_iq4_nl *)row + b;
                unpack_nl4(x->qs, li_kvalues_iq4nl, q);
                d = li_f16_to_f32(x->d);
                break;
            }
            default: { /* MXFP4: level + 12, 0..24 */
                const block_mxfp4 *x = (const block_mxfp4 *)row + b;
                unpack_nl4(x->qs, li_kvalues_mxfp4, q);
                for (int i = 0; i < 32; i++) q[i] = (int8_t)(q[i] + LI_MXFP4_OFFSET);
                d = li_e8m0_half(x->e);
                break;
            }
            }
            put_chunks(p->w + (size_t)b * 32 * R, r, q, 32, 0);
            if (p->sign) {
                int8_t a[32];
                for (int i = 0; i < 32; i++) a[i] = (int8_t)(q[i] < 0 ? -q[i] : q[i]);
                put_chunks(p->wa + (size_t)b * 32 * R, r, a, 32, 0);
            }
            p->d[b * R + r] = d;
            p->m[b * R + r] = m;
        }
    }
}

/* The scales of row r's Q4_K super-block s when the values are already in
 * the panel: the 6-bit scales and mins taken apart four at a time in 32-bit
 * words (bytes 0..7 of sm: the 8 sub-blocks' scales, 8..15 their mins), each
 * entry stored whole. The plain path below takes the same numbers. */
static void pack_q4_K_scales(const block_q4_K *x, int64_t s, int r, li_panel *p) {
    uint32_t u[3], w[4];
    memcpy(u, x->scales, sizeof(u));
    w[0] = u[0] & 0x3f3f3f3fu;                                                /* sc 0..3 */
    w[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;           /* sc 4..7 */
    w[2] = u[1] & 0x3f3f3f3fu;                                                /* mn 0..3 */
    w[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;    /* mn 4..7 */
    uint8_t sm[16];
    memcpy(sm, w, sizeof(sm));
    p->d[s * R + r] = li_f16_to_f32(x->d);
    p->m[s * R + r] = li_f16_to_f32(x->dmin);
    int16_t *ts = p->sc + ((size_t)s * 16 * R + (size_t)r) * 2;
    int16_t *tm = p->mc + ((size_t)s * 8 * R + (size_t)r) * 2;
    for (int i = 0; i < 8; i++) { /* sub-block i: groups 2i, 2i + 1 */
        put_pair(ts + (size_t)(2 * i) * R * 2, sm[i], sm[i]);
        put_pair(ts + (size_t)(2 * i + 1) * R * 2, sm[i], sm[i]);
        put_pair(tm + (size_t)i * R * 2, sm[8 + i], sm[8 + i]);
    }
    if (p->mc32) {
        int16_t *t32 = p->mc32 + ((size_t)s * 4 * R + (size_t)r) * 2;
        for (int q2 = 0; q2 < 4; q2++) put_pair(t32 + (size_t)q2 * R * 2, sm[8 + 2 * q2], sm[8 + 2 * q2 + 1]);
    }
}

/* K-quants: value = d * sc_g * u - m * mc_g for group g of 16, u unsigned.
 * Q3_K, Q6_K and IQ4_XS have no min, only an offset (u = q + off): mc_g =
 * off * sc_g, and m = d, unused (the kernels take the offset out in integer) */
static void pack_ksuper(int type, const void *w, size_t row_bytes, int nr, int64_t nb, li_panel *p) {
    /* a level that writes this type's values with vectors leaves only the scales to this loop */
    const int values_done = li_K->panel_values && li_K->panel_values(type, w, row_bytes, nr, nb, p->w, NULL);
    int8_t q[QK_K];
    int sc[16], mn[16];
    for (int r = 0; r < nr; r++) {
        const char *row = (const char *)w + (size_t)r * row_bytes;
        for (int64_t s = 0; s < nb; s++) {
            if (values_done && type == LI_TYPE_Q4_K) {
                pack_q4_K_scales((const block_q4_K *)(const void *)row + s, s, r, p);
                continue;
            }
            float d, m;
            int off = 0; /* u = q + off */
            switch (type) {
            case LI_TYPE_Q2_K: {
                const block_q2_K *x = (const block_q2_K *)row + s;
                unpack_q2_K(x, q, sc, mn);
                d = li_f16_to_f32(x->d);
                m = li_f16_to_f32(x->dmin);
                break;
            }
            case LI_TYPE_Q3_K: {
                const block_q3_K *x = (const block_q3_K *)row + s;
                unpack_q3_K(x, q, sc);
                d = m = li_f16_to_f32(x->d);
                off = 4;
                for (int g = 0; g < 16; g++) mn[g] = 4 * sc[g];
                break;
            }
            case LI_TYPE_IQ4_XS: { /* level + 128, the offset out like Q6_K's; per block of 32 a scale */
                const block_iq4_xs *x = (const block_iq4_xs *)row + s;
                unpack_iq4_xs(x, q);
                d = m = li_f16_to_f32(x->d);
                off = 128;
                for (int g = 0; g < 16; g++) {
                    sc[g] = iq4_xs_scale(x, g / 2);
                    mn[g] = 128 * sc[g];
                }
                break;
            }
            case LI_TYPE_Q6_K: {
                const block_q6_K *x = (const block_q6_K *)row + s;
                if (!values_done) unpack_q6_K(x, q);
                d = m = li_f16_to_f32(x->d);
                off = 32;
                for (int g = 0; g < 16; g++) {
                    sc[g] = x->scales[g];
                    mn[g] = 32 * sc[g];
                }
                break;
            }
            default: { /* Q4_K, Q5_K: 8 groups of 32 */
                int sc8[8], mn8[8];
                if (type == LI_TYPE_Q4_K) {
                    const block_q4_K *x = (const block_q4_K *)row + s;
                    unpack_q4_K(x, q, sc8, mn8);
                    d = li_f16_to_f32(x->d);
                    m = li_f16_to_f32(x->dmin);
                } else {
                    const block_q5_K *x = (const block_q5_K *)row + s;
                    unpack_q5_K(x, q, sc8, mn8);
                    d = li_f16_to_f32(x->d);
                    m = li_f16_to_f32(x->dmin);
                }
                for (int g = 0; g < 16; g++) {
                    sc[g] = sc8[g / 2];
                    mn[g] = mn8[g / 2];
                }
                break;
            }
            }
            if (!values_done) put_chunks(p->w + (size_t)s * QK_K * R, r, q, QK_K, off);
            p->d[s * R + r] = d;
            p->m[s * R + r] = m;
            /* each (row, group) entry is a pair of int16: one 4-byte store */
            int16_t *ts = p->sc + ((size_t)s * 16 * R + (size_t)r) * 2;
            for (int g = 0; g < 16; g++) put_pair(ts + (size_t)g * R * 2, sc[g], sc[g]);
            int16_t *tm = p->mc + ((size_t)s * 8 * R + (size_t)r) * 2;
            for (int pr = 0; pr < 8; pr++) put_pair(tm + (size_t)pr * R * 2, mn[2 * pr], mn[2 * pr + 1]);
            if (p->mc32) { /* groups 4q, 4q + 2 start sub-blocks 2q, 2q + 1 */
                int16_t *t32 = p->mc32 + ((size_t)s * 4 * R + (size_t)r) * 2;
                for (int q2 = 0; q2 < 4; q2++) put_pair(t32 + (size_t)q2 * R * 2, mn[4 * q2], mn[4 * q2 + 2]);
            }
        }
    }
}

void li_panel_pack(int type, const void *w, size_t row_bytes, int nr, int64_t k, void *scratch,
                   li_panel *p) {
    memset(p, 0, sizeof(*p));
    p->kind = li_panel_kind(type);
    p->sign = panel_signed(type);
    p->offset = panel_offset(type);
    p->has_min = type == LI_TYPE_Q4_1 || type == LI_TYPE_Q5_1 || type == LI_TYPE_Q2_K ||
                 type == LI_TYPE_Q4_K || type == LI_TYPE_Q5_K;
    switch (type) {
    case LI_TYPE_Q2_K: p->bits = 2; break;
    case LI_TYPE_Q3_K: p->bits = 3; break;
    case LI_TYPE_Q4_0: case LI_TYPE_Q4_1: case LI_TYPE_Q4_K: p->bits = 4; break;
    case LI_TYPE_Q5_0: case LI_TYPE_Q5_1: case LI_TYPE_Q5_K: case LI_TYPE_MXFP4: p->bits = 5; break;
    case LI_TYPE_Q6_K: p->bits = 6; break;
    default: p->bits = 8; break; /* Q8_0, IQ4_NL: magnitudes up to 127; IQ4_XS: level + 128 */
    }
    const size_t bytes = layout(p->kind, k, p->sign, type == LI_TYPE_Q4_K, scratch, p);
    if (nr < R) memset(scratch, 0, bytes); /* rows past nr: zeros, their results unused */
    if (p->kind == LI_PANEL_BLK32) {
        p->nb = k / 32;
        pack_blk32(type, w, row_bytes, nr, p->nb, p);
    } else {
        p->nb = k / QK_K;
        pack_ksuper(type, w, row_bytes, nr, p->nb, p);
    }
}

/* ---- the driver ---- */

/* Cache blocking. A thread packs up to PANELS_MAX panels (a block of rows)
 * at once, then takes the batch a block of columns at a time, and each
 * column block passes over every panel of the row block while its
 * activations stay in L2. Without it every panel streamed the whole batch's
 * activations (a megabyte for k = 2048 and 512 rows) from beyond L2, and
 * the kernels waited on them. The blocking only reorders which (row, column)
 * outputs are made when: each one is still made whole by one kernel call. */
#define PANELS_MAX 8
#ifndef BLOCK_BYTES
#define BLOCK_BYTES ((size_t)160 * 1024) /* about a third of a Zen 3 / Skylake L2 each */
#endif

/* panels packed at once for a matrix of the type and k */
static int panels_at_once(int type, int64_t k) {
    const size_t pb = li_panel_bytes(type, k);
    const size_t np = pb ? BLOCK_BYTES / pb : 1;
    return (int)LI_MAX(1, LI_MIN(PANELS_MAX, (int64_t)np));
}

size_t li_gemm_scratch_bytes(int type, int64_t k, int64_t n) {
    if (li_panel_kind(type) == LI_PANEL_NONE) return 0;
    return li_panel_bytes(type, k) * (size_t)panels_at_once(type, k) + 64 +
           (size_t)n * (size_t)(k / 32) * sizeof(int32_t);
}

int li_gemm_applies(int type, int64_t n, int64_t rows, int64_t k) {
    const int kind = li_panel_kind(type);
    const int64_t min_n = type == LI_TYPE_MXFP4          ? LI_GEMM_MIN_N_MXFP4
                          : rows * k <= LI_GEMM_SMALL ? LI_GEMM_MIN_N_SMALL
                                                      : LI_GEMM_MIN_N;
    return n >= min_n && kind != LI_PANEL_NONE && li_K->gemm[kind] != NULL;
}

void li_gemm_q(const li_weight *w, const void *xq, int64_t n, float *y, int64_t y_stride,
               void *scratch, int ith, int nth) {
    const int act = li_types[w->type].act_type;
    const size_t xs = li_act_row_bytes(act, w->k);
    const li_gemm_fn kernel = li_K->gemm[li_panel_kind(w->type)];
    const size_t pb = li_panel_bytes(w->type, w->k);
    const int np_max = panels_at_once(w->type, w->k);
    char *base = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int32_t *asum = (int32_t *)(void *)(base + pb * (size_t)np_max);
    const int64_t nb32 = w->k / 32;
    if (w->type == LI_TYPE_Q4_K) {
        /* the sums of each 32 activation values, paired as the panel's mc32 pairs the mins */
        for (int64_t c = 0; c < n; c++) {
            const act_q8_K *a = (const act_q8_K *)(const void *)((const char *)xq + (size_t)c * xs);
            for (int64_t s = 0; s < w->k / QK_K; s++)
                for (int q2 = 0; q2 < 4; q2++) {
                    const int16_t *bs = a[s].bsums + 4 * q2;
                    const uint16_t lo = (uint16_t)(bs[0] + bs[1]), hi = (uint16_t)(bs[2] + bs[3]);
                    asum[c * nb32 + s * 8 + q2] = (int32_t)((uint32_t)lo | (uint32_t)hi << 16);
                }
        }
    } else if (act == LI_ACT_Q8_0) {
        /* each thread sums the activation blocks it will need: all of them */
        for (int64_t c = 0; c < n; c++) {
            const act_q8_0 *a = (const act_q8_0 *)(const void *)((const char *)xq + (size_t)c * xs);
            for (int64_t b = 0; b < nb32; b++) {
                int32_t s = 0;
                for (int i = 0; i < 32; i++) s += a[b].qs[i];
                asum[c * nb32 + b] = s;
            }
        }
    }
    /* columns per block: a multiple of 4 (the kernels' column group) whose
     * activations fill about BLOCK_BYTES */
    const int64_t nc_blk = LI_MAX(4, (int64_t)(BLOCK_BYTES / xs) / 4 * 4);
    int64_t lo, hi;
    li_split(w->rows, ith, nth, &lo, &hi);
    li_panel p[PANELS_MAX];
    for (int64_t rb = lo; rb < hi; rb += (int64_t)np_max * R) {
        int np = 0;
        for (int64_t r0 = rb; r0 < hi && np < np_max; r0 += R, np++)
            li_panel_pack(w->type, (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes,
                          (int)LI_MIN(R, hi - r0), w->k, base + pb * (size_t)np, &p[np]);
        for (int64_t c0 = 0; c0 < n; c0 += nc_blk) {
            const int64_t nc = LI_MIN(nc_blk, n - c0);
            for (int i = 0; i < np; i++) {
                const int64_t r0 = rb + (int64_t)i * R;
                kernel(&p[i], (int)LI_MIN(R, hi - r0), (const char *)xq + (size_t)c0 * xs, xs, nc,
                       asum + c0 * nb32, y + c0 * y_stride + r0, (size_t)y_stride);
            }
        }
    }
}
