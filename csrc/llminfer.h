/* llminfer.h: the C core's public interface, mirrored by llminfer/_clib.pxd.
 *
 * Every function returns a status (LI_OK or a negative LI_E_* code) or a
 * plain value; none aborts or exits. Buffers are caller-owned; sizes are
 * passed alongside pointers and checked before anything is read or written.
 *
 * Shapes follow numpy: a weight matrix is [rows, k] with k contiguous, stored
 * row by row in its GGUF type; activations are float32 [n, k].
 */
#ifndef LLMINFER_H
#define LLMINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ---- */
#define LI_OK 0
#define LI_E_ARG (-1)      /* invalid argument (null pointer, negative size, bad enum) */
#define LI_E_TYPE (-2)     /* tensor type unknown or not supported by this operation */
#define LI_E_SHAPE (-3)    /* sizes do not agree (byte length, block multiple, ...) */
#define LI_E_NOMEM (-4)    /* allocation failed */
#define LI_E_ISA (-5)      /* instruction set not available on this CPU or build */
#define LI_E_CONTEXT (-6)  /* position outside the context / KV cache */
#define LI_E_TOKEN (-7)    /* token id outside the vocabulary */
#define LI_E_KV (-8)       /* a block table entry outside its pool, or a position outside its table */
#define LI_E_DEVICE (-9)   /* a GPU backend failed: no device, out of device memory, a kernel error */
const char *li_status_name(int status);

/* ---- tensor types: the GGML type numbers ---- */
enum li_type {
    LI_TYPE_F32 = 0,
    LI_TYPE_F16 = 1,
    LI_TYPE_Q4_0 = 2,
    LI_TYPE_Q4_1 = 3,
    LI_TYPE_Q5_0 = 6,
    LI_TYPE_Q5_1 = 7,
    LI_TYPE_Q8_0 = 8,
    LI_TYPE_Q2_K = 10,
    LI_TYPE_Q3_K = 11,
    LI_TYPE_Q4_K = 12,
    LI_TYPE_Q5_K = 13,
    LI_TYPE_Q6_K = 14,
    LI_TYPE_IQ2_XXS = 16,
    LI_TYPE_IQ2_XS = 17,
    LI_TYPE_IQ3_XXS = 18,
    LI_TYPE_IQ1_S = 19,
    LI_TYPE_IQ4_NL = 20,
    LI_TYPE_IQ3_S = 21,
    LI_TYPE_IQ2_S = 22,
    LI_TYPE_IQ4_XS = 23,
    LI_TYPE_IQ1_M = 29,
    LI_TYPE_BF16 = 30,
    LI_TYPE_TQ1_0 = 34,
    LI_TYPE_TQ2_0 = 35,
    LI_TYPE_MXFP4 = 39,
    LI_TYPE_COUNT = 40
};

/* Block size (elements) and type size (bytes) of a supported type; LI_E_TYPE otherwise. */
int li_type_sizes(int type, int *block_size, int *type_size);
/* Bytes taken by `rows` rows of `k` elements; 0 when type is unsupported or k not a block multiple. */
size_t li_row_bytes(int type, int64_t k);
const char *li_type_name(int type);

/* ---- CPU features and kernel levels ---- */
enum li_isa {
    LI_ISA_SCALAR = 0,
    LI_ISA_AVX2 = 1,       /* x86-64 AVX2 + FMA + F16C */
    LI_ISA_AVX512 = 2,     /* AVX2 level plus AVX-512 F/BW/VL/DQ and VNNI (prefill kernels) */
    LI_ISA_NEON = 3,       /* aarch64 Advanced SIMD */
    LI_ISA_NEON_DOT = 4,   /* NEON plus the SDOT instruction */
    LI_ISA_COUNT = 5
};
const char *li_isa_name(int isa);
/* Feature names the CPU reports, space separated, into buf (always terminated). */
void li_cpu_features(char *buf, size_t size);
/* 1 when `isa` was compiled in and the CPU can run it. */
int li_isa_available(int isa);
int li_isa_best(void);
int li_isa_current(void);
/* Select the kernel level used by every later call; LI_E_ISA if unavailable.
 * Not to be called while another thread is computing. */
int li_isa_select(int isa);

/* Where decode's repacked kernels hint the weight stream ahead of their
 * loads (csrc/kernels/x86_avx512_x16.c): into L1 as the first line to go
 * (prefetchnta, the way AMD's cores read fastest) or into L2 (prefetcht1:
 * Intel's, whose prefetchnta fills L1 alone and left one core at a third of
 * its read pace). A context takes its kind when it is created (li_tuning);
 * li_stream_hint_select sets the kind new contexts take (li_init's choice
 * by the CPU's vendor until then). A hint never changes a result. */
enum li_stream_hint {
    LI_STREAM_L1_NTA = 0,
    LI_STREAM_L2 = 1,
    LI_STREAM_COUNT = 2
};
const char *li_stream_hint_name(int kind);
int li_stream_hint_default(void);
int li_stream_hint_current(void);
/* LI_E_ARG for a kind out of range */
int li_stream_hint_select(int kind);

int li_openmp_enabled(void);
int li_max_threads(void);

/* ---- row kernels on numpy-shaped data ---- */
/* dst[rows, k] (float32) from src (rows * row_bytes(type, k) bytes). */
int li_dequantize(int type, const void *src, size_t src_bytes, int64_t rows, int64_t k,
                  float *dst, int n_threads);
/* dst (rows * row_bytes(type, k) bytes) from src[rows, k]; Q4_0..Q8_0 match the gguf
 * package bit for bit; Q4_K, Q5_K, Q6_K use our own K-quant search; MXFP4 matches
 * llama.cpp's quantize_row_mxfp4_ref. */
int li_quantize(int type, const float *src, int64_t rows, int64_t k, void *dst,
                size_t dst_bytes, int n_threads);
/* y[n, rows] = x[n, k] . W[rows, k]^T with W stored in `type`. */
int li_matmul(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k,
              const float *x, int64_t n, float *y, int n_threads);
/* The same product through the weights' repacked form (repack.h), packed
 * for this call: LI_E_TYPE where the active kernel level has no repacked
 * kernel for the type. The results are bitwise those of li_matmul. */
int li_matmul_repacked(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, const float *x,
                       int64_t n, float *y, int n_threads);
