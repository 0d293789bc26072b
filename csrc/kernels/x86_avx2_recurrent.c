/* x86_avx2_recurrent.c: the recurrent mixers' kernels for x86-64 with AVX2
 * and FMA. Built with -mavx2 -mfma -mf16c (/arch:AVX2); reached only after
 * dispatch.c has seen those features. scalar_recurrent.c is the
 * specification; the Python tests (test_recurrent_kernels.py) hold each
 * kernel here to it within a stated tolerance.
 *
 * conv_rows: eight channels a vector, the window and the weights held
 *   transposed (tap-major) for the item's tokens; each product is a multiply
 *   then an add in the scalar order, so the sum is the scalar file's bits;
 *   SiLU takes expf per value, which keeps them (the output is
 *   bit-identical to the specification).
 * gdn_head, mamba2_head: the state's rows are independent, so each row is
 *   taken through a chunk of LI_RECURRENT_CHUNK tokens while it sits in L1,
 *   rather than every row through one token. The delta rule is two passes
 *   over a row per token (decay fused with k . S, then the rank-1 update
 *   fused with q . S), the scan one (decay and B update fused with C . S),
 *   each sum in two 8-lane fused multiply-add accumulators and then the
 *   tail from the first element past the last full vector; the per-token
 *   gates come from recurrent_math.h, as at every level.
 */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX2__) && (defined(_MSC_VER) || defined(__FMA__))
#include <immintrin.h>

#include "recurrent_math.h"

LI_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- causal convolution ---- */

#define CONV_MAX_TAPS 64 /* model.c allows 1 to 64 */

static void conv_rows(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                      const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act) {
    const int h = K - 1;
    int64_t ch = c0;
    if (K <= CONV_MAX_TAPS) {
        __m256 wt[CONV_MAX_TAPS], win[CONV_MAX_TAPS];
        float lane[8];
        for (; ch + 8 <= c1; ch += 8) {
            for (int j = 0; j < K; j++) /* tap j of the 8 channels */
                wt[j] = _mm256_set_ps(w[(ch + 7) * K + j], w[(ch + 6) * K + j], w[(ch + 5) * K + j],
                                      w[(ch + 4) * K + j], w[(ch + 3) * K + j], w[(ch + 2) * K + j],
                                      w[(ch + 1) * K + j], w[ch * K + j]);
            for (int j = 0; j < h; j++)
                win[j] = _mm256_set_ps(state[(ch + 7) * h + j], state[(ch + 6) * h + j], state[(ch + 5) * h + j],
                                       state[(ch + 4) * h + j], state[(ch + 3) * h + j], state[(ch + 2) * h + j],
                                       state[(ch + 1) * h + j], state[ch * h + j]);
            const __m256 b0 = bias ? _mm256_loadu_ps(bias + ch) : _mm256_setzero_ps();
            for (int64_t i = 0; i < n; i++) {
                const int64_t t = rows[i];
                const __m256 xt = _mm256_loadu_ps(x + (size_t)t * x_ld + (size_t)ch);
                __m256 s = b0;
                for (int j = 0; j < h; j++) s = _mm256_add_ps(s, _mm256_mul_ps(wt[j], win[j]));
                s = _mm256_add_ps(s, _mm256_mul_ps(wt[h], xt));
                for (int j = 0; j + 1 < h; j++) win[j] = win[j + 1];
                if (h > 0) win[h - 1] = xt;
                float *yt = y + (size_t)t * y_ld + (size_t)ch;
                if (act) {
                    _mm256_storeu_ps(lane, s);
                    for (int l = 0; l < 8; l++) yt[l] = li_silu(lane[l]);
                } else {
                    _mm256_storeu_ps(yt, s);
                }
            }
            for (int j = 0; j < h; j++) {
                _mm256_storeu_ps(lane, win[j]);
                for (int l = 0; l < 8; l++) state[(ch + l) * h + j] = lane[l];
            }
        }
    }
    if (ch < c1) li_conv_rows_scalar(x, x_ld, y, y_ld, rows, n, w, bias, K, state, ch, c1, act);
}

