/* quantize_iq.c: float rows to IQ4_NL and IQ4_XS, our own quantizer.
 *
 * Both store 4-bit indices into the non-linear table kvalues_iq4nl (-127 ..
 * 113, denser near zero) and a scale per 32 values. As the table is not
 * symmetric, the scale's sign matters, and the plain absmax / 127 scale is
 * not the best one. So each block's scale is searched: for candidate scales
 * that put the block's largest value at or near either end of the table
 * (2 x 15 candidates), every value takes its nearest level and the scale is
 * refit by weighted least squares, d = sum(w q x) / sum(w q^2); the candidate
 * with the lowest weighted squared error, sum(w x^2) - (sum(w q x))^2 /
 * sum(w q^2), wins. The weights w = x^2 + mean(x^2) of the block favour the
 * large values, which matter most for the products, without ignoring the
 * small ones. (This is the search llama.cpp describes for its IQ4
 * quantizer; the code is ours.)
 *
 * IQ4_NL stores the scale as float16; IQ4_XS stores a float16 d per 256
 * values and a 6-bit l in [-32, 31] per 32, scale d * l: d is set so that
 * the block scale of largest magnitude is exactly d * -32, and the other
 * scales are rounded to their nearest multiple. In both, the indices are
 * finally chosen against the scales actually stored.
 */
#include <math.h>

#include "common.h"
#include "kernels/kernels.h"
#include "kernels/iq_tables.h"
#include "quantize.h"

#define NL_CANDIDATES 7 /* candidates on each side of each end of the table */

/* The nearest level of the 16-entry table to a value v, for |v| up to 128:
 * the levels are integers, so the midpoints between them are multiples of
 * 1/2, and the nearest level is the same over each half-open half-unit
 * [h/2, (h+1)/2); a midpoint itself goes to the level above. A table over h
 * (levels_lut) makes the search a lookup; values beyond it take the ends. */
#define LUT_HALF 256 /* half-units on each side of 0 */

typedef struct {
    const int8_t *t;
    uint8_t idx[2 * LUT_HALF];
} levels_lut;

static void levels_lut_init(levels_lut *L, const int8_t *t) {
    L->t = t;
    for (int h = -LUT_HALF; h < LUT_HALF; h++) {
        const float v = (float)h * 0.5f + 0.25f; /* inside half-unit h */
        int best = 0;
        for (int i = 1; i < 16; i++)
            if (fabsf(v - (float)t[i]) < fabsf(v - (float)t[best])) best = i;
        L->idx[h + LUT_HALF] = (uint8_t)best;
    }
}

static int nearest_level(const levels_lut *L, float v) {
    if (!(v > -(float)(LUT_HALF / 2))) return 0; /* also NaN */
    if (v >= (float)(LUT_HALF / 2)) return 15;
    return L->idx[(int)floorf(2.0f * v) + LUT_HALF];
}

/* the best scale of n values x with weights w (0 for an all-zero block) */
static float fit_nl_scale(const float *x, const float *w, int n, const levels_lut *L) {
    const int8_t *t = L->t;
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    if (!(amax > 1e-30f)) return 0.0f;
    float best_d = 0.0f, best_gain = -1.0f; /* gain = sum(wqx)^2 / sum(wq^2): error reduction */
    for (int end = 0; end < 2; end++)
        for (int s = -NL_CANDIDATES; s <= NL_CANDIDATES; s++) {
            const float target = (float)(end ? t[15] : t[0]) + (float)s;
            const float id = target / mx;
            float sqx = 0.0f, sq2 = 0.0f;
            for (int j = 0; j < n; j++) {
                const float q = (float)t[nearest_level(L, id * x[j])];
                sqx += w[j] * q * x[j];
                sq2 += w[j] * q * q;
            }
            if (sq2 > 0.0f && sqx * sqx / sq2 > best_gain) {
                best_gain = sqx * sqx / sq2;
                best_d = sqx / sq2;
            }
        }
    return best_d;
}

static void block_weights(const float *x, int n, float sigma2, float *w) {
    for (int j = 0; j < n; j++) w[j] = x[j] * x[j] + sigma2;
}

