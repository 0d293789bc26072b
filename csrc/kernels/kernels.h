/* kernels.h: the table of kernels one ISA level provides.
 *
 * The scalar table (scalar.c) is the specification: plain loops, always
 * built. Each SIMD level (x86_avx2.c, arm_neon.c, ...) starts from a copy of
 * the scalar table and replaces the entries it implements, so a level may be
 * partial and still complete. dispatch.c picks one table at run time.
 *
 * Weight x activation products: a weight of type T is multiplied by
 * activations first quantized to li_types[T].act_type (Q8_0 for Q4_0/Q5_0/Q8_0
 * and IQ4_NL/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, IQ4_XS, the
 * grid i-quants and TQ1_0/TQ2_0, plain float for F32/F16/BF16).
 */
#ifndef LLMINFER_KERNELS_H
#define LLMINFER_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../arch.h"
#include "../blocks.h"
#include "../gemm.h"
#include "../llminfer.h"
#include "../repack.h"
#include "../sgemm.h"

/* activation formats (indices into li_kernels.quant_act) */
enum li_act_type { LI_ACT_F32 = 0, LI_ACT_Q8_0 = 1, LI_ACT_Q8_1 = 2, LI_ACT_Q8_K = 3, LI_ACT_COUNT = 4 };

/* Most activation rows one dot call takes: one weight row is decoded once and
 * used against all of them (prefill tiling). */
#define LI_DOT_MAX_NC 4

/* activation row c of type T, the rows x_stride bytes apart (as li_dot_fn
 * lays them out) */
#define ACT_ROW(T, x, c, stride) ((const T *)((const char *)(x) + (size_t)(c) * (stride)))

/* k floats of a row from its stored form */
typedef void (*li_dequant_fn)(const void *src, float *dst, int64_t k);
/* k floats into activation blocks (k a multiple of the act block size) */
typedef void (*li_quant_act_fn)(const float *src, void *dst, int64_t k);
/* s[c] = dot(weight row w, activation row c) for c < nc <= LI_DOT_MAX_NC, where
 * activation row c starts at (const char *)x + c * x_stride; k elements each. */
typedef void (*li_dot_fn)(int64_t k, const void *w, const void *x, size_t x_stride, int nc,
                          float *s);

/* Most weight rows one dot_rows call takes. */
#define LI_DOT_MAX_NR 4
/* y[c * y_stride + r] = dot(weight row r, activation row c) for r < nr <= LI_DOT_MAX_NR and
 * c < nc <= LI_DOT_MAX_NC, where weight row r starts at (const char *)w + r * w_stride.
 * Several weight rows at once let a level share the per-block activation work
 * (loads, sums, scales) between rows, which is what decode (nc = 1) is short of.
 * Optional: where a table's entry is NULL, li_matmul_q calls `dot` row by row,
 * so `dot` stays the reference and a level may leave this out. */
typedef void (*li_dot_rows_fn)(int64_t k, const void *w, size_t w_stride, int nr, const void *x,
                               size_t x_stride, int nc, float *y, size_t y_stride);

/* Causal convolution of K taps over channels [c0, c1) of rows rows[0..n):
 * y[t][ch] = (act ? SiLU : identity)(bias[ch] + sum_j w[ch][j] win_j), the
 * window being channel ch's K - 1 past inputs (state[ch][0..K-1), the
 * oldest first) and then x[t][ch]; the window then moves on by one. */
typedef void (*li_conv_rows_fn)(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows,
                                int64_t n, const float *w, const float *bias, int K, float *state, int64_t c0,
                                int64_t c1, int act);
/* One Gated DeltaNet value head over rows rows[0..n), state S [dv][dk]; per
 * row t: decay = exp(softplus(alpha_t + dt_b) a), b = sigmoid(beta_t), and
 * for each row j of S: S_j *= decay; d = (v_j - S_j . k) b; S_j += d k;
 * o_j = S_j . q. */
typedef void (*li_gdn_head_fn)(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q,
                               const float *k, size_t qk_ld, const float *v, size_t v_ld, const float *alpha,
                               const float *beta, size_t ab_ld, float dt_b, float a, float *o, size_t o_ld);
/* One Mamba2 head over rows rows[0..n), state S [hd][ds]; per row t: dt =
 * softplus(dt_t + dt_b), dA = exp(dt a), and for each channel i (row i of
 * S): S_i = S_i dA + (x_i dt) B; y_i = (S_i . C + x_i d) SiLU(z_i). */
