/* arm_neon_quants.h: the weight-block decoders and the quantized dot products
 * of the two NEON levels. arm_neon.c and arm_neon_dot.c each include it once,
 * after defining
 *
 *     LI_INLINE int32x4_t idot16(int32x4_t acc, int8x16_t a, int8x16_t b);
 *
 * which adds sum(a[j] * b[j]), j < 16, into acc, spread over its lanes in any
 * way (widening multiplies on plain NEON, SDOT on the dot-product level). So
 * one source is compiled once per level, everything in it static to its file.
 *
 * Decoders turn a block into int8x16 vectors of its small integers, in
 * element order, the same values as scalar.c's unpack_*; dequantization
 * (arm_neon.c) and the dot products are both written over them.
 *
 * The dot products give scalar.c's results to the bit: a block's integer sums
 * are exact whatever the order, and its float step is scalar.c's expression,
 * evaluated lane-wise with one activation row per lane of a float32x4 (lane c
 * is row c), so each row sees the same float operations in the same order.
 * The fused multiply-adds of that expression are explicit (vfmaq_f32,
 * vfmsq_f32, as scalar.c's fmaf); nothing else may be fused, which needs
 * -ffp-contract=off, as setup.py builds.
 *
 * Ranges the integer code relies on: activations from quant_act lie in
 * [-127, 127]; a weight byte (at worst -128) times one fits int16 twice
 * over, which the plain-NEON idot16 uses. Little-endian only (the including
 * files check): 32-bit words are read from byte arrays.
 */
#ifndef LLMINFER_ARM_NEON_QUANTS_H
#define LLMINFER_ARM_NEON_QUANTS_H

#include <arm_neon.h>
#include <string.h>

#include "../common.h"
#include "kernels.h"
#include "unpack_iq.h" /* li_e8m0_half and the 4-bit level tables of IQ4_NL and MXFP4 */

/* Fixed-count loops over vectors and rows, unrolled at any optimization
 * level so that the arrays they index (a half's q[8], the rows' sums) stay in
 * registers rather than on the stack. */
#if defined(__GNUC__) || defined(__clang__)
#define LI_PRAGMA(x) _Pragma(#x)
#define UNROLL(n) LI_PRAGMA(GCC unroll n)
#else
#define UNROLL(n)
#endif
#define FOR_EACH_ROW(c, nc) UNROLL(4) for (int c = 0; c < (nc); c++)

/* ---- lane helpers ---- */

LI_INLINE int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* lane j = the sum of the lanes of the j-th argument */
LI_INLINE int32x4_t hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

/* lane c = the sum of the lanes of v[c], for c < nc (v[c] zero beyond) */
LI_INLINE int32x4_t sum_rows(const int32x4_t v[4], const int nc) {
    if (nc == 1) return vsetq_lane_s32(vaddvq_s32(v[0]), vdupq_n_s32(0), 0);
    return hsum4(v[0], v[1], v[2], v[3]);
}

LI_INLINE void store_rows(float *s, float32x4_t v, const int nc) {
    float t[4];
    vst1q_f32(t, v);
    FOR_EACH_ROW(c, nc) s[c] = t[c];
}

/* 16 bytes as four int32x4, lane order kept */
LI_INLINE void widen_s8(int8x16_t v, int32x4_t w[4]) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    w[0] = vmovl_s16(vget_low_s16(lo));
    w[1] = vmovl_high_s16(lo);
    w[2] = vmovl_s16(vget_low_s16(hi));
    w[3] = vmovl_high_s16(hi);
}

LI_INLINE void widen_u8x8(uint8x8_t v, int32x4_t w[2]) {
    const int16x8_t x = vreinterpretq_s16_u16(vmovl_u8(v));
    w[0] = vmovl_s16(vget_low_s16(x));
    w[1] = vmovl_high_s16(x);
}

/* A block's f16 scale (d, m, dmin) to float by the conversion unit, a few
 * instructions instead of scalar.c's branchy bit work. The one difference,
 * a signalling NaN coming out quiet, cannot show: a scale only ever enters a
 * multiply or an add, which quiets it anyway (a NaN's payload could differ
 * only where two NaNs meet in one operation). */
