/* model.c: the forward pass of a decoder-only transformer (Llama, Qwen2,
 * Gemma 3 and their kin, and the hybrid models' recurrent mixers and the
 * MoE layers) over a batch of tokens from many sequences, in a context
 * (context.c: its KV pools and scratch) made for a checked description
 * (model_check.c).
 *
 * The Python layer describes a model (li_model_desc: shapes, options, and
 * pointers to weights in the memory-mapped file), owns the block tables of
 * the paged KV cache, and asks for batches (li_batch) to be run. One call
 * runs the whole batch through every layer inside a single OpenMP parallel
 * region: each step is split among the team and steps are separated by
 * barriers, so nothing is forked, joined or allocated per token, and the GIL
 * is not needed.
 *
 * The graph, per layer, for a batch of n tokens (x is the residual stream
 * [n, n_embd]); each step names what it reads and writes:
 *   attention half:   xb = rmsnorm(x) * attn_norm -> xq
 *                     q, k, v = xq Wq^T, xq Wk^T, xq Wv^T  (+ biases; q/k norms; RoPE)
 *                     k, v -> the cache; att = softmax(q k^T * scale) v -> xq
 *                     o = xq Wo^T (rmsnorm * post_attn_norm); x += o
 *   feed-forward half: xb = rmsnorm(x) * ffn_norm -> xq
 *                     h = act(xq Wg^T) * (xq Wu^T) -> xq
 *                     o = xq Wd^T (rmsnorm * post_ffn_norm); x += o
 * then logits = (rmsnorm(x) * output_norm) Wout^T for the rows asked for.
 * Each row's arithmetic is the same whatever the batch holds: the products
 * give a row's outputs bitwise the same for any batch size (kernels.h), and
 * attention splits a token's positions by position only (attention.c).
 *
 * With a backend (backend.h), layers [0, be_layers) run there: the team
 * embeds the batch, the backend takes the residual stream through its layers
 * (and the head, with be_output), and the team runs the remaining layers and
 * the head. Without one the whole pass is one parallel region, as it always
 * was.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "common.h"
#include "context.h"
#include "kernels/kernels.h"
#include "matmul.h"
#include "recurrent.h"
#include "repack.h"

/* ---- forward steps (each called by every thread with its ith of nth) ---- */

/* xq in the activation formats of the given weights, from rows [lo, hi) of
 * src; rows are packed (stride li_act_row_bytes(a, k)), as li_matmul_q reads them */
static void quantize_rows_to(void *const *xq, const float *src, int64_t k, int64_t lo, int64_t hi,
                             const li_matrix *const *ws, int nw) {
    int done = 0; /* bit set of formats already written */
    for (int i = 0; i < nw; i++) {
        const int a = li_types[ws[i]->type].act_type;
        if (done & (1 << a)) continue;
        done |= 1 << a;
        const size_t row = li_act_row_bytes(a, k);
        for (int64_t t = lo; t < hi; t++) li_K->quant_act[a](src + t * k, (char *)xq[a] + (size_t)t * row, k);
    }
}

static void quantize_rows_for(li_context *c, const float *src, int64_t k, int64_t lo, int64_t hi,
                              const li_matrix *const *ws, int nw) {
    quantize_rows_to(c->xq, src, k, lo, hi, ws, nw);
}

/* the activations a weight reads: xq in its format, as quantize_rows_for or gated_quantize left them */
static const void *acts_for(const li_context *c, const li_matrix *w) { return c->xq[li_types[w->type].act_type]; }

/* y[n, rows] = xq . W^T, xq already in W's activation format */
static void matmul(li_context *c, const li_matrix *w, const void *xq, int64_t n, float *y, int64_t y_stride, int ith,
                   int nth) {
    if (w->packed && li_K->x16[w->type]) { /* repacked at load (repack.h): decode and prefill alike */
        int32_t *scratch = (int32_t *)(void *)(c->gemm_scratch + (size_t)ith * c->gemm_bytes);
        li_x16_matmul(w->type, w->packed, w->rows, w->k, xq, n, y, y_stride, scratch, c->share, ith, nth, c->hints);
        return;
    }
    const li_weight wt = {w->data, w->type, w->rows, w->k, w->nbytes / (size_t)w->rows};
    if (li_gemm_applies(w->type, n, w->rows, w->k))
        li_gemm_q(&wt, xq, n, y, y_stride, c->gemm_scratch + (size_t)ith * c->gemm_bytes, ith, nth);
    else
        li_matmul_q_shared(&wt, xq, n, y, y_stride, c->share, ith, nth);
}

/* one product of a list for matmuls */
typedef struct {
    const li_matrix *w;
    const void *xq;
    int64_t n;
    float *y;
    int64_t y_stride;
} product;

/* The run of ps[0..np) that matmuls shares as one product from ps[0]: its
 * parts in parts, and its length, 0 when ps[0] is not repacked for the
 * x16 kernels (or is a prompt's) and goes to matmul alone */
static int joint_run(const li_context *c, const product *ps, int np, li_x16_part_desc *parts) {
    int j = 0;
    for (; j < np && j < LI_X16_MAX_PARTS; j++) {
        const product *p = &ps[j];
        if (!p->w->packed || !li_K->x16[p->w->type] || p->n >= LI_X16_UNPACK_MIN) break;
        parts[j] = (li_x16_part_desc){p->w->type, p->w->packed, p->w->rows, p->w->k, p->xq, p->n, p->y, p->y_stride};
    }
    /* the longest run whose terms the scratch holds (their room only grows with the run) */
    while (j >= 2 && li_x16_parts_scratch_ints(parts, j) * sizeof(int32_t) > c->gemm_bytes) j--;
    return j;
}

/* the products of a list that follow one another with no barrier between
 * them, each as matmul gives it: runs of repacked ones over fewer than
 * LI_X16_UNPACK_MIN rows (up to LI_X16_MAX_PARTS, as many as the thread's
 * scratch holds the terms of) shared as one (li_x16_matmul_parts), the
 * others one by one. Decode reads the weights at the memory's pace, and
 * its products' ends and stream starts cost it (repack.h). A prompt's
 * products are compute-bound and long: sharing them changed nothing
 * measurable, so prompts keep the separate products
 * (docs/kernel-tuning.md#model-joint-products). */
static void matmuls(li_context *c, const product *ps, int np, int ith, int nth) {
    int32_t *scratch = (int32_t *)(void *)(c->gemm_scratch + (size_t)ith * c->gemm_bytes);
    li_x16_part_desc parts[LI_X16_MAX_PARTS];
    for (int i = 0; i < np;) {
        const int j = joint_run(c, ps + i, np - i, parts);
        if (j >= 2) {
            (void)li_x16_matmul_parts(parts, j, scratch, c->share, ith, nth, c->hints); /* j is in range */
            i += j;
        } else {
            matmul(c, ps[i].w, ps[i].xq, ps[i].n, ps[i].y, ps[i].y_stride, ith, nth);
            i++;
        }
    }
}

/* The barrier before matmuls(c, ps, np): while a thread waits there (for
 * the thread that alone adds a decoded row's residual, norms and quantizes
 * it, or for the other's end of the product before), it hints the start of
 * its share of the first product to L2 (li_share_sync_ahead), and reads
 * during a wait in which the memory had nothing to do. Decode's products
 * only: a prompt's are compute-bound. */
static void sync_before(li_context *c, const product *ps, int np, int ith, int nth) {
    li_x16_part_desc parts[LI_X16_MAX_PARTS];
    const void *p = NULL;
    size_t bytes = 0;
    const int j = np > 0 ? joint_run(c, ps, np, parts) : 0;
    if (j >= 1) li_x16_parts_head(parts, j, ith, nth, &p, &bytes);
    li_share_sync_ahead(c->share, p, bytes);
}

/* h = fn(g) * u over [n, k] (or src alone when up is NULL), then quantized
 * for w into dst (rows of li_act_row_bytes(act, k)); split by activation
 * blocks so a single token's row is shared by the whole team */
static void gated_quantize_to(void *dst, float *src, const float *up, int64_t n, int64_t k, const li_matrix *w,
                              int fn, int ith, int nth) {
    const int a = li_types[w->type].act_type;
    const int64_t bs = li_act_block_size(a), per_row = k / bs;
    const size_t blk = li_act_row_bytes(a, bs), row = li_act_row_bytes(a, k);
    int64_t lo, hi;
    li_split(n * per_row, ith, nth, &lo, &hi);
    for (int64_t b = lo; b < hi; b++) {
        const int64_t t = b / per_row, j = (b % per_row) * bs;
        float *x = src + t * k + j;
        if (up) li_gate_apply(fn, x, up + t * k + j, x, bs);
        li_K->quant_act[a](x, (char *)dst + (size_t)t * row + (size_t)(b % per_row) * blk, bs);
    }
}

/* the same into xq, where matmul's acts_for finds it */
static void gated_quantize(li_context *c, float *src, const float *up, int64_t n, int64_t k, const li_matrix *w,
                           int fn, int ith, int nth) {
    gated_quantize_to(c->xq[li_types[w->type].act_type], src, up, n, k, w, fn, ith, nth);
}

/* x += norm(o + bias) * residual_scale (bias: NULL, or the output
 * projection's, gpt-oss; o normed by post_norm when the model has one),
 * rows [lo, hi) */
static void residual(const li_model_desc *m, float *x, float *o, const float *bias, const float *post_norm,
                     int64_t lo, int64_t hi) {
    const int64_t E = m->n_embd;
    for (int64_t t = lo; t < hi; t++) {
        if (bias) li_K->add_f32(o + t * E, bias, o + t * E, E);
        if (post_norm) li_K->rms_norm(o + t * E, post_norm, o + t * E, E, m->norm_eps);
        if (m->residual_scale != 1.0f) li_K->scale_f32(o + t * E, m->residual_scale, E);
        li_K->add_f32(x + t * E, o + t * E, x + t * E, E);
    }
}

/* xb = rmsnorm(x) * w for rows [lo, hi); a model without pre-norms (olmo2)
 * passes w NULL and x goes to xb as it is */
static void pre_norm(const li_model_desc *m, const float *x, const float *w, float *xb, int64_t lo, int64_t hi) {
    const int64_t E = m->n_embd;
    for (int64_t t = lo; t < hi; t++) {
        if (w)
            li_K->rms_norm(x + t * E, w, xb + t * E, E, m->norm_eps);
        else
            memcpy(xb + t * E, x + t * E, (size_t)E * sizeof(float));
    }
}

