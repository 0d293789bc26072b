/* matmul.h: the parallel building blocks of ops.c and model.c. Each is called
 * by every thread of a team with its index ith of nth, and does that thread's
 * share; a caller separates dependent steps with LI_BARRIER(). */
#ifndef LLMINFER_MATMUL_H
#define LLMINFER_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* A weight matrix [rows, k] stored row by row in `type`. */
typedef struct {
    const void *data;
    int type;
    int64_t rows, k;
    size_t row_bytes;
} li_weight;

/* Quantize x[n, k] (row stride x_stride floats) to the activation format of
 * weight type `type`, into xq (rows of li_act_row_bytes(act, k) bytes). */
void li_quantize_acts(int type, const float *x, int64_t x_stride, int64_t n, int64_t k, void *xq,
                      int ith, int nth);

/* y[c, r] = dot(W[r], x[c]) for r < rows, c < n; xq as li_quantize_acts left
 * it; y has row stride y_stride floats. Thread ith takes its share of rows. */
void li_matmul_q(const li_weight *w, const void *xq, int64_t n, float *y, int64_t y_stride,
                 int ith, int nth);

/* li_matmul_q with its rows shared among the team as it works (share.h):
 * units of 16 rows, each thread from its own share on, then from the back
 * of another's; a row's result is the same whoever computes it. Every
 * thread of the team calls it, with the products of a region in the same
 * order; share NULL (or one thread) is li_matmul_q's fixed split. */
struct li_share;
void li_matmul_q_shared(const li_weight *w, const void *xq, int64_t n, float *y, int64_t y_stride,
                        struct li_share *share, int ith, int nth);

/* Prefill over packed panels (gemm.c), for batches of at least LI_GEMM_MIN_N
 * rows of a type with a panel form at a level with a panel kernel. Each
 * thread needs li_gemm_scratch_bytes of its own scratch. */
/* Packing a panel costs about one pass of the dot kernels over its rows, and
 * the dot kernels read a weight row once per LI_DOT_MAX_NC activation rows:
 * below ~32 rows (a decode step of a few dozen sequences) they are faster
 * (measured on a 1B Q4_K_M model, 2 threads: n=8 took 0.54x the time of
 * the panels, n=16 0.8x, n=32 about the same). Both give a row bitwise the
 * same result, so the choice is only one of speed. */
#define LI_GEMM_MIN_N 32
/* A small matrix (at most LI_GEMM_SMALL values: a MoE expert's) takes the
 * panels from LI_GEMM_MIN_N_SMALL rows: a Qwen3.6-35B-A3B-shaped MoE's
 * prompt routes ~16 tokens to each expert, and its 1-thread pp512 ran 7-8%
 * faster so (docs/kernel-tuning.md#gemm-small-matrices); a large matrix at
 * n = 16 still went faster through the dot kernels. */
#define LI_GEMM_SMALL ((int64_t)1 << 20)
#define LI_GEMM_MIN_N_SMALL 16
/* MXFP4's panels (level + 12, written with vectors) cost little to pack and
 * its dot kernels' table lookups much per value: its experts (gpt-oss's)
 * take the panels from 8 rows (docs/kernel-tuning.md) */
#define LI_GEMM_MIN_N_MXFP4 8
int li_gemm_applies(int type, int64_t n, int64_t rows, int64_t k);
size_t li_gemm_scratch_bytes(int type, int64_t k, int64_t n);
void li_gemm_q(const li_weight *w, const void *xq, int64_t n, float *y, int64_t y_stride,
               void *scratch, int ith, int nth);

/* RoPE angles computed the way ggml computes them, so that positions rotate
 * as in llama.cpp to the last bit: theta_i = p * theta_scale^i by repeated
 * float products, theta_scale = powf(freq_base, -2/n_rot), and the angle is
 * freq_scale * theta_i / factors[i] (factors: Llama 3.1's, or NULL). */
typedef struct {
    float theta_scale, freq_scale;
    const float *factors; /* [n_rot/2] or NULL */
    int sect[4];          /* M-RoPE sections (li_model_desc's rope_sect_*); their sum 0: one position */
    int n_sect;           /* their sum */
    int interleave;       /* imrope: sections interleaved pair by pair */
} li_rope_params;
void li_rope_params_init(li_rope_params *r, int64_t n_rot, float freq_base, float freq_scale,
                         const float *factors);
/* cs[t, i] = (cos, sin) of token t's angle i, i < n_rot/2 (once per batch,
 * shared by all layers and heads). With sections (li_rope_set_sections),
 * pair i turns by the position of its section: pos4[t, 0..3] where pos4 is
 * given, else (pos[t], pos[t], pos[t], 0); pos4 is ignored without. */
void li_rope_cache(const int32_t *pos, const int32_t *pos4, int64_t n_tok, int64_t n_rot, const li_rope_params *r,
                   float *cs);
void li_rope_set_sections(li_rope_params *r, const int sect[4], int interleave);
/* rotate one head vector in place with its token's row of the cache */
void li_rope_head(float *x, const float *cs, int64_t n_rot, int mode);

#endif