LI_INLINE float h2f(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* the rows' activation scales as a vector; for one row, lane 0 copied to
 * all (the other lanes are computed and dropped) */
LI_INLINE float32x4_t row_scales(const float v[4], const int nc) {
    return nc == 1 ? vdupq_n_f32(v[0]) : vld1q_f32(v);
}

/* a 32-element block, as two vectors, against activations a[32] */
LI_INLINE int32x4_t dot32(const int8x16_t q[2], const int8_t *a) {
    return idot16(idot16(vdupq_n_s32(0), q[0], vld1q_s8(a)), q[1], vld1q_s8(a + 16));
}

/* ---- decoders: 32-element blocks ---- */

static const uint8_t lane_bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
static const uint8_t lane_byte01[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
static const uint8_t lane_byte23[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

/* n[0] = elements 0-15 (low nibbles of qs), n[1] = elements 16-31 (high) */
LI_INLINE void nibbles16(const uint8_t *qs, uint8x16_t n[2]) {
    const uint8x16_t v = vld1q_u8(qs);
    n[0] = vandq_u8(v, vdupq_n_u8(15));
    n[1] = vshrq_n_u8(v, 4);
}

/* bit 4 of each element of a Q5 block (bit j of qh for element j), as 16 or 0 */
LI_INLINE void q5_high_bits(const uint8_t qh[4], uint8x16_t hb[2]) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const uint8x16_t rep = vreinterpretq_u8_u32(vdupq_n_u32(h)); /* qh[0..3], four times */
    const uint8x16_t bit = vld1q_u8(lane_bit), b4 = vdupq_n_u8(16);
    hb[0] = vandq_u8(vtstq_u8(vqtbl1q_u8(rep, vld1q_u8(lane_byte01)), bit), b4);
    hb[1] = vandq_u8(vtstq_u8(vqtbl1q_u8(rep, vld1q_u8(lane_byte23)), bit), b4);
}

LI_INLINE void decode_q4_0(const block_q4_0 *b, int8x16_t q[2]) {
    uint8x16_t n[2];
    nibbles16(b->qs, n);
    q[0] = vsubq_s8(s8(n[0]), vdupq_n_s8(8));
    q[1] = vsubq_s8(s8(n[1]), vdupq_n_s8(8));
}

LI_INLINE void decode_q4_1(const block_q4_1 *b, int8x16_t q[2]) {
    uint8x16_t n[2];
    nibbles16(b->qs, n);
    q[0] = s8(n[0]);
    q[1] = s8(n[1]);
}

/* q - 16, in [-16, 15] */
LI_INLINE void decode_q5_0(const block_q5_0 *b, int8x16_t q[2]) {
    uint8x16_t n[2], h[2];
    nibbles16(b->qs, n);
    q5_high_bits(b->qh, h);
    q[0] = vsubq_s8(s8(vorrq_u8(n[0], h[0])), vdupq_n_s8(16));
    q[1] = vsubq_s8(s8(vorrq_u8(n[1], h[1])), vdupq_n_s8(16));
}

LI_INLINE void decode_q5_1(const block_q5_1 *b, int8x16_t q[2]) {
    uint8x16_t n[2], h[2];
    nibbles16(b->qs, n);
    q5_high_bits(b->qh, h);
    q[0] = s8(vorrq_u8(n[0], h[0]));
    q[1] = s8(vorrq_u8(n[1], h[1]));
}

/* IQ4_NL and MXFP4: 4-bit indices in Q4_0's nibble order, through their 16-entry level table */
LI_INLINE void decode_nl4(const uint8_t *qs, const int8_t table[16], int8x16_t q[2]) {
    uint8x16_t n[2];
    nibbles16(qs, n);
    const int8x16_t t = vld1q_s8(table);
    q[0] = vqtbl1q_s8(t, n[0]);
    q[1] = vqtbl1q_s8(t, n[1]);
}

LI_INLINE void decode_q8_0(const block_q8_0 *b, int8x16_t q[2]) {
    q[0] = vld1q_s8(b->qs);
    q[1] = vld1q_s8(b->qs + 16);
}

/* ---- decoders: K-quants, by halves of 128 elements ----
 * In half h, q[v] holds elements 128h + 16v .. 128h + 16v + 15: the group of
 * 16 number 8h + v, or a half of the group of 32 number 4h + v/2. */

/* The 2-bit fields of Q2_K and Q3_K: element 128h + 32s + l is bits 2s of
 * qs[32h + l], l < 32, so q[2s] and q[2s + 1] come from one shift of the
 * half's 32 bytes. */
LI_INLINE void crumbs_half(const uint8_t *qs, uint8x16_t q[8]) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    const uint8x16_t v0 = vld1q_u8(qs), v1 = vld1q_u8(qs + 16);
    q[0] = vandq_u8(v0, m3);
    q[1] = vandq_u8(v1, m3);
    q[2] = vandq_u8(vshrq_n_u8(v0, 2), m3);
    q[3] = vandq_u8(vshrq_n_u8(v1, 2), m3);
    q[4] = vandq_u8(vshrq_n_u8(v0, 4), m3);
    q[5] = vandq_u8(vshrq_n_u8(v1, 4), m3);
    q[6] = vshrq_n_u8(v0, 6);
    q[7] = vshrq_n_u8(v1, 6);
}

/* q in [0, 3] */
LI_INLINE void decode_q2_K_half(const block_q2_K *b, int h, int8x16_t q[8]) {
    uint8x16_t c[8];
    crumbs_half(b->qs + 32 * h, c);
    UNROLL(8) for (int v = 0; v < 8; v++) q[v] = s8(c[v]);
}

/* q = crumb - 4 where the element's high bit is clear; element 32j + l has it
 * in bit j of hmask[l], so in half h, q[v] tests bit 4h + v/2 of
 * hmask[0..15] (v even) or hmask[16..31] (v odd). q in [-4, 3] */
LI_INLINE void decode_q3_K_half(const block_q3_K *b, int h, int8x16_t q[8]) {
    uint8x16_t c[8];
    crumbs_half(b->qs + 32 * h, c);
    const uint8x16_t hm[2] = {vld1q_u8(b->hmask), vld1q_u8(b->hmask + 16)};
    const uint8x16_t four = vdupq_n_u8(4);
    UNROLL(8) for (int v = 0; v < 8; v++) {
        const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + v / 2)));
        q[v] = vsubq_s8(s8(c[v]), s8(vbicq_u8(four, vtstq_u8(hm[v & 1], bit))));
    }
}