/* 1 when the active kernel level multiplies `type` in its repacked form */
int li_x16_available(int type);
/* A matrix repacked once, multiplied many times (benchmarks, tests):
 * create (LI_E_TYPE where li_x16_available says no), multiply x[n, k] into
 * y[n, rows], free. */
typedef struct li_repacked li_repacked;
int li_repacked_create(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, int n_threads,
                       li_repacked **out);
int li_repacked_matmul(const li_repacked *m, const float *x, int64_t n, float *y, int n_threads);
/* count (1 to 32) such products, y_i[n_i, rows_i] = x_i W_i^T, shared by
 * the team as one (repack.h's li_x16_matmul_parts): each bitwise what
 * li_repacked_matmul gives it */
int li_repacked_matmul_joint(const li_repacked *const *ms, const float *const *xs, const int64_t *ns, float *const *ys,
                             int count, int n_threads);
void li_repacked_free(li_repacked *m);
/* vpdpbusd-class int8 multiply-adds per second one thread of the active
 * level reaches on independent register chains (the int8 peak the kernel
 * benchmark compares with); 0 where the level has none */
double li_bench_int8_peak(void);

/* ---- float products over weights packed once (sgemm.h): the vision encoder ---- */
/* W [rows, k] stored in `type` packed into panels of 16 rows: F16 stays F16
 * (widened as the kernel reads it) unless f32_panels; every other type is
 * dequantized to float. */
typedef struct li_gemm_weight li_gemm_weight;
int li_gemm_weight_create(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, int f32_panels,
                          int n_threads, li_gemm_weight **out);
/* bytes the panels take */
size_t li_gemm_weight_bytes(const li_gemm_weight *w);
void li_gemm_weight_free(li_gemm_weight *w);
/* y[m, rows] = x[m, k] W^T (+ bias[rows]) (+ res[m, rows]); bias, res may be
 * NULL. Each element's bits are the same at any thread count and level. */
int li_gemm(const li_gemm_weight *w, const float *x, int64_t m, const float *bias, const float *res, float *y,
            int n_threads);
/* Non-causal attention of one sequence of n rows: head h of row i is d
 * floats at q + i*ld + h*d (k, v likewise); out row i head h at out +
 * i*out_ld + h*d gets softmax(scale q K^T) V over all n keys. scratch:
 * li_attention_full_scratch bytes the caller keeps between calls (fresh
 * memory costs a page fault per page on each call), or NULL: allocated for
 * the call. */
int li_attention_full(const float *q, const float *k, const float *v, size_t ld, int64_t n, int n_head, int64_t d,
                      float scale, float *out, size_t out_ld, void *scratch, size_t scratch_bytes, int n_threads);
/* bytes of scratch li_attention_full takes for these sizes and threads; 0 for sizes not positive */
size_t li_attention_full_scratch(int64_t n, int n_head, int64_t d, int n_threads);
/* y[rows, k] = (x - mean) / sqrt(var + eps) (* w) (+ b), per row; w, b may be NULL */
int li_layer_norm(const float *x, int64_t rows, int64_t k, const float *w, const float *b, float eps, float *y,
                  int n_threads);
/* y = act(x) (LI_FN_SILU, LI_FN_GELU) as li_activation, the elements shared by n_threads */
int li_activation_mt(int fn, const float *x, int64_t n, float *y, int n_threads);

/* y[rows, k] = x / sqrt(mean(x^2) + eps) * w  (w may be NULL: no scaling) */
int li_rms_norm(const float *x, const float *w, int64_t rows, int64_t k, float eps, float *y,
                int n_threads);
/* The function that gates a feed-forward (the *function*; the formats a
 * matmul quantizes its activations to are li_act_type, kernels.h). */
enum li_gate_fn {
    LI_FN_SILU = 0,
    LI_FN_GELU = 1,
    LI_FN_RELU_SQR = 2, /* max(x, 0)^2, computed exactly: ungated feed-forwards only (nemotron_h) */
    /* gpt-oss's clamped SwiGLU (ggml_swiglu_oai): g = min(g, 7), u = clamp(u,
     * -7, 7), y = g / (1 + exp(-1.702 g)) * (u + 1), computed with expf (no
     * table); gated only (li_activation refuses it) */
    LI_FN_SWIGLU_OAI = 3
};
/* y = act(x) through the F16 lookup tables */
int li_activation(int fn, const float *x, int64_t n, float *y);
/* y = act(g) * u */
int li_gated_activation(int fn, const float *g, const float *u, int64_t n, float *y);
/* y = act(g) * u as li_gated_activation, the elements shared by n_threads;
 * y may be g itself (in place) */
int li_gated_activation_mt(int fn, const float *g, const float *u, int64_t n, float *y, int n_threads);
/* row-wise softmax, numerically stable */
int li_softmax(const float *x, int64_t rows, int64_t k, float *y);
/* the least and greatest of x[0..n), n >= 1; both NaN when some x is NaN */
int li_value_range(const float *x, int64_t n, float *lo, float *hi);
/* The ids of the k largest of x[0..n) (1 <= k <= n, no NaN) into ids, the
 * largest value first and, among equal values, the lowest id first (so of
 * values equal to the k-th largest, the lowest ids are the ones kept). */
int li_top_k_f32(const float *x, int64_t n, int64_t k, int32_t *ids);
/* Top-p's cut over x[0..n) (no NaN) with weights e (exp(x - max), float32):
 * going down x (larger first, lower ids first among equals) and counting
 * only tokens of weight > 0 and x >= floor_x, the token where the running
 * weight first reaches target. *v its logit and *r how many tokens of that
 * logit the cut keeps (it and those of lower id), >= 1; *r = 0 when the
 * tokens at or above floor_x weigh less than target. scratch: 12 * n bytes. */
int li_top_p_cut(const float *x, const float *e, int64_t n, double target, float floor_x, void *scratch,
                 float *v, int64_t *r);
int li_add(const float *a, const float *b, int64_t n, float *y);
int li_mul(const float *a, const float *b, int64_t n, float *y);

enum li_rope_mode { LI_ROPE_NORM = 0, LI_ROPE_NEOX = 2 };
/* In place on x[n_tok, n_head, head_dim]: the first n_rot dims of each head are
 * rotated by pos[t] * freq_scale * freq_base^(-2i/n_rot). NORM rotates pairs
 * (2i, 2i+1); NEOX rotates (i, i + n_rot/2). */
