/* quantize.c: float rows to stored weight types.
 *
 * Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 reproduce the gguf package's numpy
 * quantizers bit for bit: the same float32 operations in the same order
 * (this file is built with -ffp-contract=off), the same truncations and
 * clamps, and float16 scales rounded to nearest even.
 *
 * Q4_K, Q5_K and Q6_K use a quantizer of our own: each sub-block's scale (and
 * min) is chosen by a small search that refits them by least squares on the
 * rounded values and keeps the lowest squared error; the sub-block scales are
 * then themselves quantized to the super-block's 6-bit (8-bit for Q6_K)
 * grid, and the values requantized against the scales actually stored.
 *
 * IQ4_NL, IQ4_XS and MXFP4: quantize_iq.c.
 */
#include <math.h>

#include "common.h"
#include "kernels/kernels.h"
#include "quantize.h"

/* ---- the gguf-exact 32-element types ---- */

static void absmax_signed(const float *x, int n, float *value, float *amax) {
    /* the first element of largest magnitude, with its sign (numpy argmax) */
    int best = 0;
    float a = fabsf(x[0]);
    for (int j = 1; j < n; j++)
        if (fabsf(x[j]) > a) {
            a = fabsf(x[j]);
            best = j;
        }
    *value = x[best];
    *amax = a;
}

static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    *mn = lo;
    *mx = hi;
}

static int trunc_clamp(float v, int hi) {
    int q = (int)v;
    return q < 0 ? 0 : (q > hi ? hi : q);
}

