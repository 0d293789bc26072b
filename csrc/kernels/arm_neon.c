/* arm_neon.c: kernels for aarch64 Advanced SIMD (NEON), which every 64-bit
 * ARM CPU has, so this file needs no flags. arm_neon_dot.c starts from this
 * table and swaps in SDOT versions of the integer dot products.
 *
 * Dequantization, activation quantization and the element-wise ops give
 * scalar.c's results to the bit: the same float operations in the same order
 * and operand order (built with -ffp-contract=off, so no multiply-add is
 * fused), and round-half-to-even float-to-int conversion (vcvtnq), which is
 * lrintf's rounding. The quantized dot products (arm_neon_quants.h) are exact
 * too. Reductions over floats (dot_f32, dot_f32_f16, the F32/F16/BF16 weight
 * dots, rms_norm's sum, softmax's sum) add in a different order, with fused
 * multiply-adds; softmax uses its own exp (within 2 ulp of expf).
 */
#include "kernels.h"

#if defined(LI_ARCH_ARM64) && !defined(__ARM_BIG_ENDIAN)
#include <arm_neon.h>
#include <math.h>

#include "../common.h"

/* sum(a[j] * b[j]) into acc: each int16 lane takes two products (which fit:
 * see arm_neon_quants.h), then adjacent lanes are added into int32 */
LI_INLINE int32x4_t idot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
    const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b);
    return vpadalq_s16(acc, p);
}

#include "arm_neon_quants.h"

/* ---- float16 / bfloat16 ---- */

/* Eight halfs to floats, bit for bit as li_f16_to_f32. FCVTL quiets a
 * signalling NaN (sets mantissa bit 22) where scalar.c keeps it, so the bit
 * is cleared again in lanes whose half was one (exponent all ones, mantissa
 * not zero, quiet bit 0x200 clear). */
LI_INLINE void f16x8_to_f32(uint16x8_t h, float32x4_t f[2]) {
    const float16x8_t hf = vreinterpretq_f16_u16(h);
    const uint16x8_t mag = vandq_u16(h, vdupq_n_u16(0x7fff));
    const uint16x8_t snan = vandq_u16(vcgtq_u16(mag, vdupq_n_u16(0x7c00)),
                                      vcltq_u16(mag, vdupq_n_u16(0x7e00)));
    const int16x8_t m = vreinterpretq_s16_u16(snan);
    const uint32x4_t qbit = vdupq_n_u32(0x00400000u);
    const uint32x4_t clr_lo = vandq_u32(vreinterpretq_u32_s32(vmovl_s16(vget_low_s16(m))), qbit);
    const uint32x4_t clr_hi = vandq_u32(vreinterpretq_u32_s32(vmovl_high_s16(m)), qbit);
    f[0] = vreinterpretq_f32_u32(
        vbicq_u32(vreinterpretq_u32_f32(vcvt_f32_f16(vget_low_f16(hf))), clr_lo));
    f[1] = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(vcvt_high_f32_f16(hf)), clr_hi));
}

/* four halfs to floats where a NaN's quiet bit does not matter (products) */
LI_INLINE float32x4_t f16x4_to_f32(const uint16_t *h) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

LI_INLINE float32x4_t bf16x4_to_f32(const uint16_t *h) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(h), 16));
}

/* eight floats to halfs, round to nearest even: li_f32_to_f16's results,
 * NaN payloads included */
LI_INLINE uint16x8_t f32x8_to_f16(float32x4_t a, float32x4_t b) {
    return vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(a), b));
}

/* ---- dequantization ---- */

/* y[0..15] = d * (float)q */
LI_INLINE void put_mul(float *y, int8x16_t q, float32x4_t d) {
    int32x4_t w[4];
    widen_s8(q, w);
    for (int j = 0; j < 4; j++) vst1q_f32(y + 4 * j, vmulq_f32(d, vcvtq_f32_s32(w[j])));
}

/* y[0..15] = d * (float)q + m */
LI_INLINE void put_mul_add(float *y, int8x16_t q, float32x4_t d, float32x4_t m) {
    int32x4_t w[4];
    widen_s8(q, w);
    for (int j = 0; j < 4; j++)
        vst1q_f32(y + 4 * j, vaddq_f32(vmulq_f32(d, vcvtq_f32_s32(w[j])), m));
}

