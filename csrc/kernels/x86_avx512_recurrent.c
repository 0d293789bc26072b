/* x86_avx512_recurrent.c: the recurrent mixers' kernels at the AVX-512
 * level. Built with the AVX-512 flags of x86_avx512.c; reached only after
 * dispatch.c has seen them all. scalar_recurrent.c is the specification.
 *
 * The AVX2 file's plan (x86_avx2_recurrent.c) on 16 lanes: conv_rows takes
 * sixteen channels a vector (gathered tap-major), a multiply then an add
 * per tap in the scalar order and expf for SiLU, so its output is the
 * specification's bits; gdn_head and mamba2_head take each state row
 * through a chunk of tokens while it sits in L1, their sums in two 16-lane
 * fused multiply-add accumulators, the elements past the last full pair of
 * vectors in a masked vector (its lanes outside the row read as zero and
 * are never stored).
 */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__)
#include <immintrin.h>

#include "recurrent_math.h"

/* ---- causal convolution ---- */

#define CONV_MAX_TAPS 64 /* model.c allows 1 to 64 */

static void conv_rows(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                      const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act) {
    const int h = K - 1;
    int64_t ch = c0;
    if (K <= CONV_MAX_TAPS) {
        __m512 wt[CONV_MAX_TAPS], win[CONV_MAX_TAPS];
        float lane[16];
        const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        const __m512i wi = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(K));
        const __m512i si = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(h));
        for (; ch + 16 <= c1; ch += 16) {
            for (int j = 0; j < K; j++) wt[j] = _mm512_i32gather_ps(wi, w + ch * K + j, 4);
            for (int j = 0; j < h; j++) win[j] = _mm512_i32gather_ps(si, state + ch * h + j, 4);
            const __m512 b0 = bias ? _mm512_loadu_ps(bias + ch) : _mm512_setzero_ps();
            for (int64_t i = 0; i < n; i++) {
                const int64_t t = rows[i];
                const __m512 xt = _mm512_loadu_ps(x + (size_t)t * x_ld + (size_t)ch);
                __m512 s = b0;
                for (int j = 0; j < h; j++) s = _mm512_add_ps(s, _mm512_mul_ps(wt[j], win[j]));
                s = _mm512_add_ps(s, _mm512_mul_ps(wt[h], xt));
                for (int j = 0; j + 1 < h; j++) win[j] = win[j + 1];
                if (h > 0) win[h - 1] = xt;
                float *yt = y + (size_t)t * y_ld + (size_t)ch;
                if (act) {
                    _mm512_storeu_ps(lane, s);
                    for (int l = 0; l < 16; l++) yt[l] = li_silu(lane[l]);
                } else {
                    _mm512_storeu_ps(yt, s);
                }
            }
            for (int j = 0; j < h; j++) _mm512_i32scatter_ps(state + ch * h + j, si, win[j], 4);
        }
    }
    if (ch < c1) li_conv_rows_scalar(x, x_ld, y, y_ld, rows, n, w, bias, K, state, ch, c1, act);
}

/* lanes [0, r) of a vector, r < 16 */
LI_INLINE __mmask16 tail_mask(int64_t r) { return (__mmask16)((1u << r) - 1u); }

/* ---- Gated DeltaNet ---- */