int li_rope(float *x, int64_t n_tok, int64_t n_head, int64_t head_dim, int64_t n_rot,
            const int32_t *pos, float freq_base, float freq_scale, int mode);
/* li_rope on the heads of tokens ld floats apart (ld >= n_head * head_dim),
 * head h of token t turned by pos[t * n_pos + h % n_pos] (n_pos >= 1: one
 * position column, or one per head in turn, as the 2-D RoPE of vision towers
 * turns half-heads by the row and by the column); the tokens shared by
 * n_threads, each value the same at any n_threads */
int li_rope_mt(float *x, int64_t n_tok, int64_t ld, int64_t n_head, int64_t head_dim, int64_t n_rot,
               const int32_t *pos, int n_pos, float freq_base, float freq_scale, int mode, int n_threads);


/* ---- models: a decoder-only transformer, described by the Python layer ---- */

/* A weight matrix [rows, k] in `type`, borrowed (the caller keeps it alive). */
typedef struct li_matrix {
    const void *data;
    int type;
    int64_t rows, k;
    size_t nbytes;
    const void *packed; /* NULL, or the rows repacked by li_model_repack (owned by it) */
} li_matrix;

/* One block. Vectors are float32 and borrowed; NULL means "absent".
 * The Python layer fills this struct and li_model_desc field by field from
 * the spec's attributes of the same names (tools/gen_desc.py writes that
 * code from this header): a new option is a field here, its attribute on the
 * spec (llminfer/models/base.py) and the architecture that sets it. */
typedef struct li_layer_desc {
    const float *attn_norm;      /* [n_embd] */
    li_matrix wq, wk, wv, wo;    /* [n_head*head_dim, n_embd], [n_head_kv*head_dim, n_embd] x2, [n_embd, n_head*head_dim_v] */
    const float *bq, *bk, *bv;   /* biases (qwen2) */
    const float *q_norm, *k_norm;/* [head_dim] per-head RMSNorm (gemma3) */
    const float *post_attn_norm; /* [n_embd] norm of the attention output before the residual (gemma) */
    const float *ffn_norm;       /* [n_embd] */
    li_matrix w_gate, w_up, w_down; /* [n_ff, n_embd] x2, [n_embd, n_ff] */
    const float *post_ffn_norm;  /* [n_embd] */
    float rope_base, rope_scale; /* this layer's RoPE frequency base and linear scale (1/factor) */
    int sliding_window;          /* 0: attends to the whole context; else to the last W positions */
    int no_rope;                 /* nonzero: this layer's queries and keys are not rotated (smollm3) */
    /* Mixture of experts (router.data non-NULL; w_gate, w_up, w_down then unused and NULL):
     * the experts' weights one after another, as GGUF stores its 3-D ffn_*_exps tensors */
    li_matrix router;            /* [n_expert, n_embd] (ffn_gate_inp) */
    li_matrix gate_exps, up_exps;/* [n_expert * n_ff_exp, n_embd] */
    li_matrix down_exps;         /* [n_expert * n_embd, n_ff_exp] */
    /* The layer's mixer (enum li_mixer): attention, or a recurrent layer of a
     * hybrid model that keeps a fixed-size state per sequence (a window of
     * past inputs for its convolution, and a recurrent matrix) in the
     * context's state pool instead of keys and values. A layer with neither
     * a dense (w_gate) nor an expert (router) feed-forward has none. */
    int mixer;
    int attn_out_gate;           /* qwen35: wq yields per head head_dim queries then head_dim gate values; the
                                  * attention output is multiplied by sigmoid(gate) before wo */
    li_matrix ssm_in;            /* GDN: attn_qkv [2 * n_group * d_state + d_inner, n_embd] (q, k, v);
                                  * shortconv: in_proj [3 * n_embd, n_embd] (b, c, x);
                                  * mamba2: ssm_in [2 * d_inner + 2 * n_group * d_state + n_head, n_embd] (z, xBC, dt) */
    li_matrix ssm_z;             /* GDN: attn_gate [d_inner, n_embd], the output gate z */
    li_matrix ssm_beta, ssm_alpha; /* GDN: [n_head, n_embd] each */
    const float *ssm_conv;       /* [channels, d_conv]: channel c's taps, the oldest input first */
    const float *ssm_conv_b;     /* mamba2: [channels] */
    const float *ssm_dt_b;       /* GDN, mamba2: [n_head] added to dt (alpha) before softplus */
    const float *ssm_a;          /* GDN, mamba2: [n_head], the (negative) decay rate as the file stores it */
    const float *ssm_d;          /* mamba2: [n_head] skip */
    const float *ssm_norm;       /* GDN: [head_v_dim] RMSNorm of each head's output; mamba2: [d_inner] grouped */
    li_matrix ssm_out;           /* [n_embd, d_inner] (shortconv: out_proj [n_embd, n_embd]) */
    /* A MoE layer's shared expert (qwen35moe, qwen3next, qwen2moe): a gated
     * feed-forward of n_ff_shexp every token goes through, its output times
     * sigmoid(x . gate_inp_shexp), added to the routed experts' */
    li_matrix gate_shexp, up_shexp; /* [n_ff_shexp, n_embd] */
    li_matrix down_shexp;        /* [n_embd, n_ff_shexp] */
    const float *gate_inp_shexp; /* [n_embd], or NULL: the shared expert ungated */
    const float *router_sel_b;   /* [n_expert] LI_GATING_SIGMOID: added to the sigmoids to choose (exp_probs_b) */
    /* gpt-oss: a learned logit per query head that joins each softmax's
     * denominator (as exp(sink - max)) but weighs no value; biases on the
     * attention output, the router and the experts (NULL: none) */
    const float *attn_sinks;     /* [n_head] */
    const float *bo;             /* [n_embd] added to the attention output (wo's product) */
    const float *router_b;       /* [n_expert] added to the router's logits */
    const float *gate_exps_b, *up_exps_b; /* [n_expert * n_ff_exp]: expert e's at e * n_ff_exp */
    const float *down_exps_b;    /* [n_expert * n_embd]: expert e's at e * n_embd */
    /* Gemma 4: sliding and full layers differ in their attention sizes and
     * RoPE; the values get a per-head RMSNorm; the last layers attend to an
     * earlier layer's keys and values; each layer's output may be scaled;
     * and the small (E) models add a per-layer embedding after the
     * feed-forward */
    int head_dim, head_dim_v, n_head_kv, n_rot, n_ff; /* this layer's sizes; 0: the model's */
    const float *rope_factors;   /* [n_rot/2] this layer's RoPE frequency divisors; NULL: the model's */
    const float *v_norm;         /* [head_dim_v] per-head RMSNorm of the values before the cache, or NULL */
    int kv_reuse;                /* > 0: the layer has no wk, wv (nor k_norm, v_norm) and attends to the keys and
                                  * values of layer il - kv_reuse, an earlier attention layer of the same group and
                                  * sizes; 0: its own */
    float out_scale;             /* != 0: the residual stream is multiplied by this after the layer; 0: not */
    li_matrix pe_gate;           /* [n_embd_pe, n_embd]: with per-layer embeddings, after the feed-forward
                                  * x += rmsnorm(pe_proj (gelu(pe_gate x) * pe_in)) * pe_post_norm, pe_in the
                                  * token's per-layer input for this layer (li_model_desc) */
    li_matrix pe_proj;           /* [n_embd, n_embd_pe] */
    const float *pe_post_norm;   /* [n_embd] */
    /* Gemma 4's MoE layers (router_in_scale non-NULL): the router reads
     * rmsnorm(x) * router_in_scale / sqrt(n_embd), the experts rmsnorm(x) *
     * moe_norm, the shared expert (ungated, n_ff_shexp wide) rmsnorm(x) *
     * ffn_norm; expert e's output is times down_exps_s[e]; the experts'
     * weighted sum is normed by moe_post_norm, the shared expert's output by
     * shexp_post_norm, and their sum by post_ffn_norm before the residual */
    const float *router_in_scale;/* [n_embd] */
    const float *moe_norm;       /* [n_embd] */
    const float *down_exps_s;    /* [n_expert], or NULL */
    const float *moe_post_norm, *shexp_post_norm; /* [n_embd] */
    li_matrix gate_up_exps;      /* [n_expert * 2 * n_ff_exp, n_embd]: each expert's gate rows, then its up rows,
                                  * in place of gate_exps and up_exps (absent: those) */
} li_layer_desc;

