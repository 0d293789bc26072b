/* scalar.c: the reference kernels, in plain C loops. They are the
 * specification every SIMD level is tested against, and the level used on a
 * CPU without one. No intrinsics, no #if.
 *
 * Each weight type has one `unpack_*` (unpack.h) that turns a block into
 * small integers and its scales; dequantization, the dot product and the
 * prefill panels (gemm.c) are all written over that, so each layout is
 * spelled out once. Dequantization performs the same
 * float operations, in the same order, as gguf's numpy code, so the results
 * are bit-identical (this file is built with -ffp-contract=off).
 */
#include <math.h>

#include "../common.h"
#include "kernels.h"
#include "unpack.h"

/* ---- dequantization ---- */

static void dequant_f32(const void *src, float *y, int64_t k) { memcpy(y, src, (size_t)k * 4); }

static void dequant_f16(const void *src, float *y, int64_t k) {
    const uint16_t *x = (const uint16_t *)src;
    for (int64_t i = 0; i < k; i++) y[i] = li_f16_to_f32(x[i]);
}

static void dequant_bf16(const void *src, float *y, int64_t k) {
    const uint16_t *x = (const uint16_t *)src;
    for (int64_t i = 0; i < k; i++) y[i] = li_bf16_to_f32(x[i]);
}

static void dequant_q4_0(const void *src, float *y, int64_t k) {
    const block_q4_0 *b = (const block_q4_0 *)src;
    int8_t q[QK4_0];
    for (int64_t i = 0; i < k / QK4_0; i++, y += QK4_0) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_q4_0(&b[i], q);
        for (int j = 0; j < QK4_0; j++) y[j] = d * (float)q[j];
    }
}

static void dequant_q4_1(const void *src, float *y, int64_t k) {
    const block_q4_1 *b = (const block_q4_1 *)src;
    int8_t q[QK4_1];
    for (int64_t i = 0; i < k / QK4_1; i++, y += QK4_1) {
        const float d = li_f16_to_f32(b[i].d), m = li_f16_to_f32(b[i].m);
        unpack_q4_1(&b[i], q);
        for (int j = 0; j < QK4_1; j++) y[j] = d * (float)q[j] + m;
    }
}

static void dequant_q5_0(const void *src, float *y, int64_t k) {
    const block_q5_0 *b = (const block_q5_0 *)src;
    int8_t q[QK5_0];
    for (int64_t i = 0; i < k / QK5_0; i++, y += QK5_0) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_5bit(b[i].qh, b[i].qs, q);
        for (int j = 0; j < QK5_0; j++) y[j] = d * (float)(q[j] - 16);
    }
}

static void dequant_q5_1(const void *src, float *y, int64_t k) {
    const block_q5_1 *b = (const block_q5_1 *)src;
    int8_t q[QK5_1];
    for (int64_t i = 0; i < k / QK5_1; i++, y += QK5_1) {
        const float d = li_f16_to_f32(b[i].d), m = li_f16_to_f32(b[i].m);
        unpack_5bit(b[i].qh, b[i].qs, q);
        for (int j = 0; j < QK5_1; j++) y[j] = d * (float)q[j] + m;
    }
}

static void dequant_q8_0(const void *src, float *y, int64_t k) {
    const block_q8_0 *b = (const block_q8_0 *)src;
    for (int64_t i = 0; i < k / QK8_0; i++, y += QK8_0) {
        const float d = li_f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = d * (float)b[i].qs[j];
    }
}

static void dequant_q2_K(const void *src, float *y, int64_t k) {
    const block_q2_K *b = (const block_q2_K *)src;
    int8_t q[QK_K];
    int sc[16], mn[16];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = li_f16_to_f32(b[i].d), dmin = li_f16_to_f32(b[i].dmin);
        unpack_q2_K(&b[i], q, sc, mn);
        for (int g = 0; g < 16; g++) {
            const float dl = d * (float)sc[g], ml = dmin * (float)mn[g];
            for (int l = 0; l < 16; l++) y[16 * g + l] = dl * (float)q[16 * g + l] - ml;
        }
    }
}

