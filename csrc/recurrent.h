/* recurrent.h: the recurrent mixers' per-sequence kernels (recurrent.c),
 * called by the forward pass (model.c) on items of (sequence, channels) or
 * (sequence, head). Rows are batch rows of one sequence, in position order;
 * *_ld are row strides in floats. */
#ifndef LLMINFER_RECURRENT_H
#define LLMINFER_RECURRENT_H

#include <stddef.h>
#include <stdint.h>

/* causal convolution of K taps over channels [c0, c1), the window state
 * [channels, K - 1] updated in place; act: SiLU of the output */
void li_conv_rows(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                  const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act);
/* a GDN key head's q and k L2-normed, q scaled by 1 / sqrt(dk) */
void li_gdn_norm_qk(float *q, float *k, int64_t dk, float eps);
/* one GDN value head's delta-rule recurrence over the rows, state S [dv, dk] */
void li_gdn_head(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q, const float *k,
                 size_t qk_ld, const float *v, size_t v_ld, const float *alpha, const float *beta, size_t ab_ld,
                 float dt_b, float a, float *o, size_t o_ld);
/* one Mamba2 head's selective scan over the rows, state S [hd, ds]; x, B, C
 * share the row stride x_ld (they lie in one row of the convolution's output) */
void li_mamba2_head(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n, const float *x, size_t x_ld,
                    const float *B, const float *C, const float *dt, size_t dt_ld, float dt_b, float a, float d,
                    const float *z, size_t z_ld, float *y, size_t y_ld);
/* o = rmsnorm(o) * w * silu(z) */
void li_gated_head_norm(float *o, const float *w, const float *z, int64_t dv, float eps);
/* x *= sigmoid(g) */
void li_sigmoid_gate(float *x, const float *g, int64_t n);

#endif
