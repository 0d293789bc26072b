/* arm_neon_recurrent.c: the recurrent mixers' kernels for aarch64 Advanced
 * SIMD (every 64-bit ARM CPU has it, so no flags). scalar_recurrent.c is
 * the specification; tests/c/test_kernels_neon.c holds these to it.
 *
 * The AVX2 file's plan (x86_avx2_recurrent.c) on 4 lanes: conv_rows takes
 * four channels a vector, tap-major, a multiply then an add per tap in the
 * scalar order and expf for SiLU, so its output is the specification's
 * bits; gdn_head and mamba2_head take each state row through a chunk of
 * tokens while it sits in L1, their sums in two 4-lane fused multiply-add
 * accumulators, then the tail past the last full vector in scalar order.
 */
#include "kernels.h"

#if defined(LI_ARCH_ARM64) && !defined(__ARM_BIG_ENDIAN)
#include <arm_neon.h>

#include "recurrent_math.h"

/* ---- causal convolution ---- */

#define CONV_MAX_TAPS 64 /* model.c allows 1 to 64 */

static void conv_rows(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                      const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act) {
    const int h = K - 1;
    int64_t ch = c0;
    if (K <= CONV_MAX_TAPS) {
        float32x4_t wt[CONV_MAX_TAPS], win[CONV_MAX_TAPS];
        float lane[4];
        for (; ch + 4 <= c1; ch += 4) {
            for (int j = 0; j < K; j++) {
                for (int l = 0; l < 4; l++) lane[l] = w[(ch + l) * K + j];
                wt[j] = vld1q_f32(lane);
            }
            for (int j = 0; j < h; j++) {
                for (int l = 0; l < 4; l++) lane[l] = state[(ch + l) * h + j];
                win[j] = vld1q_f32(lane);
            }
            const float32x4_t b0 = bias ? vld1q_f32(bias + ch) : vdupq_n_f32(0.0f);
            for (int64_t i = 0; i < n; i++) {
                const int64_t t = rows[i];
                const float32x4_t xt = vld1q_f32(x + (size_t)t * x_ld + (size_t)ch);
                float32x4_t s = b0;
                for (int j = 0; j < h; j++) s = vaddq_f32(s, vmulq_f32(wt[j], win[j]));
                s = vaddq_f32(s, vmulq_f32(wt[h], xt));
                for (int j = 0; j + 1 < h; j++) win[j] = win[j + 1];
                if (h > 0) win[h - 1] = xt;
                float *yt = y + (size_t)t * y_ld + (size_t)ch;
                if (act) {
                    vst1q_f32(lane, s);
                    for (int l = 0; l < 4; l++) yt[l] = li_silu(lane[l]);
                } else {
                    vst1q_f32(yt, s);
                }
            }
            for (int j = 0; j < h; j++) {
                vst1q_f32(lane, win[j]);
                for (int l = 0; l < 4; l++) state[(ch + l) * h + j] = lane[l];
            }
        }
    }
    if (ch < c1) li_conv_rows_scalar(x, x_ld, y, y_ld, rows, n, w, bias, K, state, ch, c1, act);
}

/* ---- Gated DeltaNet ---- */

/* row *= s, returning row . u (after the scaling) */
LI_INLINE float scale_dot(float *row, float s, const float *u, int64_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int64_t e = 0;
    for (; e + 8 <= n; e += 8) {
        const float32x4_t r0 = vmulq_n_f32(vld1q_f32(row + e), s);
        const float32x4_t r1 = vmulq_n_f32(vld1q_f32(row + e + 4), s);
        vst1q_f32(row + e, r0);
        vst1q_f32(row + e + 4, r1);
        a0 = vfmaq_f32(a0, r0, vld1q_f32(u + e));
        a1 = vfmaq_f32(a1, r1, vld1q_f32(u + e + 4));
    }
    if (e + 4 <= n) {
        const float32x4_t r0 = vmulq_n_f32(vld1q_f32(row + e), s);
        vst1q_f32(row + e, r0);
        a0 = vfmaq_f32(a0, r0, vld1q_f32(u + e));
        e += 4;
    }
    float acc = vaddvq_f32(vaddq_f32(a0, a1));
    for (; e < n; e++) {
        row[e] *= s;
        acc += row[e] * u[e];
    }
    return acc;
}

/* row += c * k, returning row . u (after the update) */
LI_INLINE float axpy_dot(float *row, float c, const float *k, const float *u, int64_t n) {
    const float32x4_t vc = vdupq_n_f32(c);
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int64_t e = 0;
    for (; e + 8 <= n; e += 8) {
        const float32x4_t r0 = vfmaq_f32(vld1q_f32(row + e), vc, vld1q_f32(k + e));
        const float32x4_t r1 = vfmaq_f32(vld1q_f32(row + e + 4), vc, vld1q_f32(k + e + 4));
        vst1q_f32(row + e, r0);
        vst1q_f32(row + e + 4, r1);
        a0 = vfmaq_f32(a0, r0, vld1q_f32(u + e));
        a1 = vfmaq_f32(a1, r1, vld1q_f32(u + e + 4));
    }
    if (e + 4 <= n) {
        const float32x4_t r0 = vfmaq_f32(vld1q_f32(row + e), vc, vld1q_f32(k + e));
        vst1q_f32(row + e, r0);
        a0 = vfmaq_f32(a0, r0, vld1q_f32(u + e));
        e += 4;
    }
    float acc = vaddvq_f32(vaddq_f32(a0, a1));
    for (; e < n; e++) {
        row[e] += c * k[e];
        acc += row[e] * u[e];
    }
    return acc;
}