typedef void (*li_mamba2_head_fn)(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n,
                                  const float *x, size_t x_ld, const float *B, const float *C, const float *dt,
                                  size_t dt_ld, float dt_b, float a, float d, const float *z, size_t z_ld, float *y,
                                  size_t y_ld);

typedef struct li_kernels {
    int isa;
    li_dequant_fn dequant[LI_TYPE_COUNT];
    li_dot_fn dot[LI_TYPE_COUNT];
    li_dot_rows_fn dot_rows[LI_TYPE_COUNT]; /* NULL where the level has none */
    li_quant_act_fn quant_act[LI_ACT_COUNT];

    /* y = x * (1/sqrt(mean(x^2)+eps)) * w (w may be NULL) */
    void (*rms_norm)(const float *x, const float *w, float *y, int64_t k, float eps);
    /* in place, numerically stable */
    void (*softmax)(float *x, int64_t k);
    /* y[i] = lut(x[i]) (* u[i] when u is not NULL), lut a 65536-entry F16-indexed table */
    /* y[i] = act(x[i]) (* u[i] when u is not NULL) through the F16-indexed
     * tables of ops.c: SiLU interpolates between table points with the
     * tabulated slope (to float accuracy, as ggml computes SiLU exactly);
     * GELU takes ggml's table, values rounded to f16, exact beyond +-10 */
    void (*act_apply)(int fn, const float *x, const float *u, float *y, int64_t n);
    /* attention over an F16 cache */
    float (*dot_f32_f16)(const float *a, const uint16_t *b, int64_t n);
    void (*axpy_f16)(float a, const uint16_t *x, float *y, int64_t n); /* y += a*x */
    void (*f32_to_f16)(const float *x, uint16_t *y, int64_t n);
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float a, const float *x, float *y, int64_t n); /* y += a*x */
    void (*scale_f32)(float *x, float a, int64_t n);
    void (*add_f32)(const float *a, const float *b, float *y, int64_t n);
    void (*mul_f32)(const float *a, const float *b, float *y, int64_t n);

    /* attention over n cached rows of d float16 values, row j at k + j*stride,
     * for the nh query heads that share them (grouped-query attention):
     * out[h*out_ld + j] = scale * dot(q + h*q_stride, row j) */
    void (*attn_scores_f16)(const float *q, size_t q_stride, int nh, const uint16_t *k, size_t stride,
                            int64_t n, int64_t d, float scale, float *out, size_t out_ld);
    /* out + h*out_stride [0..d) += sum over j < n of p[h*p_ld + j] * row j of v, for h < nh */
    void (*attn_accum_f16)(const float *p, size_t p_ld, int nh, const uint16_t *v, size_t stride,
                           int64_t n, int64_t d, float *out, size_t out_stride);
    /* x[i] = exp(x[i] - mx) in place; returns their sum */
    float (*exp_sum)(float *x, int64_t n, float mx);
    /* the least and greatest of x[0..n) (n >= 1) into lo and hi; both NaN
     * when some x is NaN */
    void (*range_f32)(const float *x, int64_t n, float *lo, float *hi);
    /* x[i] = z = x[i] * scale, then cap * tanh(z / cap) when cap > 0 (the
     * final logit soft-cap). Scalar: tanhf. A SIMD level's tanh is its own
     * approximation (within 1e-6 relative of tanh), the same function of
     * each element wherever it lies in x, so a logit's bits do not depend
     * on how the rows are split between threads. */
    void (*softcap_f32)(float *x, int64_t n, float scale, float cap);

    /* prefill kernels over packed panels (gemm.h), by panel kind; NULL: the
     * level multiplies batches with its dot kernels */
    li_gemm_fn gemm[3];
    /* the values of a K-quant panel written with vectors (gemm.h); NULL: gemm.c's plain packing */
    li_panel_values_fn panel_values;
    /* products over weights repacked at load (repack.h), by weight type; NULL
     * where the level has none */
    li_x16_fn x16[LI_TYPE_COUNT];
    /* prefill over a group's values unpacked once (repack.h); NULL where
     * the type's x16 kernel reads its packed values directly */
    li_x16_unpack_fn x16_unpack[LI_TYPE_COUNT];
    li_x16u_fn x16u[LI_TYPE_COUNT];
    /* the float GEMM's register tile (sgemm.h), by panel element type */
    li_sgemm_tile_fn sgemm_tile[LI_SGEMM_ELEMS];
    /* p [n][LI_SGEMM_NR], n >= 1, column by column: p[i][j] = exp(p[i][j] -
     * max over i of p[i][j]), sum[j] their sum (full attention's scores,
     * keys down, queries across) */
    void (*softmax_panel)(float *p, int64_t n, float *sum);

    /* the recurrent mixers of hybrid models (their types above say what each
     * computes): one sequence's rows, in position order, through its state,
     * updated in place in the layout the state pool keeps. scalar_recurrent.c
     * is their specification. */
    li_conv_rows_fn conv_rows;
    li_gdn_head_fn gdn_head;
    li_mamba2_head_fn mamba2_head;
} li_kernels;

