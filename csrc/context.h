/* context.h: the state a context holds (context.c builds it, attention.c and
 * model.c use it), and the error message helper every file reports through.
 *
 * Lifetimes, as llama2.c splits them: the model description (weights in the
 * memory-mapped file) outlives the context; the KV pools live as long as the
 * context; the scratch is rewritten by every batch; the per-batch fields
 * (views, seq, kv_row) point at what the current li_context_decode call was
 * handed and are meaningless outside it.
 */
#ifndef LLMINFER_CONTEXT_H
#define LLMINFER_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "llminfer.h"
#include "matmul.h"
#include "share.h"
#include "util.h"

#define MAX_ROPE_TABLES 4

/* layer il's view of the model (li_context.lm) */
#define lm_of(c, il) (&(c)->lm[il])
/* Most experts a MoE layer may have (released models have up to 512). */
#define LI_MAX_EXPERTS 4096
/* Attention splits a token's visible positions at multiples of this span
 * (or of the block size, if larger). The split depends on positions only, so
 * a token's result is the same however it is batched or threaded. */
#define LI_ATTN_SPAN 256
/* At most this many tokens in a batch split their attention spans across
 * the team (decode); larger batches have enough (tile, kv head) items. */
#define LI_ATTN_SPLIT_TOKENS 4
/* Larger batches take their tokens in tiles: consecutive tokens of one
 * sequence at consecutive positions (a prompt chunk, a speculative check)
 * share each cached row they read. At most this many tokens per tile, and
 * about LI_ATTN_TILE_QUERIES query heads per tile. */
#define LI_ATTN_TILE 8
#define LI_ATTN_TILE_QUERIES 32
/* A dense feed-forward runs over at most this many batch rows at a time: its
 * [rows, n_ff] gate and up outputs are the largest buffers of a prefill (32
 * MiB at 512 rows of a 1B model), and each row's result does not depend on
 * which rows share its chunk. Each chunk packs the three matrices' panels
 * again (gemm.c), and where the level has no repacked kernels (AVX2) that
 * packing is a cost of its own beside the products: a default batch of 512
 * rows is one chunk, packed once. */
#define LI_FFN_CHUNK 512

struct li_context {
    const li_model_desc *m;
    li_kv_config kv;
    int n_batch, max_threads;
    int span;              /* attention span: max(LI_ATTN_SPAN, block_size) */
    int max_chunks;        /* spans with keys a token can see (bounded by the pools) */

    /* KV pools, per layer, in its group's pool of blocks:
     * [n_blocks[group], block_size, n_head_kv] rows of k_row / v_row bytes */
    char **k_pool, **v_pool;  /* [n_layer] (NULL for a layer that reads another's: kv_src) */
    size_t *k_rows, *v_rows;  /* [n_layer] bytes of one head's keys (head_dim) / values (head_dim_v) */
    int *group;               /* [n_layer] LI_KV_FULL or LI_KV_SWA */
    int *kv_src;              /* [n_layer] the layer whose pool a layer reads and writes: itself, or
                               * il - kv_reuse (which it only reads) */
    li_model_desc *lm;        /* [n_layer] the model as layer il sees it: its own attention sizes and
                               * RoPE divisors in place of the model's (lm_of) */