static void gdn_head(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q,
                     const float *k, size_t qk_ld, const float *v, size_t v_ld, const float *alpha,
                     const float *beta, size_t ab_ld, float dt_b, float a, float *o, size_t o_ld) {
    float decay[LI_RECURRENT_CHUNK], b[LI_RECURRENT_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += LI_RECURRENT_CHUNK) {
        const int64_t m = LI_MIN(n - i0, LI_RECURRENT_CHUNK);
        for (int64_t i = 0; i < m; i++) {
            const size_t t = (size_t)rows[i0 + i];
            decay[i] = expf(li_softplus(alpha[t * ab_ld] + dt_b) * a);
            b[i] = li_sigmoid(beta[t * ab_ld]);
        }
        for (int64_t j = 0; j < dv; j++) {
            float *row = S + j * dk;
            for (int64_t i = 0; i < m; i++) {
                const size_t t = (size_t)rows[i0 + i];
                const float *kt = k + t * qk_ld;
                const float d = (v[t * v_ld + (size_t)j] - scale_dot(row, decay[i], kt, dk)) * b[i];
                o[t * o_ld + (size_t)j] = axpy_dot(row, d, kt, q + t * qk_ld, dk);
            }
        }
    }
}

/* ---- Mamba2 ---- */

/* row = row * s + c * B, returning row . C */
LI_INLINE float decay_update_dot(float *row, float s, float c, const float *B, const float *C, int64_t n) {
    const float32x4_t vc = vdupq_n_f32(c);
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = vdupq_n_f32(0.0f);
    int64_t e = 0;
    for (; e + 8 <= n; e += 8) {
        const float32x4_t r0 = vfmaq_f32(vmulq_n_f32(vld1q_f32(row + e), s), vc, vld1q_f32(B + e));
        const float32x4_t r1 = vfmaq_f32(vmulq_n_f32(vld1q_f32(row + e + 4), s), vc, vld1q_f32(B + e + 4));
        vst1q_f32(row + e, r0);
        vst1q_f32(row + e + 4, r1);
        a0 = vfmaq_f32(a0, r0, vld1q_f32(C + e));
        a1 = vfmaq_f32(a1, r1, vld1q_f32(C + e + 4));
    }
    if (e + 4 <= n) {
        const float32x4_t r0 = vfmaq_f32(vmulq_n_f32(vld1q_f32(row + e), s), vc, vld1q_f32(B + e));
        vst1q_f32(row + e, r0);
        a0 = vfmaq_f32(a0, r0, vld1q_f32(C + e));
        e += 4;
    }
    float acc = vaddvq_f32(vaddq_f32(a0, a1));
    for (; e < n; e++) {
        row[e] = row[e] * s + c * B[e];
        acc += row[e] * C[e];
    }
    return acc;
}

static void mamba2_head(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n, const float *x,
                        size_t x_ld, const float *B, const float *C, const float *dt, size_t dt_ld, float dt_b,
                        float a, float d, const float *z, size_t z_ld, float *y, size_t y_ld) {
    float dts[LI_RECURRENT_CHUNK], dA[LI_RECURRENT_CHUNK];
    for (int64_t k0 = 0; k0 < n; k0 += LI_RECURRENT_CHUNK) {
        const int64_t m = LI_MIN(n - k0, LI_RECURRENT_CHUNK);
        for (int64_t k = 0; k < m; k++) {
            dts[k] = li_softplus(dt[(size_t)rows[k0 + k] * dt_ld] + dt_b);
            dA[k] = expf(dts[k] * a);
        }
        for (int64_t i = 0; i < hd; i++) {
            float *row = S + i * ds;
            for (int64_t k = 0; k < m; k++) {
                const size_t t = (size_t)rows[k0 + k];
                const float xi = x[t * x_ld + (size_t)i];
                const float sc = decay_update_dot(row, dA[k], xi * dts[k], B + t * x_ld, C + t * x_ld, ds);
                y[t * y_ld + (size_t)i] = (sc + xi * d) * li_silu(z[t * z_ld + (size_t)i]);
            }
        }
    }
}

void li_recurrent_fill_neon(li_kernels *t) {
    t->conv_rows = conv_rows;
    t->gdn_head = gdn_head;
    t->mamba2_head = mamba2_head;
}
#elif defined(LI_ARCH_ARM64)
/* big-endian aarch64: the entries stay scalar (the level is never chosen) */
void li_recurrent_fill_neon(li_kernels *t) { (void)t; }
#else
typedef int li_empty_translation_unit;
#endif
