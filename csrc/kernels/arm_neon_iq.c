/* arm_neon_iq.c: NEON dot products of the non-linear, grid, ternary and
 * MXFP4 types (scalar_iq.c is their specification), for aarch64's baseline
 * Advanced SIMD: no flags needed. li_kernels_fill_neon calls
 * li_kernels_fill_neon_iq, so the dot-product level inherits them.
 * Dequantization stays the scalar file's, but for IQ4_NL's and MXFP4's: a
 * table lookup and one multiply per value, d * level as scalar_iq.c's.
 *
 * IQ4_NL's and MXFP4's dot products live in arm_neon_quants.h with Q4_0's,
 * so that the dot-product level takes them over SDOT.
 *
 * Every block is turned into signed bytes (a table lookup, vqtbl1q, for
 * IQ4_XS's 4-bit levels, against Q8_K activations; grid rows of 8 or 4
 * bytes times sign bytes of +-1 for the grid types; 8 * grid +- 1 for IQ1_S/IQ1_M; t - 1 for
 * the ternary types), multiplied with the activations in int16 (vmull_s8)
 * and summed into int32 lanes; group scales multiply the int32 partial sums.
 * All integer sums are exact, and the float steps are scalar_iq.c's, so the
 * results are its own to the bit.
 */
#include "kernels.h"

#if defined(LI_ARCH_ARM64) && !defined(__ARM_BIG_ENDIAN)
#include <arm_neon.h>
#include <math.h>

#include "../common.h"
#include "unpack_iq.h"

/* acc + the products a[j] * b[j] pairwise in int32 lanes; |a|, |b| <= 127
 * (or |a| <= 62 against b = -128), so each int16 pair sum fits */
LI_INLINE int32x4_t idot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
    const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b);
    return vpadalq_s16(acc, p);
}

/* ---- IQ4_NL, MXFP4: their dot products are arm_neon_quants.h's (both levels) ---- */

LI_INLINE void nl4_values(const uint8_t *qs, int8x16_t table, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vqtbl1q_s8(table, vandq_u8(v, vdupq_n_u8(15)));
    *hi = vqtbl1q_s8(table, vshrq_n_u8(v, 4));
}

/* y = d * level, 32 values a block */
LI_INLINE void nl4_dequant(const int type, const void *src, float *y, int64_t k) {
    const int8x16_t table = vld1q_s8(type == LI_TYPE_MXFP4 ? li_kvalues_mxfp4 : li_kvalues_iq4nl);
    for (int64_t i = 0; i < k / 32; i++, y += 32) {
        int8x16_t v[2];
        float d;
        if (type == LI_TYPE_IQ4_NL) {
            const block_iq4_nl *b = (const block_iq4_nl *)src + i;
            nl4_values(b->qs, table, &v[0], &v[1]);
            d = li_f16_to_f32(b->d);
        } else {
            const block_mxfp4 *b = (const block_mxfp4 *)src + i;
            nl4_values(b->qs, table, &v[0], &v[1]);
            d = li_e8m0_half(b->e);
        }
        for (int h = 0; h < 2; h++) {
            const int16x8_t w[2] = {vmovl_s8(vget_low_s8(v[h])), vmovl_high_s8(v[h])};
            for (int j = 0; j < 4; j++) {
                const int32x4_t q = j % 2 ? vmovl_high_s16(w[j / 2]) : vmovl_s16(vget_low_s16(w[j / 2]));
                vst1q_f32(y + 16 * h + 4 * j, vmulq_n_f32(vcvtq_f32_s32(q), d));
            }
        }
    }
}

static void dequant_iq4_nl(const void *src, float *y, int64_t k) { nl4_dequant(LI_TYPE_IQ4_NL, src, y, k); }
static void dequant_mxfp4(const void *src, float *y, int64_t k) { nl4_dequant(LI_TYPE_MXFP4, src, y, k); }

/* ---- IQ4_XS against Q8_K: per super-block the sum over blocks b of
 * (ls_b - 32) * sum(q * qx), then scalar_iq.c's fmaf(isum, d * dx, acc) ---- */