/* What mixes a layer's positions. */
enum li_mixer {
    LI_MIX_ATTN = 0,             /* attention over the paged KV cache */
    LI_MIX_GDN = 1,              /* Gated DeltaNet (qwen35, qwen35moe, qwen3next) */
    LI_MIX_SHORTCONV = 2,        /* LFM2's gated short convolution */
    LI_MIX_MAMBA2 = 3,           /* Mamba2's selective scan (mamba2, nemotron_h, granitehybrid) */
    LI_MIX_NONE = 4,             /* no mixer: the layer is its feed-forward alone (nemotron_h) */
    LI_MIX_COUNT = 5
};

/* How a MoE layer weighs its experts. */
enum li_expert_gating {
    LI_GATING_SOFTMAX = 0,       /* softmax over all logits, the k most probable, their probabilities
                                  * renormalized to sum to 1 (qwen3moe) */
    LI_GATING_SOFTMAX_WEIGHT = 1,/* the k largest logits, then a softmax over those k (gpt-oss) */
    LI_GATING_SIGMOID = 2,       /* sigmoids of the logits; the k largest after adding the layer's
                                  * router_sel_b (selection only), their sigmoids normalized to sum 1 (lfm2moe) */
    LI_GATING_COUNT = 3
};

typedef struct li_model_desc {
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, head_dim_v, n_ff, n_rot;
    int rope_mode;               /* LI_ROPE_NORM or LI_ROPE_NEOX */
    /* M-RoPE (qwen2vl; ggml's GGML_ROPE_TYPE_MROPE), all 0: off. Rotated pair
     * i (NeoX, i < n_rot/2) turns by the token's temporal position where
     * i % S < rope_sect_t, its height one where i % S < t + h, its width one
     * where i % S < t + h + w, else its fourth (S the four's sum); a row's
     * four positions are the batch's rope_pos, or (pos, pos, pos, 0).
     * rope_sect_interleave (qwen3vl's GGML_ROPE_TYPE_IMROPE): s = i % S turns
     * by the height where s % 3 == 1 and s < 3 h, the width where s % 3 == 2
     * and s < 3 w, the temporal where s % 3 == 0 and s < 3 t, else the fourth */
    int rope_sect_t, rope_sect_h, rope_sect_w, rope_sect_e;
    int rope_sect_interleave;
    /* DeepStack (qwen3vl): input rows (the batch's embd) are n_embd * (1 +
     * n_deepstack) wide; after layer il < n_deepstack, slice il + 1 of a
     * row is added to its residual stream (token rows add nothing) */
    int n_deepstack;
    int gate_fn;                 /* enum li_gate_fn, gating the feed-forward (dense, experts and shared); a layer
                                  * without w_gate (ungated: act(x Wu^T) Wd^T) takes LI_FN_RELU_SQR (nemotron_h) */
    float norm_eps;
    float embd_scale;            /* token embeddings are multiplied by this (gemma: sqrt(n_embd)) */
    float attn_scale;            /* scores are q.k * attn_scale */
    li_matrix tok_embd;          /* [n_vocab, n_embd] */
    const float *output_norm;    /* [n_embd] */
    li_matrix output;            /* [n_vocab, n_embd]; may alias tok_embd */
    const float *rope_factors;   /* [n_rot/2] dividing each RoPE frequency (Llama 3.1), or NULL */
    const li_layer_desc *layers; /* [n_layer] */
    float residual_scale;        /* each half's output is multiplied by this before the residual add (granite; else 1) */
    float logit_scale;           /* logits are multiplied by this (granite: 1/logit_scale; else 1) */
    float attn_softcap;          /* > 0: attention scores become cap * tanh(score / cap) (gemma2); 0: none */
    float final_softcap;         /* > 0: logits become cap * tanh(logit / cap) (gemma2); 0: none */
    int qk_norm_whole;           /* q_norm/k_norm span the whole projection [n_head(_kv) * head_dim] (olmo2),
                                  * not one head */
    int n_expert, n_expert_used; /* experts per MoE layer and how many each token is routed to (0, 0: dense) */
    int n_ff_exp;                /* feed-forward width of one expert */
    float attn_temp_scale;       /* != 0: a query at position p is multiplied by
                                  * ln(floor((p + attn_temp_offset) / attn_temp_floor) + 1) * attn_temp_scale + 1
                                  * after RoPE (Llama 4 / Ministral 3 temperature tuning); 0: none */
    float attn_temp_offset;
    int attn_temp_floor;         /* > 0 when attn_temp_scale != 0 */
    /* recurrent layers (li_layer_desc.mixer): GDN has n_head value heads of
     * d_inner / n_head and n_group key heads of d_state (value head h reads
     * key head h % n_group); mamba2 has n_head heads of d_inner / n_head
     * channels, a state of d_state per channel, n_group groups of B and C */
    int ssm_d_conv;              /* the convolution's taps (GGUF ssm.conv_kernel; shortconv.l_cache) */
    int ssm_d_inner;
    int ssm_d_state;
    int ssm_n_group;
    int ssm_n_head;
    int ssm_kv_grouped;          /* GDN: value head h reads key head h / (n_head / n_group) (qwen3next's
                                  * grouped order), not h % n_group (qwen35's, tiled) */
    int n_ff_shexp;              /* the shared expert's width (0: none) */
    int expert_gating;           /* enum li_expert_gating: how router logits become the experts' weights */
    /* per-layer embeddings (gemma4's E models; n_embd_pe 0: none). Token t's
     * input for layer l, pe_in[l, t], is (rmsnorm(slice l of pe_model_proj
     * x0 / sqrt(n_embd)) * pe_proj_norm + slice l of pe_tok_embd's row of the
     * token * sqrt(n_embd_pe)) / sqrt(2), x0 the token's scaled embedding and
     * a slice n_embd_pe wide (an input row instead of a token takes row 0) */
    int n_embd_pe;
    li_matrix pe_tok_embd;       /* [n_vocab, n_layer * n_embd_pe] */
    li_matrix pe_model_proj;     /* [n_layer * n_embd_pe, n_embd] */
    const float *pe_proj_norm;   /* [n_embd_pe] */
    /* -- the core's own -- */
    int embd_release;            /* set by li_model_repack(release): tok_embd is a clean file mapping that
                                  * nothing reads in bulk, and each token's lookup hands its row's pages back */
    int embd_file;               /* set by li_model_embd_file: with embd_release, a lookup reads its row
                                  * from embd_fd at embd_offset + the row's place in tok_embd (pread) */
    int embd_fd;
    int64_t embd_offset;
    void *packed_arena;          /* NULL, or the one block li_model_repack keeps every repacked matrix in */
} li_model_desc;