/* y[0..15] = d * (float)q - m */
LI_INLINE void put_mul_sub(float *y, int8x16_t q, float32x4_t d, float32x4_t m) {
    int32x4_t w[4];
    widen_s8(q, w);
    for (int j = 0; j < 4; j++)
        vst1q_f32(y + 4 * j, vsubq_f32(vmulq_f32(d, vcvtq_f32_s32(w[j])), m));
}

static void f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t f[2];
        f16x8_to_f32(vld1q_u16(x + i), f);
        vst1q_f32(y + i, f[0]);
        vst1q_f32(y + i + 4, f[1]);
    }
    for (; i < n; i++) y[i] = li_f16_to_f32(x[i]);
}

static void dequant_f16(const void *src, float *y, int64_t k) {
    f16_to_f32((const uint16_t *)src, y, k);
}

static void dequant_bf16(const void *src, float *y, int64_t k) {
    const uint16_t *x = (const uint16_t *)src;
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) vst1q_f32(y + i, bf16x4_to_f32(x + i));
    for (; i < k; i++) y[i] = li_bf16_to_f32(x[i]);
}

static void dequant_q4_0(const void *src, float *y, int64_t k) {
    const block_q4_0 *b = (const block_q4_0 *)src;
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const float32x4_t d = vdupq_n_f32(h2f(b[i].d));
        int8x16_t q[2];
        decode_q4_0(&b[i], q);
        put_mul(y, q[0], d);
        put_mul(y + 16, q[1], d);
    }
}

static void dequant_q4_1(const void *src, float *y, int64_t k) {
    const block_q4_1 *b = (const block_q4_1 *)src;
    for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
        const float32x4_t d = vdupq_n_f32(h2f(b[i].d));
        const float32x4_t m = vdupq_n_f32(h2f(b[i].m));
        int8x16_t q[2];
        decode_q4_1(&b[i], q);
        put_mul_add(y, q[0], d, m);
        put_mul_add(y + 16, q[1], d, m);
    }
}

static void dequant_q5_0(const void *src, float *y, int64_t k) {
    const block_q5_0 *b = (const block_q5_0 *)src;
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const float32x4_t d = vdupq_n_f32(h2f(b[i].d));
        int8x16_t q[2];
        decode_q5_0(&b[i], q);
        put_mul(y, q[0], d);
        put_mul(y + 16, q[1], d);
    }
}

static void dequant_q5_1(const void *src, float *y, int64_t k) {
    const block_q5_1 *b = (const block_q5_1 *)src;
    for (int64_t i = 0; i < k / QK5_1; i++, y += QK5_1) {
        const float32x4_t d = vdupq_n_f32(h2f(b[i].d));
        const float32x4_t m = vdupq_n_f32(h2f(b[i].m));
        int8x16_t q[2];
        decode_q5_1(&b[i], q);
        put_mul_add(y, q[0], d, m);
        put_mul_add(y + 16, q[1], d, m);
    }
}

static void dequant_q8_0(const void *src, float *y, int64_t k) {
    const block_q8_0 *b = (const block_q8_0 *)src;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const float32x4_t d = vdupq_n_f32(h2f(b[i].d));
        int8x16_t q[2];
        decode_q8_0(&b[i], q);
        put_mul(y, q[0], d);
        put_mul(y + 16, q[1], d);
    }
}

static void dequant_q2_K(const void *src, float *y, int64_t k) {
    const block_q2_K *b = (const block_q2_K *)src;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            decode_q2_K_half(&b[i], h, q);
            for (int v = 0; v < 8; v++) {
                const int g = 8 * h + v;
                const float dl = d * (float)(b[i].scales[g] & 15);
                const float ml = dmin * (float)(b[i].scales[g] >> 4);
                put_mul_sub(y + 16 * g, q[v], vdupq_n_f32(dl), vdupq_n_f32(ml));
            }
        }
    }
}

static void dequant_q3_K(const void *src, float *y, int64_t k) {
    const block_q3_K *b = (const block_q3_K *)src;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = h2f(b[i].d);
        int8_t sc[16];
        vst1q_s8(sc, q3_K_scales(b[i].scales));
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            decode_q3_K_half(&b[i], h, q);
            for (int v = 0; v < 8; v++) {
                const int g = 8 * h + v;
                put_mul(y + 16 * g, q[v], vdupq_n_f32(d * (float)sc[g]));
            }
        }
    }
}