/* row *= s, returning row . u (after the scaling) */
LI_INLINE float scale_dot(float *row, float s, const float *u, int64_t n) {
    const __m512 vs = _mm512_set1_ps(s);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t e = 0;
    for (; e + 32 <= n; e += 32) {
        const __m512 r0 = _mm512_mul_ps(_mm512_loadu_ps(row + e), vs);
        const __m512 r1 = _mm512_mul_ps(_mm512_loadu_ps(row + e + 16), vs);
        _mm512_storeu_ps(row + e, r0);
        _mm512_storeu_ps(row + e + 16, r1);
        a0 = _mm512_fmadd_ps(r0, _mm512_loadu_ps(u + e), a0);
        a1 = _mm512_fmadd_ps(r1, _mm512_loadu_ps(u + e + 16), a1);
    }
    for (; e < n; e += 16) {
        const __mmask16 m = n - e >= 16 ? (__mmask16)0xffff : tail_mask(n - e);
        const __m512 r0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + e), vs);
        _mm512_mask_storeu_ps(row + e, m, r0);
        a0 = _mm512_fmadd_ps(r0, _mm512_maskz_loadu_ps(m, u + e), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* row += c * k, returning row . u (after the update) */
LI_INLINE float axpy_dot(float *row, float c, const float *k, const float *u, int64_t n) {
    const __m512 vc = _mm512_set1_ps(c);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t e = 0;
    for (; e + 32 <= n; e += 32) {
        const __m512 r0 = _mm512_fmadd_ps(vc, _mm512_loadu_ps(k + e), _mm512_loadu_ps(row + e));
        const __m512 r1 = _mm512_fmadd_ps(vc, _mm512_loadu_ps(k + e + 16), _mm512_loadu_ps(row + e + 16));
        _mm512_storeu_ps(row + e, r0);
        _mm512_storeu_ps(row + e + 16, r1);
        a0 = _mm512_fmadd_ps(r0, _mm512_loadu_ps(u + e), a0);
        a1 = _mm512_fmadd_ps(r1, _mm512_loadu_ps(u + e + 16), a1);
    }
    for (; e < n; e += 16) {
        const __mmask16 m = n - e >= 16 ? (__mmask16)0xffff : tail_mask(n - e);
        const __m512 r0 = _mm512_fmadd_ps(vc, _mm512_maskz_loadu_ps(m, k + e), _mm512_maskz_loadu_ps(m, row + e));
        _mm512_mask_storeu_ps(row + e, m, r0);
        a0 = _mm512_fmadd_ps(r0, _mm512_maskz_loadu_ps(m, u + e), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
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
    const __m512 vs = _mm512_set1_ps(s), vc = _mm512_set1_ps(c);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t e = 0;
    for (; e + 32 <= n; e += 32) {
        const __m512 r0 = _mm512_fmadd_ps(vc, _mm512_loadu_ps(B + e), _mm512_mul_ps(_mm512_loadu_ps(row + e), vs));
        const __m512 r1 =
            _mm512_fmadd_ps(vc, _mm512_loadu_ps(B + e + 16), _mm512_mul_ps(_mm512_loadu_ps(row + e + 16), vs));
        _mm512_storeu_ps(row + e, r0);
        _mm512_storeu_ps(row + e + 16, r1);
        a0 = _mm512_fmadd_ps(r0, _mm512_loadu_ps(C + e), a0);
        a1 = _mm512_fmadd_ps(r1, _mm512_loadu_ps(C + e + 16), a1);
    }
    for (; e < n; e += 16) {
        const __mmask16 m = n - e >= 16 ? (__mmask16)0xffff : tail_mask(n - e);
        const __m512 r0 =
            _mm512_fmadd_ps(vc, _mm512_maskz_loadu_ps(m, B + e), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + e), vs));
        _mm512_mask_storeu_ps(row + e, m, r0);
        a0 = _mm512_fmadd_ps(r0, _mm512_maskz_loadu_ps(m, C + e), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
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

void li_recurrent_fill_avx512(li_kernels *t) {
    t->conv_rows = conv_rows;
    t->gdn_head = gdn_head;
    t->mamba2_head = mamba2_head;
}
#elif defined(LI_ARCH_X86)
/* built without the AVX-512 flags: the entries stay as they are (the level
 * is never chosen then: li_kernels_fill_avx512 leaves its table scalar) */
void li_recurrent_fill_avx512(li_kernels *t) { (void)t; }
#else
typedef int li_empty_translation_unit;
#endif