static void dequant_q3_K(const void *src, float *y, int64_t k) {
    const block_q3_K *b = (const block_q3_K *)src;
    int8_t q[QK_K];
    int sc[16];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_q3_K(&b[i], q, sc);
        for (int g = 0; g < 16; g++) {
            const float dl = d * (float)sc[g];
            for (int l = 0; l < 16; l++) y[16 * g + l] = dl * (float)q[16 * g + l];
        }
    }
}

/* Q4_K and Q5_K differ only in how q is unpacked */
static void dequant_k_groups32(const int8_t q[QK_K], const int sc[8], const int mn[8], float d,
                               float dmin, float *y) {
    for (int j = 0; j < 8; j++) {
        const float dl = d * (float)sc[j], ml = dmin * (float)mn[j];
        for (int l = 0; l < 32; l++) y[32 * j + l] = dl * (float)q[32 * j + l] - ml;
    }
}

static void dequant_q4_K(const void *src, float *y, int64_t k) {
    const block_q4_K *b = (const block_q4_K *)src;
    int8_t q[QK_K];
    int sc[8], mn[8];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        unpack_q4_K(&b[i], q, sc, mn);
        dequant_k_groups32(q, sc, mn, li_f16_to_f32(b[i].d), li_f16_to_f32(b[i].dmin), y);
    }
}

static void dequant_q5_K(const void *src, float *y, int64_t k) {
    const block_q5_K *b = (const block_q5_K *)src;
    int8_t q[QK_K];
    int sc[8], mn[8];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        unpack_q5_K(&b[i], q, sc, mn);
        dequant_k_groups32(q, sc, mn, li_f16_to_f32(b[i].d), li_f16_to_f32(b[i].dmin), y);
    }
}

static void dequant_q6_K(const void *src, float *y, int64_t k) {
    const block_q6_K *b = (const block_q6_K *)src;
    int8_t q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_q6_K(&b[i], q);
        for (int g = 0; g < 16; g++) {
            const float dl = d * (float)b[i].scales[g];
            for (int l = 0; l < 16; l++) y[16 * g + l] = dl * (float)q[16 * g + l];
        }
    }
}

/* ---- activation quantization ----
 * The same rounding as llama.cpp's x86 path, so that llminfer and llama.cpp
 * feed identical integers to the dot products and agree to the last token:
 * q = round-half-even(x * 127/amax); the Q8_0/Q8_1 scale and Q8_1's sum are
 * stored rounded to float16 (ggml keeps them as f16); Q8_K maps the element
 * of largest magnitude to -127 and keeps d = 1/iscale in float. */

static int8_t round_q8(float v) { return (int8_t)lrintf(v); }

static float f16_round(float v) { return li_f16_to_f32(li_f32_to_f16(v)); }

static void quant_act_f32(const float *x, void *dst, int64_t k) { memcpy(dst, x, (size_t)k * 4); }

static float absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = LI_MAX(amax, fabsf(x[j]));
    return amax;
}

static void quant_act_q8_0(const float *x, void *dst, int64_t k) {
    act_q8_0 *y = (act_q8_0 *)dst;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        const float amax = absmax(x, QK8_0);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[i].d = f16_round(amax / 127.0f);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = round_q8(x[j] * id);
    }
}

static void quant_act_q8_1(const float *x, void *dst, int64_t k) {
    act_q8_1 *y = (act_q8_1 *)dst;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        const float amax = absmax(x, QK8_0);
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK8_0; j++) {
            y[i].qs[j] = round_q8(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = f16_round(d);
        y[i].s = f16_round(d * (float)sum);
    }
}

static void quant_act_q8_K(const float *x, void *dst, int64_t k) {
    act_q8_K *y = (act_q8_K *)dst;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float amax = 0.0f, mx = 0.0f; /* the first element of largest magnitude, signed */
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                mx = x[j];
            }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -127.0f / mx;
        y[i].d = 1.0f / iscale;
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) {
                const int v = (int)lrintf(iscale * x[16 * g + l]);
                y[i].qs[16 * g + l] = (int8_t)LI_MIN(127, v);
                sum += y[i].qs[16 * g + l];
            }
            y[i].bsums[g] = (int16_t)sum;
        }
    }
}