/* Q4_K: qs[32c + l] holds element 64c + l (low nibble) and 64c + 32 + l
 * (high); half h is chunks c = 2h and 2h + 1. q in [0, 15] */
LI_INLINE void nibbles_k_half(const uint8_t *qs, uint8x16_t q[8]) {
    const uint8x16_t m4 = vdupq_n_u8(15);
    UNROLL(2) for (int c = 0; c < 2; c++) {
        const uint8x16_t v0 = vld1q_u8(qs + 32 * c), v1 = vld1q_u8(qs + 32 * c + 16);
        q[4 * c + 0] = vandq_u8(v0, m4);
        q[4 * c + 1] = vandq_u8(v1, m4);
        q[4 * c + 2] = vshrq_n_u8(v0, 4);
        q[4 * c + 3] = vshrq_n_u8(v1, 4);
    }
}

LI_INLINE void decode_q4_K_half(const block_q4_K *b, int h, int8x16_t q[8]) {
    uint8x16_t n[8];
    nibbles_k_half(b->qs + 64 * h, n);
    UNROLL(8) for (int v = 0; v < 8; v++) q[v] = s8(n[v]);
}

/* Q5_K: the Q4_K nibble plus bit 4 from bit j of qh[l] for element 32j + l;
 * q in [0, 31] */
