/* recurrent_math.h: the per-token scalars of the recurrent kernels, one
 * definition for every level (scalar_recurrent.c, x86_*_recurrent.c,
 * arm_neon_recurrent.c), so that the levels differ only in how they add up
 * a row of the state, never in a gate or a decay. Plain libm: ggml computes
 * these with expf / log1pf too. */
#ifndef LLMINFER_RECURRENT_MATH_H
#define LLMINFER_RECURRENT_MATH_H

#include <math.h>

#include "../common.h"

LI_INLINE float li_silu(float x) { return x / (1.0f + expf(-x)); }
LI_INLINE float li_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
LI_INLINE float li_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Tokens whose gates a SIMD level works out ahead, before it takes each row
 * of the state through them while the row sits in L1: the rows of S are
 * independent of each other, so the order (row, token) does the float
 * operations of (token, row) on each value, and gives its bits. */
#define LI_RECURRENT_CHUNK 16

#endif