    /* scratch for one batch */
    float *x;              /* [n_batch, n_embd] residual stream */
    float *xb;             /* [n_batch, n_embd] normed input of a projection; att and o share its buffer */
    float *q;              /* [n_batch, n_head * head_dim] */
    float *k;              /* [n_batch, n_head_kv * head_dim] */
    float *v;              /* [n_batch, n_head_kv * head_dim_v] */
    float *att;            /* [n_batch, n_head * head_dim_v] (xb's buffer) */
    float *o;              /* [n_batch, n_embd] (xb's buffer) */
    float *g, *u;          /* [LI_FFN_CHUNK, n_ff], or [n_batch * n_expert_used, n_ff_exp] in a MoE layer */
    void *xq[LI_ACT_COUNT];/* quantized activations, one buffer per format, rows of the widest input */
    size_t xq_row[LI_ACT_COUNT];
    void *xd[LI_ACT_COUNT];/* [LI_FFN_CHUNK] rows of xq_row: a chunk's gated activations for ffn_down */
    void *qq;              /* [n_batch, n_head] queries in the activation format of a quantized K */
    size_t qq_row;
    float *scores;         /* [max_threads, tile_max, heads per kv head, span] attention weights of one span */
    float *vrow;           /* [max_threads, head_dim_v] one dequantized value row */
    float *parts;          /* [LI_ATTN_SPLIT_TOKENS, n_head, max_chunks, 2 + head_dim_v] split spans */
    float *tparts;         /* [max_threads, tile_max, heads per kv head, max_chunks, 2 + head_dim_v] */
    int tile_max;          /* tokens per attention tile (LI_ATTN_TILE, less with many heads or spans) */
    float *tq;             /* [max_threads, tile_max, heads per kv head, head_dim] a tile's queries */
    char *tqq;             /* [max_threads, tile_max, heads per kv head] of qq_row: quantized, for a quantized K */
    float *tout;           /* [max_threads, tile_max, heads per kv head, head_dim_v] a tile's weighted values */
    int32_t *tile0;        /* [n_batch + 1] tile i is the batch rows [tile0[i], tile0[i + 1]) */
    int n_tiles;
    char *gemm_scratch;    /* [max_threads] regions of gemm_bytes for prefill panels */
    char *own;             /* [max_threads] regions of own_bytes: a decoded row's copy per thread (own_rows) */
    size_t own_bytes;
    char *embd_rows;       /* [max_threads] regions of embd_row_bytes: an embedding row read from the file */
    size_t embd_row_bytes;
    size_t gemm_bytes;
    li_share *share;       /* the team's shares of each repacked product (share.h) */
    uint32_t passes;       /* decode passes of a 2-thread team (thread 0's count), for placement_probe */
    int probe_now;         /* whether this pass probes (thread 0 sets it before the pass's first barrier) */
    li_tuning tuning;      /* the context's host tuning (llminfer.h), changed only between passes */
    int near;              /* placement_probe's finding: the team's two threads share a core */
    unsigned hints;        /* LI_X16_HINT_* for this pass's repacked products, set before its first barrier */

    /* mixture of experts (NULL for a dense model); a slot is one (token, choice) */
    float *route;          /* [n_batch, n_expert] router logits, then probabilities */
    int32_t *sel;          /* [n_batch, n_expert_used] the experts each token chose, most probable first */
    float *wsel;           /* [n_batch, n_expert_used] their normalized weights */
    int32_t *slot;         /* [n_batch, n_expert_used] the slot of each choice */
    int32_t *slot_tok;     /* [n_batch * n_expert_used] the token of each slot */
    int32_t *e_off;        /* [n_expert + 1] expert e's slots are [e_off[e], e_off[e + 1]) */
    void *xe[LI_ACT_COUNT];/* slots' quantized inputs, gathered per expert */
    size_t xe_row[LI_ACT_COUNT];
    float *eo;             /* [n_batch * n_expert_used, n_embd] each slot's expert output */
    float *sg, *su;        /* [LI_FFN_CHUNK, n_ff_shexp] the shared expert's gate and up outputs */
    float *so;             /* [n_batch, n_embd] its output */
    float *sgate;          /* [n_batch] sigmoid(x . gate_inp_shexp) per row */
    float *gu;             /* [n_batch * n_expert_used, 2 * n_ff_exp] fused gate_up_exps products, or NULL */

    /* per batch */
    int32_t *pos;          /* [n_batch] */
    int32_t *vis;          /* [n_batch] the last position a row sees where its layer is non-causal
                            * (li_last_visible): its own, or with non_causal the last of its sequence
                            * in the batch */
    int non_causal;        /* li_context_set_causal's mode: LI_OPEN_NONE (causal), LI_OPEN_ALL or LI_OPEN_SWA */
    int32_t *kv_row[LI_KV_GROUPS]; /* [n_batch] pool row (block * block_size + slot) a token writes */
    int32_t *out_rows;     /* [n_batch] batch rows whose logits are returned */
    float *logit_part;     /* [n_batch, max_threads, 2] the (min, max) of each piece of each logits row */
    int64_t range_rows;    /* the logits rows whose pieces the last decode left there (-1: none) */
    int range_pieces;      /* pieces per row: the team's size */
    int32_t *n_spans;      /* [n_batch] spans with keys per token and group: [t * 2 + group] */
    const int32_t *seq;    /* the batch's sequence indices */
    const li_seq_view *views;
    int split;             /* this batch splits spans across the team */
    int hidden_out;        /* decode writes normed hidden rows, not logits (li_context_set_hidden_output) */
    int probe;             /* check for non-finite values after each step (li_context_set_probe) */
    int probe_order;       /* the first such step of this decode, in pass order (INT_MAX: none) */
    li_probe_result found; /* ... what and where it was */