/* Where tok_embd's bytes lie in a file open for reading: descriptor fd
 * (the caller keeps it open while the description is used), from byte
 * offset. Once the matrices are repacked with release, each lookup then
 * reads its row with pread, so the mapping is neither faulted nor handed
 * back (where pread is missing, or a read comes up short, through the
 * mapping as before). */
int li_model_embd_file(li_model_desc *m, int fd, int64_t offset);

/* The size and modification time (ns; whole seconds on Windows) of the open
 * file fd, to tell whether a mapped file changed since it was opened. */
int li_file_stamp(int fd, int64_t *size, int64_t *mtime_ns);

/* Watch [start, start + length), a mapped file: a SIGBUS at an address in
 * it (the file truncated under the map) maps zero pages over the rest of the
 * range instead of killing the process, and li_fault_hit says so after.
 * Other SIGBUS go to the handler before ours (csrc/fault.c). *token names
 * the watch (-1 where watching is a no-op); LI_E_NOMEM when every slot is in
 * use. li_fault_unwatch before the range is unmapped; a stale token is a
 * no-op. li_fault_hit: 1 once a fault in the range was caught, else 0. */
int li_fault_watch(const void *start, size_t length, int64_t *token);
int li_fault_unwatch(int64_t token);
int li_fault_hit(int64_t token);

/* The first unit of a stored tensor (nbytes of type `type`) whose scale is
 * NaN or infinite into *unit (-1 if none): a block for the quantized types
 * (its f16 d, dmin or m; MXFP4's exponent 0xFF), an element for F32, F16
 * and BF16. release: hand the scanned pages of a mapped file back as it
 * goes (never for anonymous memory: it would be zeroed). */
int li_first_nonfinite(int type, const void *data, size_t nbytes, int release, int64_t *unit);

/* Check a description for consistency: shapes, types, sizes. */
int li_model_check(const li_model_desc *m);

/* Repack the matrices the forward pass multiplies by (repack.h), in layers
 * first_layer.. (and the output head with with_output: layers before it run
 * elsewhere, on a GPU), where the
 * active kernel level has a kernel for their repacked form, with up to
 * n_threads threads; a matrix that cannot be repacked (no kernel, no memory)
 * keeps its rows, with the same results. release: hand the pages of the
 * original rows back to the file (they are clean; anything that reads them
 * again gets them from the page cache). *bytes: the repacked bytes held.
 * li_model_unpack frees them; call it before the description goes. */
int li_model_repack(li_model_desc *m, int first_layer, int with_output, int n_threads, int release,
                    size_t *bytes);
/* the bytes li_model_repack would allocate now for the same arguments (0
 * for what is repacked already or has no kernel at the active level) */
size_t li_model_repack_size(li_model_desc *m, int first_layer, int with_output);
void li_model_unpack(li_model_desc *m);

typedef struct li_context li_context;

/* ---- the paged KV cache ----
 * Keys and values live in blocks of block_size positions taken from pools
 * sized at start-up. Layers that attend to the whole context share one pool
 * (group LI_KV_FULL); sliding-window layers share another (LI_KV_SWA), so a
 * sequence can give back its window's old blocks while keeping the rest. A
 * block id is the same in every layer of its group. The caller (the Python
 * layer) owns the block tables and the free lists; the C core only reads
 * and writes through the tables it is handed. Within a block, position p of
 * the block (p = pos % block_size) holds for each kv head one row of
 * head_dim values in kv_type: F32, F16, Q8_0 or Q4_0 (the last two in blocks
 * of 32 along the head, read directly by the attention kernels). */
enum li_kv_group { LI_KV_FULL = 0, LI_KV_SWA = 1, LI_KV_GROUPS = 2 };
typedef struct li_kv_config {
    int kv_type;                 /* LI_TYPE_F32, LI_TYPE_F16, LI_TYPE_Q8_0 or LI_TYPE_Q4_0 */
    int block_size;              /* positions per block, a power of two from 1 to 1024 */
    int n_blocks[LI_KV_GROUPS];  /* blocks in each group's pool; 0 for a group no layer uses */
    int n_state_slots;           /* slots of the state pool (recurrent layers); 0 in a model without them */
} li_kv_config;

