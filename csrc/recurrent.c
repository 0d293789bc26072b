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
 * The convolution, the delta rule and the selective scan are kernels of
 * the active level (li_K: conv_rows, gdn_head, mamba2_head, specified by
 * kernels/scalar_recurrent.c and tested per level against it); the norms
 * and gates here run over the level's vector kernels (dot, scale, RMSNorm).
 * Within a level every call does a sequence's float operations in one
 * order, whatever the batch or the team.
 */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/recurrent_math.h"
#include "recurrent.h"

void li_conv_rows(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                  const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act) {
    li_K->conv_rows(x, x_ld, y, y_ld, rows, n, w, bias, K, state, c0, c1, act);
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

void li_gdn_head(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q, const float *k,
                 size_t qk_ld, const float *v, size_t v_ld, const float *alpha, const float *beta, size_t ab_ld,
                 float dt_b, float a, float *o, size_t o_ld) {
    li_K->gdn_head(S, dk, dv, rows, n, q, k, qk_ld, v, v_ld, alpha, beta, ab_ld, dt_b, a, o, o_ld);
}

/* o = rmsnorm(o) * w * silu(z), one head's dv values */
void li_gated_head_norm(float *o, const float *w, const float *z, int64_t dv, float eps) {
    li_K->rms_norm(o, w, o, dv, eps);
    for (int64_t j = 0; j < dv; j++) o[j] *= li_silu(z[j]);
}

void li_sigmoid_gate(float *x, const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= li_sigmoid(g[i]);
}

void li_mamba2_head(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n, const float *x, size_t x_ld,
                    const float *B, const float *C, const float *dt, size_t dt_ld, float dt_b, float a, float d,
                    const float *z, size_t z_ld, float *y, size_t y_ld) {
    li_K->mamba2_head(S, hd, ds, rows, n, x, x_ld, B, C, dt, dt_ld, dt_b, a, d, z, z_ld, y, y_ld);
}