/* Q4_K / Q5_K: y = d * sc[j] * q - dmin * mn[j] over groups j of 32 */
LI_INLINE void put_k_half(float *y, const int8x16_t q[8], int h, const uint8_t sc[8],
                          const uint8_t mn[8], float d, float dmin) {
    for (int v = 0; v < 8; v++) {
        const int j = 4 * h + v / 2;
        const float dl = d * (float)sc[j], ml = dmin * (float)mn[j];
        put_mul_sub(y + 16 * v, q[v], vdupq_n_f32(dl), vdupq_n_f32(ml));
    }
}

static void dequant_q4_K(const void *src, float *y, int64_t k) {
    const block_q4_K *b = (const block_q4_K *)src;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        uint8_t sc[8], mn[8];
        k_scales(b[i].scales, sc, mn);
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            decode_q4_K_half(&b[i], h, q);
            put_k_half(y + 128 * h, q, h, sc, mn, d, dmin);
        }
    }
}

static void dequant_q5_K(const void *src, float *y, int64_t k) {
    const block_q5_K *b = (const block_q5_K *)src;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        uint8_t sc[8], mn[8];
        k_scales(b[i].scales, sc, mn);
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            decode_q5_K_half(&b[i], h, q);
            put_k_half(y + 128 * h, q, h, sc, mn, d, dmin);
        }
    }
}

static void dequant_q6_K(const void *src, float *y, int64_t k) {
    const block_q6_K *b = (const block_q6_K *)src;
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = h2f(b[i].d);
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            decode_q6_K_half(&b[i], h, q);
            for (int v = 0; v < 8; v++) {
                const int g = 8 * h + v;
                put_mul(y + 16 * g, q[v], vdupq_n_f32(d * (float)b[i].scales[g]));
            }
        }
    }
}

/* ---- activation quantization ---- */

/* max |x[j]| over n floats, n a multiple of 16 */
LI_INLINE float absmax16(const float *x, int n) {
    float32x4_t m[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int j = 0; j < n; j += 16)
        for (int r = 0; r < 4; r++) m[r] = vmaxq_f32(m[r], vabsq_f32(vld1q_f32(x + j + 4 * r)));
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(m[0], m[1]), vmaxq_f32(m[2], m[3])));
}

/* 16 values of (int8_t)lrintf(x * id): round half to even, then keep the low
 * byte as scalar.c's cast does. |x * id| <= 127 whenever id is finite; when
 * 1/d overflows (a subnormal d), x * id is +-inf or NaN, and the saturated
 * int32 (0x7fffffff, 0x80000000, 0) has the same low byte as lrintf's
 * saturated long, so a truncating narrow (not vqmovn) matches there too. */
LI_INLINE int8x16_t round16(const float *x, float id) {
    int32x4_t r[4];
    for (int j = 0; j < 4; j++) r[j] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4 * j), id));
    const int16x8_t lo = vcombine_s16(vmovn_s32(r[0]), vmovn_s32(r[1]));
    const int16x8_t hi = vcombine_s16(vmovn_s32(r[2]), vmovn_s32(r[3]));
    return vcombine_s8(vmovn_s16(lo), vmovn_s16(hi));
}

/* the scalar file's rounding (and llama.cpp's): id = 127/amax, round half to
 * even, scales kept at float16 precision */
LI_INLINE float f16_round(float v) { return li_f16_to_f32(li_f32_to_f16(v)); }

static void quant_act_q8_0(const float *x, void *dst, int64_t k) {
    act_q8_0 *y = (act_q8_0 *)dst;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        const float amax = absmax16(x, QK8_0), id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = f16_round(amax / 127.0f);
        vst1q_s8(y[i].qs, round16(x, id));
        vst1q_s8(y[i].qs + 16, round16(x + 16, id));
    }
}

static void quant_act_q8_1(const float *x, void *dst, int64_t k) {
    act_q8_1 *y = (act_q8_1 *)dst;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        const float amax = absmax16(x, QK8_0), id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const float d = amax / 127.0f;
        const int8x16_t q0 = round16(x, id), q1 = round16(x + 16, id);
        vst1q_s8(y[i].qs, q0);
        vst1q_s8(y[i].qs + 16, q1);
        const int sum = vaddlvq_s8(q0) + vaddlvq_s8(q1);
        y[i].d = f16_round(d);
        y[i].s = f16_round(d * (float)sum);
    }
}