/* What one sequence sees: per group, its block table, block[i] holding
 * positions [i * block_size, (i + 1) * block_size). An entry of -1 is a block
 * that is not there (freed out of a sliding window, or dropped by a context
 * shift): its positions are masked out of attention. */
typedef struct li_seq_view {
    const int32_t *blocks[LI_KV_GROUPS];
    int n_blocks[LI_KV_GROUPS];
    int state_slot;              /* the sequence's slot in the state pool (-1: none, in a model without
                                  * recurrent layers). The slot holds the state after every position
                                  * before the batch's first token of this sequence; the batch updates it
                                  * in place to the state after its last. */
    const float *lora_scale;     /* [n_lora] the scale of each of the context's LoRA adapters for this
                                  * sequence (li_context_set_loras), 0 where it is off; NULL with n_lora 0:
                                  * every adapter off */
    int n_lora;
} li_seq_view;

/* A batch, in the spirit of llama.cpp's llama_batch: n tokens, each with its
 * input (a token id, or a row of embd), its position, the sequence (an index
 * into the views passed beside the batch) and whether its logits are wanted.
 * Tokens of one sequence are given in position order; a token sees the
 * positions at or before its own that are in its table, those written by
 * this batch included. */
typedef struct li_batch {
    int n;
    const int32_t *token;  /* [n] token ids; NULL when embd is given */
    const float *embd;     /* [n, n_embd * (1 + n_deepstack)] input rows instead of token ids, or NULL */
    const int32_t *pos;    /* [n] */
    const int32_t *seq;    /* [n] index into the views */
    const int8_t *logits;  /* [n] nonzero: this row's logits are returned; NULL: only the last row's */
    const int32_t *rope_pos; /* [n, 4] each row's M-RoPE positions (temporal, height, width, fourth), each in
                              * [0, 2^24), for a model with rope sections (LI_E_ARG in another); NULL: (pos,
                              * pos, pos, 0). pos stays the row's place in the cache and in the causal order:
                              * an image's rows take consecutive places but 2-D rope positions (llama.cpp's
                              * mtmd), and the text after it rope positions behind its places */
} li_batch;

/* Which group layer il's keys and values live in. */
int li_layer_kv_group(const li_model_desc *m, int il);
/* Bytes one block takes in one layer of the group (keys and values). */
size_t li_kv_block_bytes(const li_model_desc *m, int kv_type, int block_size, int il);

/* A context holds the KV pools and the scratch for batches of up to n_batch
 * tokens, for up to max_threads threads. The model description must outlive
 * the context. */
int li_context_create(const li_model_desc *m, const li_kv_config *kv, int n_batch, int max_threads,
                      li_context **out);
void li_context_free(li_context *c);
/* A context whose layers [0, n_layers) (and the output head when
 * with_output, which needs n_layers == n_layer) run on a backend (backend.h:
 * a GPU) on device `device`, the rest on the CPU. ops NULL or n_layers 0 is
 * li_context_create. A backend's failure is LI_E_DEVICE (or LI_E_TYPE for a
 * weight type it cannot run) with its reason in li_last_error. */
typedef struct li_backend_ops li_backend_ops;
int li_context_create_offload(const li_model_desc *m, const li_kv_config *kv, int n_batch, int max_threads,
                              const li_backend_ops *ops, int n_layers, int with_output, int device,
                              li_context **out);
/* Bytes of KV pool held for layer `il` (both K and V). */
size_t li_context_kv_bytes(const li_context *c, int il);
/* Copy block src to block dst in every layer of a group (copy-on-write of a
 * shared block that a sequence is about to write). */
int li_kv_copy_block(li_context *c, int group, int src, int dst);
/* Bytes one block of a group takes over all its layers (keys and values):
 * the size li_kv_read_block / li_kv_write_block move; 0 for a group no layer uses. */
size_t li_kv_group_block_bytes(const li_context *c, int group);
/* Copy block `block` of a group out of (read) or into (write) a flat buffer
 * of `size` bytes, which must be li_kv_group_block_bytes: for each layer of
 * the group in order, its key rows, then its value rows. (Saving and
 * restoring a sequence's state.) */
int li_kv_read_block(const li_context *c, int group, int block, void *dst, size_t size);
int li_kv_write_block(li_context *c, int group, int block, const void *src, size_t size);
/* ---- the state pool (recurrent layers of hybrid models) ----
 * Beside the KV pools, a context holds n_state_slots slots; a slot holds,
 * for each recurrent layer in order, its convolution window ((d_conv - 1)
 * past inputs per channel, the oldest first) and its recurrent matrix (GDN:
 * per value head d_v rows of d_k; mamba2: per head head_dim rows of
 * d_state), all float32. The caller assigns slots to sequences as it
 * assigns blocks; a fresh sequence's slot is cleared (all zero). */
/* Floats one slot holds for layer il (0 for a layer that is not recurrent). */
size_t li_state_layer_floats(const li_model_desc *m, int il);
/* Bytes one slot holds over all layers (0 in a model without recurrent layers). */
size_t li_state_slot_bytes(const li_model_desc *m);
/* Copy slot src to slot dst (fork, snapshot, restore); clear a slot. */
int li_state_copy(li_context *c, int src, int dst);
int li_state_clear(li_context *c, int slot);
/* Copy a slot out of (read) or into (write) a buffer of li_state_slot_bytes. */
int li_state_read(const li_context *c, int slot, void *dst, size_t size);
int li_state_write(li_context *c, int slot, const void *src, size_t size);
/* Run a batch through every layer, writing each token's keys and values at
 * its position in its sequence's tables, and the logits of the rows asked for
 * into logits ([rows asked for, n_vocab], in batch order). The result of a
 * row depends only on its sequence's inputs, never on what else is in the
 * batch nor on n_threads. */
int li_context_decode(li_context *c, const li_batch *b, const li_seq_view *views, int n_views,
                      float *logits, size_t logits_size, int n_threads);
/* After a decode that computed n rows of logits on the CPU: each row's least
 * and greatest value into lo_hi[2 i], lo_hi[2 i + 1] (both NaN when the row
 * holds a NaN), and 1. 0 when the last decode left no such figures for n
 * rows (hidden-state output, a head run by a backend, a failed pass). */