/* ---- a decoded row, each thread's own ----
 *
 * A pass of one token (decode) has one row to norm and quantize before each
 * half's first products, and one residual to add after each half: split by
 * rows, thread 0 did them while the others waited at a barrier, and then
 * read its quantized row from another core. With own rows every thread
 * keeps the residual stream's row itself (thread 0 in x, the others in
 * their region of `own`), adds each half's output to it, and norms and
 * quantizes it into its own xb and xq: the same operations on the same
 * values, so the same bits in every thread, and no barrier before the
 * half's products. Dense models only (a MoE half adds its residual split by
 * rows), of short rows (own_rows). A thread's row is an own_row, laid out
 * by li_own_layout (with the context's allocation, above). */
/* whether a pass of n tokens on nth threads keeps own rows: a row of up to
 * OWN_ROWS_MAX_EMBD, whose norm and quantization cost each thread less than
 * the barrier and the wait they replace. Tokens alternating with and without
 * in one process (32-token blocks, 2 threads, medians): SmolLM2 (576) -2.0%
 * a token with its CPUs apart and -1.7% on one core, Gemma 3 270M (640)
 * -1.4% apart; the 1B (2048) +0.6% apart (Q4_K_M) and on one core (Q4_0),
 * its shared row's wait being one in which the others read ahead
 * (sync_before). */
#define OWN_ROWS_MAX_EMBD 1024
static int own_rows(const li_context *c, int64_t n, int nth) {
    /* LoRA's deltas read the shared xb (lora.c); own rows give the same bits, so either is right */
    return n == 1 && nth > 1 && c->m->n_expert == 0 && c->m->n_embd <= OWN_ROWS_MAX_EMBD && !c->lora_any &&
           !c->no_own;
}

static own_row own_of(const li_context *c, int ith) {
    own_row r;
    (void)li_own_layout(c, c->own + (size_t)ith * c->own_bytes, ith, &r);
    return r;
}

/* residual() of one row into a thread's own x: o, shared by the team, is
 * normed and scaled in the thread's xb, where residual() works on o itself */
static void own_residual(const li_model_desc *m, const own_row *r, const float *o, const float *bias,
                         const float *post_norm) {
    const int64_t E = m->n_embd;
    const float *add = o;
    if (bias || post_norm || m->residual_scale != 1.0f) {
        memcpy(r->xb, o, (size_t)E * sizeof(float));
        if (bias) li_K->add_f32(r->xb, bias, r->xb, E);
        if (post_norm) li_K->rms_norm(r->xb, post_norm, r->xb, E, m->norm_eps);
        if (m->residual_scale != 1.0f) li_K->scale_f32(r->xb, m->residual_scale, E);
        add = r->xb;
    }
    li_K->add_f32(r->x, add, r->x, E);
}

/* A half's input for its first products ws[0..nw): x normed by norm_w into
 * xb and quantized into xq, for the rows [lo, hi) (shared rows) or the
 * thread's own row; xq gets where each format's rows are. Shared rows need
 * the barrier before the products (sync_before); own rows do not. */
static void half_input(li_context *c, const float *norm_w, const li_matrix *const *ws, int nw, int own, int ith,
                       int64_t lo, int64_t hi, void **xq) {
    const li_model_desc *m = c->m;
    if (own) {
        const own_row r = own_of(c, ith);
        pre_norm(m, r.x, norm_w, r.xb, 0, 1);
        quantize_rows_to(r.xq, r.xb, m->n_embd, 0, 1, ws, nw);
        memcpy(xq, r.xq, sizeof(r.xq));
    } else {
        pre_norm(m, c->x, norm_w, c->xb, lo, hi);
        quantize_rows_for(c, c->xb, m->n_embd, lo, hi, ws, nw);
        memcpy(xq, c->xq, sizeof(c->xq));
    }
}

/* x += a half's output o (plus bias, when not NULL): the thread's own row, or rows [lo, hi) */
static void half_output(li_context *c, const float *bias, const float *post_norm, int own, int ith, int64_t lo,
                        int64_t hi) {
    if (own) {
        const own_row r = own_of(c, ith);
        own_residual(c->m, &r, c->o, bias, post_norm);
    } else {
        residual(c->m, c->x, c->o, bias, post_norm, lo, hi);
    }
}

/* The attention half: reads x, adds the attention output to it. */
static void attention_half(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth) {
    const li_model_desc *m = lm_of(c, il);
    const int64_t E = m->n_embd;
    const int64_t nq = (int64_t)m->n_head * m->head_dim, nk = (int64_t)m->n_head_kv * m->head_dim;
    const int64_t nv = (int64_t)m->n_head_kv * m->head_dim_v, na = (int64_t)m->n_head * m->head_dim_v;
    int64_t lo, hi;

    const int own = own_rows(c, n, nth);
    li_split(n, ith, nth, &lo, &hi);
    const li_matrix *qkv[3] = {&L->wq, &L->wk, &L->wv};
    void *xq[LI_ACT_COUNT];
    half_input(c, L->attn_norm, qkv, L->kv_reuse > 0 ? 1 : 3, own, ith, lo, hi, xq);
    const int gated = L->attn_out_gate; /* qwen35: wq gives [queries, gate] per head, into qg */
    const int kv_own = L->kv_reuse == 0;
    const product qkv_p[3] = {{&L->wq, xq[li_types[L->wq.type].act_type], n, gated ? c->qg : c->q, gated ? 2 * nq : nq},
                              {&L->wk, kv_own ? xq[li_types[L->wk.type].act_type] : NULL, n, c->k, nk},
                              {&L->wv, kv_own ? xq[li_types[L->wv.type].act_type] : NULL, n, c->v, nv}};
    const int n_qkv = L->kv_reuse > 0 ? 1 : 3; /* a layer reading another's keys and values has queries alone */
    if (!own) sync_before(c, qkv_p, n_qkv, ith, nth);
    const li_lora_proj qkv_l[3] = {
        {offsetof(li_lora_layer, wq), il, &L->wq, c->xb, E, gated ? c->qg : c->q, gated ? 2 * nq : nq, 0, NULL},
        {offsetof(li_lora_layer, wk), il, &L->wk, c->xb, E, c->k, nk, 0, NULL},
        {offsetof(li_lora_layer, wv), il, &L->wv, c->xb, E, c->v, nv, 0, NULL}};
    const int lora_qkv = li_lora_covers(c, qkv_l, n_qkv); /* never with own rows: xb holds every row */
    if (lora_qkv) li_lora_down(c, qkv_l, n_qkv, n, ith, nth);
    matmuls(c, qkv_p, n_qkv, ith, nth);
    li_attention_prefetch(c, L, il, n, ith, nth);
    li_share_sync(c->share);
    if (lora_qkv) {
        li_lora_up(c, qkv_l, n_qkv, n, ith, nth);
        li_share_sync(c->share);
    }
    if (gated) {
        const int64_t hd = m->head_dim;
        li_split(n * m->n_head, ith, nth, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) {
            const int64_t t = i / m->n_head, h = i % m->n_head;
            const float *src = c->qg + t * 2 * nq + h * 2 * hd;
            memcpy(c->q + t * nq + h * hd, src, (size_t)hd * sizeof(float));
            memcpy(c->gate + t * nq + h * hd, src + hd, (size_t)hd * sizeof(float));
        }
        li_share_sync(c->share);
    }

    if (m->qk_norm_whole) { /* olmo2: one RMSNorm over all heads of q, one over k */
        li_split(n, ith, nth, &lo, &hi);
        for (int64_t t = lo; t < hi; t++) {
            li_K->rms_norm(c->q + t * nq, L->q_norm, c->q + t * nq, nq, m->norm_eps);
            li_K->rms_norm(c->k + t * nk, L->k_norm, c->k + t * nk, nk, m->norm_eps);
        }
        li_share_sync(c->share);
    }

    /* per (token, head): biases, norms, RoPE, cache write */
    const int heads = m->n_head + (kv_own ? m->n_head_kv : 0);
    li_split(n * heads, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) li_prepare_head(c, L, il, i / heads, (int)(i % heads));
    li_share_sync(c->share);

    li_attention(c, L, il, n, ith, nth);
    li_share_sync(c->share);
    if (gated) { /* the output times sigmoid(gate), per token and head */
        li_split(n * m->n_head, ith, nth, &lo, &hi);
        for (int64_t i = lo; i < hi; i++)
            li_sigmoid_gate(c->att + i * m->head_dim_v, c->gate + i * m->head_dim, m->head_dim_v);
        li_share_sync(c->share);
    }

    gated_quantize(c, c->att, NULL, n, na, &L->wo, 0, ith, nth);
    const product wo_p = {&L->wo, acts_for(c, &L->wo), n, c->o, E};
    sync_before(c, &wo_p, 1, ith, nth);
    const li_lora_proj wo_l = {offsetof(li_lora_layer, wo), il, &L->wo, c->att, na, c->o, E, 0, NULL};
    const int lora_o = li_lora_covers(c, &wo_l, 1);
    if (lora_o) { /* A att, before Wo's product writes o over att */
        li_lora_down(c, &wo_l, 1, n, ith, nth);
        li_share_sync(c->share);
    }
    matmuls(c, &wo_p, 1, ith, nth);
    li_share_sync(c->share);
    if (lora_o) {
        li_lora_up(c, &wo_l, 1, n, ith, nth);
        li_share_sync(c->share);
    }

    li_split(n, ith, nth, &lo, &hi);
    half_output(c, L->bo, L->post_attn_norm, own, ith, lo, hi);
}

/* ---- recurrent mixers (hybrid models) ----
 * Each reads x and adds its output to it as the attention half does, its
 * input and output rows split the same way. Between the products, the
 * recurrence runs per sequence (its rows in batch order, which is position
 * order) on items of (sequence, channels) or (sequence, head): whatever
 * else is batched and however many threads share it, a sequence's values
 * go through the same operations in the same order. */

#define CONV_CHANNELS 64 /* channels per convolution item */

static float *state_of(const li_context *c, int s, int il) {
    return c->state + (size_t)c->views[s].state_slot * c->slot_floats + c->state_off[il];
}

/* the output rows o[n, k] through ssm_out into c->o, then added to x */
static void mixer_output(li_context *c, const li_layer_desc *L, float *o, int64_t n, int64_t k, int own, int ith,
                         int nth) {
    int64_t lo, hi;
    gated_quantize(c, o, NULL, n, k, &L->ssm_out, 0, ith, nth);
    const product out_p = {&L->ssm_out, acts_for(c, &L->ssm_out), n, c->o, c->m->n_embd};
    sync_before(c, &out_p, 1, ith, nth);
    matmuls(c, &out_p, 1, ith, nth);
    li_share_sync(c->share);
    li_split(n, ith, nth, &lo, &hi);
    half_output(c, NULL, NULL, own, ith, lo, hi);
}