static float mean_square(const float *x, int n) {
    double s = 0.0;
    for (int j = 0; j < n; j++) s += (double)x[j] * x[j];
    return (float)(s / n);
}

/* 32 values against scale d into 16 bytes of indices, Q4_0's nibble order */
static void put_indices(const float *x, float d, const levels_lut *L, uint8_t qs[16]) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++) {
        const int lo = nearest_level(L, x[j] * id);
        const int hi = nearest_level(L, x[j + 16] * id);
        qs[j] = (uint8_t)(lo | hi << 4);
    }
}

void li_quantize_iq4_nl(const float *x, void *dst, int64_t k) {
    block_iq4_nl *y = (block_iq4_nl *)dst;
    levels_lut L;
    levels_lut_init(&L, li_kvalues_iq4nl);
    float w[32];
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
        block_weights(x, 32, mean_square(x, 32), w);
        y[i].d = li_f32_to_f16(fit_nl_scale(x, w, 32, &L));
        put_indices(x, li_f16_to_f32(y[i].d), &L, y[i].qs);
    }
}

void li_quantize_iq4_xs(const float *x, void *dst, int64_t k) {
    block_iq4_xs *y = (block_iq4_xs *)dst;
    levels_lut L;
    levels_lut_init(&L, li_kvalues_iq4nl);
    float w[32], s[8];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float sigma2 = mean_square(x, QK_K);
        float smax = 0.0f; /* the block scale of largest magnitude, signed */
        for (int g = 0; g < 8; g++) {
            block_weights(x + 32 * g, 32, sigma2, w);
            s[g] = fit_nl_scale(x + 32 * g, w, 32, &L);
            if (fabsf(s[g]) > fabsf(smax)) smax = s[g];
        }
        y[i].d = li_f32_to_f16(smax / -32.0f);
        const float d = li_f16_to_f32(y[i].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].scales_h = 0;
        memset(y[i].scales_l, 0, sizeof(y[i].scales_l));
        for (int g = 0; g < 8; g++) {
            const float r = s[g] * id;
            const int l = r < -32.0f ? -32 : r > 31.0f ? 31 : (int)lrintf(r);
            const int u = l + 32;
            y[i].scales_l[g / 2] |= (uint8_t)((u & 15) << (4 * (g % 2)));
            y[i].scales_h |= (uint16_t)((u >> 4) << (2 * g));
            put_indices(x + 32 * g, d * (float)l, &L, y[i].qs + 16 * g);
        }
    }
}

/* ---- MXFP4: llama.cpp's quantize_row_mxfp4_ref, bit for bit ----
 * Per 32 values, the shared exponent e = floor(log2f(amax)) - 2 + 127 and
 * d = 2^(e - 128) (half the E8M0 scale: the table's E2M1 levels are
 * doubled); each value takes the level of least |level * d - x|, the first
 * among equals. An amax below 2^-125, whose exponent falls outside a byte
 * (ggml's float-to-uint8 conversion is undefined there), takes e = 0. */
static float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return li_bits_f32(bits);
}

void li_quantize_mxfp4(const float *x, void *dst, int64_t k) {
    block_mxfp4 *y = (block_mxfp4 *)dst;
    for (int64_t i = 0; i < k / QK_MXFP4; i++, x += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        int e = 0;
        if (amax > 0.0f) {
            const float f = floorf(log2f(amax)) - 2.0f + 127.0f;
            e = f < 0.0f ? 0 : (f > 255.0f ? 255 : (int)f);
        }
        const float d = e8m0_half((uint8_t)e);
        y[i].e = (uint8_t)e;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            int q[2];
            for (int h = 0; h < 2; h++) {
                const float v = x[j + h * QK_MXFP4 / 2];
                int best = 0;
                float best_err = fabsf((float)li_kvalues_mxfp4[0] * d - v);
                for (int l = 1; l < 16; l++) {
                    const float err = fabsf((float)li_kvalues_mxfp4[l] * d - v);
                    if (err < best_err) {
                        best = l;
                        best_err = err;
                    }
                }
                q[h] = best;
            }
            y[i].qs[j] = (uint8_t)(q[0] | q[1] << 4);
        }
    }
}