static void quant_act_q8_K(const float *x, void *dst, int64_t k) {
    act_q8_K *y = (act_q8_K *)dst;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float amax = absmax16(x, QK_K);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float mx = amax; /* the first element of largest magnitude, signed */
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) == amax) {
                mx = x[j];
                break;
            }
        const float iscale = -127.0f / mx;
        y[i].d = 1.0f / iscale;
        for (int g = 0; g < QK_K / 16; g++) {
            const int8x16_t q = round16(x + 16 * g, iscale);
            vst1q_s8(y[i].qs + 16 * g, q);
            y[i].bsums[g] = vaddlvq_s8(q);
        }
    }
}

/* ---- dot products of float-format weights (F32, F16, BF16) ---- */

/* four weights at w[i..i+3] as floats; `type` is a constant after inlining */
LI_INLINE float32x4_t load_w4(const void *w, int64_t i, const int type) {
    if (type == LI_TYPE_F16) return f16x4_to_f32((const uint16_t *)w + i);
    if (type == LI_TYPE_BF16) return bf16x4_to_f32((const uint16_t *)w + i);
    return vld1q_f32((const float *)w + i);
}

LI_INLINE float load_w1(const void *w, int64_t i, const int type) {
    if (type == LI_TYPE_F16) return li_f16_to_f32(((const uint16_t *)w)[i]);
    if (type == LI_TYPE_BF16) return li_bf16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

/* sixteen weights at a time, converted once and used by every row */
LI_INLINE void dot_float_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                              float *s, const int type) {
    float32x4_t acc[4][4];
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 4; j++) acc[c][j] = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        float32x4_t wv[4];
        for (int j = 0; j < 4; j++) wv[j] = load_w4(w, i + 4 * j, type);
        for (int c = 0; c < nc; c++) {
            const float *xc = ACT_ROW(float, x, c, xs) + i;
            for (int j = 0; j < 4; j++) acc[c][j] = vfmaq_f32(acc[c][j], wv[j], vld1q_f32(xc + 4 * j));
        }
    }
    for (int c = 0; c < nc; c++) {
        const float *xc = ACT_ROW(float, x, c, xs);
        float t = vaddvq_f32(vaddq_f32(vaddq_f32(acc[c][0], acc[c][1]), vaddq_f32(acc[c][2], acc[c][3])));
        for (int64_t j = i; j < k; j++) t += load_w1(w, j, type) * xc[j];
        s[c] = t;
    }
}

LI_INLINE void dot_f32_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                            float *s) {
    dot_float_rows(k, w, x, xs, nc, s, LI_TYPE_F32);
}
LI_INLINE void dot_f16_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                            float *s) {
    dot_float_rows(k, w, x, xs, nc, s, LI_TYPE_F16);
}
LI_INLINE void dot_bf16_rows(int64_t k, const void *w, const void *x, size_t xs, const int nc,
                             float *s) {
    dot_float_rows(k, w, x, xs, nc, s, LI_TYPE_BF16);
}

static void dot_f32(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_f32_rows)
}
static void dot_f16(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_f16_rows)
}
static void dot_bf16(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    FOR_ROWS_BY_4(dot_bf16_rows)
}

/* ---- vector ops ---- */

static float vdot_f32(const float *a, const float *b, int64_t n) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 4; j++)
            acc[j] = vfmaq_f32(acc[j], vld1q_f32(a + i + 4 * j), vld1q_f32(b + i + 4 * j));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + i), vld1q_f32(b + i));
    float t = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

static float dot_f32_f16(const float *a, const uint16_t *b, int64_t n) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 4; j++)
            acc[j] = vfmaq_f32(acc[j], vld1q_f32(a + i + 4 * j), f16x4_to_f32(b + i + 4 * j));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + i), f16x4_to_f32(b + i));
    float t = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) t += a[i] * li_f16_to_f32(b[i]);
    return t;
}

/* y += a * x, as scalar.c: the product rounded, then the sum */
static void axpy_f16(float a, const uint16_t *x, float *y, int64_t n) {
    const float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(va, f16x4_to_f32(x + i))));
    for (; i < n; i++) y[i] += a * li_f16_to_f32(x[i]);
}

static void axpy_f32(float a, const float *x, float *y, int64_t n) {
    const float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(va, vld1q_f32(x + i))));
    for (; i < n; i++) y[i] += a * x[i];
}