/* the convolution of channels [0, channels) of every sequence: items of
 * (sequence, CONV_CHANNELS channels) */
static void conv_items(li_context *c, const li_layer_desc *L, int il, const float *in, int64_t in_ld, float *out,
                       int64_t out_ld, int64_t channels, int act, const float *mul, int64_t mul_ld, int ith, int nth) {
    const int64_t per = (channels + CONV_CHANNELS - 1) / CONV_CHANNELS;
    int64_t lo, hi;
    li_split((int64_t)c->n_seqs * per, ith, nth, &lo, &hi);
    for (int64_t it = lo; it < hi; it++) {
        const int s = (int)(it / per);
        const int32_t *rows = c->seq_rows + c->seq_off[s];
        const int64_t cnt = c->seq_off[s + 1] - c->seq_off[s];
        if (cnt == 0) continue;
        const int64_t c0 = (it % per) * CONV_CHANNELS, c1 = LI_MIN(channels, c0 + CONV_CHANNELS);
        li_conv_rows(in, (size_t)in_ld, out, (size_t)out_ld, rows, cnt, L->ssm_conv, L->ssm_conv_b, c->m->ssm_d_conv,
                     state_of(c, s, il), c0, c1, act);
        if (mul) /* LFM2: y = c * conv */
            for (int64_t i = 0; i < cnt; i++)
                for (int64_t ch = c0; ch < c1; ch++) out[rows[i] * out_ld + ch] *= mul[rows[i] * mul_ld + ch];
    }
}

/* LFM2's short convolution: b, c, x = in_proj(x); y = c * conv(b * x); out_proj */
static void shortconv_half(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth) {
    const int64_t E = c->m->n_embd, ld = c->r_in_ld;
    int64_t lo, hi;
    const int own = own_rows(c, n, nth);
    li_split(n, ith, nth, &lo, &hi);
    const li_matrix *ws[1] = {&L->ssm_in};
    void *xq[LI_ACT_COUNT];
    half_input(c, L->attn_norm, ws, 1, own, ith, lo, hi, xq);
    const product in_p = {&L->ssm_in, xq[li_types[L->ssm_in.type].act_type], n, c->r_in, ld};
    if (!own) sync_before(c, &in_p, 1, ith, nth);
    matmuls(c, &in_p, 1, ith, nth);
    li_share_sync(c->share);

    li_split(n, ith, nth, &lo, &hi); /* bx = b * x, the convolution's input */
    for (int64_t t = lo; t < hi; t++) li_K->mul_f32(c->r_in + t * ld, c->r_in + t * ld + 2 * E, c->r_conv + t * ld, E);
    li_share_sync(c->share);
    conv_items(c, L, il, c->r_conv, ld, c->r_out, E, E, 0, c->r_in + E, ld, ith, nth);
    li_share_sync(c->share);
    mixer_output(c, L, c->r_out, n, E, own, ith, nth);
}

/* Gated DeltaNet (qwen35): q, k, v = conv(attn_qkv(x)) with SiLU; z =
 * attn_gate(x); alpha, beta per value head; the delta rule per value head;
 * each head's output RMSNormed times SiLU(z); ssm_out */
static void gdn_half(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth) {
    const li_model_desc *m = c->m;
    const int64_t H = m->ssm_n_head, G = m->ssm_n_group, N = m->ssm_d_state, DI = m->ssm_d_inner, dv = DI / H;
    const int64_t CH = 2 * G * N + DI, ld = c->r_in_ld;
    int64_t lo, hi;
    const int own = own_rows(c, n, nth);
    li_split(n, ith, nth, &lo, &hi);
    const li_matrix *ws[4] = {&L->ssm_in, &L->ssm_z, &L->ssm_alpha, &L->ssm_beta};
    void *xq[LI_ACT_COUNT];
    half_input(c, L->attn_norm, ws, 4, own, ith, lo, hi, xq);
    const product ps[4] = {{&L->ssm_in, xq[li_types[L->ssm_in.type].act_type], n, c->r_in, ld},
                           {&L->ssm_z, xq[li_types[L->ssm_z.type].act_type], n, c->r_z, DI},
                           {&L->ssm_alpha, xq[li_types[L->ssm_alpha.type].act_type], n, c->r_ab, 2 * H},
                           {&L->ssm_beta, xq[li_types[L->ssm_beta.type].act_type], n, c->r_ab + H, 2 * H}};
    if (!own) sync_before(c, ps, 4, ith, nth);
    matmuls(c, ps, 4, ith, nth);
    li_share_sync(c->share);

    conv_items(c, L, il, c->r_in, ld, c->r_conv, ld, CH, 1, NULL, 0, ith, nth);
    li_share_sync(c->share);
    li_split(n * G, ith, nth, &lo, &hi); /* each key head's q and k normed */
    for (int64_t i = lo; i < hi; i++) {
        float *row = c->r_conv + (i / G) * ld;
        li_gdn_norm_qk(row + (i % G) * N, row + G * N + (i % G) * N, N, m->norm_eps);
    }
    li_share_sync(c->share);

    li_split((int64_t)c->n_seqs * H, ith, nth, &lo, &hi);
    for (int64_t it = lo; it < hi; it++) {
        const int s = (int)(it / H);
        const int64_t h = it % H, g = m->ssm_kv_grouped ? h / (H / G) : h % G;
        const int32_t *rows = c->seq_rows + c->seq_off[s];
        const int64_t cnt = c->seq_off[s + 1] - c->seq_off[s];
        if (cnt == 0) continue;
        float *S = state_of(c, s, il) + CH * (m->ssm_d_conv - 1) + h * dv * N;
        li_gdn_head(S, N, dv, rows, cnt, c->r_conv + g * N, c->r_conv + G * N + g * N, (size_t)ld,
                    c->r_conv + 2 * G * N + h * dv, (size_t)ld, c->r_ab + h, c->r_ab + H + h, (size_t)(2 * H),
                    L->ssm_dt_b[h], L->ssm_a[h], c->r_out + h * dv, (size_t)DI);
        for (int64_t i = 0; i < cnt; i++)
            li_gated_head_norm(c->r_out + rows[i] * DI + h * dv, L->ssm_norm, c->r_z + rows[i] * DI + h * dv, dv,
                               m->norm_eps);
    }
    li_share_sync(c->share);
    mixer_output(c, L, c->r_out, n, DI, own, ith, nth);
}

/* Mamba2: z, xBC, dt = ssm_in(x); x, B, C = SiLU(conv(xBC) + bias); the
 * selective scan per head, plus x * D, times SiLU(z); RMSNorm per group of
 * d_inner / n_group channels (when the layer has ssm_norm); ssm_out */
static void mamba2_half(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth) {
    const li_model_desc *m = c->m;
    const int64_t H = m->ssm_n_head, G = m->ssm_n_group, N = m->ssm_d_state, DI = m->ssm_d_inner, hd = DI / H;
    const int64_t CH = DI + 2 * G * N, ld = c->r_in_ld;
    int64_t lo, hi;
    const int own = own_rows(c, n, nth);
    li_split(n, ith, nth, &lo, &hi);
    const li_matrix *ws[1] = {&L->ssm_in};
    void *xq[LI_ACT_COUNT];
    half_input(c, L->attn_norm, ws, 1, own, ith, lo, hi, xq);
    const product in_p = {&L->ssm_in, xq[li_types[L->ssm_in.type].act_type], n, c->r_in, ld};
    if (!own) sync_before(c, &in_p, 1, ith, nth);
    matmuls(c, &in_p, 1, ith, nth);
    li_share_sync(c->share);

    conv_items(c, L, il, c->r_in + DI, ld, c->r_conv, ld, CH, 1, NULL, 0, ith, nth);
    li_share_sync(c->share);
    li_split((int64_t)c->n_seqs * H, ith, nth, &lo, &hi);
    for (int64_t it = lo; it < hi; it++) {
        const int s = (int)(it / H);
        const int64_t h = it % H, g = h / (H / G);
        const int32_t *rows = c->seq_rows + c->seq_off[s];
        const int64_t cnt = c->seq_off[s + 1] - c->seq_off[s];
        if (cnt == 0) continue;
        float *S = state_of(c, s, il) + CH * (m->ssm_d_conv - 1) + h * hd * N;
        li_mamba2_head(S, hd, N, rows, cnt, c->r_conv + h * hd, (size_t)ld, c->r_conv + DI + g * N,
                       c->r_conv + DI + G * N + g * N, c->r_in + DI + CH + h, (size_t)ld, L->ssm_dt_b[h], L->ssm_a[h],
                       L->ssm_d[h], c->r_in + h * hd, (size_t)ld, c->r_out + h * hd, (size_t)DI);
    }
    li_share_sync(c->share);
    if (L->ssm_norm) {
        const int64_t gs = DI / G;
        li_split(n * G, ith, nth, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) {
            float *y = c->r_out + (i / G) * DI + (i % G) * gs;
            li_K->rms_norm(y, L->ssm_norm + (i % G) * gs, y, gs, m->norm_eps);
        }
        li_share_sync(c->share);
    }
    mixer_output(c, L, c->r_out, n, DI, own, ith, nth);
}

/* The feed-forward half (gated: act(x Wg^T) * (x Wu^T), then Wd): reads x,
 * adds its output to it. Rows are split as the attention half splits them,
 * so the two need no barrier between them. The projections run over chunks of
 * LI_FFN_CHUNK rows, so g and u stay small whatever n_batch is: a chunk's
 * gated activations go to xd, apart from the xq rows later chunks still read. */
/* an ungated feed-forward's activation, fn(u) in place, then quantized for
 * w into dst: gated_quantize_to's split, with fn applied to u itself (a
 * squared ReLU exactly, the others through the kernels' act_apply) */
static void act_quantize_to(void *dst, float *u, int64_t n, int64_t k, const li_matrix *w, int fn, int ith,
                            int nth) {
    const int a = li_types[w->type].act_type;
    const int64_t bs = li_act_block_size(a), per_row = k / bs;
    const size_t blk = li_act_row_bytes(a, bs), row = li_act_row_bytes(a, k);
    int64_t lo, hi;
    li_split(n * per_row, ith, nth, &lo, &hi);
    for (int64_t b = lo; b < hi; b++) {
        const int64_t t = b / per_row, j = (b % per_row) * bs;
        float *x = u + t * k + j;
        if (fn == LI_FN_RELU_SQR)
            for (int64_t i = 0; i < bs; i++) x[i] = x[i] > 0.0f ? x[i] * x[i] : 0.0f;
        else
            li_K->act_apply(fn, x, NULL, x, bs);
        li_K->quant_act[a](x, (char *)dst + (size_t)t * row + (size_t)(b % per_row) * blk, bs);
    }
}