/* ---- dot products: one weight row against nc activation rows ----
 *
 * The quantized products are specified here, and every level computes the
 * same thing to the bit, so that a row's result never depends on which
 * kernel (decode, small batch, prefill panel), which column group, thread
 * or row group it went through. Per block (32 values; a 256-value
 * super-block for the K-quants) an exact integer dot product, then one fused
 * multiply-add per block into the row's float sum, blocks in order:
 *
 *   Q4_0, Q5_0, Q8_0, Q3_K, Q6_K  acc = fmaf(isum, d * dx, acc)
 *   Q4_1, Q5_1                    acc = fmaf(isum, d * dx, acc); acc = fmaf(m, sx, acc)
 *   Q2_K, Q4_K, Q5_K              acc = fmaf(isum, d * dx, acc); acc = fmaf(-imin, dmin * dx, acc)
 *
 * isum: sum of q * qx over the block, q the signed value (Q4_0's q - 8,
 * Q3_K's and Q6_K's offsets included), times the integer sub-scales for
 * K-quants; imin: sum of the integer mins times the activation's group sums.
 * Both are exact in int32 (at most 256 * 63 * 127 * 128 < 2^31), so the
 * order in which a SIMD kernel adds them does not matter; the float steps
 * it must repeat exactly. fmaf is explicit (this file is built with
 * -ffp-contract=off): the SIMD levels have fused multiply-adds and use them.
 * Float weights (F32, F16, BF16) have one kernel per level, with the same
 * operations for every column, and may differ between levels. */

static int32_t idot(const int8_t *a, const int8_t *b, int n) {
    int32_t s = 0;
    for (int j = 0; j < n; j++) s += (int32_t)a[j] * b[j];
    return s;
}

static void dot_f32(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    for (int c = 0; c < nc; c++) {
        const float *a = (const float *)w, *b = ACT_ROW(float, x, c, xs);
        float acc = 0.0f;
        for (int64_t i = 0; i < k; i++) acc += a[i] * b[i];
        s[c] = acc;
    }
}

static void dot_f16(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    for (int c = 0; c < nc; c++) {
        const uint16_t *a = (const uint16_t *)w;
        const float *b = ACT_ROW(float, x, c, xs);
        float acc = 0.0f;
        for (int64_t i = 0; i < k; i++) acc += li_f16_to_f32(a[i]) * b[i];
        s[c] = acc;
    }
}

static void dot_bf16(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    for (int c = 0; c < nc; c++) {
        const uint16_t *a = (const uint16_t *)w;
        const float *b = ACT_ROW(float, x, c, xs);
        float acc = 0.0f;
        for (int64_t i = 0; i < k; i++) acc += li_bf16_to_f32(a[i]) * b[i];
        s[c] = acc;
    }
}