/* ---- Gated DeltaNet ---- */

/* row *= s, returning row . u (after the scaling) */
LI_INLINE float scale_dot(float *row, float s, const float *u, int64_t n) {
    const __m256 vs = _mm256_set1_ps(s);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t e = 0;
    for (; e + 16 <= n; e += 16) {
        const __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(row + e), vs);
        const __m256 r1 = _mm256_mul_ps(_mm256_loadu_ps(row + e + 8), vs);
        _mm256_storeu_ps(row + e, r0);
        _mm256_storeu_ps(row + e + 8, r1);
        a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(u + e), a0);
        a1 = _mm256_fmadd_ps(r1, _mm256_loadu_ps(u + e + 8), a1);
    }
    if (e + 8 <= n) {
        const __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(row + e), vs);
        _mm256_storeu_ps(row + e, r0);
        a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(u + e), a0);
        e += 8;
    }
    float acc = hsum8(_mm256_add_ps(a0, a1));
    for (; e < n; e++) {
        row[e] *= s;
        acc += row[e] * u[e];
    }
    return acc;
}

/* row += c * k, returning row . u (after the update) */
LI_INLINE float axpy_dot(float *row, float c, const float *k, const float *u, int64_t n) {
    const __m256 vc = _mm256_set1_ps(c);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t e = 0;
    for (; e + 16 <= n; e += 16) {
        const __m256 r0 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(k + e), _mm256_loadu_ps(row + e));
        const __m256 r1 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(k + e + 8), _mm256_loadu_ps(row + e + 8));
        _mm256_storeu_ps(row + e, r0);
        _mm256_storeu_ps(row + e + 8, r1);
        a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(u + e), a0);
        a1 = _mm256_fmadd_ps(r1, _mm256_loadu_ps(u + e + 8), a1);
    }
    if (e + 8 <= n) {
        const __m256 r0 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(k + e), _mm256_loadu_ps(row + e));
        _mm256_storeu_ps(row + e, r0);
        a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(u + e), a0);
        e += 8;
    }
    float acc = hsum8(_mm256_add_ps(a0, a1));
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
    const __m256 vs = _mm256_set1_ps(s), vc = _mm256_set1_ps(c);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t e = 0;
    for (; e + 16 <= n; e += 16) {
        const __m256 r0 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(B + e), _mm256_mul_ps(_mm256_loadu_ps(row + e), vs));
        const __m256 r1 =
            _mm256_fmadd_ps(vc, _mm256_loadu_ps(B + e + 8), _mm256_mul_ps(_mm256_loadu_ps(row + e + 8), vs));
        _mm256_storeu_ps(row + e, r0);
        _mm256_storeu_ps(row + e + 8, r1);
        a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(C + e), a0);
        a1 = _mm256_fmadd_ps(r1, _mm256_loadu_ps(C + e + 8), a1);
    }
    if (e + 8 <= n) {
        const __m256 r0 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(B + e), _mm256_mul_ps(_mm256_loadu_ps(row + e), vs));
        _mm256_storeu_ps(row + e, r0);
        a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(C + e), a0);
        e += 8;
    }
    float acc = hsum8(_mm256_add_ps(a0, a1));
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

void li_recurrent_fill_avx2(li_kernels *t) {
    t->conv_rows = conv_rows;
    t->gdn_head = gdn_head;
    t->mamba2_head = mamba2_head;
}
#elif defined(LI_ARCH_X86)
/* built without the AVX2 flags: the scalar entries stay (the level is never
 * chosen then: li_kernels_fill_avx2 leaves its table scalar) */
void li_recurrent_fill_avx2(li_kernels *t) { (void)t; }
#else
typedef int li_empty_translation_unit;
#endif