/* per-type facts (qtypes.c) */
typedef struct {
    const char *name;
    int block_size; /* elements per block; 0 when the type is not supported */
    int type_size;  /* bytes per block */
    int act_type;   /* enum li_act_type its activations are quantized to */
} li_type_traits;
extern const li_type_traits li_types[LI_TYPE_COUNT];
/* bytes of one activation row of k elements in act format a */
size_t li_act_row_bytes(int act, int64_t k);
int li_act_block_size(int act);

/* the scalar activation (SIMD levels hand it the elements past their last full vector) */
void li_act_apply_scalar(int fn, const float *x, const float *u, float *y, int64_t n);
/* the scalar convolution (SIMD levels hand it the channels past their last full vector) */
void li_conv_rows_scalar(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                         const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act);
/* gpt-oss's clamped SwiGLU (LI_FN_SWIGLU_OAI), y = min(g, 7) sigmoid(1.702
 * min(g, 7)) (clamp(u, -7, 7) + 1), element by element with expf in ggml's
 * order of operations, the same at every level (no table: its tails reach
 * values the f16 grid rounds coarsely) */
void li_swiglu_oai(const float *g, const float *u, float *y, int64_t n);
/* y = fn(g) * u for any enum li_gate_fn: the level's act_apply, or li_swiglu_oai */
void li_gate_apply(int fn, const float *g, const float *u, float *y, int64_t n);

/* the tables, filled once by dispatch.c */
void li_kernels_fill_scalar(li_kernels *t);
void li_kernels_fill_scalar_iq(li_kernels *t); /* scalar_iq.c */
void li_recurrent_fill_scalar(li_kernels *t);   /* scalar_recurrent.c */
#if defined(LI_ARCH_X86)
void li_kernels_fill_avx2(li_kernels *t);
void li_gemm_fill_avx2(li_kernels *t); /* x86_avx2_gemm.c */
void li_sgemm_fill_avx2(li_kernels *t); /* x86_avx2_sgemm.c */
void li_kernels_fill_avx2_iq(li_kernels *t); /* x86_avx2_iq.c */
void li_x16_fill_avx2(li_kernels *t);        /* x86_avx2_x16.c */
void li_recurrent_fill_avx2(li_kernels *t);  /* x86_avx2_recurrent.c */
void li_kernels_fill_avx512(li_kernels *t);
void li_x16_fill_avx512(li_kernels *t); /* x86_avx512_x16.c */
void li_recurrent_fill_avx512(li_kernels *t); /* x86_avx512_recurrent.c */
int64_t li_x16_peak_probe(int64_t iters); /* the int8 peak probe of bench.c; 0 without the flags */
#endif
#if defined(LI_ARCH_ARM64)
void li_kernels_fill_neon(li_kernels *t);
void li_kernels_fill_neon_dot(li_kernels *t);
void li_kernels_fill_neon_iq(li_kernels *t); /* arm_neon_iq.c */
void li_recurrent_fill_neon(li_kernels *t);  /* arm_neon_recurrent.c */
#endif

/* the active table (dispatch.c) */
extern const li_kernels *li_K;
void li_init(void);

/* the F16-indexed activation tables (luts.c), filled by li_luts_init */
extern float li_lut_silu[65536];
extern float li_lut_silu_slope[65536];
extern float li_lut_gelu[65536];
void li_luts_init(void);
/* where the tables are not consulted: SiLU(x) = x above, 0 below; GELU likewise */
#define LI_SILU_HI 16.0f
#define LI_SILU_LO (-64.0f)
#define LI_GELU_HI 10.0f
#define LI_GELU_LO (-10.0f)

#endif