/* 32-element blocks with a symmetric scale: q4_0, q5_0, q8_0 against act_q8_0 */
static void dot_q4_0(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q4_0 *b = (const block_q4_0 *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK4_0];
    for (int64_t i = 0; i < k / QK4_0; i++) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_q4_0(&b[i], q);
        for (int c = 0; c < nc; c++) {
            const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i;
            acc[c] = fmaf((float)idot(q, a->qs, QK4_0), d * a->d, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dot_q5_0(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q5_0 *b = (const block_q5_0 *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK5_0];
    for (int64_t i = 0; i < k / QK5_0; i++) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_5bit(b[i].qh, b[i].qs, q);
        for (int j = 0; j < QK5_0; j++) q[j] = (int8_t)(q[j] - 16);
        for (int c = 0; c < nc; c++) {
            const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i;
            acc[c] = fmaf((float)idot(q, a->qs, QK5_0), d * a->d, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dot_q8_0(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q8_0 *b = (const block_q8_0 *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    for (int64_t i = 0; i < k / QK8_0; i++) {
        const float d = li_f16_to_f32(b[i].d);
        for (int c = 0; c < nc; c++) {
            const act_q8_0 *a = ACT_ROW(act_q8_0, x, c, xs) + i;
            acc[c] = fmaf((float)idot(b[i].qs, a->qs, QK8_0), d * a->d, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

/* 32-element blocks with a min: q4_1, q5_1 against act_q8_1: d*dx*sum(q*qx) + m*sx */
static void dot_q4_1(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q4_1 *b = (const block_q4_1 *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK4_1];
    for (int64_t i = 0; i < k / QK4_1; i++) {
        const float d = li_f16_to_f32(b[i].d), m = li_f16_to_f32(b[i].m);
        unpack_q4_1(&b[i], q);
        for (int c = 0; c < nc; c++) {
            const act_q8_1 *a = ACT_ROW(act_q8_1, x, c, xs) + i;
            acc[c] = fmaf((float)idot(q, a->qs, QK4_1), d * a->d, acc[c]);
            acc[c] = fmaf(m, a->s, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dot_q5_1(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q5_1 *b = (const block_q5_1 *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK5_1];
    for (int64_t i = 0; i < k / QK5_1; i++) {
        const float d = li_f16_to_f32(b[i].d), m = li_f16_to_f32(b[i].m);
        unpack_5bit(b[i].qh, b[i].qs, q);
        for (int c = 0; c < nc; c++) {
            const act_q8_1 *a = ACT_ROW(act_q8_1, x, c, xs) + i;
            acc[c] = fmaf((float)idot(q, a->qs, QK5_1), d * a->d, acc[c]);
            acc[c] = fmaf(m, a->s, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

/* K-quants against act_q8_K: sum over groups of scale * sum(q*qx), minus the
 * min terms, which use the activation's per-16 sums (bsums). */
static void dot_q2_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q2_K *b = (const block_q2_K *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK_K];
    int sc[16], mn[16];
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = li_f16_to_f32(b[i].d), dmin = li_f16_to_f32(b[i].dmin);
        unpack_q2_K(&b[i], q, sc, mn);
        for (int c = 0; c < nc; c++) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            int32_t isum = 0, imin = 0;
            for (int g = 0; g < 16; g++) {
                isum += sc[g] * idot(q + 16 * g, a->qs + 16 * g, 16);
                imin += mn[g] * a->bsums[g];
            }
            acc[c] = fmaf((float)isum, d * a->d, acc[c]);
            acc[c] = fmaf(-(float)imin, dmin * a->d, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dot_q3_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q3_K *b = (const block_q3_K *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK_K];
    int sc[16];
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_q3_K(&b[i], q, sc);
        for (int c = 0; c < nc; c++) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            int32_t isum = 0;
            for (int g = 0; g < 16; g++) isum += sc[g] * idot(q + 16 * g, a->qs + 16 * g, 16);
            acc[c] = fmaf((float)isum, d * a->d, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static float dot_k_groups32(const int8_t q[QK_K], const int sc[8], const int mn[8], float d,
                            float dmin, const act_q8_K *a, float acc) {
    int32_t isum = 0, imin = 0;
    for (int j = 0; j < 8; j++) {
        isum += sc[j] * idot(q + 32 * j, a->qs + 32 * j, 32);
        imin += mn[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    acc = fmaf((float)isum, d * a->d, acc);
    return fmaf(-(float)imin, dmin * a->d, acc);
}

static void dot_q4_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q4_K *b = (const block_q4_K *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK_K];
    int sc[8], mn[8];
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = li_f16_to_f32(b[i].d), dmin = li_f16_to_f32(b[i].dmin);
        unpack_q4_K(&b[i], q, sc, mn);
        for (int c = 0; c < nc; c++)
            acc[c] = dot_k_groups32(q, sc, mn, d, dmin, ACT_ROW(act_q8_K, x, c, xs) + i, acc[c]);
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dot_q5_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q5_K *b = (const block_q5_K *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK_K];
    int sc[8], mn[8];
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = li_f16_to_f32(b[i].d), dmin = li_f16_to_f32(b[i].dmin);
        unpack_q5_K(&b[i], q, sc, mn);
        for (int c = 0; c < nc; c++)
            acc[c] = dot_k_groups32(q, sc, mn, d, dmin, ACT_ROW(act_q8_K, x, c, xs) + i, acc[c]);
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

static void dot_q6_K(int64_t k, const void *w, const void *x, size_t xs, int nc, float *s) {
    const block_q6_K *b = (const block_q6_K *)w;
    float acc[LI_DOT_MAX_NC] = {0};
    int8_t q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = li_f16_to_f32(b[i].d);
        unpack_q6_K(&b[i], q);
        for (int c = 0; c < nc; c++) {
            const act_q8_K *a = ACT_ROW(act_q8_K, x, c, xs) + i;
            int32_t isum = 0;
            for (int g = 0; g < 16; g++)
                isum += b[i].scales[g] * idot(q + 16 * g, a->qs + 16 * g, 16);
            acc[c] = fmaf((float)isum, d * a->d, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c] = acc[c];
}

/* ---- vector ops ---- */

static void rms_norm(const float *x, const float *w, float *y, int64_t k, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < k; i++) ss += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(ss / (double)k + (double)eps));
    if (w)
        for (int64_t i = 0; i < k; i++) y[i] = x[i] * scale * w[i];
    else
        for (int64_t i = 0; i < k; i++) y[i] = x[i] * scale;
}

static void softmax(float *x, int64_t k) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < k; i++) mx = LI_MAX(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < k; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < k; i++) x[i] *= inv;
}

static float act_one(int fn, float x) {
    if (fn == LI_FN_SILU) {
        if (x >= LI_SILU_HI) return x;
        if (x <= LI_SILU_LO) return 0.0f;
        const uint16_t h = li_f32_to_f16(x);
        return li_lut_silu[h] + li_lut_silu_slope[h] * (x - li_f16_to_f32(h));
    }
    if (x >= LI_GELU_HI) return x;
    if (x <= LI_GELU_LO) return 0.0f;
    return li_lut_gelu[li_f32_to_f16(x)];
}

void li_act_apply_scalar(int fn, const float *x, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float v = act_one(fn, x[i]);
        y[i] = u ? v * u[i] : v;
    }
}

#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f
void li_swiglu_oai(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = OAI_LIMIT < g[i] ? OAI_LIMIT : g[i]; /* std::min(g, limit): a NaN stays NaN */
        const float v = u[i] < -OAI_LIMIT ? -OAI_LIMIT : (OAI_LIMIT < u[i] ? OAI_LIMIT : u[i]); /* std::clamp */
        const float glu = x / (1.0f + expf(OAI_ALPHA * (-x)));
        y[i] = glu * (v + 1.0f);
    }
}

void li_gate_apply(int fn, const float *g, const float *u, float *y, int64_t n) {
    if (fn == LI_FN_SWIGLU_OAI)
        li_swiglu_oai(g, u, y, n);
    else
        li_K->act_apply(fn, g, u, y, n);
}

static float dot_f32_f16(const float *a, const uint16_t *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * li_f16_to_f32(b[i]);
    return acc;
}

static void axpy_f16(float a, const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * li_f16_to_f32(x[i]);
}

static void f32_to_f16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = li_f32_to_f16(x[i]);
}

static void f16_to_f32(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = li_f16_to_f32(x[i]);
}

static float vdot_f32(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void axpy_f32(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void scale_f32(float *x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

static void add_f32(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

static void mul_f32(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

static void attn_scores_f16(const float *q, size_t q_stride, int nh, const uint16_t *k, size_t stride,
                            int64_t n, int64_t d, float scale, float *out, size_t out_ld) {
    for (int h = 0; h < nh; h++)
        for (int64_t j = 0; j < n; j++)
            out[(size_t)h * out_ld + (size_t)j] =
                scale * dot_f32_f16(q + (size_t)h * q_stride, k + (size_t)j * stride, d);
}

static void attn_accum_f16(const float *p, size_t p_ld, int nh, const uint16_t *v, size_t stride,
                           int64_t n, int64_t d, float *out, size_t out_stride) {
    for (int h = 0; h < nh; h++)
        for (int64_t j = 0; j < n; j++)
            axpy_f16(p[(size_t)h * p_ld + (size_t)j], v + (size_t)j * stride, out + (size_t)h * out_stride, d);
}

static void range_f32(const float *x, int64_t n, float *lo, float *hi) {
    float a = x[0], b = x[0];
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        nan |= x[i] != x[i];
        a = x[i] < a ? x[i] : a;
        b = x[i] > b ? x[i] : b;
    }
    *lo = nan ? NAN : a;
    *hi = nan ? NAN : b;
}

static float exp_sum(float *x, int64_t n, float mx) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    return (float)sum;
}

static void softcap_f32(float *x, int64_t n, float scale, float cap) {
    for (int64_t i = 0; i < n; i++) {
        float z = x[i] * scale;
        if (cap > 0.0f) z = cap * tanhf(z / cap);
        x[i] = z;
    }
}

/* the float GEMM's register tile (sgemm.h): per element, fmaf over the
 * values in order, so the SIMD tiles can match it to the bit */
static void sgemm_tile_f32(int64_t kc, const float *a, const void *bv, float *c, size_t ldc, int load) {
    const float *b = (const float *)bv;
    for (int r = 0; r < LI_SGEMM_MR; r++)
        for (int j = 0; j < LI_SGEMM_NR; j++) {
            float acc = load ? c[(size_t)r * ldc + j] : 0.0f;
            for (int64_t kk = 0; kk < kc; kk++) acc = fmaf(a[kk * LI_SGEMM_MR + r], b[kk * LI_SGEMM_NR + j], acc);
            c[(size_t)r * ldc + j] = acc;
        }
}

static void sgemm_tile_f16(int64_t kc, const float *a, const void *bv, float *c, size_t ldc, int load) {
    const uint16_t *b = (const uint16_t *)bv;
    for (int r = 0; r < LI_SGEMM_MR; r++)
        for (int j = 0; j < LI_SGEMM_NR; j++) {
            float acc = load ? c[(size_t)r * ldc + j] : 0.0f;
            for (int64_t kk = 0; kk < kc; kk++)
                acc = fmaf(a[kk * LI_SGEMM_MR + r], li_f16_to_f32(b[kk * LI_SGEMM_NR + j]), acc);
            c[(size_t)r * ldc + j] = acc;
        }
}

static void softmax_panel(float *p, int64_t n, float *sum) {
    for (int j = 0; j < LI_SGEMM_NR; j++) {
        float mx = p[j];
        for (int64_t i = 1; i < n; i++) mx = p[i * LI_SGEMM_NR + j] > mx ? p[i * LI_SGEMM_NR + j] : mx;
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) {
            float *e = p + i * LI_SGEMM_NR + j;
            *e = expf(*e - mx);
            s += *e;
        }
        sum[j] = (float)s;
    }
}

void li_kernels_fill_scalar(li_kernels *t) {
    memset(t, 0, sizeof(*t));
    t->isa = LI_ISA_SCALAR;
#define SET(T, name)                             \
    t->dequant[LI_TYPE_##T] = dequant_##name;    \
    t->dot[LI_TYPE_##T] = dot_##name;
    SET(F32, f32) SET(F16, f16) SET(BF16, bf16);
    SET(Q4_0, q4_0) SET(Q4_1, q4_1) SET(Q5_0, q5_0) SET(Q5_1, q5_1) SET(Q8_0, q8_0);
    SET(Q2_K, q2_K) SET(Q3_K, q3_K) SET(Q4_K, q4_K) SET(Q5_K, q5_K) SET(Q6_K, q6_K);
#undef SET
    li_kernels_fill_scalar_iq(t); /* scalar_iq.c: the i-quants, ternary types and MXFP4 */
    t->quant_act[LI_ACT_F32] = quant_act_f32;
    t->quant_act[LI_ACT_Q8_0] = quant_act_q8_0;
    t->quant_act[LI_ACT_Q8_1] = quant_act_q8_1;
    t->quant_act[LI_ACT_Q8_K] = quant_act_q8_K;
    t->rms_norm = rms_norm;
    t->softmax = softmax;
    t->act_apply = li_act_apply_scalar;
    t->dot_f32_f16 = dot_f32_f16;
    t->axpy_f16 = axpy_f16;
    t->f32_to_f16 = f32_to_f16;
    t->f16_to_f32 = f16_to_f32;
    t->dot_f32 = vdot_f32;
    t->axpy_f32 = axpy_f32;
    t->scale_f32 = scale_f32;
    t->add_f32 = add_f32;
    t->mul_f32 = mul_f32;
    t->attn_scores_f16 = attn_scores_f16;
    t->attn_accum_f16 = attn_accum_f16;
    t->exp_sum = exp_sum;
    t->range_f32 = range_f32;
    t->softcap_f32 = softcap_f32;
    t->sgemm_tile[LI_SGEMM_F32] = sgemm_tile_f32;
    t->sgemm_tile[LI_SGEMM_F16] = sgemm_tile_f16;
    t->softmax_panel = softmax_panel;
    li_recurrent_fill_scalar(t); /* scalar_recurrent.c: the recurrent mixers */
}