static float inverse(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

static void quantize_q4_0(const float *x, void *dst, int64_t k) {
    block_q4_0 *y = (block_q4_0 *)dst;
    for (int64_t i = 0; i < k / QK4_0; i++, x += QK4_0) {
        float mx, amax;
        absmax_signed(x, QK4_0, &mx, &amax);
        const float d = mx / -8.0f, id = inverse(d);
        y[i].d = li_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int q0 = trunc_clamp(x[j] * id + 8.5f, 15);
            const int q1 = trunc_clamp(x[j + QK4_0 / 2] * id + 8.5f, 15);
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void quantize_q4_1(const float *x, void *dst, int64_t k) {
    block_q4_1 *y = (block_q4_1 *)dst;
    for (int64_t i = 0; i < k / QK4_1; i++, x += QK4_1) {
        float mn, mx;
        min_max(x, QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15.0f, id = inverse(d);
        y[i].d = li_f32_to_f16(d);
        y[i].m = li_f32_to_f16(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int q0 = trunc_clamp((x[j] - mn) * id + 0.5f, 15);
            const int q1 = trunc_clamp((x[j + QK4_1 / 2] - mn) * id + 0.5f, 15);
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

/* pack 32 five-bit values into qs (low nibbles) and qh (bit 4 of each) */
static void pack_5bit(const int q[32], uint8_t qh[4], uint8_t qs[16]) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
        h |= (uint32_t)(q[j] >> 4) << j;
        h |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    for (int b = 0; b < 4; b++) qh[b] = (uint8_t)(h >> (8 * b));
}

static void quantize_q5_0(const float *x, void *dst, int64_t k) {
    block_q5_0 *y = (block_q5_0 *)dst;
    int q[QK5_0];
    for (int64_t i = 0; i < k / QK5_0; i++, x += QK5_0) {
        float mx, amax;
        absmax_signed(x, QK5_0, &mx, &amax);
        const float d = mx / -16.0f, id = inverse(d);
        y[i].d = li_f32_to_f16(d);
        for (int j = 0; j < QK5_0; j++) q[j] = trunc_clamp(x[j] * id + 16.5f, 31);
        pack_5bit(q, y[i].qh, y[i].qs);
    }
}

static void quantize_q5_1(const float *x, void *dst, int64_t k) {
    block_q5_1 *y = (block_q5_1 *)dst;
    int q[QK5_1];
    for (int64_t i = 0; i < k / QK5_1; i++, x += QK5_1) {
        float mn, mx;
        min_max(x, QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31.0f, id = inverse(d);
        y[i].d = li_f32_to_f16(d);
        y[i].m = li_f32_to_f16(mn);
        for (int j = 0; j < QK5_1; j++) q[j] = trunc_clamp((x[j] - mn) * id + 0.5f, 31);
        pack_5bit(q, y[i].qh, y[i].qs);
    }
}

static void quantize_q8_0(const float *x, void *dst, int64_t k) {
    block_q8_0 *y = (block_q8_0 *)dst;
    for (int64_t i = 0; i < k / QK8_0; i++, x += QK8_0) {
        float mx, amax;
        absmax_signed(x, QK8_0, &mx, &amax);
        const float d = amax / 127.0f, id = inverse(d);
        y[i].d = li_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void quantize_f32(const float *x, void *dst, int64_t k) { memcpy(dst, x, (size_t)k * 4); }

static void quantize_f16(const float *x, void *dst, int64_t k) {
    uint16_t *y = (uint16_t *)dst;
    for (int64_t i = 0; i < k; i++) y[i] = li_f32_to_f16(x[i]);
}

/* round to nearest even, matching numpy / ggml's fp32 -> bf16 */
static void quantize_bf16(const float *x, void *dst, int64_t k) {
    uint16_t *y = (uint16_t *)dst;
    for (int64_t i = 0; i < k; i++) {
        uint32_t u = li_f32_bits(x[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            y[i] = (uint16_t)((u >> 16) | 64u); /* quiet NaN */
        else
            y[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

/* ---- K-quants: our own search ---- */

static int round_clamp(float v, int lo, int hi) {
    int q = (int)lrintf(v);
    return q < lo ? lo : (q > hi ? hi : q);
}

/* Fit x ~= s*q - m, q in [0, nmax], m >= 0, minimising the squared error.
 * Candidate grids stretch the range a little either way; for each, the
 * rounded q are refit by least squares. Returns the squared error. */
static float fit_affine(const float *x, int n, int nmax, float *s_out, float *m_out) {
    float lo, hi;
    min_max(x, n, &lo, &hi);
    if (lo > 0.0f) lo = 0.0f; /* the min term can only lower values */
    if (hi - lo <= 0.0f) {
        *s_out = 0.0f;
        *m_out = -lo;
        float e = 0.0f;
        for (int j = 0; j < n; j++) e += (x[j] - lo) * (x[j] - lo);
        return e;
    }
    float best_err = INFINITY, best_s = (hi - lo) / (float)nmax, best_m = -lo;
    for (int step = -10; step <= 10; step++) {
        const float iscale = ((float)nmax + 0.1f * (float)step) / (hi - lo);
        int q[QK_K];
        double sq = 0, sqq = 0, sx = 0, sxq = 0;
        for (int j = 0; j < n; j++) {
            q[j] = round_clamp((x[j] - lo) * iscale, 0, nmax);
            sq += q[j];
            sqq += (double)q[j] * q[j];
            sx += x[j];
            sxq += (double)x[j] * q[j];
        }
        /* least squares for x ~= s*q + b, then b clamped to <= 0 */
        const double det = n * sqq - sq * sq;
        double s, b;
        if (det > 0) {
            s = (n * sxq - sq * sx) / det;
            b = (sqq * sx - sq * sxq) / det;
        } else {
            s = 0;
            b = sx / n;
        }
        if (b > 0) {
            b = 0;
            s = sqq > 0 ? sxq / sqq : 0;
        }
        if (s < 0) continue;
        float err = 0.0f;
        for (int j = 0; j < n; j++) {
            const float e = (float)(s * q[j] + b) - x[j];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = (float)s;
            best_m = (float)-b;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
    return best_err;
}

/* Fit x ~= s*q, q in [-nneg, nneg-1]; the same search, symmetric. */
static float fit_symmetric(const float *x, int n, int nneg, float *s_out) {
    float mx, amax;
    absmax_signed(x, n, &mx, &amax);
    if (amax == 0.0f) {
        *s_out = 0.0f;
        return 0.0f;
    }
    float best_err = INFINITY, best_s = mx / -(float)nneg;
    for (int step = -10; step <= 10; step++) {
        const float iscale = -((float)nneg + 0.1f * (float)step) / mx;
        int q[QK_K];
        double sxq = 0, sqq = 0;
        for (int j = 0; j < n; j++) {
            q[j] = round_clamp(x[j] * iscale, -nneg, nneg - 1);
            sxq += (double)x[j] * q[j];
            sqq += (double)q[j] * q[j];
        }
        if (sqq == 0) continue;
        const float s = (float)(sxq / sqq);
        float err = 0.0f;
        for (int j = 0; j < n; j++) {
            const float e = s * (float)q[j] - x[j];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = s;
        }
    }
    *s_out = best_s;
    return best_err;
}

/* Scales and mins of 8 groups of 32 on the super-block's 6-bit grids; q[256]
 * requantized against what will be stored. */
static void quantize_k_groups32(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                                uint8_t scales[K_SCALE_SIZE], int q[QK_K]) {
    float s[8], m[8], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        fit_affine(x + 32 * j, 32, nmax, &s[j], &m[j]);
        smax = LI_MAX(smax, s[j]);
        mmax = LI_MAX(mmax, m[j]);
    }
    *d_out = li_f32_to_f16(smax / 63.0f);
    *dmin_out = li_f32_to_f16(mmax / 63.0f);
    const float d = li_f16_to_f32(*d_out), dmin = li_f16_to_f32(*dmin_out);
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = d > 0.0f ? round_clamp(s[j] / d, 0, 63) : 0;
        mn[j] = dmin > 0.0f ? round_clamp(m[j] / dmin, 0, 63) : 0;
        const float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
        for (int l = 0; l < 32; l++) {
            const float v = x[32 * j + l] + dm;
            q[32 * j + l] = ds > 0.0f ? round_clamp(v / ds, 0, nmax) : 0;
        }
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
}

static void quantize_q4_K(const float *x, void *dst, int64_t k) {
    block_q4_K *y = (block_q4_K *)dst;
    int q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        quantize_k_groups32(x, 15, &y[i].d, &y[i].dmin, y[i].scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
}

static void quantize_q5_K(const float *x, void *dst, int64_t k) {
    block_q5_K *y = (block_q5_K *)dst;
    int q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        quantize_k_groups32(x, 31, &y[i].d, &y[i].dmin, y[i].scales, q);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int i0 = 64 * c + l, i1 = 64 * c + 32 + l;
                y[i].qs[32 * c + l] = (uint8_t)((q[i0] & 15) | (q[i1] & 15) << 4);
                y[i].qh[l] |= (uint8_t)((q[i0] >> 4) << (i0 / 32) | (q[i1] >> 4) << (i1 / 32));
            }
    }
}

static void quantize_q6_K(const float *x, void *dst, int64_t k) {
    block_q6_K *y = (block_q6_K *)dst;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float s[16], smax = 0.0f;
        for (int g = 0; g < 16; g++) {
            fit_symmetric(x + 16 * g, 16, 32, &s[g]);
            smax = LI_MAX(smax, fabsf(s[g]));
        }
        y[i].d = li_f32_to_f16(smax / 127.0f);
        const float d = li_f16_to_f32(y[i].d);
        int q[QK_K];
        for (int g = 0; g < 16; g++) {
            const int sc = d > 0.0f ? round_clamp(s[g] / d, -127, 127) : 0;
            y[i].scales[g] = (int8_t)sc;
            const float ds = d * (float)sc;
            for (int l = 0; l < 16; l++)
                q[16 * g + l] = ds != 0.0f ? round_clamp(x[16 * g + l] / ds, -32, 31) + 32 : 32;
        }
        memset(y[i].qh, 0, sizeof(y[i].qh));
        memset(y[i].ql, 0, sizeof(y[i].ql));
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 128; j++) {
                const int v = q[128 * h + j];
                y[i].ql[64 * h + j % 64] |= (uint8_t)((v & 15) << (4 * (j / 64)));
                y[i].qh[32 * h + j % 32] |= (uint8_t)((v >> 4) << (2 * (j / 32)));
            }
    }
}

li_quantize_fn li_weight_quantizer(int type) {
    switch (type) {
    case LI_TYPE_F32: return quantize_f32;
    case LI_TYPE_F16: return quantize_f16;
    case LI_TYPE_BF16: return quantize_bf16;
    case LI_TYPE_Q4_0: return quantize_q4_0;
    case LI_TYPE_Q4_1: return quantize_q4_1;
    case LI_TYPE_Q5_0: return quantize_q5_0;
    case LI_TYPE_Q5_1: return quantize_q5_1;
    case LI_TYPE_Q8_0: return quantize_q8_0;
    case LI_TYPE_Q4_K: return quantize_q4_K;
    case LI_TYPE_Q5_K: return quantize_q5_K;
    case LI_TYPE_Q6_K: return quantize_q6_K;
    case LI_TYPE_IQ4_NL: return li_quantize_iq4_nl;
    case LI_TYPE_IQ4_XS: return li_quantize_iq4_xs;
    case LI_TYPE_MXFP4: return li_quantize_mxfp4;
    default: return NULL;
    }
}