LI_INLINE void decode_q5_K_half(const block_q5_K *b, int h, int8x16_t q[8]) {
    uint8x16_t n[8];
    nibbles_k_half(b->qs + 64 * h, n);
    const uint8x16_t qh[2] = {vld1q_u8(b->qh), vld1q_u8(b->qh + 16)};
    const uint8x16_t b4 = vdupq_n_u8(16);
    UNROLL(8) for (int v = 0; v < 8; v++) {
        const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * h + v / 2)));
        q[v] = s8(vorrq_u8(n[v], vandq_u8(vtstq_u8(qh[v & 1], bit), b4)));
    }
}

/* Q6_K: in half h, element 128h + 32s + l (l < 32) has its low nibble in
 * ql[64h + 32(s&1) + l] (low nibble for s < 2, high for s >= 2) and bits 4-5
 * in bits 2s of qh[32h + l]. q in [-32, 31] */
LI_INLINE void decode_q6_K_half(const block_q6_K *b, int h, int8x16_t q[8]) {
    const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
    const uint8x16_t m4 = vdupq_n_u8(15), m3 = vdupq_n_u8(3);
    const uint8x16_t l[4] = {vld1q_u8(ql), vld1q_u8(ql + 16), vld1q_u8(ql + 32), vld1q_u8(ql + 48)};
    const uint8x16_t hi[2] = {vld1q_u8(qh), vld1q_u8(qh + 16)};
    const uint8x16_t hb[8] = {
        vandq_u8(hi[0], m3), vandq_u8(hi[1], m3),
        vandq_u8(vshrq_n_u8(hi[0], 2), m3), vandq_u8(vshrq_n_u8(hi[1], 2), m3),
        vandq_u8(vshrq_n_u8(hi[0], 4), m3), vandq_u8(vshrq_n_u8(hi[1], 4), m3),
        vshrq_n_u8(hi[0], 6), vshrq_n_u8(hi[1], 6),
    };
    UNROLL(8) for (int v = 0; v < 8; v++) {
        const uint8x16_t src = l[v & 3];
        const uint8x16_t lo = v < 4 ? vandq_u8(src, m4) : vshrq_n_u8(src, 4);
        q[v] = vsubq_s8(s8(vorrq_u8(lo, vshlq_n_u8(hb[v], 4))), vdupq_n_s8(32));
    }
}

/* ---- scale decoders ---- */

/* Q3_K: 16 signed 6-bit scales minus 32; low 4 bits in bytes 0-7 (group g
 * in byte g % 8, nibble g / 8), high 2 bits in bytes 8-11 (byte 8 + g % 4,
 * bits 2 (g / 4)) */
static const int8_t q3_hi_shift[16] = {0, 0, 0, 0, -2, -2, -2, -2, -4, -4, -4, -4, -6, -6, -6, -6};

LI_INLINE int8x16_t q3_K_scales(const uint8_t s[12]) {
    uint8_t lo[8];
    uint32_t hi;
    memcpy(lo, s, 8);
    memcpy(&hi, s + 8, 4);
    const uint8x8_t l = vld1_u8(lo);
    const uint8x16_t low4 = vcombine_u8(vand_u8(l, vdup_n_u8(15)), vshr_n_u8(l, 4));
    const uint8x16_t rep = vreinterpretq_u8_u32(vdupq_n_u32(hi)); /* lane g: byte 8 + g % 4 */
    const uint8x16_t hi2 = vandq_u8(vshlq_u8(rep, vld1q_s8(q3_hi_shift)), vdupq_n_u8(3));
    return vsubq_s8(s8(vorrq_u8(low4, vshlq_n_u8(hi2, 4))), vdupq_n_s8(32));
}

/* Q4_K / Q5_K: 8 scales and 8 mins of 6 bits in 12 bytes; for j < 4,
 * sc[j] = s[j] & 63, mn[j] = s[j+4] & 63, and the upper four take their low
 * 4 bits from s[j+8] (scale: low nibble, min: high) and their top 2 bits from
 * the top of s[j] (scale) or s[j+4] (min). Byte-wise on 32-bit words. */