static void f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vst1q_u16(y + i, f32x8_to_f16(vld1q_f32(x + i), vld1q_f32(x + i + 4)));
    for (; i < n; i++) y[i] = li_f32_to_f16(x[i]);
}

static void scale_f32(float *x, float a, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), a));
    for (; i < n; i++) x[i] *= a;
}

static void add_f32(const float *a, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
    for (; i < n; i++) y[i] = a[i] + b[i];
}

static void mul_f32(const float *a, const float *b, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vld1q_f32(a + i), vld1q_f32(b + i)));
    for (; i < n; i++) y[i] = a[i] * b[i];
}

/* sum of squares in double, as scalar.c (a float squared is exact in double,
 * so only the order of the additions differs), then y = x * scale * w */
static void rms_norm(const float *x, const float *w, float *y, int64_t k, float eps) {
    float64x2_t acc[2] = {vdupq_n_f64(0.0), vdupq_n_f64(0.0)};
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        const float64x2_t lo = vcvt_f64_f32(vget_low_f32(v)), hi = vcvt_high_f64_f32(v);
        acc[0] = vfmaq_f64(acc[0], lo, lo);
        acc[1] = vfmaq_f64(acc[1], hi, hi);
    }
    double ss = vaddvq_f64(vaddq_f64(acc[0], acc[1]));
    for (; i < k; i++) ss += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(ss / (double)k + (double)eps));
    const float32x4_t vs = vdupq_n_f32(scale);
    i = 0;
    if (w)
        for (; i + 4 <= k; i += 4)
            vst1q_f32(y + i, vmulq_f32(vmulq_f32(vld1q_f32(x + i), vs), vld1q_f32(w + i)));
    else
        for (; i + 4 <= k; i += 4) vst1q_f32(y + i, vmulq_f32(vld1q_f32(x + i), vs));
    for (; i < k; i++) y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

/* e^x for four floats, within 2 ulp of expf over the whole float range.
 * e^x = 2^n * e^r with n = round(x / ln 2) and |r| <= ln2 / 2; r is x - n ln2
 * with ln2 split in two (the first part has few bits, so n * it is exact);
 * e^r by its Taylor series to r^7 (truncation below 1e-8 relative); 2^n
 * applied as two factors 2^(n/2) and 2^(n - n/2), both normal for every n
 * the clamp allows, so that results in the subnormal range round once. */
LI_INLINE float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.8f)), vdupq_n_f32(-104.0f)); /* NaN stays NaN */
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t ni = vcvtq_s32_f32(n); /* in [-150, 128] */
    const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

static void softmax(float *x, int64_t k) {
    float32x4_t vm = vdupq_n_f32(-INFINITY);
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) vm = vmaxq_f32(vm, vld1q_f32(x + i));
    float mx = vmaxvq_f32(vm);
    for (; i < k; i++) mx = LI_MAX(mx, x[i]);
    const float32x4_t vmx = vdupq_n_f32(mx);
    float64x2_t acc = vdupq_n_f64(0.0);
    double sum = 0.0;
    for (i = 0; i + 4 <= k; i += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), vmx));
        vst1q_f32(x + i, e);
        acc = vaddq_f64(acc, vaddq_f64(vcvt_f64_f32(vget_low_f32(e)), vcvt_high_f64_f32(e)));
    }
    for (; i < k; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    sum += vaddvq_f64(acc);
    const float inv = (float)(1.0 / sum);
    scale_f32(x, inv, k);
}

/* The F16 index of each x goes through the conversion unit; the table reads
 * are scalar (NEON has no gather). */

/* tanh of 4 floats: x86_avx2.c's tanh_ps (Eigen's rational approximation,
 * within 4e-7 relative of tanh); FMIN/FMAX return NaN when x is */