LI_INLINE void iq4_xs_dot(const int type, int64_t k, const void *w, const void *x, size_t xs, const int nc,
                          float *s) {
    (void)type;
    const int8x16_t table = vld1q_s8(li_kvalues_iq4nl);
    float acc[LI_DOT_MAX_NC] = {0};
    for (int64_t i = 0; i < k / QK_K; i++) {
        const block_iq4_xs *b = (const block_iq4_xs *)w + i;
        int32_t isum[LI_DOT_MAX_NC] = {0};
        for (int g = 0; g < 8; g++) {
            int8x16_t lo, hi;
            nl4_values(b->qs + 16 * g, table, &lo, &hi);
            const int sc = iq4_xs_scale(b, g);
            for (int c = 0; c < nc; c++) {
                const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
                const int32x4_t p = idot16(idot16(vdupq_n_s32(0), lo, vld1q_s8(a->qs + 32 * g)), hi,
                                           vld1q_s8(a->qs + 32 * g + 16));
                isum[c] += sc * vaddvq_s32(p);
            }
        }
        const float d = li_f16_to_f32(b->d);
        for (int c = 0; c < nc; c++) acc[c] = fmaf((float)isum[c], d * ACT_ROW(act_q8_K, x, c, xs)[i].d, acc[c]);
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

/* ---- the grid types and TQ1_0/TQ2_0 against Q8_K ---- */

LI_INLINE int8x16_t rows2(const void *r0, const void *r1) {
    return vcombine_s8(vld1_s8((const int8_t *)r0), vld1_s8((const int8_t *)r1));
}

LI_INLINE int8x16_t rows4x4(const uint8_t *r0, const uint8_t *r1, const uint8_t *r2, const uint8_t *r3) {
    uint8_t t[16];
    memcpy(t, r0, 4);
    memcpy(t + 4, r1, 4);
    memcpy(t + 8, r2, 4);
    memcpy(t + 12, r3, 4);
    return vreinterpretq_s8_u8(vld1q_u8(t));
}

LI_INLINE int8x16_t signed2(int8x16_t grid, uint8_t s0, uint8_t s1) {
    return vmulq_s8(grid, rows2(li_sign_bytes[s0], li_sign_bytes[s1]));
}

/* 8 * g + (neg ? -1 : 1) for two rows of 8 */
LI_INLINE int8x16_t iq1_values(const int8_t *g0, const int8_t *g1, int neg0, int neg1) {
    const int8x16_t delta = vcombine_s8(vdup_n_s8(neg0 ? -1 : 1), vdup_n_s8(neg1 ? -1 : 1));
    return vaddq_s8(vshlq_n_s8(rows2(g0, g1), 3), delta);
}

/* group g of 32 values: q[0] the first 16, q[1] the second, raw scales sc[0], sc[1] */
LI_INLINE void grid_group(const int type, const void *blk, int g, int8x16_t q[2], int sc[2]) {
    switch (type) {
    case LI_TYPE_IQ2_XXS: {
        const uint8_t *p = (const uint8_t *)((const block_iq2_xxs *)blk)->qs + 8 * g;
        const uint32_t aux = iq_u32(p + 4);
        q[0] = signed2(rows2(li_iq2xxs_grid[p[0]], li_iq2xxs_grid[p[1]]), li_ksigns_iq2xs[aux & 127],
                       li_ksigns_iq2xs[(aux >> 7) & 127]);
        q[1] = signed2(rows2(li_iq2xxs_grid[p[2]], li_iq2xxs_grid[p[3]]), li_ksigns_iq2xs[(aux >> 14) & 127],
                       li_ksigns_iq2xs[(aux >> 21) & 127]);
        sc[0] = sc[1] = (int)(aux >> 28);
        return;
    }
    case LI_TYPE_IQ2_XS: {
        const block_iq2_xs *b = (const block_iq2_xs *)blk;
        const uint16_t *p = b->qs + 4 * g;
        for (int h = 0; h < 2; h++)
            q[h] = signed2(rows2(li_iq2xs_grid[p[2 * h] & 511], li_iq2xs_grid[p[2 * h + 1] & 511]),
                           li_ksigns_iq2xs[p[2 * h] >> 9], li_ksigns_iq2xs[p[2 * h + 1] >> 9]);
        sc[0] = b->scales[g] & 15;
        sc[1] = b->scales[g] >> 4;
        return;
    }
    case LI_TYPE_IQ2_S: {
        const block_iq2_s *b = (const block_iq2_s *)blk;
        const uint8_t *p = b->qs + 4 * g, *sg = b->qs + 32 + 4 * g;
        const int qh = b->qh[g];
        for (int h = 0; h < 2; h++) {
            const int e = 2 * h;
            q[h] = signed2(rows2(li_iq2s_grid[p[e] | (((qh >> (2 * e)) & 3) << 8)],
                                 li_iq2s_grid[p[e + 1] | (((qh >> (2 * e + 2)) & 3) << 8)]),
                           sg[e], sg[e + 1]);
        }
        sc[0] = b->scales[g] & 15;
        sc[1] = b->scales[g] >> 4;
        return;
    }
    case LI_TYPE_IQ3_XXS: {
        const block_iq3_xxs *b = (const block_iq3_xxs *)blk;
        const uint8_t *p = b->qs + 8 * g;
        const uint32_t aux = iq_u32(b->qs + 64 + 4 * g);
        for (int h = 0; h < 2; h++)
            q[h] = signed2(rows4x4(li_iq3xxs_grid[p[4 * h]], li_iq3xxs_grid[p[4 * h + 1]],
                                   li_iq3xxs_grid[p[4 * h + 2]], li_iq3xxs_grid[p[4 * h + 3]]),
                           li_ksigns_iq2xs[(aux >> (14 * h)) & 127], li_ksigns_iq2xs[(aux >> (14 * h + 7)) & 127]);
        sc[0] = sc[1] = (int)(aux >> 28);
        return;
    }
    case LI_TYPE_IQ3_S: {
        const block_iq3_s *b = (const block_iq3_s *)blk;
        const uint8_t *p = b->qs + 8 * g, *sg = b->signs + 4 * g;
        const int qh = b->qh[g];
#define IDX(e) (p[e] | (((qh >> (e)) & 1) << 8))
        q[0] = signed2(rows4x4(li_iq3s_grid[IDX(0)], li_iq3s_grid[IDX(1)], li_iq3s_grid[IDX(2)], li_iq3s_grid[IDX(3)]),
                       sg[0], sg[1]);
        q[1] = signed2(rows4x4(li_iq3s_grid[IDX(4)], li_iq3s_grid[IDX(5)], li_iq3s_grid[IDX(6)], li_iq3s_grid[IDX(7)]),
                       sg[2], sg[3]);
#undef IDX
        sc[0] = sc[1] = (b->scales[g / 2] >> (4 * (g % 2))) & 15;
        return;
    }
    case LI_TYPE_IQ1_S: {
        const block_iq1_s *b = (const block_iq1_s *)blk;
        const uint8_t *p = b->qs + 4 * g;
        const unsigned h = b->qh[g];
        const int neg = (h >> 15) & 1;
        q[0] = iq1_values(li_iq1s_grid[p[0] | ((h << 8) & 0x700)], li_iq1s_grid[p[1] | ((h << 5) & 0x700)], neg, neg);
        q[1] = iq1_values(li_iq1s_grid[p[2] | ((h << 2) & 0x700)], li_iq1s_grid[p[3] | ((h >> 1) & 0x700)], neg, neg);
        sc[0] = sc[1] = (int)((h >> 12) & 7);
        return;
    }
    default: { /* IQ1_M */
        const block_iq1_m *b = (const block_iq1_m *)blk;
        const uint8_t *p = b->qs + 4 * g;
        for (int h = 0; h < 2; h++) {
            const int n = b->qh[2 * g + h];
            q[h] = iq1_values(li_iq1s_grid[p[2 * h] | ((n << 8) & 0x700)], li_iq1s_grid[p[2 * h + 1] | ((n << 4) & 0x700)],
                              (n >> 3) & 1, (n >> 7) & 1);
        }
        const unsigned wd = iq_u16(b->scales + 2 * (g / 2));
        sc[0] = (int)((wd >> (6 * (g % 2))) & 7);
        sc[1] = (int)((wd >> (6 * (g % 2) + 3)) & 7);
        return;
    }
    }
}

LI_INLINE size_t grid_bytes(const int type) {
    switch (type) {
    case LI_TYPE_IQ2_XXS: return sizeof(block_iq2_xxs);
    case LI_TYPE_IQ2_XS: return sizeof(block_iq2_xs);
    case LI_TYPE_IQ2_S: return sizeof(block_iq2_s);
    case LI_TYPE_IQ3_XXS: return sizeof(block_iq3_xxs);
    case LI_TYPE_IQ3_S: return sizeof(block_iq3_s);
    case LI_TYPE_IQ1_S: return sizeof(block_iq1_s);
    default: return sizeof(block_iq1_m);
    }
}

LI_INLINE void grid_dot(const int type, int64_t k, const void *w, const void *x, size_t xs, const int nc,
                        float *out) {
    const size_t bytes = grid_bytes(type);
    const float f = type == LI_TYPE_IQ3_XXS ? 0.25f : type == LI_TYPE_IQ3_S ? 1.0f : 0.125f;
    float acc[LI_DOT_MAX_NC] = {0};
    for (int64_t i = 0; i < k / QK_K; i++) {
        const void *blk = (const char *)w + (size_t)i * bytes;
        int32x4_t isum[LI_DOT_MAX_NC];
        for (int c = 0; c < nc; c++) isum[c] = vdupq_n_s32(0);
        for (int g = 0; g < 8; g++) {
            int8x16_t q[2];
            int sc[2];
            grid_group(type, blk, g, q, sc);
            for (int c = 0; c < nc; c++) {
                const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
                for (int h = 0; h < 2; h++)
                    isum[c] = vmlaq_n_s32(isum[c], idot16(vdupq_n_s32(0), q[h], vld1q_s8(a->qs + 32 * g + 16 * h)),
                                          2 * sc[h] + 1);
            }
        }
        uint16_t dh;
        if (type == LI_TYPE_IQ1_M) dh = iq1_m_d((const block_iq1_m *)blk);
        else memcpy(&dh, blk, 2); /* every other grid block starts with d */
        const float d = li_f16_to_f32(dh);
        for (int c = 0; c < nc; c++) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            acc[c] = fmaf((float)vaddvq_s32(isum[c]), d * a->d * f, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) out[c] = acc[c];
}

LI_INLINE void tq_dot(const int type, int64_t k, const void *w, const void *x, size_t xs, const int nc,
                      float *out) {
    float acc[LI_DOT_MAX_NC] = {0};
    for (int64_t i = 0; i < k / QK_K; i++) {
        int8x16_t q[16];
        float d;
        if (type == LI_TYPE_TQ1_0) {
            const block_tq1_0 *b = (const block_tq1_0 *)w + i;
            int8_t u[QK_K];
            unpack_tq1_0(b, u);
            for (int j = 0; j < 16; j++) q[j] = vld1q_s8(u + 16 * j);
            d = li_f16_to_f32(b->d);
        } else {
            const block_tq2_0 *b = (const block_tq2_0 *)w + i;
            const uint8x16_t three = vdupq_n_u8(3);
            const int8x16_t one = vdupq_n_s8(1);
            for (int h = 0; h < 2; h++)
                for (int half = 0; half < 2; half++) {
                    const uint8x16_t v = vld1q_u8(b->qs + 32 * h + 16 * half);
                    const uint8x16_t t[4] = {vandq_u8(v, three), vandq_u8(vshrq_n_u8(v, 2), three),
                                             vandq_u8(vshrq_n_u8(v, 4), three), vshrq_n_u8(v, 6)};
                    for (int l = 0; l < 4; l++) q[8 * h + 2 * l + half] = vsubq_s8(vreinterpretq_s8_u8(t[l]), one);
                }
            d = li_f16_to_f32(b->d);
        }
        for (int c = 0; c < nc; c++) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            int32x4_t p = vdupq_n_s32(0);
            for (int j = 0; j < 16; j++) p = idot16(p, q[j], vld1q_s8(a->qs + 16 * j));
            acc[c] = fmaf((float)vaddvq_s32(p), d * a->d * 1.0f, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) out[c] = acc[c];
}

#define ENTRY(name, T, worker)                                                                    \
    static void dot_##name(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) { \
        switch (nc) {                                                                             \
        case 1: worker(LI_TYPE_##T, k, w, x, xs, 1, s); break;                                    \
        case 2: worker(LI_TYPE_##T, k, w, x, xs, 2, s); break;                                    \
        case 3: worker(LI_TYPE_##T, k, w, x, xs, 3, s); break;                                    \
        default: worker(LI_TYPE_##T, k, w, x, xs, 4, s); break;                                   \
        }                                                                                         \
    }
ENTRY(iq4_xs, IQ4_XS, iq4_xs_dot)
ENTRY(tq1_0, TQ1_0, tq_dot)
ENTRY(tq2_0, TQ2_0, tq_dot)
ENTRY(iq2_xxs, IQ2_XXS, grid_dot)
ENTRY(iq2_xs, IQ2_XS, grid_dot)
ENTRY(iq2_s, IQ2_S, grid_dot)
ENTRY(iq3_xxs, IQ3_XXS, grid_dot)
ENTRY(iq3_s, IQ3_S, grid_dot)
ENTRY(iq1_s, IQ1_S, grid_dot)
ENTRY(iq1_m, IQ1_M, grid_dot)
#undef ENTRY

void li_kernels_fill_neon_iq(li_kernels *t) {
    t->dequant[LI_TYPE_IQ4_NL] = dequant_iq4_nl;
    t->dequant[LI_TYPE_MXFP4] = dequant_mxfp4;
#define SET(T, name) t->dot[LI_TYPE_##T] = dot_##name;
    SET(IQ4_XS, iq4_xs) SET(TQ1_0, tq1_0) SET(TQ2_0, tq2_0);
    SET(IQ2_XXS, iq2_xxs) SET(IQ2_XS, iq2_xs) SET(IQ2_S, iq2_s) SET(IQ3_XXS, iq3_xxs) SET(IQ3_S, iq3_s);
    SET(IQ1_S, iq1_s) SET(IQ1_M, iq1_m);
#undef SET
}
#elif defined(LI_ARCH_ARM64)
void li_kernels_fill_neon_iq(li_kernels *t) { (void)t; } /* big-endian: the scalar kernels stay */
#else
typedef int li_empty_translation_unit;
#endif