LI_INLINE void k_scales(const uint8_t s[K_SCALE_SIZE], uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    const uint32_t w[4] = {
        u[0] & lo6,
        (u[2] & lo4) | ((u[0] >> 6) & lo2) << 4,
        u[1] & lo6,
        ((u[2] >> 4) & lo4) | ((u[1] >> 6) & lo2) << 4,
    };
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
}

/* ---- dot products ---- */

/* Each kernel is written for nc <= 4 rows (one per lane), as an inline
 * function of a constant nc, and the entry point calls it on the rows four
 * at a time, so the row loops unroll and the per-row vectors stay in
 * registers. (arm_neon.c uses this for its float-weight dots too.) */
#define FOR_ROWS_BY_4(rows_fn)                                                   \
    for (int c0 = 0; c0 < nc; c0 += 4) {                                         \
        const void *xc = (const char *)x + (size_t)c0 * xs;                      \
        switch (LI_MIN(4, nc - c0)) {                                            \
        case 1: rows_fn(k, w, xc, xs, 1, s + c0); break;                         \
        case 2: rows_fn(k, w, xc, xs, 2, s + c0); break;                         \
        case 3: rows_fn(k, w, xc, xs, 3, s + c0); break;                         \
        default: rows_fn(k, w, xc, xs, 4, s + c0); break;                        \
        }                                                                        \
    }

/* One block of Q4_0 / Q5_0 / Q8_0 (values q, scale d) against block i of
 * act_q8_0 rows: acc[c] = fma(dot(q, a->qs), d * a->d, acc[c]) */
LI_INLINE float32x4_t step_q8_0(float32x4_t acc, const int8x16_t q[2], float d, const void *x,
                                size_t xs, int64_t i, const int nc) {
    int32x4_t p[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    float ad[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    FOR_EACH_ROW(c, nc) {
        const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i;
        ad[c] = a->d;
        p[c] = dot32(q, a->qs);
    }
    const float32x4_t dd = vmulq_f32(vdupq_n_f32(d), row_scales(ad, nc));
    return vfmaq_f32(acc, vcvtq_f32_s32(sum_rows(p, nc)), dd);
}

/* Q4_1 / Q5_1 against act_q8_1: acc[c] = fma(dot(q, a->qs), d * a->d, acc[c]), then
 * acc[c] = fma(m, a->s, acc[c]) */
LI_INLINE float32x4_t step_q8_1(float32x4_t acc, const int8x16_t q[2], float d, float m,
                                const void *x, size_t xs, int64_t i, const int nc) {
    int32x4_t p[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    float ad[4] = {0.0f, 0.0f, 0.0f, 0.0f}, as[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    FOR_EACH_ROW(c, nc) {
        const act_q8_1 *a = ACT_ROW(act_q8_1, x, c, xs) + i;
        ad[c] = a->d;
        as[c] = a->s;
        p[c] = dot32(q, a->qs);
    }
    const float32x4_t dd = vmulq_f32(vdupq_n_f32(d), row_scales(ad, nc));
    acc = vfmaq_f32(acc, vcvtq_f32_s32(sum_rows(p, nc)), dd);
    return vfmaq_f32(acc, vdupq_n_f32(m), row_scales(as, nc));
}

LI_INLINE void dot_q4_0_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    const block_q4_0 *b = (const block_q4_0 *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK4_0; i++) {
        int8x16_t q[2];
        decode_q4_0(&b[i], q);
        acc = step_q8_0(acc, q, h2f(b[i].d), x, xs, i, nc);
    }
    store_rows(s, acc, nc);
}

LI_INLINE void dot_q5_0_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    const block_q5_0 *b = (const block_q5_0 *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK5_0; i++) {
        int8x16_t q[2];
        decode_q5_0(&b[i], q);
        acc = step_q8_0(acc, q, h2f(b[i].d), x, xs, i, nc);
    }
    store_rows(s, acc, nc);
}

LI_INLINE void dot_q8_0_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    const block_q8_0 *b = (const block_q8_0 *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK8_0; i++) {
        int8x16_t q[2];
        decode_q8_0(&b[i], q);
        acc = step_q8_0(acc, q, h2f(b[i].d), x, xs, i, nc);
    }
    store_rows(s, acc, nc);
}

/* IQ4_NL and MXFP4 against act_q8_0, as Q4_0 (scalar_iq.c's per-block fma) */
LI_INLINE void dot_iq4_nl_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                               float *s) {
    const block_iq4_nl *b = (const block_iq4_nl *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / 32; i++) {
        int8x16_t q[2];
        decode_nl4(b[i].qs, li_kvalues_iq4nl, q);
        acc = step_q8_0(acc, q, h2f(b[i].d), x, xs, i, nc);
    }
    store_rows(s, acc, nc);
}