LI_INLINE float32x4_t tanh_f32x4(float32x4_t x) {
    const float32x4_t c = vdupq_n_f32(7.99881172180175781f);
    const float32x4_t xc = vmaxq_f32(vnegq_f32(c), vminq_f32(c, x));
    const float32x4_t x2 = vmulq_f32(xc, xc);
    float32x4_t p = vfmaq_f32(vdupq_n_f32(2.00018790482477e-13f), x2, vdupq_n_f32(-2.76076847742355e-16f));
    p = vfmaq_f32(vdupq_n_f32(-8.60467152213735e-11f), x2, p);
    p = vfmaq_f32(vdupq_n_f32(5.12229709037114e-08f), x2, p);
    p = vfmaq_f32(vdupq_n_f32(1.48572235717979e-05f), x2, p);
    p = vfmaq_f32(vdupq_n_f32(6.37261928875436e-04f), x2, p);
    p = vfmaq_f32(vdupq_n_f32(4.89352455891786e-03f), x2, p);
    p = vmulq_f32(xc, p);
    float32x4_t q = vfmaq_f32(vdupq_n_f32(1.18534705686654e-04f), x2, vdupq_n_f32(1.19825839466702e-06f));
    q = vfmaq_f32(vdupq_n_f32(2.26843463243900e-03f), x2, q);
    q = vfmaq_f32(vdupq_n_f32(4.89352518554385e-03f), x2, q);
    return vbslq_f32(vcltq_f32(vabsq_f32(x), vdupq_n_f32(0.0004f)), x, vdivq_f32(p, q));
}

LI_INLINE float32x4_t softcap_f32x4(float32x4_t v, float scale, float32x4_t cap, int capped) {
    const float32x4_t z = vmulq_n_f32(v, scale);
    return capped ? vmulq_f32(cap, tanh_f32x4(vdivq_f32(z, cap))) : z;
}

/* the last n % 4 through the same vector steps (in a buffer), as x86_avx2.c's */
static void softcap_f32(float *x, int64_t n, float scale, float cap) {
    const float32x4_t vc = vdupq_n_f32(cap);
    const int capped = cap > 0.0f;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, softcap_f32x4(vld1q_f32(x + i), scale, vc, capped));
    if (i < n) {
        float t[4] = {0};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        vst1q_f32(t, softcap_f32x4(vld1q_f32(t), scale, vc, capped));
        memcpy(x + i, t, (size_t)(n - i) * sizeof(float));
    }
}

void li_kernels_fill_neon(li_kernels *t) {
    li_kernels_fill_scalar(t);
    t->dequant[LI_TYPE_F16] = dequant_f16;
    t->dequant[LI_TYPE_BF16] = dequant_bf16;
    t->dequant[LI_TYPE_Q4_0] = dequant_q4_0;
    t->dequant[LI_TYPE_Q4_1] = dequant_q4_1;
    t->dequant[LI_TYPE_Q5_0] = dequant_q5_0;
    t->dequant[LI_TYPE_Q5_1] = dequant_q5_1;
    t->dequant[LI_TYPE_Q8_0] = dequant_q8_0;
    t->dequant[LI_TYPE_Q2_K] = dequant_q2_K;
    t->dequant[LI_TYPE_Q3_K] = dequant_q3_K;
    t->dequant[LI_TYPE_Q4_K] = dequant_q4_K;
    t->dequant[LI_TYPE_Q5_K] = dequant_q5_K;
    t->dequant[LI_TYPE_Q6_K] = dequant_q6_K;
    t->dot[LI_TYPE_F32] = dot_f32;
    t->dot[LI_TYPE_F16] = dot_f16;
    t->dot[LI_TYPE_BF16] = dot_bf16;
    set_quant_dots(t);
    t->quant_act[LI_ACT_Q8_0] = quant_act_q8_0;
    t->quant_act[LI_ACT_Q8_1] = quant_act_q8_1;
    t->quant_act[LI_ACT_Q8_K] = quant_act_q8_K;
    li_kernels_fill_neon_iq(t); /* arm_neon_iq.c: the i-quants, ternary types and MXFP4 */
    t->rms_norm = rms_norm;
    t->softmax = softmax;
    t->dot_f32_f16 = dot_f32_f16;
    t->axpy_f16 = axpy_f16;
    t->f32_to_f16 = f32_to_f16;
    t->f16_to_f32 = f16_to_f32;
    t->dot_f32 = vdot_f32;
    t->axpy_f32 = axpy_f32;
    t->scale_f32 = scale_f32;
    t->add_f32 = add_f32;
    t->mul_f32 = mul_f32;
    t->softcap_f32 = softcap_f32;
    li_recurrent_fill_neon(t); /* arm_neon_recurrent.c: the recurrent mixers */
    t->isa = LI_ISA_NEON;
}
#elif defined(LI_ARCH_ARM64)
/* big-endian aarch64: the table stays scalar and dispatch skips the level */
void li_kernels_fill_neon(li_kernels *t) { li_kernels_fill_scalar(t); }
#else
typedef int li_empty_translation_unit;
#endif