static void ffn_half(li_context *c, const li_layer_desc *L, int64_t n, int ith, int nth) {
    const li_model_desc *m = lm_of(c, (int)(L - c->m->layers));
    const int64_t E = m->n_embd, F = m->n_ff;
    const int il = (int)(L - m->layers);
    int64_t lo, hi;

    const int own = own_rows(c, n, nth);
    const int gated = L->w_gate.data != NULL;
    li_split(n, ith, nth, &lo, &hi);
    const li_matrix *gu[2] = {&L->w_gate, &L->w_up};
    void *xq[LI_ACT_COUNT];
    half_input(c, L->ffn_norm, gated ? gu : gu + 1, gated ? 2 : 1, own, ith, lo, hi, xq);

    const size_t row_g = gated ? li_act_row_bytes(li_types[L->w_gate.type].act_type, E) : 0;
    const size_t row_u = li_act_row_bytes(li_types[L->w_up.type].act_type, E);
    void *xd = c->xd[li_types[L->w_down.type].act_type];
    for (int64_t c0 = 0; c0 < n; c0 += LI_FFN_CHUNK) {
        const int64_t nc = LI_MIN((int64_t)LI_FFN_CHUNK, n - c0);
        /* the previous chunk's down projection read only xd, which the barrier below orders */
        const product gu_p[2] = {
            {&L->w_gate, gated ? (const char *)xq[li_types[L->w_gate.type].act_type] + (size_t)c0 * row_g : NULL, nc,
             c->g, F},
            {&L->w_up, (const char *)xq[li_types[L->w_up.type].act_type] + (size_t)c0 * row_u, nc, c->u, F}};
        const product *ps = gated ? gu_p : gu_p + 1;
        if (c0 == 0 && !own) sync_before(c, ps, gated ? 2 : 1, ith, nth); /* after the quantized rows */
        /* LoRA (lora.c; never with own rows): its deltas after each product, a barrier after each step */
        const li_lora_proj gu_l[2] = {
            {offsetof(li_lora_layer, w_gate), il, &L->w_gate, c->xb + c0 * E, E, c->g, F, c0, NULL},
            {offsetof(li_lora_layer, w_up), il, &L->w_up, c->xb + c0 * E, E, c->u, F, c0, NULL}};
        const li_lora_proj *gu_lp = gated ? gu_l : gu_l + 1;
        const int lora_gu = li_lora_covers(c, gu_lp, gated ? 2 : 1);
        if (lora_gu) li_lora_down(c, gu_lp, gated ? 2 : 1, nc, ith, nth);
        matmuls(c, ps, gated ? 2 : 1, ith, nth);
        li_share_sync(c->share);
        if (lora_gu) {
            li_lora_up(c, gu_lp, gated ? 2 : 1, nc, ith, nth);
            li_share_sync(c->share);
        }

        if (gated)
            gated_quantize_to(xd, c->g, c->u, nc, F, &L->w_down, m->gate_fn, ith, nth);
        else
            act_quantize_to(xd, c->u, nc, F, &L->w_down, m->gate_fn, ith, nth);
        const product down_p = {&L->w_down, xd, nc, c->o + c0 * E, E};
        sync_before(c, &down_p, 1, ith, nth);
        /* the activations in place: g times fn, or fn(u) */
        const li_lora_proj down_l = {offsetof(li_lora_layer, w_down), il, &L->w_down, gated ? c->g : c->u, F,
                                     c->o + c0 * E, E, c0, NULL};
        const int lora_d = li_lora_covers(c, &down_l, 1);
        if (lora_d) li_lora_down(c, &down_l, 1, nc, ith, nth); /* down's product writes o, not g or u */
        matmuls(c, &down_p, 1, ith, nth);
        if (lora_d) {
            li_share_sync(c->share);
            li_lora_up(c, &down_l, 1, nc, ith, nth);
            li_share_sync(c->share); /* the next chunk's steps write lora_tmp, g and u again */
        }
    }
    li_share_sync(c->share);

    li_split(n, ith, nth, &lo, &hi);
    half_output(c, NULL, L->post_ffn_norm, own, ith, lo, hi);
}

/* ---- per-layer embeddings and output scales (gemma4) ---- */

/* Each token's per-layer inputs pe_in (llminfer.h, li_model_desc) from its
 * scaled embedding in x: rows [lo, hi) are this thread's, as the embedding's */
static void pe_inputs(li_context *c, const li_batch *b, int64_t n, int ith, int nth, int64_t lo, int64_t hi) {
    const li_model_desc *m = c->m;
    const int64_t E = m->n_embd, P = m->n_embd_pe, NL = m->n_layer, NP = NL * P;
    const li_matrix *w[1] = {&m->pe_model_proj};
    quantize_rows_for(c, c->x, E, lo, hi, w, 1);
    const product p = {&m->pe_model_proj, acts_for(c, &m->pe_model_proj), n, c->pe_raw, NP};
    sync_before(c, &p, 1, ith, nth);
    matmuls(c, &p, 1, ith, nth);
    li_share_sync(c->share);
    const li_matrix *emb = &m->pe_tok_embd;
    const size_t emb_row = emb->nbytes / (size_t)emb->rows;
    float *row = c->pe_row + (size_t)ith * (size_t)NP;
    const float proj_scale = 1.0f / sqrtf((float)E), tok_scale = sqrtf((float)P), in_scale = 1.0f / sqrtf(2.0f);
    for (int64_t t = lo; t < hi; t++) {
        const int32_t tok = b->token ? b->token[t] : 0; /* an input row takes token 0's */
        li_K->dequant[emb->type]((const char *)emb->data + (size_t)tok * emb_row, row, NP);
        for (int64_t l = 0; l < NL; l++) {
            float *pr = c->pe_raw + t * NP + l * P;
            float *out = c->pe_in + ((size_t)l * (size_t)c->n_batch + (size_t)t) * (size_t)P;
            li_K->scale_f32(pr, proj_scale, P);
            li_K->rms_norm(pr, m->pe_proj_norm, out, P, m->norm_eps);
            for (int64_t j = 0; j < P; j++) out[j] = (out[j] + row[l * P + j] * tok_scale) * in_scale;
        }
    }
}

/* After layer il's feed-forward: its per-layer embedding (when the model has
 * them), x += rmsnorm(pe_proj (gelu(pe_gate x) * pe_in[il])) * pe_post_norm,
 * then x *= out_scale (when not 0). Rows [lo, hi) as the halves split them. */
static void layer_end(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth) {
    const li_model_desc *m = c->m;
    const int64_t E = m->n_embd, P = m->n_embd_pe;
    int64_t lo, hi;
    li_split(n, ith, nth, &lo, &hi);
    if (P > 0) {
        const li_matrix *w[1] = {&L->pe_gate};
        quantize_rows_for(c, c->x, E, lo, hi, w, 1);
        const product gp = {&L->pe_gate, acts_for(c, &L->pe_gate), n, c->pe_g, P};
        sync_before(c, &gp, 1, ith, nth);
        matmuls(c, &gp, 1, ith, nth);
        li_share_sync(c->share);
        gated_quantize(c, c->pe_g, c->pe_in + (size_t)il * (size_t)c->n_batch * (size_t)P, n, P, &L->pe_proj,
                       LI_FN_GELU, ith, nth);
        const product pp = {&L->pe_proj, acts_for(c, &L->pe_proj), n, c->o, E};
        sync_before(c, &pp, 1, ith, nth);
        matmuls(c, &pp, 1, ith, nth);
        li_share_sync(c->share);
        for (int64_t t = lo; t < hi; t++) {
            li_K->rms_norm(c->o + t * E, L->pe_post_norm, c->o + t * E, E, m->norm_eps);
            li_K->add_f32(c->x + t * E, c->o + t * E, c->x + t * E, E);
        }
    }
    if (L->out_scale != 0.0f)
        for (int64_t t = lo; t < hi; t++) li_K->scale_f32(c->x + t * E, L->out_scale, E);
}

/* ---- mixture of experts ---- */

/* The ids of the k largest v[e] + bias[e] (bias NULL: v alone) into sel,
 * the largest first and, among equals, the lower index first. */
static void top_k_ids(const float *v, const float *bias, int n, int k, int32_t *sel) {
    for (int j = 0; j < k; j++) {
        int pick = -1;
        float best = 0.0f;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            const float x = bias ? v[e] + bias[e] : v[e];
            if (!taken && (pick < 0 || x > best)) {
                pick = e;
                best = x;
            }
        }
        sel[j] = pick;
    }
}

/* w[j] = prob[sel[j]] renormalized to sum to 1, the sum clamped as
 * llama.cpp clamps it, to the smallest normal float16 */
static void picked_weights(const float *prob, const int32_t *sel, int k, float *w) {
    float wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        w[j] = prob[sel[j]];
        wsum += w[j];
    }
    wsum = LI_MAX(wsum, 6.103515625e-5f);
    for (int j = 0; j < k; j++) w[j] /= wsum;
}

/* Route one token: softmax over its router logits, the k most probable
 * experts (the lower index first among equals) in descending order, and
 * their probabilities renormalized to sum to 1 (Qwen3-MoE). */
static void route_token(const float *logits, int n_expert, int k, float *prob, int32_t *sel, float *w) {
    float best = logits[0];
    for (int e = 1; e < n_expert; e++) best = LI_MAX(best, logits[e]);
    float sum = 0.0f;
    for (int e = 0; e < n_expert; e++) {
        prob[e] = expf(logits[e] - best);
        sum += prob[e];
    }
    for (int e = 0; e < n_expert; e++) prob[e] /= sum;
    top_k_ids(prob, NULL, n_expert, k, sel);
    picked_weights(prob, sel, k, w);
}

/* Route one token as lfm2moe does (LI_GATING_SIGMOID): p = sigmoid(logit);
 * the k largest p + bias (the lower index first among equals, bias NULL:
 * none) in descending order, weighted by their p normalized to sum 1. */
static void route_token_sigmoid(const float *logits, const float *bias, int n_expert, int k, float *prob,
                                int32_t *sel, float *w) {
    for (int e = 0; e < n_expert; e++) prob[e] = 1.0f / (1.0f + expf(-logits[e]));
    top_k_ids(prob, bias, n_expert, k, sel);
    picked_weights(prob, sel, k, w);
}

/* Route one token as gpt-oss does (LI_GATING_SOFTMAX_WEIGHT): the k
 * largest logits (the lower index first among equals) in descending order,
 * their weights a softmax over those k alone, as ggml's soft_max computes
 * it (a double sum, its inverse rounded to float). */