LI_INLINE void dot_mxfp4_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                              float *s) {
    const block_mxfp4 *b = (const block_mxfp4 *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK_MXFP4; i++) {
        int8x16_t q[2];
        decode_nl4(b[i].qs, li_kvalues_mxfp4, q);
        acc = step_q8_0(acc, q, li_e8m0_half(b[i].e), x, xs, i, nc);
    }
    store_rows(s, acc, nc);
}

LI_INLINE void dot_q4_1_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    const block_q4_1 *b = (const block_q4_1 *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK4_1; i++) {
        int8x16_t q[2];
        decode_q4_1(&b[i], q);
        acc = step_q8_1(acc, q, h2f(b[i].d), h2f(b[i].m), x, xs, i, nc);
    }
    store_rows(s, acc, nc);
}

LI_INLINE void dot_q5_1_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    const block_q5_1 *b = (const block_q5_1 *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK5_1; i++) {
        int8x16_t q[2];
        decode_q5_1(&b[i], q);
        acc = step_q8_1(acc, q, h2f(b[i].d), h2f(b[i].m), x, xs, i, nc);
    }
    store_rows(s, acc, nc);
}

/* One half of a K-quant block against activations a[128]:
 * groups of 16 (Q2_K, Q3_K, Q6_K): acc += sum over v of sc[v] * dot(q[v], a_v),
 * with sc_lo holding the scales of q[0..3] and sc_hi those of q[4..7]. */
LI_INLINE int32x4_t half_dot_g16(int32x4_t acc, const int8x16_t q[8], const int8_t *a,
                                 int32x4_t sc_lo, int32x4_t sc_hi) {
    int32x4_t p[8];
    UNROLL(8) for (int v = 0; v < 8; v++) p[v] = idot16(vdupq_n_s32(0), q[v], vld1q_s8(a + 16 * v));
    acc = vmlaq_s32(acc, hsum4(p[0], p[1], p[2], p[3]), sc_lo);
    return vmlaq_s32(acc, hsum4(p[4], p[5], p[6], p[7]), sc_hi);
}

/* groups of 32 (Q4_K, Q5_K): sc holds the scales of the half's four groups */
LI_INLINE int32x4_t half_dot_g32(int32x4_t acc, const int8x16_t q[8], const int8_t *a,
                                 int32x4_t sc) {
    int32x4_t p[4];
    UNROLL(4) for (int j = 0; j < 4; j++) p[j] = dot32(q + 2 * j, a + 32 * j);
    return vmlaq_s32(acc, hsum4(p[0], p[1], p[2], p[3]), sc);
}

/* sum over 16 groups of mn[g] * bsums[g] (Q2_K), as int32 lanes to be added */
LI_INLINE int32x4_t mins_g16(int16x8_t mn0, int16x8_t mn1, const int16_t *bsums) {
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    int32x4_t r = vmull_s16(vget_low_s16(mn0), vget_low_s16(b0));
    r = vmlal_high_s16(r, mn0, b0);
    r = vmlal_s16(r, vget_low_s16(mn1), vget_low_s16(b1));
    return vmlal_high_s16(r, mn1, b1);
}