int li_context_logit_range(const li_context *c, float *lo_hi, int64_t n);
/* ---- encoders (encoder.c): BERT-style models for embeddings ----
 * Post-norm blocks with LayerNorm (weight and bias), attention over every
 * position of the sequence (no causal mask), absolute position embeddings
 * (bert) or RoPE (nomic-bert), a GELU feed-forward (bert) or a SiLU-gated
 * one (nomic-bert, when w_gate has data). A matrix with NULL data, or a NULL
 * vector, is absent. */
typedef struct li_encoder_layer {
    li_matrix wq, wk, wv;        /* [n_embd, n_embd] each */
    const float *bq, *bk, *bv;   /* [n_embd] or NULL */
    li_matrix wo;                /* [n_embd, n_embd] */
    const float *bo;
    const float *attn_out_norm, *attn_out_norm_b; /* [n_embd] */
    li_matrix w_up;              /* [n_ff, n_embd] */
    const float *b_up;
    li_matrix w_gate;            /* [n_ff, n_embd], or absent: ungated GELU */
    li_matrix w_down;            /* [n_embd, n_ff] */
    const float *b_down;
    const float *out_norm, *out_norm_b; /* [n_embd] */
} li_encoder_layer;

typedef struct li_encoder_desc {
    int n_vocab, n_embd, n_layer, n_head, head_dim, n_ff;
    int n_pos;                   /* rows of pos_embd (the longest input), 0 without */
    int n_types;                 /* rows of type_embd, 0 without */
    int n_rot, rope_mode;        /* n_rot 0: no RoPE */
    float rope_base, norm_eps;
    li_matrix tok_embd;          /* [n_vocab, n_embd] */
    li_matrix pos_embd;          /* [n_pos, n_embd] or absent */
    li_matrix type_embd;         /* [n_types, n_embd] or absent */
    const float *embd_norm, *embd_norm_b; /* [n_embd] */
    const li_encoder_layer *layers; /* [n_layer] */
} li_encoder_desc;

int li_encoder_check(const li_encoder_desc *m);
/* out[n, n_embd] = the last hidden states of one sequence of n tokens at
 * positions 0..n-1 (token types from types, or 0 when NULL). Rows depend on
 * this sequence only, never on n_threads. */
int li_encode(const li_encoder_desc *m, const int32_t *tokens, const int32_t *types, int n, float *out,
              size_t out_size, int n_threads);

/* ---- LoRA adapters ----
 * A low-rank delta to a projection W [rows, k]: A [rank, k] and B [rows,
 * rank], float32, row-major (numpy order; llama.cpp's lora_a and lora_b).
 * A row whose sequence gives adapter j the scale s_j != 0 gets, after W x,
 * y += s * (B (A x)) for each such adapter in order, s = s_j * alpha / rank
 * (s_j itself when alpha is 0), as llama.cpp's build_lora_mm. The delta is
 * computed per row with the same operations whatever else is batched and
 * however many threads run; a row whose scales are all 0 is the base
 * model's, bit for bit. A pair with NULL a and b is absent. */
typedef struct li_lora_pair {
    const float *a;              /* [rank, k] */
    const float *b;              /* [rows, rank] */
    int rank;
} li_lora_pair;
typedef struct li_lora_layer {
    li_lora_pair wq, wk, wv, wo, w_gate, w_up, w_down;
} li_lora_layer;
typedef struct li_lora {
    float alpha;                 /* adapter.lora.alpha; 0: the scales are used as given */
    const li_lora_layer *layers; /* [n_layer] */
    li_lora_pair output;         /* the output head's */
    li_lora_pair tok_embd;       /* the token embedding's, flipped as llama.cpp has it: a [n_vocab, rank],
                                  * b [n_embd, rank]; token t's row gets s * b a[t] before any scaling
                                  * (not input rows given as embd) */
} li_lora;
/* Borrow n adapters (their arrays stay alive and unchanged while the
 * context uses them; n 0 drops them). Refused (LI_E_ARG) on a context
 * with offloaded layers, for a pair without its other half, a rank outside
 * 1..65536, or a pair on a projection the model lacks. Not to be called
 * during a decode. */
int li_context_set_loras(li_context *c, const li_lora *loras, int n);

/* on nonzero: later decodes write, for each row asked for, the final normed
 * hidden state ([n_embd], what the output head would read) instead of the
 * logits, so the rows are n_embd wide (decoder embeddings); 0 goes back. */
int li_context_set_hidden_output(li_context *c, int on);

/* The attention of later decodes (llama.cpp's llama_set_causal_attn and
 * its non_causal_type): LI_ATTN_CAUSAL, the default; LI_ATTN_NON_CAUSAL,
 * each row sees the positions of its sequence up to the last one in the
 * batch, not only up to its own, in every layer (an image's rows attend to
 * each other both ways, Gemma 3's; a sliding layer's window still bounds
 * what lies before); LI_ATTN_NON_CAUSAL_SWA, so in the sliding-window
 * layers only, the others staying causal (Gemma 4's). Another mode is
 * LI_E_ARG. Not on a context whose layers are offloaded (LI_E_ARG at
 * decode). */
enum li_attn_mode { LI_ATTN_NON_CAUSAL = 0, LI_ATTN_CAUSAL = 1, LI_ATTN_NON_CAUSAL_SWA = 2 };
int li_context_set_causal(li_context *c, int mode);

/* A context's host tuning: choices that change no result, only how fast a
 * pass runs. Set when the context is created (stream_hint: the process's
 * li_stream_hint_current(); placement: LI_PLACEMENT_PROBE), changed only
 * between passes (li_context_set_tuning), and read by the kernels as
 * arguments: a draft model's context and its target's each have their own.
 * placement: where a 2-thread decode team runs: PROBE times the team's
 * barrier every few passes to tell two hyperthreads of one core (near) from
 * two cores (apart), as this VM moves them; NEAR and APART fix it. */
enum li_placement {
    LI_PLACEMENT_PROBE = 0,
    LI_PLACEMENT_NEAR = 1,
    LI_PLACEMENT_APART = 2,
    LI_PLACEMENT_COUNT = 3
};
typedef struct {
    int stream_hint; /* enum li_stream_hint */
    int placement;   /* enum li_placement */
} li_tuning;
/* LI_E_ARG for a kind or placement out of range (nothing changed) */
int li_context_set_tuning(li_context *c, const li_tuning *t);
/* the context's tuning; *near: whether its last 2-thread decode ran as if
 * on one core (the probe's finding or the fixed placement) */
