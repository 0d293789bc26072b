/* scalar_iq.c: the reference kernels of the non-linear, grid, ternary and
 * MXFP4 types (IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), in plain C loops over unpack_iq.h. Like
 * scalar.c they are the specification the SIMD levels are tested against,
 * and are built with -ffp-contract=off: dequantization repeats gguf's numpy
 * float operations in its order, so results are bit-identical to it.
 *
 * Dot products (every level computes these to the bit; see scalar.c):
 *   IQ4_NL, MXFP4 x Q8_0    per 32: acc = fmaf(isum, d * dx, acc)
 *   the rest x Q8_K         per 256: acc = fmaf(isum, d * dx * F, acc), with
 *                           isum = sum over groups g of 16 of sc[g] * sum(q * qx)
 * where for the grid types sc = 2s + 1 and F = 1/8 (IQ2_*, IQ1_*, whose
 * values are 8 * grid +- 1), 1/4 (IQ3_XXS) or 1 (IQ3_S), for TQ1_0 and
 * TQ2_0 sc = 1, F = 1, and for IQ4_XS sc = ls - 32 of the group's block of
 * 32, F = 1. MXFP4 takes Q8_0 activations (not Q8_K as in ggml) so that it
 * shares the 32-value prefill panels of Q8_0 (gemm.c); its per-block scale
 * is a power of two. IQ4_XS takes Q8_K, as in ggml: a super-block's sum is
 * then one integer, with no float step per block of 32 (x86_avx512_x16.c).
 */
#include <math.h>

#include "../common.h"
#include "kernels.h"
#include "unpack_iq.h"

static int32_t idot(const int8_t *a, const int8_t *b, int n) {
    int32_t s = 0;
    for (int j = 0; j < n; j++) s += (int32_t)a[j] * b[j];
    return s;
}

/* ---- 32-value blocks against Q8_0 ---- */

static void dequant_iq4_nl(const void *src, float *y, int64_t k) {
    const block_iq4_nl *b = (const block_iq4_nl *)src;
    int8_t q[32];
    for (int64_t i = 0; i < k / 32; i++, y += 32) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_nl4(b[i].qs, li_kvalues_iq4nl, q);
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
    }
}