/* sum over 8 groups of 32 of mn[j] * (bsums[2j] + bsums[2j+1]) (Q4_K, Q5_K) */
LI_INLINE int32x4_t mins_g32(int16x8_t mn, const int16_t *bsums) {
    const int16x8_t bs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    return vmlal_high_s16(vmull_s16(vget_low_s16(mn), vget_low_s16(bs)), mn, bs);
}

/* the float step shared by Q2_K, Q4_K, Q5_K:
 * acc[c] = fma(isum, d * a->d, acc[c]), then acc[c] = fma(-imin, dmin * a->d, acc[c]) */
LI_INLINE float32x4_t step_k_min(float32x4_t acc, const float ad[4], float d, float dmin,
                                 const int32x4_t isum[4], const int32x4_t imin[4], const int nc) {
    const float32x4_t fs = vcvtq_f32_s32(sum_rows(isum, nc)), fm = vcvtq_f32_s32(sum_rows(imin, nc));
    acc = vfmaq_f32(acc, fs, vmulq_f32(vdupq_n_f32(d), row_scales(ad, nc)));
    return vfmsq_f32(acc, fm, vmulq_f32(vdupq_n_f32(dmin), row_scales(ad, nc)));
}

/* Q3_K, Q6_K: acc[c] = fma(isum, d * a->d, acc[c]) */
LI_INLINE float32x4_t step_k(float32x4_t acc, const float ad[4], float d, const int32x4_t isum[4],
                             const int nc) {
    const float32x4_t dd = vmulq_f32(vdupq_n_f32(d), row_scales(ad, nc));
    return vfmaq_f32(acc, vcvtq_f32_s32(sum_rows(isum, nc)), dd);
}

#define ZERO4_S32 {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)}

LI_INLINE void dot_q2_K_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    const block_q2_K *b = (const block_q2_K *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const uint8x16_t raw = vld1q_u8(b[i].scales);
        int32x4_t sc[4];
        widen_s8(s8(vandq_u8(raw, vdupq_n_u8(15))), sc);
        const uint8x16_t mn = vshrq_n_u8(raw, 4);
        const int16x8_t mn0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
        const int16x8_t mn1 = vreinterpretq_s16_u16(vmovl_high_u8(mn));
        int32x4_t isum[4] = ZERO4_S32, imin[4] = ZERO4_S32;
        float ad[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        FOR_EACH_ROW(c, nc) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            ad[c] = a->d;
            imin[c] = mins_g16(mn0, mn1, a->bsums);
        }
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            decode_q2_K_half(&b[i], h, q);
            FOR_EACH_ROW(c, nc) {
                const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
                isum[c] = half_dot_g16(isum[c], q, a->qs + 128 * h, sc[2 * h], sc[2 * h + 1]);
            }
        }
        acc = step_k_min(acc, ad, h2f(b[i].d), h2f(b[i].dmin), isum, imin, nc);
    }
    store_rows(s, acc, nc);
}

LI_INLINE void dot_q3_K_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    const block_q3_K *b = (const block_q3_K *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK_K; i++) {
        int32x4_t sc[4];
        widen_s8(q3_K_scales(b[i].scales), sc);
        int32x4_t isum[4] = ZERO4_S32;
        float ad[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        FOR_EACH_ROW(c, nc) ad[c] = (ACT_ROW(act_q8_K, x, c, xs) + i)->d;
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            decode_q3_K_half(&b[i], h, q);
            FOR_EACH_ROW(c, nc) {
                const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
                isum[c] = half_dot_g16(isum[c], q, a->qs + 128 * h, sc[2 * h], sc[2 * h + 1]);
            }
        }
        acc = step_k(acc, ad, h2f(b[i].d), isum, nc);
    }
    store_rows(s, acc, nc);
}

/* Q4_K and Q5_K differ only in their half decoder; `type` is a constant
 * after inlining, so the other branch goes */