    /* RoPE: one frequency table per distinct (base, scale), and per batch a cos/sin table */
    int n_rope;
    li_rope_params rope[MAX_ROPE_TABLES];
    int rope_n_rot[MAX_ROPE_TABLES]; /* the dims each table rotates */
    int n_rot_max;         /* the most of them: rope_cs's stride between tables is n_batch * n_rot_max */
    float *rope_cs;        /* [n_rope, n_batch * n_rot_max]: table r's token t at r * n_batch * n_rot_max +
                            * t * rope_n_rot[r] */
    int *layer_rope;       /* [n_layer] -> table */

    /* per-layer embeddings (m->n_embd_pe > 0), P = n_embd_pe, NL = n_layer */
    float *pe_raw;         /* [n_batch, NL * P] pe_model_proj's products */
    float *pe_in;          /* [NL, n_batch, P] each layer's inputs */
    float *pe_g;           /* [n_batch, P] a layer's gate */
    float *pe_row;         /* [max_threads, NL * P] a token's dequantized pe_tok_embd row */
    int no_own;            /* the model scales or adds to a layer's output (out_scale, per-layer
                            * embeddings), which own rows do not: no own rows */

    /* hybrid models: the state pool (llminfer.h) and the recurrent mixers' scratch */
    float *state;          /* [n_state_slots, slot_floats] */
    size_t slot_floats;    /* floats of one slot, over every recurrent layer */
    size_t *state_off;     /* [n_layer] where a layer's state starts in a slot (floats) */
    float *r_in;           /* [n_batch, r_in_ld] ssm_in's output */
    int64_t r_in_ld;
    float *r_z;            /* [n_batch, ssm_d_inner] GDN's output gate */
    float *r_ab;           /* [n_batch, 2 * ssm_n_head] GDN's alpha, then beta */
    float *r_conv;         /* [n_batch, r_in_ld] the convolution's input or output */
    float *r_out;          /* [n_batch, r_out_ld] the mixer's output, before ssm_out */
    int64_t r_out_ld;
    float *qg;             /* [n_batch, 2 * n_head * head_dim] a gated attention's joint q projection */
    float *gate;           /* [n_batch, n_head * head_dim] its gate */
    int32_t *seq_rows;     /* [n_batch] the batch's rows grouped by sequence, each in batch order */
    int32_t *seq_off;      /* [seq_cap + 1] sequence s's rows are seq_rows[seq_off[s] .. seq_off[s + 1]) */
    int seq_cap, n_seqs;
    uint8_t *slot_mark;    /* [n_state_slots] a batch's check that no two sequences share a slot */

    /* a backend holding layers [0, be_layers) (and the head, with be_output);
     * those layers have no CPU pools (k_pool[il] NULL) */
    const li_backend_ops *be_ops;
    void *be;
    int be_layers, be_output;

    /* LoRA adapters (li_context_set_loras), borrowed, and per batch each
     * row's scale of each: lora_s[t * n_lora + j] (0: off) */
    const li_lora *loras;
    int n_lora, lora_rank;  /* adapters, and the largest rank of any pair */
    float *lora_s;         /* [n_batch, n_lora] */
    float *lora_tmp;       /* [LI_LORA_PROJ, n_batch, n_lora, lora_rank] each (row, adapter)'s A x */
    int lora_any;          /* this batch has a row with a scale != 0 */
};
/* the most projections a step runs side by side (q, k, v) */
#define LI_LORA_PROJ 3

