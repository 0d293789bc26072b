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

/* the index of the level of the sorted 16-entry table t nearest to v */
static int nearest_level(const int8_t *t, float v) {
    if (!(v > (float)t[0])) return 0; /* also NaN */
    if (v >= (float)t[15]) return 15;
    int lo = 0, hi = 15; /* t[lo] < v < t[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < (float)t[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - (float)t[lo] < (float)t[hi] - v ? lo : hi;
}

/* the best scale of n values x with weights w (0 for an all-zero block) */
static float fit_nl_scale(const float *x, const float *w, int n, const int8_t *t) {
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
            double sqx = 0.0, sq2 = 0.0;
            for (int j = 0; j < n; j++) {
                const float q = (float)t[nearest_level(t, id * x[j])];
                sqx += (double)w[j] * q * x[j];
                sq2 += (double)w[j] * q * q;
            }
            if (sq2 > 0.0 && sqx * sqx / sq2 > best_gain) {
                best_gain = (float)(sqx * sqx / sq2);
                best_d = (float)(sqx / sq2);
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
static void put_indices(const float *x, float d, uint8_t qs[16]) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++) {
        const int lo = nearest_level(li_kvalues_iq4nl, x[j] * id);
        const int hi = nearest_level(li_kvalues_iq4nl, x[j + 16] * id);
        qs[j] = (uint8_t)(lo | hi << 4);
    }
}

void li_quantize_iq4_nl(const float *x, void *dst, int64_t k) {
    block_iq4_nl *y = (block_iq4_nl *)dst;
    float w[32];
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
        block_weights(x, 32, mean_square(x, 32), w);
        y[i].d = li_f32_to_f16(fit_nl_scale(x, w, 32, li_kvalues_iq4nl));
        put_indices(x, li_f16_to_f32(y[i].d), y[i].qs);
    }
}

void li_quantize_iq4_xs(const float *x, void *dst, int64_t k) {
    block_iq4_xs *y = (block_iq4_xs *)dst;
    float w[32], s[8];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const float sigma2 = mean_square(x, QK_K);
        float smax = 0.0f; /* the block scale of largest magnitude, signed */
        for (int g = 0; g < 8; g++) {
            block_weights(x + 32 * g, 32, sigma2, w);
            s[g] = fit_nl_scale(x + 32 * g, w, 32, li_kvalues_iq4nl);
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
            put_indices(x + 32 * g, d * (float)l, y[i].qs + 16 * g);
        }
    }
}
