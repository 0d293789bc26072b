/* recurrent.c: the recurrent mixers of hybrid models, one sequence at a time.
 *
 * Each function runs one sequence's tokens of a batch in position order
 * through a state it updates in place, for a range of channels or one head:
 * the forward pass (model.c) hands the team items of (sequence, channels) or
 * (sequence, head), so a token's result depends on its sequence alone and
 * never on what else is batched or on the team's size. Tokens run one after
 * another, as the recurrence defines them (no chunked form), so a prompt
 * given whole, in chunks or one token at a time gives the same bits.
 *
 * The arithmetic is plain C over the vector kernels of the active level
 * (li_K: dot, axpy, scale, RMSNorm), which each level (scalar, AVX2,
 * AVX-512, NEON) implements and tests against its scalar form.
 */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "recurrent.h"

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* out[t][ch] = sum_j w[ch][j] * win_j, the window being channel ch's K - 1
 * past inputs (state, the oldest first) and then x[t][ch]; the state then
 * moves on by one. Channels [c0, c1) of rows rows[0..n). */
void li_conv_rows(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
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
            y[(size_t)t * y_ld + (size_t)ch] = act ? silu(s) : s;
        }
    }
}

/* x /= max(|x|, eps) (ggml's L2 norm) */
static void l2_norm(float *x, int64_t k, float eps) {
    const float ss = li_K->dot_f32(x, x, k);
    const float r = sqrtf(ss);
    li_K->scale_f32(x, 1.0f / (r > eps ? r : eps), k);
}

void li_gdn_norm_qk(float *q, float *k, int64_t dk, float eps) {
    l2_norm(q, dk, eps);
    l2_norm(k, dk, eps);
    li_K->scale_f32(q, 1.0f / sqrtf((float)dk), dk);
}

/* One Gated DeltaNet value head over a sequence's tokens: per token t,
 * decay = exp(softplus(alpha + dt_b) * a), b = sigmoid(beta), and for each
 * row j of S (a value dimension, over the dk key dimensions):
 *   S_j *= decay;  d_j = (v_j - S_j . k) * b;  S_j += d_j k;  o_j = S_j . q
 * (q and k already L2-normed, q scaled). The rows are independent, so each
 * is taken through the token's whole update while it is in cache. */
void li_gdn_head(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q, const float *k,
                 size_t qk_ld, const float *v, size_t v_ld, const float *alpha, const float *beta, size_t ab_ld,
                 float dt_b, float a, float *o, size_t o_ld) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = rows[i];
        const float *qt = q + (size_t)t * qk_ld, *kt = k + (size_t)t * qk_ld, *vt = v + (size_t)t * v_ld;
        const float decay = expf(softplus(alpha[(size_t)t * ab_ld] + dt_b) * a);
        const float b = sigmoid(beta[(size_t)t * ab_ld]);
        float *ot = o + (size_t)t * o_ld;
        for (int64_t j = 0; j < dv; j++) {
            float *row = S + j * dk;
            li_K->scale_f32(row, decay, dk);
            const float d = (vt[j] - li_K->dot_f32(row, kt, dk)) * b;
            li_K->axpy_f32(d, kt, row, dk);
            ot[j] = li_K->dot_f32(row, qt, dk);
        }
    }
}

/* o = rmsnorm(o) * w * silu(z), one head's dv values */
void li_gated_head_norm(float *o, const float *w, const float *z, int64_t dv, float eps) {
    li_K->rms_norm(o, w, o, dv, eps);
    for (int64_t j = 0; j < dv; j++) o[j] *= silu(z[j]);
}

void li_sigmoid_gate(float *x, const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= sigmoid(g[i]);
}

/* One Mamba2 head over a sequence's tokens: per token, dt = softplus(dt +
 * dt_b), dA = exp(dt * a), and for each of the head's channels i (row i of
 * S, over the d_state dimensions):
 *   S_i = S_i * dA + (x_i * dt) B;  y_i = S_i . C + x_i * d;  y_i *= silu(z_i)
 * B and C are the head's group's. */
void li_mamba2_head(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n, const float *x, size_t x_ld,
                    const float *B, const float *C, const float *dt, size_t dt_ld, float dt_b, float a, float d,
                    const float *z, size_t z_ld, float *y, size_t y_ld) {
    for (int64_t k = 0; k < n; k++) {
        const int64_t t = rows[k];
        const float *xt = x + (size_t)t * x_ld, *Bt = B + (size_t)t * x_ld, *Ct = C + (size_t)t * x_ld;
        const float *zt = z + (size_t)t * z_ld;
        const float dts = softplus(dt[(size_t)t * dt_ld] + dt_b);
        const float dA = expf(dts * a);
        float *yt = y + (size_t)t * y_ld;
        for (int64_t i = 0; i < hd; i++) {
            float *row = S + i * ds;
            li_K->scale_f32(row, dA, ds);
            li_K->axpy_f32(xt[i] * dts, Bt, row, ds);
            yt[i] = (li_K->dot_f32(row, Ct, ds) + xt[i] * d) * silu(zt[i]);
        }
    }
}