/* lora.c: one projection a step adapts. pair: where its li_lora_pair is in
 * li_lora_layer (offsetof), for layer il, or il -1: the output head. x: its
 * float input rows (x_ld apart), y: its output rows (y_ld apart), n rows of
 * the step; row t is batch row row_map[t], or row0 + t when row_map is NULL. */
typedef struct li_lora_proj {
    size_t pair;
    int il;
    const li_matrix *w;
    const float *x;
    int64_t x_ld;
    float *y;
    int64_t y_ld;
    int64_t row0;
    const int32_t *row_map;
} li_lora_proj;
/* each batch row's scales into lora_s and lora_any, the views' scales checked */
int li_lora_prepare(li_context *c, const li_batch *b, const li_seq_view *views, int n_views);
/* whether some adapter adapts one of ps[0..np) and some row of the batch has a scale != 0 (the
 * same answer in every thread) */
int li_lora_covers(const li_context *c, const li_lora_proj *ps, int np);
/* before the base product: each (row, adapter) with a scale != 0's A x into lora_tmp */
void li_lora_down(li_context *c, const li_lora_proj *ps, int np, int64_t n, int ith, int nth);
/* after it (and a barrier): y += s * B (A x), adapters in order */
void li_lora_up(li_context *c, const li_lora_proj *ps, int np, int64_t n, int ith, int nth);
void li_lora_free(li_context *c);
/* batch row `row`'s embedding x (n_embd floats) of token `token` += each adapter's delta (one thread) */
void li_lora_embed(const li_context *c, int32_t token, int64_t row, float *x);

/* model_check.c: what the context and the pass read of a description */
/* return a failing status at once (the caller's own, already reported) */
#define CHECK(expr)                  \
    do {                             \
        const int st_ = (expr);      \
        if (st_ != LI_OK) return st_; \
    } while (0)
/* layer L's view of the model: its own attention sizes and RoPE divisors in place of the model's */
void li_layer_view(const li_model_desc *m, const li_layer_desc *L, li_model_desc *out);
/* whether L has attention sizes of its own (Gemma 4's sliding layers) */
int li_own_sizes(const li_layer_desc *L);
/* whether some layer is a recurrent mixer */
int li_has_recurrent(const li_model_desc *m);
/* a KV cache type the context stores (f32, f16, q8_0, q4_0) */
int li_kv_type_ok(int t);
/* the rows of ssm_in, the convolution's channels and the floats of state of
 * a layer with a recurrent mixer (0, 0, 0 for the others) */
void li_mixer_sizes(const li_model_desc *m, const li_layer_desc *L, int64_t *in_rows, int64_t *channels,
                    int64_t *state);

/* context.c */
/* a thread's own copy of a decoded row (model.c's own_rows; laid out by li_own_layout) */
typedef struct {
    float *x;                /* [n_embd] the residual stream's row */
    float *xb;               /* [n_embd] its normed copy, or an output normed before it is added */
    void *xq[LI_ACT_COUNT];  /* xb quantized, in each format of xq */
} own_row;

/* the layout of thread ith's region of c->own at base, into r (when not NULL); its size */
size_t li_own_layout(const li_context *c, char *base, int ith, own_row *r);

/* attention.c */
/* biases, per-head norms, RoPE and the cache write for token t, head item h
 * (h < n_head: a query head; else key/value head h - n_head) */
void li_prepare_head(li_context *c, const li_layer_desc *L, int il, int64_t t, int h);
/* att = softmax(q k^T * scale) v for every token and head of the batch */
void li_attention(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth);
void li_attention_prefetch(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth);
/* spans holding at least one key visible to a token at pos with this table */
int li_count_spans(const li_context *c, const li_layer_desc *L, const int32_t *blocks, int n_blocks, int pos,
                   int end);
/* the first position a token at pos sees in layer L */
int li_first_visible(const li_layer_desc *L, int pos);
/* the layers a non-causal batch opens (li_context.non_causal) */
enum { LI_OPEN_NONE = 0, LI_OPEN_ALL = 1, LI_OPEN_SWA = 2 };
/* the last position batch row t sees in layer L: c->vis[t] where the
 * context's mode makes L non-causal, else its own position */
int li_last_visible(const li_context *c, const li_layer_desc *L, int64_t t);
void li_round_to_f16(float *x, int64_t n);

#endif
