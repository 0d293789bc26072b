/* scalar_recurrent.c: the recurrent mixers' kernels in plain loops, the
 * specification the SIMD levels (x86_avx2_recurrent.c,
 * x86_avx512_recurrent.c, arm_neon_recurrent.c) are tested against.
 *
 * Each takes one sequence's rows of a batch, in position order, through the
 * state it updates in place (kernels.h gives the layouts). Tokens run one
 * after another, as the recurrence defines them (no chunked form), so a
 * prompt given whole, in chunks or a token at a time gives the same bits;
 * the caller (model.c) hands each (sequence, channels) or (sequence, head)
 * to one call, so nothing else in the batch reaches a sequence's values.
 * Sums run from the first element to the last, one multiply and one add
 * each (the build does not contract them into fused multiply-adds).
 */
#include "kernels.h"
#include "recurrent_math.h"

void li_conv_rows_scalar(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                         const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act) {
    const int h = K - 1; /* inputs of history per channel */
    for (int64_t ch = c0; ch < c1; ch++) {
        float *st = state + ch * h;
        const float *wc = w + ch * K;
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = rows[i];
            const float xt = x[(size_t)t * x_ld + (size_t)ch];
            float s = bias ? bias[ch] : 0.0f;
            for (int j = 0; j < h; j++) s += wc[j] * st[j];
            s += wc[h] * xt;
            for (int j = 0; j + 1 < h; j++) st[j] = st[j + 1];
            if (h > 0) st[h - 1] = xt;
            y[(size_t)t * y_ld + (size_t)ch] = act ? li_silu(s) : s;
        }
    }
}

static float dot(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void gdn_head(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q,
                     const float *k, size_t qk_ld, const float *v, size_t v_ld, const float *alpha,
                     const float *beta, size_t ab_ld, float dt_b, float a, float *o, size_t o_ld) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = rows[i];
        const float *qt = q + (size_t)t * qk_ld, *kt = k + (size_t)t * qk_ld, *vt = v + (size_t)t * v_ld;
        const float decay = expf(li_softplus(alpha[(size_t)t * ab_ld] + dt_b) * a);
        const float b = li_sigmoid(beta[(size_t)t * ab_ld]);
        float *ot = o + (size_t)t * o_ld;
        for (int64_t j = 0; j < dv; j++) {
            float *row = S + j * dk;
            for (int64_t e = 0; e < dk; e++) row[e] *= decay;
            const float d = (vt[j] - dot(row, kt, dk)) * b;
            for (int64_t e = 0; e < dk; e++) row[e] += d * kt[e];
            ot[j] = dot(row, qt, dk);
        }
    }
}

static void mamba2_head(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n, const float *x,
                        size_t x_ld, const float *B, const float *C, const float *dt, size_t dt_ld, float dt_b,
                        float a, float d, const float *z, size_t z_ld, float *y, size_t y_ld) {
    for (int64_t k = 0; k < n; k++) {
        const int64_t t = rows[k];
        const float *xt = x + (size_t)t * x_ld, *Bt = B + (size_t)t * x_ld, *Ct = C + (size_t)t * x_ld;
        const float *zt = z + (size_t)t * z_ld;
        const float dts = li_softplus(dt[(size_t)t * dt_ld] + dt_b);
        const float dA = expf(dts * a);
        float *yt = y + (size_t)t * y_ld;
        for (int64_t i = 0; i < hd; i++) {
            float *row = S + i * ds;
            const float xdt = xt[i] * dts;
            for (int64_t e = 0; e < ds; e++) row[e] *= dA;
            for (int64_t e = 0; e < ds; e++) row[e] += xdt * Bt[e];
            yt[i] = (dot(row, Ct, ds) + xt[i] * d) * li_silu(zt[i]);
        }
    }
}

void li_recurrent_fill_scalar(li_kernels *t) {
    t->conv_rows = li_conv_rows_scalar;
    t->gdn_head = gdn_head;
    t->mamba2_head = mamba2_head;
}