static void dot_iq4_nl(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_iq4_nl *b = (const block_iq4_nl *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[32];
    for (int64_t i = 0; i < k / 32; i++) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_nl4(b[i].qs, li_kvalues_iq4nl, q);
        for (int c = 0; c < nc; c++) {
            const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i;
            acc[c] = fmaf((float)idot(q, a->qs, 32), d * a->d, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dequant_mxfp4(const void *src, float *y, int64_t k) {
    const block_mxfp4 *b = (const block_mxfp4 *)src;
    int8_t q[32];
    for (int64_t i = 0; i < k / 32; i++, y += 32) {
        const float d = li_e8m0_half(b[i].e);
        unpack_nl4(b[i].qs, li_kvalues_mxfp4, q);
        for (int j = 0; j < 32; j++) y[j] = d * (float)q[j];
    }
}

static void dot_mxfp4(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_mxfp4 *b = (const block_mxfp4 *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[32];
    for (int64_t i = 0; i < k / 32; i++) {
        const float d = li_e8m0_half(b[i].e);
        unpack_nl4(b[i].qs, li_kvalues_mxfp4, q);
        for (int c = 0; c < nc; c++) {
            const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i;
            acc[c] = fmaf((float)idot(q, a->qs, 32), d * a->d, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dequant_iq4_xs(const void *src, float *y, int64_t k) {
    const block_iq4_xs *b = (const block_iq4_xs *)src;
    int8_t q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_iq4_xs(&b[i], q);
        for (int g = 0; g < 8; g++) {
            const float dl = d * (float)iq4_xs_scale(&b[i], g);
            for (int j = 0; j < 32; j++) y[32 * g + j] = dl * (float)q[32 * g + j];
        }
    }
}

/* ---- super-blocks of 256 against Q8_K ---- */

/* acc + d * dx * f * sum over groups of 16 of sc[g] * sum(q * qx) */
static float grid_block_dot(const int8_t q[QK_K], const int sc[16], float d, float f, const act_q8_K *a,
                            float acc) {
    int32_t isum = 0;
    for (int g = 0; g < 16; g++) isum += sc[g] * idot(q + 16 * g, a->qs + 16 * g, 16);
    return fmaf((float)isum, d * a->d * f, acc);
}

static void dot_iq4_xs(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_iq4_xs *b = (const block_iq4_xs *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK_K];
    int sc[16];
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_iq4_xs(&b[i], q);
        for (int g = 0; g < 16; g++) sc[g] = iq4_xs_scale(&b[i], g / 2);
        for (int c = 0; c < nc; c++) acc[c] = grid_block_dot(q, sc, d, 1.0f, ACT_ROW(act_q8_K, x, c, xs) + i, acc[c]);
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dequant_tq1_0(const void *src, float *y, int64_t k) {
    const block_tq1_0 *b = (const block_tq1_0 *)src;
    int8_t q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_tq1_0(&b[i], q);
        for (int j = 0; j < QK_K; j++) y[j] = d * (float)q[j];
    }
}

static void dequant_tq2_0(const void *src, float *y, int64_t k) {
    const block_tq2_0 *b = (const block_tq2_0 *)src;
    int8_t q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_tq2_0(&b[i], q);
        for (int j = 0; j < QK_K; j++) y[j] = d * (float)q[j];
    }
}

static const int ones16[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

#define TERNARY_DOT(name)                                                                         \
    static void dot_##name(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) { \
        const block_##name *b = (const block_##name *)w;                                          \
        float acc[LI_DOT_MAX_NC] = {0};                                                           \
        int8_t q[QK_K];                                                                           \
        for (int64_t i = 0; i < k / QK_K; i++) {                                                  \
            const float d = li_f16_to_f32(b[i].d);                                                \
            unpack_##name(&b[i], q);                                                              \
            for (int c = 0; c < nc; c++)                                                          \
                acc[c] = grid_block_dot(q, ones16, d, 1.0f, ACT_ROW(act_q8_K, x, c, xs) + i, acc[c]); \
        }                                                                                         \
        for (int c = 0; c < nc; c++) s[c] = acc[c];                                               \
    }
TERNARY_DOT(tq1_0)
TERNARY_DOT(tq2_0)
#undef TERNARY_DOT

/* The grid types: dequantization scales (gguf's float expressions, in its
 * order) and the dot product's integer scales and factor. */
LI_INLINE float group_scale(int type, float d, int s) {
    switch (type) {
    case LI_TYPE_IQ2_XXS: case LI_TYPE_IQ2_XS: case LI_TYPE_IQ2_S:
        return d * (0.5f + (float)s) * 0.25f;
    case LI_TYPE_IQ3_XXS: return d * (0.5f + (float)s) * 0.5f;
    default: return d * (float)(2 * s + 1); /* IQ3_S; IQ1_S, IQ1_M (times grid +- 1/8) */
    }
}

LI_INLINE float grid_factor(int type) {
    switch (type) {
    case LI_TYPE_IQ3_XXS: return 0.25f;
    case LI_TYPE_IQ3_S: return 1.0f;
    default: return 0.125f;
    }
}

LI_INLINE int is_iq1(int type) { return type == LI_TYPE_IQ1_S || type == LI_TYPE_IQ1_M; }

/* block i of a row of `type` as q[256], raw scales s[16] and d */
LI_INLINE float grid_unpack(int type, const void *row, int64_t i, int8_t q[QK_K], int s[16]) {
    switch (type) {
    case LI_TYPE_IQ2_XXS: {
        const block_iq2_xxs *b = (const block_iq2_xxs *)row + i;
        unpack_iq2_xxs(b, q, s);
        return li_f16_to_f32(b->d);
    }
    case LI_TYPE_IQ2_XS: {
        const block_iq2_xs *b = (const block_iq2_xs *)row + i;
        unpack_iq2_xs(b, q, s);
        return li_f16_to_f32(b->d);
    }
    case LI_TYPE_IQ2_S: {
        const block_iq2_s *b = (const block_iq2_s *)row + i;
        unpack_iq2_s(b, q, s);
        return li_f16_to_f32(b->d);
    }
    case LI_TYPE_IQ3_XXS: {
        const block_iq3_xxs *b = (const block_iq3_xxs *)row + i;
        unpack_iq3_xxs(b, q, s);
        return li_f16_to_f32(b->d);
    }
    case LI_TYPE_IQ3_S: {
        const block_iq3_s *b = (const block_iq3_s *)row + i;
        unpack_iq3_s(b, q, s);
        return li_f16_to_f32(b->d);
    }
    case LI_TYPE_IQ1_S: {
        const block_iq1_s *b = (const block_iq1_s *)row + i;
        unpack_iq1_s(b, q, s);
        return li_f16_to_f32(b->d);
    }
    default: { /* IQ1_M */
        const block_iq1_m *b = (const block_iq1_m *)row + i;
        unpack_iq1_m(b, q, s);
        return li_f16_to_f32(iq1_m_d(b));
    }
    }
}

LI_INLINE void grid_dequant(int type, const void *src, float *y, int64_t k) {
    int8_t q[QK_K];
    int s[16];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = grid_unpack(type, src, i, q, s);
        for (int g = 0; g < 16; g++) {
            const float dl = group_scale(type, d, s[g]);
            if (is_iq1(type))
                for (int j = 0; j < 16; j++) y[16 * g + j] = dl * ((float)q[16 * g + j] * 0.125f);
            else
                for (int j = 0; j < 16; j++) y[16 * g + j] = dl * (float)q[16 * g + j];
        }
    }
}

LI_INLINE void grid_dot(int type, int64_t k, const void *w, const void *x, size_t xs, int nc, float *out) {
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK_K];
    int s[16], sc[16];
    const float f = grid_factor(type);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = grid_unpack(type, w, i, q, s);
        for (int g = 0; g < 16; g++) sc[g] = 2 * s[g] + 1;
        for (int c = 0; c < nc; c++) acc[c] = grid_block_dot(q, sc, d, f, ACT_ROW(act_q8_K, x, c, xs) + i, acc[c]);
    }
    for (int c = 0; c < nc; c++) out[c] = acc[c];
}

#define GRID_ENTRIES(name, T)                                                                      \
    static void dequant_##name(const void *src, float *y, int64_t k) { grid_dequant(LI_TYPE_##T, src, y, k); } \
    static void dot_##name(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) { \
        grid_dot(LI_TYPE_##T, k, w, x, xs, nc, s);                                                 \
    }
GRID_ENTRIES(iq2_xxs, IQ2_XXS)
GRID_ENTRIES(iq2_xs, IQ2_XS)
GRID_ENTRIES(iq2_s, IQ2_S)
GRID_ENTRIES(iq3_xxs, IQ3_XXS)
GRID_ENTRIES(iq3_s, IQ3_S)
GRID_ENTRIES(iq1_s, IQ1_S)
GRID_ENTRIES(iq1_m, IQ1_M)
#undef GRID_ENTRIES

void li_kernels_fill_scalar_iq(li_kernels *t) {
#define SET(T, name)                             \
    t->dequant[LI_TYPE_##T] = dequant_##name;    \
    t->dot[LI_TYPE_##T] = dot_##name;
    SET(IQ4_NL, iq4_nl) SET(IQ4_XS, iq4_xs) SET(MXFP4, mxfp4) SET(TQ1_0, tq1_0) SET(TQ2_0, tq2_0);
    SET(IQ2_XXS, iq2_xxs) SET(IQ2_XS, iq2_xs) SET(IQ2_S, iq2_s) SET(IQ3_XXS, iq3_xxs) SET(IQ3_S, iq3_s);
    SET(IQ1_S, iq1_s) SET(IQ1_M, iq1_m);
#undef SET
}