static void route_token_topk(const float *logits, int n_expert, int k, int32_t *sel, float *w) {
    top_k_ids(logits, NULL, n_expert, k, sel);
    const float best = logits[sel[0]];
    double sum = 0.0;
    for (int j = 0; j < k; j++) {
        w[j] = expf(logits[sel[j]] - best);
        sum += (double)w[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < k; j++) w[j] *= inv;
}

/* expert e's rows of an expert tensor, as a matrix of its own (its groups
 * of the packed copy, which repack.c packs expert by expert) */
static li_matrix expert_slice(const li_matrix *w, int n_expert, int e) {
    const int64_t rows = w->rows / n_expert;
    const size_t bytes = w->nbytes / (size_t)n_expert;
    const li_matrix out = {(const char *)w->data + (size_t)e * bytes, w->type, rows, w->k, bytes,
                           li_x16_part(w, n_expert, e)};
    return out;
}

/* The used experts' products of one step, from expert *e on: for each
 * expert with slots, a product per matrix of ws[0..nw) (its slice, the
 * slots' inputs from xin[i] in that matrix's activation format, n_in wide,
 * out[i] n_out wide), as many as LI_X16_MAX_PARTS holds whole; *e moves past
 * the experts taken. Returns the products' count, 0 when none is left. */
static int expert_batch(const li_context *c, const li_matrix *const *ws, void *const *xin, float *const *out, int nw,
                        int64_t n_in, int64_t n_out, int *e, li_matrix *slices, product *ps) {
    const int NE = c->m->n_expert;
    int np = 0;
    for (; *e < NE && np + nw <= LI_X16_MAX_PARTS; (*e)++) {
        const int64_t s0 = c->e_off[*e], cnt = c->e_off[*e + 1] - s0;
        if (cnt == 0) continue;
        for (int i = 0; i < nw; i++, np++) {
            const size_t row = li_act_row_bytes(li_types[ws[i]->type].act_type, n_in);
            slices[np] = expert_slice(ws[i], NE, *e);
            ps[np] = (product){&slices[np], (const char *)xin[i] + (size_t)s0 * row, cnt, out[i] + s0 * n_out, n_out};
        }
    }
    return np;
}

/* A step's expert products, LI_X16_MAX_PARTS at a time (matmuls), after the
 * barrier that ends the step before (sync_before) */
static void expert_products(li_context *c, const li_matrix *const *ws, void *const *xin, float *const *out, int nw,
                            int64_t n_in, int64_t n_out, int ith, int nth) {
    li_matrix slices[LI_X16_MAX_PARTS];
    product ps[LI_X16_MAX_PARTS];
    int e = 0, np = expert_batch(c, ws, xin, out, nw, n_in, n_out, &e, slices, ps);
    sync_before(c, ps, np, ith, nth);
    for (; np > 0; np = expert_batch(c, ws, xin, out, nw, n_in, n_out, &e, slices, ps)) matmuls(c, ps, np, ith, nth);
}

/* The feed-forward half of a MoE layer. Each token is routed to k experts;
 * its (token, choice) pairs become slots, grouped by expert (tokens in batch
 * order within an expert), so each expert's gate, up and down products run
 * once over all the slots routed to it: prefill reads an expert's weights
 * once per batch, and decode reads only the chosen experts. A slot's product
 * is the same whatever the expert's slot count (matmul gives a row the same
 * result for any n), and a token's experts are summed in the order of its
 * choices, so a token's output does not depend on the rest of the batch. */
/* The shared expert's gated feed-forward over the rows of xq (moe_half
 * quantized them for it) into so, in chunks of LI_FFN_CHUNK rows as
 * ffn_half runs a dense one; ends with a barrier. */
static void shared_expert(li_context *c, const li_layer_desc *L, int64_t n, int ith, int nth) {
    const li_model_desc *m = c->m;
    const int64_t E = m->n_embd, F = m->n_ff_shexp;
    const size_t row_g = li_act_row_bytes(li_types[L->gate_shexp.type].act_type, E);
    const size_t row_u = li_act_row_bytes(li_types[L->up_shexp.type].act_type, E);
    void *xd = c->xd[li_types[L->down_shexp.type].act_type];
    for (int64_t c0 = 0; c0 < n; c0 += LI_FFN_CHUNK) {
        const int64_t nc = LI_MIN((int64_t)LI_FFN_CHUNK, n - c0);
        li_share_sync(c->share); /* the previous chunk's down product has read xd */
        const product gu_p[2] = {
            {&L->gate_shexp, (const char *)c->xq[li_types[L->gate_shexp.type].act_type] + (size_t)c0 * row_g, nc,
             c->sg, F},
            {&L->up_shexp, (const char *)c->xq[li_types[L->up_shexp.type].act_type] + (size_t)c0 * row_u, nc, c->su,
             F}};
        matmuls(c, gu_p, 2, ith, nth);
        li_share_sync(c->share);
        gated_quantize_to(xd, c->sg, c->su, nc, F, &L->down_shexp, m->gate_fn, ith, nth);
        const product down_p = {&L->down_shexp, xd, nc, c->so + c0 * E, E};
        sync_before(c, &down_p, 1, ith, nth);
        matmuls(c, &down_p, 1, ith, nth);
    }
    li_share_sync(c->share);
}

static void moe_half(li_context *c, const li_layer_desc *L, int64_t n, int ith, int nth) {
    const li_model_desc *m = c->m;
    const int64_t E = m->n_embd, Fe = m->n_ff_exp;
    const int NE = m->n_expert, K = m->n_expert_used;
    int64_t lo, hi;

    const int shared = L->gate_shexp.data != NULL;
    const int g4 = L->router_in_scale != NULL; /* gemma4: router, experts and shared expert read their own norms */
    li_split(n, ith, nth, &lo, &hi);
    if (g4) {
        const float s = 1.0f / sqrtf((float)E);
        for (int64_t t = lo; t < hi; t++) {
            li_K->rms_norm(c->x + t * E, L->router_in_scale, c->xb + t * E, E, m->norm_eps);
            li_K->scale_f32(c->xb + t * E, s, E);
        }
        const li_matrix *in[1] = {&L->router};
        quantize_rows_for(c, c->xb, E, lo, hi, in, 1);
    } else {
        pre_norm(m, c->x, L->ffn_norm, c->xb, lo, hi);
        const li_matrix *in[5] = {&L->router, &L->gate_exps, &L->up_exps, &L->gate_shexp, &L->up_shexp};
        quantize_rows_for(c, c->xb, E, lo, hi, in, shared ? 5 : 3);
        for (int64_t t = lo; t < hi && shared; t++) /* the shared expert's gate, while the normed rows are there */
            c->sgate[t] = L->gate_inp_shexp
                              ? 1.0f / (1.0f + expf(-li_K->dot_f32(c->xb + t * E, L->gate_inp_shexp, E)))
                              : 1.0f;
    }
    li_share_sync(c->share);

    matmul(c, &L->router, acts_for(c, &L->router), n, c->route, NE, ith, nth);
    li_share_sync(c->share);

    li_split(n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) { /* route's row is free after this token's softmax: its probabilities go there */
        float *r = c->route + t * NE;
        if (L->router_b) li_K->add_f32(r, L->router_b, r, NE);
        if (m->expert_gating == LI_GATING_SOFTMAX_WEIGHT)
            route_token_topk(r, NE, K, c->sel + t * K, c->wsel + t * K);
        else if (m->expert_gating == LI_GATING_SIGMOID)
            route_token_sigmoid(r, L->router_sel_b, NE, K, r, c->sel + t * K, c->wsel + t * K);
        else
            route_token(r, NE, K, r, c->sel + t * K, c->wsel + t * K);
    }
    li_share_sync(c->share);
    if (g4) { /* the shared expert over rmsnorm(x) * ffn_norm into so, then the experts' input */
        li_split(n, ith, nth, &lo, &hi);
        pre_norm(m, c->x, L->ffn_norm, c->xb, lo, hi);
        const li_matrix *sh[2] = {&L->gate_shexp, &L->up_shexp};
        quantize_rows_for(c, c->xb, E, lo, hi, sh, 2);
        shared_expert(c, L, n, ith, nth); /* its first barrier orders the rows before its products */
        li_split(n, ith, nth, &lo, &hi);
        pre_norm(m, c->x, L->moe_norm, c->xb, lo, hi);
        const li_matrix *ex[3] = {&L->gate_up_exps, &L->gate_exps, &L->up_exps};
        quantize_rows_for(c, c->xb, E, lo, hi, L->gate_up_exps.data ? ex : ex + 1, L->gate_up_exps.data ? 1 : 2);
        li_share_sync(c->share);
    }

    if (ith == 0) { /* counting sort of the slots by expert; a few thousand steps */
        int32_t *off = c->e_off;
        for (int e = 0; e <= NE; e++) off[e] = 0;
        for (int64_t s = 0; s < n * K; s++) off[c->sel[s] + 1]++;
        for (int e = 0; e < NE; e++) off[e + 1] += off[e];
        for (int64_t s = 0; s < n * K; s++) { /* off[e] walks to the end of e's range ... */
            const int32_t at = off[c->sel[s]]++;
            c->slot[s] = at;
            c->slot_tok[at] = (int32_t)(s / K);
        }
        for (int e = NE; e > 0; e--) off[e] = off[e - 1]; /* ... and is put back to its start */
        off[0] = 0;
    }
    li_share_sync(c->share);

    /* each slot's input row: its token's row of xq, in the formats of gate and up */
    const int fused = L->gate_up_exps.data != NULL;
    const int ag = li_types[(fused ? L->gate_up_exps : L->gate_exps).type].act_type;
    const int au = fused ? ag : li_types[L->up_exps.type].act_type;
    li_split(n * K, ith, nth, &lo, &hi);
    for (int64_t s = lo; s < hi; s++) {
        const size_t rg = li_act_row_bytes(ag, E), ru = li_act_row_bytes(au, E);
        memcpy((char *)c->xe[ag] + (size_t)s * rg, (const char *)c->xq[ag] + (size_t)c->slot_tok[s] * rg, rg);
        if (au != ag)
            memcpy((char *)c->xe[au] + (size_t)s * ru, (const char *)c->xq[au] + (size_t)c->slot_tok[s] * ru, ru);
    }

    /* the used experts' gate and up products */
    if (fused) { /* one product per expert, its rows then cut into gate and up */
        const li_matrix *w[1] = {&L->gate_up_exps};
        void *w_in[1] = {c->xe[ag]};
        float *w_out[1] = {c->gu};
        expert_products(c, w, w_in, w_out, 1, E, 2 * Fe, ith, nth);
        li_share_sync(c->share);
        li_split(n * K, ith, nth, &lo, &hi);
        for (int64_t s = lo; s < hi; s++) {
            memcpy(c->g + s * Fe, c->gu + s * 2 * Fe, (size_t)Fe * sizeof(float));
            memcpy(c->u + s * Fe, c->gu + s * 2 * Fe + Fe, (size_t)Fe * sizeof(float));
        }
    } else {
        const li_matrix *gu[2] = {&L->gate_exps, &L->up_exps};
        void *gu_in[2] = {c->xe[ag], c->xe[au]};
        float *gu_out[2] = {c->g, c->u};
        expert_products(c, gu, gu_in, gu_out, 2, E, Fe, ith, nth);
    }
    li_share_sync(c->share);
    if (L->gate_exps_b || L->up_exps_b) { /* each slot's expert's biases (gpt-oss) */
        li_split(n * K, ith, nth, &lo, &hi);
        int e = 0;
        for (int64_t s = lo; s < hi; s++) {
            while (c->e_off[e + 1] <= s) e++; /* the expert whose range holds slot s */
            if (L->gate_exps_b) li_K->add_f32(c->g + s * Fe, L->gate_exps_b + (int64_t)e * Fe, c->g + s * Fe, Fe);
            if (L->up_exps_b) li_K->add_f32(c->u + s * Fe, L->up_exps_b + (int64_t)e * Fe, c->u + s * Fe, Fe);
        }
        li_share_sync(c->share);
    }

    /* the gathered inputs are spent: xe[ad] now takes the down products' inputs */
    const int ad = li_types[L->down_exps.type].act_type;
    gated_quantize_to(c->xe[ad], c->g, c->u, n * K, Fe, &L->down_exps, m->gate_fn, ith, nth);
    const li_matrix *down[1] = {&L->down_exps};
    void *down_in[1] = {c->xe[ad]};
    float *down_out[1] = {c->eo};
    expert_products(c, down, down_in, down_out, 1, Fe, E, ith, nth);
    li_share_sync(c->share);

    li_split(n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *o = c->o + t * E;
        memset(o, 0, (size_t)E * sizeof(float));
        for (int j = 0; j < K; j++) {
            const float *eo = c->eo + (int64_t)c->slot[t * K + j] * E;
            const float w = L->down_exps_s ? c->wsel[t * K + j] * L->down_exps_s[c->sel[t * K + j]]
                                           : c->wsel[t * K + j];
            if (L->down_exps_b) { /* the expert's output bias, before its weight (ggml_add_id, then ggml_mul) */
                const float *b = L->down_exps_b + (int64_t)c->sel[t * K + j] * E;
                for (int64_t i = 0; i < E; i++) o[i] += w * (eo[i] + b[i]);
            } else {
                for (int64_t i = 0; i < E; i++) o[i] += w * eo[i];
            }
        }
    }
    if (g4) { /* each sum normed, then added */
        for (int64_t t = lo; t < hi; t++) {
            li_K->rms_norm(c->o + t * E, L->moe_post_norm, c->o + t * E, E, m->norm_eps);
            li_K->rms_norm(c->so + t * E, L->shexp_post_norm, c->so + t * E, E, m->norm_eps);
            li_K->add_f32(c->o + t * E, c->so + t * E, c->o + t * E, E);
        }
    } else if (shared) {
        shared_expert(c, L, n, ith, nth);
        li_split(n, ith, nth, &lo, &hi);
        for (int64_t t = lo; t < hi; t++) li_K->axpy_f32(c->sgate[t], c->so + t * E, c->o + t * E, E);
    }
    residual(m, c->x, c->o, NULL, L->post_ffn_norm, lo, hi);
}

/* ---- the non-finite probe (li_context_set_probe) ---- */

/* Steps in pass order: the embedding 0, layer il's attention half 1 + 2 il
 * and its feed-forward half 2 + 2 il, the final norm 1 + 2 n_layer, the
 * logits 2 + 2 n_layer. */
static int probe_order(const li_context *c, int step, int layer) {
    switch (step) {
    case LI_PROBE_EMBED: return 0;
    case LI_PROBE_ATTN: return 1 + 2 * layer;
    case LI_PROBE_FFN: return 2 + 2 * layer;
    case LI_PROBE_BACKEND: return 2 * layer; /* where its last layer ends */
    case LI_PROBE_OUTPUT_NORM: return 1 + 2 * c->m->n_layer;
    case LI_PROBE_LOGITS: return 2 + 2 * c->m->n_layer;
    default: return INT_MAX;
    }
}

/* The first of rows [lo, hi) of x (width w) with a NaN or an infinity, or -1.
 * By the bits (exponent all ones), so no compiler flag can fold it away. */
static int64_t first_bad_row(const float *x, int64_t lo, int64_t hi, int64_t w) {
    for (int64_t t = lo; t < hi; t++)
        for (int64_t j = 0; j < w; j++)
            if ((li_f32_bits(x[t * w + j]) & 0x7f800000u) == 0x7f800000u) return t;
    return -1;
}

/* Record (step, layer, row) if it comes before what was found so far. */
static void probe_note(li_context *c, int step, int layer, int64_t row) {
    const int order = probe_order(c, step, layer);
#ifdef _OPENMP
#pragma omp critical(li_probe)
#endif
    if (order < c->probe_order || (order == c->probe_order && row < c->found.row)) {
        c->probe_order = order;
        c->found.step = step;
        c->found.layer = layer;
        c->found.row = (int)row;
    }
}

/* The team checks rows [0, n) of x (width w) after a step: each thread its
 * share, after a barrier, so any step's split of the rows will do. */
static void probe_team(li_context *c, const float *x, int64_t n, int64_t w, int step, int layer) {
    int64_t lo, hi;
    li_share_sync(c->share);
    li_split(n, li_thread_index(), li_thread_count(), &lo, &hi);
    const int64_t bad = first_bad_row(x, lo, hi, w);
    if (bad >= 0) probe_note(c, step, layer, bad);
}

int li_context_set_probe(li_context *c, int on) {
    if (!c) return li_fail(LI_E_ARG, "no context");
    c->probe = on != 0;
    return LI_OK;
}

int li_context_probe_result(const li_context *c, li_probe_result *out) {
    if (!c || !out) return li_fail(LI_E_ARG, "no context or no result");
    if (c->probe_order == INT_MAX) {
        out->step = LI_PROBE_NONE;
        out->layer = out->row = -1;
    } else {
        *out = c->found;
    }
    return LI_OK;
}

/* Where the host put a 2-thread team: a pass through the team's barrier
 * takes ~30-90 ns when its two CPUs are one core's hyperthreads and ~300 ns
 * when they are cores apart (this VM moves them between the two every few
 * seconds; bench/compare.py's probe reads the same signal). Sharing a core,
 * each thread decodes at about half the pace, and most super-block kernels'
 * L1 hints then do better a shorter way ahead (LI_X16_HINT_NEAR). Every thread
 * calls this, every PROBE_EVERY decode passes; thread 0 times each of
 * PROBE_SYNCS barriers and keeps the least, its clock's two reads included
 * (here 90-120 ns near, 210-330 ns apart; the first barriers of a pass,
 * the worker just woken, take longer). A few us a probe: under 0.1% of a
 * 135M model's 2 ms token. */
#define PROBE_SYNCS 8
#define PROBE_EVERY 8
#define NEAR_SYNC_S 160e-9
static void placement_probe(li_context *c, int ith) {
#ifdef _OPENMP
    double best = 1.0;
    for (int i = 0; i < PROBE_SYNCS; i++) {
        const double t0 = omp_get_wtime();
        li_share_sync(c->share);
        best = LI_MIN(best, omp_get_wtime() - t0);
    }
    if (ith == 0) c->near = best < NEAR_SYNC_S;
#else
    (void)c;
    (void)ith;
#endif
}

/* The pass's LI_X16_HINT_* flags from the context's tuning (thread 0, before
 * the pass's first barrier: fixed for the whole pass) */
static unsigned x16_hints(const li_context *c, int nth) {
    const int p = c->tuning.placement;
    const int near = nth == 2 && (p == LI_PLACEMENT_PROBE ? c->near : p == LI_PLACEMENT_NEAR);
    return (c->tuning.stream_hint == LI_STREAM_L2 ? LI_X16_HINT_L2 : 0u) | (near ? LI_X16_HINT_NEAR : 0u);
}

/* The team's share of a pass: the embedding (embed), layers [l0, l1), then
 * the head (head). The CPU-only pass is all three in one region. */
/* DeepStack: slice il + 1 of each input row added to its residual stream
 * after layer il, over the rows the layer's last step split the same way */
static void deepstack_add(li_context *c, const li_batch *b, int il, int64_t n, int ith, int nth) {
    const int64_t E = c->m->n_embd, W = E * (1 + c->m->n_deepstack);
    int64_t lo, hi;
    li_split(n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        li_K->add_f32(c->x + t * E, b->embd + t * W + (int64_t)(il + 1) * E, c->x + t * E, E);
}

static void forward_team(li_context *c, const li_batch *b, int64_t n_out, float *logits, int embed, int l0, int l1,
                         int head) {
    const li_model_desc *m = c->m;
    const int ith = li_thread_index(), nth = li_thread_count();
    const int64_t E = m->n_embd, n = b->n;
    int64_t lo, hi;

    li_share_begin(c->share, ith); /* the products' shares start afresh, before any is taken */
    /* thread 0 alone counts the passes, and its choice crosses the barrier:
     * the whole team takes the probe's barriers, or none of it (each call
     * is a parallel region of its own, whose end orders the next write) */
    const int decode2 = nth == 2 && n == 1;
    const int probe = decode2 && c->tuning.placement == LI_PLACEMENT_PROBE;
    if (ith == 0 && probe) c->probe_now = c->passes++ % PROBE_EVERY == 0;
    if (ith == 0) c->hints = x16_hints(c, nth); /* the last probe's finding: the next pass reads this one's */
    li_share_sync(c->share);
    if (probe && c->probe_now) placement_probe(c, ith);
    li_split(n, ith, nth, &lo, &hi);
    const li_matrix *emb = &m->tok_embd;
    const size_t emb_row = emb->nbytes / (size_t)emb->rows;
    for (int64_t t = lo; t < hi && embed; t++) {
        float *x = c->x + t * E;
        if (b->embd) {
            memcpy(x, b->embd + t * E * (1 + m->n_deepstack), (size_t)E * sizeof(float));
            continue;
        }
        const char *row = (const char *)emb->data + (size_t)b->token[t] * emb_row;
        char *copy = c->embd_rows + (size_t)ith * c->embd_row_bytes;
        const int read = m->embd_release && li_embd_read_row(m, row, emb_row, copy);
        li_K->dequant[emb->type](read ? copy : row, x, E);
        if (m->embd_release && !read) li_release_row(emb->data, emb->nbytes, row, emb_row);
        if (c->lora_any) li_lora_embed(c, b->token[t], t, x); /* before the scale, as llama.cpp */
        if (m->embd_scale != 1.0f) li_K->scale_f32(x, m->embd_scale, E);
    }
    if (embed && m->n_embd_pe > 0) pe_inputs(c, b, n, ith, nth, lo, hi);
    if (c->probe && embed) probe_team(c, c->x, n, E, LI_PROBE_EMBED, 0);
    if (own_rows(c, n, nth) && l1 > l0) { /* each thread's own copy of the row (thread 0's is x) */
        li_share_sync(c->share);
        if (ith > 0) memcpy(own_of(c, ith).x, c->x, (size_t)E * sizeof(float));
    }

    /* the embedding rows and each half's first and last steps are split the
     * same way, so consecutive steps need no barrier between them */
    for (int il = l0; il < l1; il++) {
        const li_layer_desc *Ly = &m->layers[il];
        switch (Ly->mixer) {
        case LI_MIX_ATTN: attention_half(c, Ly, il, n, ith, nth); break;
        case LI_MIX_GDN: gdn_half(c, Ly, il, n, ith, nth); break;
        case LI_MIX_SHORTCONV: shortconv_half(c, Ly, il, n, ith, nth); break;
        case LI_MIX_MAMBA2: mamba2_half(c, Ly, il, n, ith, nth); break;
        default: break; /* LI_MIX_NONE (li_model_check refuses the others) */
        }
        if (c->probe) probe_team(c, c->x, n, E, LI_PROBE_ATTN, il);
        if (Ly->router.data)
            moe_half(c, Ly, n, ith, nth);
        else if (Ly->w_up.data)
            ffn_half(c, Ly, n, ith, nth);
        if (m->n_embd_pe > 0 || Ly->out_scale != 0.0f) layer_end(c, Ly, il, n, ith, nth);
        if (il < m->n_deepstack && b->embd) deepstack_add(c, b, il, n, ith, nth);
        if (c->probe) probe_team(c, c->x, n, E, LI_PROBE_FFN, il);
    }
    if (!head) return;
    li_share_sync(c->share);

    /* logits for the rows asked for; their normed inputs go to xb from row 0 */
    li_split(n_out, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        li_K->rms_norm(c->x + (int64_t)c->out_rows[i] * E, m->output_norm, c->xb + i * E, E, m->norm_eps);
    if (c->probe) probe_team(c, c->xb, n_out, E, LI_PROBE_OUTPUT_NORM, 0);
    if (c->hidden_out) { /* embeddings: the normed rows themselves */
        if (hi > lo) memcpy(logits + lo * E, c->xb + lo * E, (size_t)(hi - lo) * (size_t)E * sizeof(float));
        return;
    }
    const li_matrix *out[1] = {&m->output};
    quantize_rows_for(c, c->xb, E, lo, hi, out, 1);
    const product head_p = {&m->output, acts_for(c, &m->output), n_out, logits, m->n_vocab};
    sync_before(c, &head_p, 1, ith, nth);
    const li_lora_proj head_l = {0, -1, &m->output, c->xb, E, logits, m->n_vocab, 0, c->out_rows};
    const int lora_h = li_lora_covers(c, &head_l, 1);
    if (lora_h) li_lora_down(c, &head_l, 1, n_out, ith, nth);
    matmuls(c, &head_p, 1, ith, nth);
    if (lora_h) {
        li_share_sync(c->share);
        li_lora_up(c, &head_l, 1, n_out, ith, nth);
    }
    const int64_t V = m->n_vocab;
    if (m->logit_scale != 1.0f || m->final_softcap != 0.0f) {
        li_share_sync(c->share);
        /* granite's logit scale, gemma2's final soft-cap */
        li_split(n_out * V, ith, nth, &lo, &hi);
        li_K->softcap_f32(logits + lo, hi - lo, m->logit_scale, m->final_softcap);
    }
    if (c->probe) probe_team(c, logits, n_out, V, LI_PROBE_LOGITS, 0);

    /* each row's least and greatest logit, in nth pieces per row, for the
     * caller's check of the logits (li_context_logit_range): the team reads
     * them while they are in its caches, where the caller's own passes over
     * a large vocabulary's row found them cold (Gemma 3's 262144 logits: two
     * numpy reductions took ~150 us of a token, the other core idle) */
    li_share_sync(c->share);
    li_split(n_out * nth, ith, nth, &lo, &hi);
    for (int64_t p = lo; p < hi; p++) {
        int64_t a, z;
        li_split(V, (int)(p % nth), nth, &a, &z);
        float *r = c->logit_part + 2 * p;
        if (z > a) {
            li_K->range_f32(logits + (p / nth) * V + a, z - a, &r[0], &r[1]);
        } else {
            r[0] = INFINITY;
            r[1] = -INFINITY;
        }
    }
    if (ith == 0) {
        c->range_rows = n_out;
        c->range_pieces = nth;
    }
}

int li_context_logit_range(const li_context *c, float *lo_hi, int64_t n) {
    if (!c || (!lo_hi && n > 0)) return li_fail(LI_E_ARG, "no context or no output");
    if (c->range_rows != n) return 0;
    for (int64_t i = 0; i < n; i++) {
        const float *r = c->logit_part + 2 * i * c->range_pieces;
        float a = r[0], b = r[1];
        for (int p = 1; p < c->range_pieces; p++) {
            const float pa = r[2 * p], pb = r[2 * p + 1];
            a = pa != pa || a != a ? NAN : LI_MIN(a, pa);
            b = pb != pb || b != b ? NAN : LI_MAX(b, pb);
        }
        lo_hi[2 * i] = a;
        lo_hi[2 * i + 1] = b;
    }
    return 1;
}

int li_context_set_hidden_output(li_context *c, int on) {
    if (!c) return li_fail(LI_E_ARG, "no context");
    c->hidden_out = on != 0;
    return LI_OK;
}

int li_context_set_tuning(li_context *c, const li_tuning *t) {
    if (!c || !t) return li_fail(LI_E_ARG, "no context or no tuning");
    if (t->stream_hint < 0 || t->stream_hint >= LI_STREAM_COUNT)
        return li_fail(LI_E_ARG, "prefetch kind %d is not one of 0 to %d", t->stream_hint, LI_STREAM_COUNT - 1);
    if (t->placement < 0 || t->placement >= LI_PLACEMENT_COUNT)
        return li_fail(LI_E_ARG, "placement %d is not one of 0 to %d", t->placement, LI_PLACEMENT_COUNT - 1);
    c->tuning = *t;
    return LI_OK;
}

int li_context_get_tuning(const li_context *c, li_tuning *out, int *near) {
    if (!c || !out) return li_fail(LI_E_ARG, "no context or no result");
    *out = c->tuning;
    if (near) *near = c->tuning.placement == LI_PLACEMENT_PROBE ? c->near : c->tuning.placement == LI_PLACEMENT_NEAR;
    return LI_OK;
}

int li_context_set_causal(li_context *c, int mode) {
    if (!c) return li_fail(LI_E_ARG, "no context");
    switch (mode) {
    case LI_ATTN_CAUSAL: c->non_causal = LI_OPEN_NONE; return LI_OK;
    case LI_ATTN_NON_CAUSAL: c->non_causal = LI_OPEN_ALL; return LI_OK;
    case LI_ATTN_NON_CAUSAL_SWA: c->non_causal = LI_OPEN_SWA; return LI_OK;
    default: return li_fail(LI_E_ARG, "attention mode %d is not one of %d (non-causal), %d (causal) or %d "
                            "(non-causal in the sliding-window layers)", mode, LI_ATTN_NON_CAUSAL, LI_ATTN_CAUSAL,
                            LI_ATTN_NON_CAUSAL_SWA);
    }
}

/* Check a batch against its views and fill the per-batch fields: each token's
 * pool rows, its spans, and the rows whose logits are returned. */
/* The batch's rows grouped by sequence (seq_rows, seq_off), and, in a model
 * with recurrent layers, each sequence's state slot checked: in the pool,
 * and no two sequences of the batch on one slot. */
static int group_rows(li_context *c, const li_batch *b, const li_seq_view *views, int n_views) {
    if (n_views < 0) return li_fail(LI_E_ARG, "%d views", n_views);
    if (n_views + 1 > c->seq_cap) {
        int32_t *off = realloc(c->seq_off, ((size_t)n_views + 1) * sizeof(int32_t));
        if (!off) return li_fail(LI_E_NOMEM, "no memory for a batch of %d sequences", n_views);
        c->seq_off = off;
        c->seq_cap = n_views + 1;
    }
    memset(c->seq_off, 0, ((size_t)n_views + 1) * sizeof(int32_t));
    for (int t = 0; t < b->n; t++) {
        const int s = b->seq[t];
        if (s < 0 || s >= n_views)
            return li_fail(LI_E_ARG, "batch row %d: sequence index %d, but %d views were given", t, s, n_views);
        c->seq_off[s + 1]++;
    }
    for (int s = 0; s < n_views; s++) c->seq_off[s + 1] += c->seq_off[s];
    for (int t = 0; t < b->n; t++) c->seq_rows[c->seq_off[b->seq[t]]++] = t; /* seq_off[s] moves to s's end */
    for (int s = n_views; s > 0; s--) c->seq_off[s] = c->seq_off[s - 1];
    c->seq_off[0] = 0;
    c->n_seqs = n_views;
    if (c->slot_floats == 0) return LI_OK;
    int st = LI_OK;
    for (int s = 0; s < n_views && st == LI_OK; s++) {
        if (c->seq_off[s + 1] == c->seq_off[s]) continue;
        const int slot = views[s].state_slot;
        if (slot < 0 || slot >= c->kv.n_state_slots)
            st = li_fail(LI_E_KV, "sequence %d: state slot %d is outside the pool of %d slots", s, slot,
                         c->kv.n_state_slots);
        else if (c->slot_mark[slot])
            st = li_fail(LI_E_KV, "two sequences of one batch hold state slot %d", slot);
        else
            c->slot_mark[slot] = 1;
    }
    for (int s = 0; s < n_views; s++) /* unmark what was marked */
        if (c->seq_off[s + 1] > c->seq_off[s] && views[s].state_slot >= 0 && views[s].state_slot < c->kv.n_state_slots)
            c->slot_mark[views[s].state_slot] = 0;
    return st;
}

static int prepare_batch(li_context *c, const li_batch *b, const li_seq_view *views, int n_views, int64_t *n_out) {
    const li_model_desc *m = c->m;
    const int bs = c->kv.block_size;
    int used[LI_KV_GROUPS] = {0, 0};
    for (int il = 0; il < m->n_layer; il++)
        if (c->group[il] < LI_KV_GROUPS) used[c->group[il]] = 1;
    /* a layer of each group, for its window */
    const li_layer_desc *rep[LI_KV_GROUPS] = {NULL, NULL};
    for (int il = 0; il < m->n_layer; il++)
        if (c->group[il] < LI_KV_GROUPS &&
            (!rep[c->group[il]] || m->layers[il].sliding_window > rep[c->group[il]]->sliding_window))
            rep[c->group[il]] = &m->layers[il];
    CHECK(group_rows(c, b, views, n_views));
    CHECK(li_lora_prepare(c, b, views, n_views));
    /* the last position each row sees: its own, or its sequence's last in the batch */
    for (int s = 0; s < n_views; s++) {
        int last = -1;
        for (int i = c->seq_off[s]; i < c->seq_off[s + 1]; i++) last = LI_MAX(last, b->pos[c->seq_rows[i]]);
        for (int i = c->seq_off[s]; i < c->seq_off[s + 1]; i++) {
            const int t = c->seq_rows[i];
            c->vis[t] = c->non_causal ? last : b->pos[t];
        }
    }
    int max_spans = 0;
    *n_out = 0;
    for (int t = 0; t < b->n; t++) {
        if (b->token && (b->token[t] < 0 || b->token[t] >= m->n_vocab))
            return li_fail(LI_E_TOKEN, "batch row %d: token id %d is outside the vocabulary [0, %d)", t, b->token[t],
                           m->n_vocab);
        const int s = b->seq[t], pos = b->pos[t];
        if (s < 0 || s >= n_views)
            return li_fail(LI_E_ARG, "batch row %d: sequence index %d, but %d views were given", t, s, n_views);
        if (pos < 0) return li_fail(LI_E_CONTEXT, "batch row %d: negative position %d", t, pos);
        if (b->rope_pos)
            for (int j = 0; j < 4; j++)
                if (b->rope_pos[t * 4 + j] < 0 || b->rope_pos[t * 4 + j] >= (1 << 24))
                    return li_fail(LI_E_ARG, "batch row %d: rope position %d of section %d is outside [0, 2^24)", t,
                                   b->rope_pos[t * 4 + j], j);
        c->pos[t] = pos;
        for (int g = 0; g < LI_KV_GROUPS; g++) {
            c->n_spans[t * 2 + g] = 0;
            c->kv_row[g][t] = 0;
            if (!used[g]) continue;
            const li_seq_view *v = &views[s];
            const int nb = v->n_blocks[g], pool = c->kv.n_blocks[g];
            if (nb < 0 || (nb > 0 && !v->blocks[g]))
                return li_fail(LI_E_ARG, "sequence %d: group %d's table is missing", s, g);
            if (pos / bs >= nb)
                return li_fail(LI_E_KV, "batch row %d: position %d is beyond sequence %d's %d blocks of %d "
                               "(group %d)", t, pos, s, nb, bs, g);
            const int32_t own = v->blocks[g][pos / bs];
            if (own < 0 || own >= pool)
                return li_fail(LI_E_KV, "batch row %d: position %d's block %d is not in the pool of %d blocks "
                               "(group %d)", t, pos, own, pool, g);
            c->kv_row[g][t] = own * bs + pos % bs;
            const int first = li_first_visible(rep[g], pos), end = li_last_visible(c, rep[g], t);
            if (end / bs >= nb)
                return li_fail(LI_E_KV, "batch row %d: position %d is beyond sequence %d's %d blocks of %d "
                               "(group %d)", t, end, s, nb, bs, g);
            for (int blk = first / bs; blk < end / bs; blk++) {
                const int32_t id = v->blocks[g][blk];
                if (id < -1 || id >= pool)
                    return li_fail(LI_E_KV, "sequence %d: table entry %d is block %d, outside the pool of %d "
                                   "(group %d)", s, blk, id, pool, g);
            }
            c->n_spans[t * 2 + g] = li_count_spans(c, rep[g], v->blocks[g], nb, pos, end);
            if (c->n_spans[t * 2 + g] > c->max_chunks)
                return li_fail(LI_E_KV, "sequence %d: its table reaches more spans (%d) than the pools hold", s,
                               c->n_spans[t * 2 + g]);
            /* split mode indexes every span of the range, empty or not */
            max_spans = LI_MAX(max_spans, end / c->span - first / c->span + 1);
        }
        if (b->logits ? b->logits[t] != 0 : t == b->n - 1) c->out_rows[(*n_out)++] = t;
    }
    c->split = b->n <= LI_ATTN_SPLIT_TOKENS && max_spans <= c->max_chunks;
    return LI_OK;
}

/* Attention tiles (attention.c): each run of consecutive rows of one
 * sequence at consecutive positions is cut into near-equal tiles of at most
 * tile_max tokens, and into enough of them that the team has an item
 * (tile, kv head) each. A token's result does not depend on its tile, so
 * this only decides how the work is shared. */
static void make_tiles(li_context *c, const li_batch *b, int nt) {
    const int need = (nt + c->m->n_head_kv - 1) / c->m->n_head_kv; /* tiles for one item per thread */
    c->n_tiles = 0;
    for (int t0 = 0; t0 < b->n;) {
        int t1 = t0 + 1;
        while (t1 < b->n && b->seq[t1] == b->seq[t0] && c->pos[t1] == c->pos[t1 - 1] + 1) t1++;
        const int len = t1 - t0;
        const int k = LI_MIN(len, LI_MAX((len + c->tile_max - 1) / c->tile_max, need));
        for (int i = 0; i < k; i++) c->tile0[c->n_tiles++] = t0 + (int)((int64_t)len * i / k);
        t0 = t1;
    }
    c->tile0[c->n_tiles] = b->n;
}

/* A pass with layers [0, be_layers) on the backend: embed on the CPU, the
 * backend's layers (and maybe the head), then the CPU's layers and head. */
static int offload_pass(li_context *c, const li_batch *b, const li_seq_view *views, int n_views, int64_t n_out,
                        float *logits, size_t logits_size, int nt) {
    const li_model_desc *m = c->m;
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    forward_team(c, b, n_out, logits, 1, 0, 0, 0);
    li_range_batch rb;
    rb.n = b->n;
    rb.pos = c->pos;
    rb.seq = b->seq;
    for (int g = 0; g < LI_KV_GROUPS; g++) rb.kv_row[g] = c->kv_row[g];
    rb.views = views;
    rb.n_views = n_views;
    rb.rope_cs = c->rope_cs;
    rb.rope_stride = c->n_batch;
    rb.layer_rope = c->layer_rope;
    rb.n_out = (int)n_out;
    rb.out_rows = c->out_rows;
    char err[400] = "";
    const int st = c->be_ops->run(c->be, &rb, c->x, c->be_output ? logits : NULL, c->be_output ? logits_size : 0,
                                  err, sizeof(err));
    if (st != LI_OK) return li_fail(st, "%s backend: %s", c->be_ops->name, err);
    if (c->probe) { /* the backend's layers as a whole: it has no probe of its own */
        const int64_t bad = c->be_output ? first_bad_row(logits, 0, n_out, m->n_vocab)
                                         : first_bad_row(c->x, 0, b->n, m->n_embd);
        if (bad >= 0) probe_note(c, LI_PROBE_BACKEND, c->be_layers, bad);
    }
    if (c->be_output) return LI_OK;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    forward_team(c, b, n_out, logits, 0, c->be_layers, m->n_layer, 1);
    return LI_OK;
}

int li_context_decode(li_context *c, const li_batch *b, const li_seq_view *views, int n_views, float *logits,
                      size_t logits_size, int n_threads) {
    li_fail(LI_OK, "%s", "");
    if (!c || !b || !views || (!b->token && !b->embd) || !b->pos || !b->seq)
        return li_fail(LI_E_ARG, "a batch needs tokens (or embeddings), positions, sequences and views");
    c->range_rows = -1; /* until this pass's head leaves its figures */
    const li_model_desc *m = c->m;
    if (b->n <= 0 || b->n > c->n_batch)
        return li_fail(LI_E_ARG, "a batch of %d tokens; this context takes 1 to %d", b->n, c->n_batch);
    if (b->rope_pos && !(m->rope_sect_t + m->rope_sect_h + m->rope_sect_w + m->rope_sect_e))
        return li_fail(LI_E_ARG, "a batch with rope positions, for a model without rope sections");
    int64_t n_out = 0;
    if (b->embd && m->n_deepstack > 0 && c->be_layers > 0)
        return li_fail(LI_E_ARG, "DeepStack input rows run on the CPU only, and this context offloads %d layers",
                       c->be_layers);
    if (c->non_causal && c->be_layers > 0)
        return li_fail(LI_E_ARG, "non-causal attention runs on the CPU only, and this context offloads %d layers",
                       c->be_layers);
    CHECK(prepare_batch(c, b, views, n_views, &n_out));
    if (n_out > 0 && !logits) return li_fail(LI_E_ARG, "no logits buffer for %lld rows", (long long)n_out);
    const int width = c->hidden_out ? m->n_embd : m->n_vocab;
    if (logits_size < (size_t)n_out * (size_t)width)
        return li_fail(LI_E_SHAPE, "the logits buffer holds %zu floats, %lld rows of %d need more", logits_size,
                       (long long)n_out, width);
    const int nt = n_threads <= 0 ? 1 : LI_MIN(n_threads, c->max_threads);
    c->views = views;
    c->seq = b->seq;
    c->probe_order = INT_MAX;
    /* with few tokens, each thread's share of a span split is decided only by
     * the number of threads, never what is computed */
    if (c->split && (int64_t)b->n * m->n_head_kv >= 2 * nt) c->split = 0;
    if (!c->split) make_tiles(c, b, nt);
    for (int r = 0; r < c->n_rope; r++)
        li_rope_cache(c->pos, b->rope_pos, b->n, c->rope_n_rot[r], &c->rope[r],
                      c->rope_cs + (size_t)r * (size_t)c->n_batch * (size_t)c->n_rot_max);
    (void)nt;
    if (!c->be) {
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
        forward_team(c, b, n_out, logits, 1, 0, m->n_layer, 1);
    } else {
        const int st = offload_pass(c, b, views, n_views, n_out, logits, logits_size, nt);
        if (st != LI_OK) {
            c->views = NULL;
            c->seq = NULL;
            return st;
        }
    }
    c->views = NULL;
    c->seq = NULL;
    return LI_OK;
}