int li_context_get_tuning(const li_context *c, li_tuning *out, int *near);

/* The non-finite probe, for finding where a NaN or an infinity first appears
 * once the logits have shown one. While on, decode checks the residual stream
 * after the embedding and after each layer's attention and feed-forward
 * halves, then the final normed rows and the logits, and records the first
 * step with a non-finite value (a diagnostic re-run: the checks add a barrier
 * per step; off, the default, they cost one branch per half). */
enum li_probe_step {
    LI_PROBE_NONE = 0,        /* every value was finite */
    LI_PROBE_EMBED = 1,       /* the embedded tokens (times the embedding scale), or the input embeddings */
    LI_PROBE_ATTN = 2,        /* the residual stream after layer `layer`'s attention half */
    LI_PROBE_FFN = 3,         /* ... after its feed-forward (or expert) half */
    LI_PROBE_BACKEND = 4,     /* after the backend's layers [0, layer) (or its head), checked as a whole */
    LI_PROBE_OUTPUT_NORM = 5, /* the final normed rows (what the output head reads) */
    LI_PROBE_LOGITS = 6       /* the logits (the output head and its scaling or soft-cap) */
};
typedef struct li_probe_result {
    int step;                 /* enum li_probe_step: where the first non-finite value appeared */
    int layer;                /* LI_PROBE_ATTN/FFN: the layer; LI_PROBE_BACKEND: layers before this one */
    int row;                  /* the lowest batch row holding one at that step (a logits row for OUTPUT_NORM, LOGITS) */
} li_probe_result;
int li_context_set_probe(li_context *c, int on);
/* what the probe found in the last decode (step LI_PROBE_NONE: nothing, or the probe was off) */
int li_context_probe_result(const li_context *c, li_probe_result *out);

/* The message of the last error on this thread (which tensor, which size), or "". */
const char *li_last_error(void);

/* ---- benchmark and test helpers (bench.c) ---- */
/* Reads `bytes` of buf (8-byte words) on n_threads threads, each its contiguous
 * share; returns their sum, so the reads cannot be left out. */
uint64_t li_bench_read(const void *buf, size_t bytes, int n_threads);
/* Seconds per li_share_sync pass of a team of n_threads, timed over `rounds`
 * passes; -1 on a bad argument or no memory. */
double li_bench_sync(int n_threads, int rounds);
/* Hands out `products` products of `units` units each (share.h) to a team of
 * n_threads, as consecutive products with no barrier between them, each
 * owner taking at least `chunk` units of its own at a time until its last
 * few (li_share_turn's chunk, >= 1); thread slow_thread spins slow_spins
 * times per unit it takes. Writes, per (product, unit), the thread that took
 * it (taken_by) and how many times it was taken (times_taken, 1 when right).
 * Returns the team's size, or a status < 0. */
int li_share_trace(int64_t units, int products, int n_threads, int slow_thread, int slow_spins, int64_t chunk,
                   int32_t *taken_by, int32_t *times_taken);
/* Runs a team of n_threads through `rounds` rounds of the team's barrier
 * (li_share_sync): in each, every thread writes the round's number to a slot
 * of its own, passes the barrier (li_share_sync_ahead, hinting 64 KiB of a
 * buffer of its own as it waits), reads every slot, and passes it again;
 * thread slow_thread first spins slow_spins times in every round r with
 * r % slow_every == 0, so that the others wait long enough to sleep. The
 * rounds run in three parallel regions on one li_share, the second with a
 * thread fewer when n_threads > 1. Writes the number of slots read with
 * another round's number (0 when right) to *stale. Returns the team's size
 * (the first region's), or a status < 0. */
int li_share_barrier_check(int n_threads, int rounds, int slow_thread, int slow_spins, int slow_every,
                           int64_t *stale);
enum li_vec_op {
    LI_VEC_DOT_F32 = 0,     /* *result = a . b            (a, b float) */
    LI_VEC_DOT_F32_F16 = 1, /* *result = a . b            (a float, b f16) */
    LI_VEC_AXPY_F32 = 2,    /* b += alpha * a             (a, b float) */
    LI_VEC_AXPY_F16 = 3,    /* b += alpha * a             (a f16, b float) */
    LI_VEC_SCALE_F32 = 4,   /* b *= alpha                 (b float; a unused but not NULL) */
    LI_VEC_F32_TO_F16 = 5,  /* b = a                      (a float, b f16) */
    LI_VEC_F16_TO_F32 = 6,  /* b = a                      (a f16, b float) */
    LI_VEC_SOFTCAP_F32 = 7  /* b = alpha tanh(b / alpha)  (b float, alpha > 0; a unused but not NULL) */
};
/* One vector kernel of the active level on n elements; the caller sizes the buffers. */
int li_vec_kernel(int op, float alpha, const void *a, void *b, int64_t n, float *result);
/* The attention kernels over an F16 cache of n rows of d values, row j at
 * cache + j*stride (stride >= d), for nh query heads (rows of a, a_ld apart):
 * accumulate = 0: out[h*out_ld + j] = scale * a_h . row j;
 * accumulate = 1: out[h*out_ld .. + d) += sum_j a[h*a_ld + j] * row j. */
int li_attn_kernel(int accumulate, const float *a, size_t a_ld, int nh, const uint16_t *cache,
                   int64_t n, int64_t d, size_t stride, float scale, float *out, size_t out_ld);
/* The recurrent mixers' kernels of the active level (csrc/kernels/kernels.h
 * says what each computes and lays out), for tests: one sequence's rows
 * rows[0..n) (indices into the row-major buffers, *_ld floats apart)
 * through a state updated in place. The caller sizes the buffers; these
 * check only what would make the kernel itself misbehave. */
int li_conv_kernel(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                   const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act);
int li_gdn_kernel(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q,
                  const float *k, size_t qk_ld, const float *v, size_t v_ld, const float *alpha,
                  const float *beta, size_t ab_ld, float dt_b, float a, float *o, size_t o_ld);
int li_mamba2_kernel(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n, const float *x,
                     size_t x_ld, const float *B, const float *C, const float *dt, size_t dt_ld, float dt_b,
                     float a, float d, const float *z, size_t z_ld, float *y, size_t y_ld);

#ifdef __cplusplus
}
#endif
#endif