LI_INLINE void dot_k32_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                            float *s, const int type) {
    const block_q4_K *b4 = (const block_q4_K *)w;
    const block_q5_K *b5 = (const block_q5_K *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const uint16_t dh = type == LI_TYPE_Q4_K ? b4[i].d : b5[i].d;
        const uint16_t dminh = type == LI_TYPE_Q4_K ? b4[i].dmin : b5[i].dmin;
        uint8_t scb[8], mnb[8];
        k_scales(type == LI_TYPE_Q4_K ? b4[i].scales : b5[i].scales, scb, mnb);
        int32x4_t sc[2];
        widen_u8x8(vld1_u8(scb), sc);
        const int16x8_t mn = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mnb)));
        int32x4_t isum[4] = ZERO4_S32, imin[4] = ZERO4_S32;
        float ad[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        FOR_EACH_ROW(c, nc) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            ad[c] = a->d;
            imin[c] = mins_g32(mn, a->bsums);
        }
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            if (type == LI_TYPE_Q4_K)
                decode_q4_K_half(&b4[i], h, q);
            else
                decode_q5_K_half(&b5[i], h, q);
            FOR_EACH_ROW(c, nc) {
                const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
                isum[c] = half_dot_g32(isum[c], q, a->qs + 128 * h, sc[h]);
            }
        }
        acc = step_k_min(acc, ad, h2f(dh), h2f(dminh), isum, imin, nc);
    }
    store_rows(s, acc, nc);
}

LI_INLINE void dot_q4_K_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    dot_k32_rows(k, w, x, xs, nc, s, LI_TYPE_Q4_K);
}

LI_INLINE void dot_q5_K_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    dot_k32_rows(k, w, x, xs, nc, s, LI_TYPE_Q5_K);
}

LI_INLINE void dot_q6_K_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    const block_q6_K *b = (const block_q6_K *)w;
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k / QK_K; i++) {
        int32x4_t sc[4];
        widen_s8(vld1q_s8(b[i].scales), sc);
        int32x4_t isum[4] = ZERO4_S32;
        float ad[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        FOR_EACH_ROW(c, nc) ad[c] = (ACT_ROW(act_q8_K, x, c, xs) + i)->d;
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            decode_q6_K_half(&b[i], h, q);
            FOR_EACH_ROW(c, nc) {
                const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
                isum[c] = half_dot_g16(isum[c], q, a->qs + 128 * h, sc[2 * h], sc[2 * h + 1]);
            }
        }
        acc = step_k(acc, ad, h2f(b[i].d), isum, nc);
    }
    store_rows(s, acc, nc);
}

#undef ZERO4_S32

static void dot_q4_0(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q4_0_rows)
}
static void dot_q4_1(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q4_1_rows)
}
static void dot_q5_0(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q5_0_rows)
}
static void dot_q5_1(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q5_1_rows)
}
static void dot_q8_0(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q8_0_rows)
}
static void dot_iq4_nl(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_iq4_nl_rows)
}
static void dot_mxfp4(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_mxfp4_rows)
}
static void dot_q2_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q2_K_rows)
}
static void dot_q3_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q3_K_rows)
}
static void dot_q4_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q4_K_rows)
}
static void dot_q5_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q5_K_rows)
}
static void dot_q6_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_q6_K_rows)
}

/* the table entries this header provides: the quantized weight types */
static void set_quant_dots(li_kernels *t) {
    t->dot[LI_TYPE_Q4_0] = dot_q4_0;
    t->dot[LI_TYPE_Q4_1] = dot_q4_1;
    t->dot[LI_TYPE_Q5_0] = dot_q5_0;
    t->dot[LI_TYPE_Q5_1] = dot_q5_1;
    t->dot[LI_TYPE_Q8_0] = dot_q8_0;
    t->dot[LI_TYPE_IQ4_NL] = dot_iq4_nl;
    t->dot[LI_TYPE_MXFP4] = dot_mxfp4;
    t->dot[LI_TYPE_Q2_K] = dot_q2_K;
    t->dot[LI_TYPE_Q3_K] = dot_q3_K;
    t->dot[LI_TYPE_Q4_K] = dot_q4_K;
    t->dot[LI_TYPE_Q5_K] = dot_q5_K;
    t->dot[LI_TYPE_Q6_K] = dot_q6_K;
}

#endif
