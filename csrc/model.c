/* model.c: the forward pass of a decoder-only transformer (Llama, Qwen2,
 * Gemma 3 and their kin), the KV cache, and the scratch it runs in.
 *
 * The Python layer describes a model (li_model_desc: shapes, options, and
 * pointers to weights in the memory-mapped file) and asks for batches of
 * tokens to be run. One call runs the whole batch through every layer inside
 * a single OpenMP parallel region: each step is split among the team and
 * steps are separated by barriers, so nothing is forked, joined or allocated
 * per token, and the GIL is not needed.
 *
 * Per layer, for a batch of n tokens (x is the residual stream [n, n_embd]):
 *   xb = rmsnorm(x) * attn_norm            -> quantized for wq/wk/wv
 *   q, k, v = xb Wq^T, xb Wk^T, xb Wv^T    (+ biases; per-head q/k norms; RoPE)
 *   k, v appended to the cache; att = softmax(q k^T * scale) v per head
 *   o = att Wo^T (rmsnorm * post_attn_norm); x += o
 *   xb = rmsnorm(x) * ffn_norm             -> quantized for gate/up
 *   h = act(xb Wg^T) * (xb Wu^T)           -> quantized for down
 *   o = h Wd^T (rmsnorm * post_ffn_norm);  x += o
 * then logits = (rmsnorm(x) * output_norm) Wout^T for the rows asked for.
 *
 * KV cache: per layer K and V of [n_slots, n_head_kv * head_dim] in F16 (or
 * F32). Position p lives in slot p % n_slots. Full-attention layers have
 * n_slots = n_ctx; sliding-window layers keep a ring of window + n_batch
 * slots, enough for every query of a batch to see its whole window.
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c11 */
#include <math.h>
#include <stdlib.h>
#if defined(_WIN32)
#include <malloc.h> /* _aligned_malloc */
#endif

#include "common.h"
#include "kernels/kernels.h"
#include "matmul.h"

#define MAX_ROPE_TABLES 4
#define MAX_ATTN_CHUNKS 32 /* a decoded token's visible positions split at most this many ways */
#define MIN_ATTN_CHUNK 32  /* positions: below this a chunk is not worth a thread */

struct li_context {
    const li_model_desc *m;
    int n_ctx, n_batch, kv_type, max_threads;
    int *n_slots;          /* [n_layer] */
    void **k_cache;        /* [n_layer] -> [n_slots, n_head_kv * head_dim] */
    void **v_cache;        /* [n_layer] -> [n_slots, n_head_kv * head_dim_v] */
    size_t kv_elt;         /* bytes per cached value */

    /* scratch for one batch */
    float *x;              /* [n_batch, n_embd] residual stream */
    float *xb;             /* [n_batch, n_embd] normed input of a projection */
    float *q;              /* [n_batch, n_head * head_dim] */
    float *k;              /* [n_batch, n_head_kv * head_dim] */
    float *v;              /* [n_batch, n_head_kv * head_dim_v] */
    float *att;            /* [n_batch, n_head * head_dim_v] */
    float *o;              /* [n_batch, n_embd] */
    float *g, *u;          /* [n_batch, n_ff] */
    void *xq[LI_ACT_COUNT];/* quantized activations, one buffer per format, rows of the widest input */
    size_t xq_row[LI_ACT_COUNT];
    float *scores;         /* [max_threads, heads per kv head, n_ctx] attention weights */
    float *attn_part;      /* [n_head, MAX_ATTN_CHUNKS, 2 + head_dim_v] a decoded token's chunk results */
    char *gemm_scratch;    /* [max_threads] regions of gemm_bytes for prefill panels */
    size_t gemm_bytes;
    int32_t *pos;          /* [n_batch] */

    /* RoPE: one frequency table per distinct (base, scale), and per batch a cos/sin table */
    int n_rope;
    li_rope_params rope[MAX_ROPE_TABLES];
    float *rope_cs;        /* [n_rope, n_batch, n_rot] */
    int *layer_rope;       /* [n_layer] -> table */
};

/* ---- memory ---- */

static void *alloc_aligned(size_t size) {
    if (size == 0) size = 64;
    size = (size + 63) / 64 * 64;
#if defined(_WIN32)
    return _aligned_malloc(size, 64);
#else
    void *p = NULL;
    return posix_memalign(&p, 64, size) == 0 ? p : NULL;
#endif
}

static void free_aligned(void *p) {
#if defined(_WIN32)
    _aligned_free(p);
#else
    free(p);
#endif
}

/* ---- checking a description ---- */

static int check_matrix(const li_matrix *w, int64_t rows, int64_t k) {
    if (!w->data) return LI_E_ARG;
    if (li_type_sizes(w->type, NULL, NULL) != LI_OK) return LI_E_TYPE;
    if (w->rows != rows || w->k != k) return LI_E_SHAPE;
    const size_t row = li_row_bytes(w->type, k);
    if (row == 0 || w->nbytes != row * (size_t)rows) return LI_E_SHAPE;
    if (k % li_act_block_size(li_types[w->type].act_type) != 0) return LI_E_SHAPE;
    return LI_OK;
}

#define CHECK(expr)                  \
    do {                             \
        const int st_ = (expr);      \
        if (st_ != LI_OK) return st_; \
    } while (0)

int li_model_check(const li_model_desc *m) {
    if (!m || !m->layers) return LI_E_ARG;
    if (m->n_vocab <= 0 || m->n_embd <= 0 || m->n_layer <= 0 || m->n_head <= 0 ||
        m->n_head_kv <= 0 || m->head_dim <= 0 || m->head_dim_v <= 0 || m->n_ff <= 0)
        return LI_E_SHAPE;
    if (m->n_head % m->n_head_kv != 0 || m->n_head / m->n_head_kv > 64) return LI_E_SHAPE;
    if (m->n_rot <= 0 || m->n_rot % 2 != 0 || m->n_rot > m->head_dim) return LI_E_SHAPE;
    if (m->rope_mode != LI_ROPE_NORM && m->rope_mode != LI_ROPE_NEOX) return LI_E_ARG;
    if (m->act != LI_ACT_SILU && m->act != LI_ACT_GELU) return LI_E_ARG;
    if (!(m->norm_eps >= 0.0f) || !(m->attn_scale > 0.0f) || !(m->embd_scale > 0.0f)) return LI_E_ARG;
    if (!m->output_norm) return LI_E_ARG;
    CHECK(check_matrix(&m->tok_embd, m->n_vocab, m->n_embd));
    CHECK(check_matrix(&m->output, m->n_vocab, m->n_embd));
    const int64_t nq = (int64_t)m->n_head * m->head_dim, nk = (int64_t)m->n_head_kv * m->head_dim;
    const int64_t nv = (int64_t)m->n_head_kv * m->head_dim_v, na = (int64_t)m->n_head * m->head_dim_v;
    for (int il = 0; il < m->n_layer; il++) {
        const li_layer_desc *L = &m->layers[il];
        if (!L->attn_norm || !L->ffn_norm) return LI_E_ARG;
        CHECK(check_matrix(&L->wq, nq, m->n_embd));
        CHECK(check_matrix(&L->wk, nk, m->n_embd));
        CHECK(check_matrix(&L->wv, nv, m->n_embd));
        CHECK(check_matrix(&L->wo, m->n_embd, na));
        CHECK(check_matrix(&L->w_gate, m->n_ff, m->n_embd));
        CHECK(check_matrix(&L->w_up, m->n_ff, m->n_embd));
        CHECK(check_matrix(&L->w_down, m->n_embd, m->n_ff));
        if (!(L->rope_base > 0.0f) || !(L->rope_scale > 0.0f) || L->sliding_window < 0)
            return LI_E_ARG;
    }
    return LI_OK;
}

/* ---- context ---- */

void li_context_free(li_context *c) {
    if (!c) return;
    if (c->k_cache)
        for (int il = 0; il < c->m->n_layer; il++) {
            free_aligned(c->k_cache[il]);
            free_aligned(c->v_cache[il]);
        }
    free(c->k_cache);
    free(c->v_cache);
    free(c->n_slots);
    free_aligned(c->x);
    free_aligned(c->xb);
    free_aligned(c->q);
    free_aligned(c->k);
    free_aligned(c->v);
    free_aligned(c->att);
    free_aligned(c->o);
    free_aligned(c->g);
    free_aligned(c->u);
    for (int a = 0; a < LI_ACT_COUNT; a++) free_aligned(c->xq[a]);
    free_aligned(c->scores);
    free_aligned(c->attn_part);
    free_aligned(c->gemm_scratch);
    free(c->pos);
    free_aligned(c->rope_cs);
    free(c->layer_rope);
    free(c);
}

/* note which activation formats the model's projections need, how wide, and
 * how much prefill scratch each thread needs */
static void need_act(li_context *c, const li_matrix *w) {
    const int a = li_types[w->type].act_type;
    const size_t row = li_act_row_bytes(a, w->k);
    if (row > c->xq_row[a]) c->xq_row[a] = row;
    const size_t g = li_gemm_scratch_bytes(w->type, w->k, c->n_batch);
    if (g > c->gemm_bytes) c->gemm_bytes = (g + 63) / 64 * 64;
}

int li_context_create(const li_model_desc *m, int n_ctx, int n_batch, int kv_type, int max_threads,
                      int swa_full, li_context **out) {
    li_init();
    if (!out) return LI_E_ARG;
    *out = NULL;
    CHECK(li_model_check(m));
    if (n_ctx <= 0 || n_batch <= 0 || max_threads <= 0) return LI_E_ARG;
    if (kv_type != LI_KV_F16 && kv_type != LI_KV_F32) return LI_E_ARG;
    if (n_batch > n_ctx) n_batch = n_ctx;

    li_context *c = calloc(1, sizeof(*c));
    if (!c) return LI_E_NOMEM;
    c->m = m;
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    c->kv_type = kv_type;
    c->max_threads = max_threads;
    c->kv_elt = kv_type == LI_KV_F16 ? 2 : 4;

    const int L = m->n_layer;
    const size_t nb = (size_t)n_batch;
    c->n_slots = calloc((size_t)L, sizeof(int));
    c->k_cache = calloc((size_t)L, sizeof(void *));
    c->v_cache = calloc((size_t)L, sizeof(void *));
    c->layer_rope = calloc((size_t)L, sizeof(int));
    float rope_keys[MAX_ROPE_TABLES][2];
    if (!c->n_slots || !c->k_cache || !c->v_cache || !c->layer_rope) goto nomem;

    for (int il = 0; il < L; il++) {
        const li_layer_desc *ly = &m->layers[il];
        const int w = ly->sliding_window;
        /* pages are only touched as positions are used, so resident memory grows with the text */
        c->n_slots[il] = (w > 0 && !swa_full) ? LI_MIN(n_ctx, w + n_batch) : n_ctx;
        const size_t slots = (size_t)c->n_slots[il];
        c->k_cache[il] = alloc_aligned(slots * (size_t)m->n_head_kv * (size_t)m->head_dim * c->kv_elt);
        c->v_cache[il] = alloc_aligned(slots * (size_t)m->n_head_kv * (size_t)m->head_dim_v * c->kv_elt);
        if (!c->k_cache[il] || !c->v_cache[il]) goto nomem;

        int t = 0;
        while (t < c->n_rope && !(rope_keys[t][0] == ly->rope_base && rope_keys[t][1] == ly->rope_scale)) t++;
        if (t == c->n_rope) {
            if (t == MAX_ROPE_TABLES) {
                li_context_free(c);
                return LI_E_ARG; /* more distinct RoPE settings than any model uses */
            }
            rope_keys[t][0] = ly->rope_base;
            rope_keys[t][1] = ly->rope_scale;
            li_rope_params_init(&c->rope[t], m->n_rot, ly->rope_base, ly->rope_scale, m->rope_factors);
            c->n_rope++;
        }
        c->layer_rope[il] = t;

        need_act(c, &ly->wq);
        need_act(c, &ly->wk);
        need_act(c, &ly->wv);
        need_act(c, &ly->wo);
        need_act(c, &ly->w_gate);
        need_act(c, &ly->w_up);
        need_act(c, &ly->w_down);
    }
    need_act(c, &m->output);

    c->x = alloc_aligned(nb * (size_t)m->n_embd * sizeof(float));
    c->xb = alloc_aligned(nb * (size_t)m->n_embd * sizeof(float));
    c->q = alloc_aligned(nb * (size_t)m->n_head * (size_t)m->head_dim * sizeof(float));
    c->k = alloc_aligned(nb * (size_t)m->n_head_kv * (size_t)m->head_dim * sizeof(float));
    c->v = alloc_aligned(nb * (size_t)m->n_head_kv * (size_t)m->head_dim_v * sizeof(float));
    c->att = alloc_aligned(nb * (size_t)m->n_head * (size_t)m->head_dim_v * sizeof(float));
    c->o = alloc_aligned(nb * (size_t)m->n_embd * sizeof(float));
    c->g = alloc_aligned(nb * (size_t)m->n_ff * sizeof(float));
    c->u = alloc_aligned(nb * (size_t)m->n_ff * sizeof(float));
    c->scores = alloc_aligned((size_t)max_threads * (size_t)(m->n_head / m->n_head_kv) * (size_t)n_ctx *
                              sizeof(float));
    c->attn_part = alloc_aligned((size_t)m->n_head * MAX_ATTN_CHUNKS * (size_t)(m->head_dim_v + 2) * sizeof(float));
    c->gemm_scratch = alloc_aligned((size_t)max_threads * LI_MAX(c->gemm_bytes, 64));
    c->pos = malloc(nb * sizeof(int32_t));
    c->rope_cs = alloc_aligned((size_t)c->n_rope * nb * (size_t)m->n_rot * sizeof(float));
    if (!c->x || !c->xb || !c->q || !c->k || !c->v || !c->att || !c->o || !c->g || !c->u ||
        !c->scores || !c->attn_part || !c->gemm_scratch || !c->pos || !c->rope_cs)
        goto nomem;
    for (int a = 0; a < LI_ACT_COUNT; a++) {
        if (c->xq_row[a] == 0) continue;
        c->xq[a] = alloc_aligned(nb * c->xq_row[a]);
        if (!c->xq[a]) goto nomem;
    }
    *out = c;
    return LI_OK;
nomem:
    li_context_free(c);
    return LI_E_NOMEM;
}

size_t li_context_kv_bytes(const li_context *c, int il) {
    if (!c || il < 0 || il >= c->m->n_layer) return 0;
    const li_model_desc *m = c->m;
    return (size_t)c->n_slots[il] * (size_t)m->n_head_kv * (size_t)(m->head_dim + m->head_dim_v) *
           c->kv_elt;
}

/* ---- forward steps (each called by every thread with its ith of nth) ---- */

/* xq in the activation formats of the given weights, from rows [lo, hi) of
 * src; rows are packed (stride li_act_row_bytes(a, k)), as li_matmul_q reads them */
static void quantize_rows_for(li_context *c, const float *src, int64_t k, int64_t lo, int64_t hi,
                              const li_matrix *const *ws, int nw) {
    int done = 0; /* bit set of formats already written */
    for (int i = 0; i < nw; i++) {
        const int a = li_types[ws[i]->type].act_type;
        if (done & (1 << a)) continue;
        done |= 1 << a;
        const size_t row = li_act_row_bytes(a, k);
        for (int64_t t = lo; t < hi; t++) li_K->quant_act[a](src + t * k, (char *)c->xq[a] + (size_t)t * row, k);
    }
}

static void matmul(li_context *c, const li_matrix *w, int64_t n, float *y, int64_t y_stride, int ith,
                   int nth) {
    const li_weight wt = {w->data, w->type, w->rows, w->k, w->nbytes / (size_t)w->rows};
    const void *xq = c->xq[li_types[w->type].act_type];
    if (li_gemm_applies(w->type, n))
        li_gemm_q(&wt, xq, n, y, y_stride, c->gemm_scratch + (size_t)ith * c->gemm_bytes, ith, nth);
    else
        li_matmul_q(&wt, xq, n, y, y_stride, ith, nth);
}

/* h = act(g) * u over [n, k], then quantized for w; split by activation
 * blocks so a single token's row is shared by the whole team */
static void gated_quantize(li_context *c, float *src, const float *up, int64_t n, int64_t k,
                           const li_matrix *w, int act, int ith, int nth) {
    const int a = li_types[w->type].act_type;
    const int64_t bs = li_act_block_size(a), per_row = k / bs;
    const size_t blk = li_act_row_bytes(a, bs), row = li_act_row_bytes(a, k);
    int64_t lo, hi;
    li_split(n * per_row, ith, nth, &lo, &hi);
    for (int64_t b = lo; b < hi; b++) {
        const int64_t t = b / per_row, j = (b % per_row) * bs;
        float *x = src + t * k + j;
        if (up) li_K->act_apply(act, x, up + t * k + j, x, bs);
        li_K->quant_act[a](x, (char *)c->xq[a] + (size_t)t * row + (size_t)(b % per_row) * blk, bs);
    }
}

static void norm_row(const float *x, const float *w, float *y, int64_t k, float eps) {
    li_K->rms_norm(x, w, y, k, eps);
}

/* With an F16 cache, queries and attention weights are rounded to float16
 * too, as llama.cpp does (its K.Q and V.softmax products take both operands
 * in F16). The error is far below that of the 8-bit activations, and keeping
 * the same roundings keeps our logits within reach of llama.cpp's. */
static void round_to_f16(float *x, int64_t n) {
    uint16_t tmp[256];
    for (int64_t i = 0; i < n; i += 256) {
        const int64_t m = LI_MIN(256, n - i);
        li_K->f32_to_f16(x + i, tmp, m);
        li_K->f16_to_f32(tmp, x + i, m);
    }
}

/* biases, per-head norms, RoPE and the cache write for token t, head item h
 * (h < n_head: a query head; else key/value head h - n_head) */
static void prepare_head(li_context *c, const li_layer_desc *L, int il, int64_t t, int h, int pos) {
    const li_model_desc *m = c->m;
    const int64_t hd = m->head_dim, hdv = m->head_dim_v;
    const float *cs = c->rope_cs + ((size_t)c->layer_rope[il] * (size_t)c->n_batch + (size_t)t) * (size_t)m->n_rot;
    if (h < m->n_head) {
        float *qh = c->q + (t * m->n_head + h) * hd;
        if (L->bq) li_K->add_f32(qh, L->bq + h * hd, qh, hd);
        if (L->q_norm) norm_row(qh, L->q_norm, qh, hd, m->norm_eps);
        li_rope_head(qh, cs, m->n_rot, m->rope_mode);
        if (c->kv_type == LI_KV_F16) round_to_f16(qh, hd);
        return;
    }
    h -= m->n_head;
    float *kh = c->k + (t * m->n_head_kv + h) * hd;
    float *vh = c->v + (t * m->n_head_kv + h) * hdv;
    if (L->bk) li_K->add_f32(kh, L->bk + h * hd, kh, hd);
    if (L->bv) li_K->add_f32(vh, L->bv + h * hdv, vh, hdv);
    if (L->k_norm) norm_row(kh, L->k_norm, kh, hd, m->norm_eps);
    li_rope_head(kh, cs, m->n_rot, m->rope_mode);
    const size_t slot = (size_t)(pos % c->n_slots[il]);
    const size_t koff = (slot * (size_t)m->n_head_kv + (size_t)h) * (size_t)hd;
    const size_t voff = (slot * (size_t)m->n_head_kv + (size_t)h) * (size_t)hdv;
    if (c->kv_type == LI_KV_F16) {
        li_K->f32_to_f16(kh, (uint16_t *)c->k_cache[il] + koff, hd);
        li_K->f32_to_f16(vh, (uint16_t *)c->v_cache[il] + voff, hdv);
    } else {
        memcpy((float *)c->k_cache[il] + koff, kh, (size_t)hd * sizeof(float));
        memcpy((float *)c->v_cache[il] + voff, vh, (size_t)hdv * sizeof(float));
    }
}

/* ---- attention ----
 * Work items are (token, kv head, chunk of the visible positions). All the
 * query heads of a kv head (grouped-query attention) are done together, so
 * each cached row is read and converted once for them. A prompt has enough
 * tokens to keep every thread busy with one chunk per item; a single decoded
 * token splits its positions into chunks so that the team shares them: each
 * chunk then leaves its softmax unnormalized with its max and sum, and a
 * second step combines the chunks. */


/* the visible positions [first, pos] of a token at pos in layer L */
static int first_visible(const li_layer_desc *L, int pos) {
    return L->sliding_window > 0 ? LI_MAX(0, pos - L->sliding_window + 1) : 0;
}

/* scores of the group's heads against cache slots [s0, s0 + n) into out (row ld) */
static void group_scores(li_context *c, int il, int kvh, const float *q, int nh, int64_t s0, int64_t n,
                         float *out, size_t ld) {
    const li_model_desc *m = c->m;
    const size_t stride = (size_t)m->n_head_kv * (size_t)m->head_dim;
    const size_t off = (size_t)s0 * stride + (size_t)kvh * (size_t)m->head_dim;
    if (c->kv_type == LI_KV_F16) {
        li_K->attn_scores_f16(q, (size_t)m->head_dim, nh, (const uint16_t *)c->k_cache[il] + off, stride, n,
                              m->head_dim, m->attn_scale, out, ld);
        return;
    }
    const float *k = (const float *)c->k_cache[il] + off;
    for (int h = 0; h < nh; h++)
        for (int64_t j = 0; j < n; j++)
            out[(size_t)h * ld + (size_t)j] =
                m->attn_scale * li_K->dot_f32(q + (size_t)h * (size_t)m->head_dim, k + (size_t)j * stride, m->head_dim);
}

/* out_h += p_h . values of slots [s0, s0 + n) for the group's heads */
static void group_accum(li_context *c, int il, int kvh, const float *p, size_t ld, int nh, int64_t s0,
                        int64_t n, float *out) {
    const li_model_desc *m = c->m;
    const size_t stride = (size_t)m->n_head_kv * (size_t)m->head_dim_v;
    const size_t off = (size_t)s0 * stride + (size_t)kvh * (size_t)m->head_dim_v;
    if (c->kv_type == LI_KV_F16) {
        li_K->attn_accum_f16(p, ld, nh, (const uint16_t *)c->v_cache[il] + off, stride, n, m->head_dim_v, out,
                             (size_t)m->head_dim_v);
        return;
    }
    const float *v = (const float *)c->v_cache[il] + off;
    for (int h = 0; h < nh; h++)
        for (int64_t j = 0; j < n; j++)
            li_K->axpy_f32(p[(size_t)h * ld + (size_t)j], v + (size_t)j * stride, out + (size_t)h * (size_t)m->head_dim_v,
                           m->head_dim_v);
}

/* Attention of the heads of kv head kvh for token t over positions [p0, p1).
 * With part == NULL the chunk is the whole visible range: the result is
 * normalized into att. Otherwise the unnormalized output goes to part (per
 * head: max, sum, then head_dim_v values). */
static void attend_chunk(li_context *c, int il, int64_t t, int kvh, int p0, int p1, float *scores, float *part,
                         size_t part_stride) {
    const li_model_desc *m = c->m;
    const int nh = m->n_head / m->n_head_kv;
    const int64_t n = p1 - p0, ns = c->n_slots[il];
    const int64_t s0 = p0 % ns, run1 = LI_MIN(n, ns - s0), run2 = n - run1; /* a ring wraps at most once */
    const float *q = c->q + (t * m->n_head + (int64_t)kvh * nh) * m->head_dim;
    group_scores(c, il, kvh, q, nh, s0, run1, scores, (size_t)n);
    if (run2 > 0) group_scores(c, il, kvh, q, nh, 0, run2, scores + run1, (size_t)n);
    float mx[64], sum[64]; /* heads per group: checked in li_model_check */
    for (int h = 0; h < nh; h++) {
        float *row = scores + (size_t)h * (size_t)n, best = row[0];
        for (int64_t j = 1; j < n; j++) best = LI_MAX(best, row[j]);
        mx[h] = best;
        sum[h] = li_K->exp_sum(row, n, best);
    }
    float *out = part ? part + 2 : c->att + (t * m->n_head + (int64_t)kvh * nh) * m->head_dim_v;
    const size_t out_stride = part ? part_stride : (size_t)m->head_dim_v;
    for (int h = 0; h < nh; h++) memset(out + (size_t)h * out_stride, 0, (size_t)m->head_dim_v * sizeof(float));
    if (!part) {
        /* the weights normalized first and, with an F16 cache, rounded to f16 as
         * llama.cpp's V x softmax product takes them */
        for (int h = 0; h < nh; h++) {
            float *row = scores + (size_t)h * (size_t)n;
            li_K->scale_f32(row, 1.0f / sum[h], n);
            if (c->kv_type == LI_KV_F16) round_to_f16(row, n);
        }
        group_accum(c, il, kvh, scores, (size_t)n, nh, s0, run1, out);
        if (run2 > 0) group_accum(c, il, kvh, scores + run1, (size_t)n, nh, 0, run2, out);
        return;
    }
    /* partial rows are spaced part_stride apart: accumulate head by head */
    for (int h = 0; h < nh; h++) {
        float *o = part + (size_t)h * part_stride;
        group_accum(c, il, kvh, scores + (size_t)h * (size_t)n, (size_t)n, 1, s0, run1, o + 2);
        if (run2 > 0) group_accum(c, il, kvh, scores + (size_t)h * (size_t)n + run1, (size_t)n, 1, 0, run2, o + 2);
        o[0] = mx[h];
        o[1] = sum[h];
    }
}

/* chunks of the visible range a decoded token's attention is split into */
static int attn_chunks(const li_context *c, int64_t n, int count, int nth) {
    if (n > 1 || nth <= 1) return 1;
    const int want = (4 * nth + c->m->n_head_kv - 1) / c->m->n_head_kv;
    return LI_MAX(1, LI_MIN(LI_MIN(want, MAX_ATTN_CHUNKS), count / MIN_ATTN_CHUNK));
}

static void attention(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth) {
    const li_model_desc *m = c->m;
    const int nh = m->n_head / m->n_head_kv, last = c->pos[n - 1];
    const int chunks = attn_chunks(c, n, last - first_visible(L, last) + 1, nth);
    float *scores = c->scores + (size_t)ith * (size_t)nh * (size_t)c->n_ctx;
    const size_t part_stride = (size_t)m->head_dim_v + 2;
    int64_t lo, hi;
    /* items dealt round-robin: a token's attention grows with its position,
     * so contiguous shares of a prompt would leave the first thread idle */
    const int64_t items = n * m->n_head_kv * chunks;
    for (int64_t i = ith; i < items; i += nth) {
        const int64_t t = i / ((int64_t)m->n_head_kv * chunks);
        const int kvh = (int)(i / chunks % m->n_head_kv), ch = (int)(i % chunks);
        const int pos = c->pos[t], first = first_visible(L, pos), count = pos - first + 1;
        const int p0 = first + (int)((int64_t)count * ch / chunks), p1 = first + (int)((int64_t)count * (ch + 1) / chunks);
        float *part = chunks > 1 ? c->attn_part + ((size_t)kvh * (size_t)nh * MAX_ATTN_CHUNKS + (size_t)ch) * part_stride
                                 : NULL;
        attend_chunk(c, il, t, kvh, p0, p1, scores, part, part_stride * MAX_ATTN_CHUNKS);
    }
    if (chunks == 1) return;
    LI_BARRIER();
    /* combine each head's chunks: weights exp(max_c - max) on outputs and sums */
    li_split(m->n_head, ith, nth, &lo, &hi);
    for (int64_t h = lo; h < hi; h++) {
        const float *p = c->attn_part + (size_t)h * MAX_ATTN_CHUNKS * part_stride;
        float best = p[0];
        for (int ch = 1; ch < chunks; ch++) best = LI_MAX(best, p[(size_t)ch * part_stride]);
        float *out = c->att + h * m->head_dim_v;
        memset(out, 0, (size_t)m->head_dim_v * sizeof(float));
        float total = 0.0f;
        for (int ch = 0; ch < chunks; ch++) {
            const float *q = p + (size_t)ch * part_stride, w = expf(q[0] - best);
            total += w * q[1];
            li_K->axpy_f32(w, q + 2, out, m->head_dim_v);
        }
        li_K->scale_f32(out, 1.0f / total, m->head_dim_v);
    }
}

static void forward_layer(li_context *c, int il, int64_t n, int ith, int nth) {
    const li_model_desc *m = c->m;
    const li_layer_desc *L = &m->layers[il];
    const int64_t E = m->n_embd, F = m->n_ff;
    const int64_t nq = (int64_t)m->n_head * m->head_dim, nk = (int64_t)m->n_head_kv * m->head_dim;
    const int64_t nv = (int64_t)m->n_head_kv * m->head_dim_v, na = (int64_t)m->n_head * m->head_dim_v;
    int64_t lo, hi;

    /* attention input: norm and quantize (rows) */
    li_split(n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) norm_row(c->x + t * E, L->attn_norm, c->xb + t * E, E, m->norm_eps);
    const li_matrix *qkv[3] = {&L->wq, &L->wk, &L->wv};
    quantize_rows_for(c, c->xb, E, lo, hi, qkv, 3);
    LI_BARRIER();

    matmul(c, &L->wq, n, c->q, nq, ith, nth);
    matmul(c, &L->wk, n, c->k, nk, ith, nth);
    matmul(c, &L->wv, n, c->v, nv, ith, nth);
    LI_BARRIER();

    /* per (token, head): biases, norms, RoPE, cache write */
    const int heads = m->n_head + m->n_head_kv;
    li_split(n * heads, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t t = i / heads;
        prepare_head(c, L, il, t, (int)(i % heads), c->pos[t]);
    }
    LI_BARRIER();

    attention(c, L, il, n, ith, nth);
    LI_BARRIER();

    gated_quantize(c, c->att, NULL, n, na, &L->wo, 0, ith, nth);
    LI_BARRIER();

    matmul(c, &L->wo, n, c->o, E, ith, nth);
    LI_BARRIER();

    /* residual, then the feed-forward input (rows) */
    li_split(n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *o = c->o + t * E, *x = c->x + t * E;
        if (L->post_attn_norm) norm_row(o, L->post_attn_norm, o, E, m->norm_eps);
        li_K->add_f32(x, o, x, E);
        norm_row(x, L->ffn_norm, c->xb + t * E, E, m->norm_eps);
    }
    const li_matrix *gu[2] = {&L->w_gate, &L->w_up};
    quantize_rows_for(c, c->xb, E, lo, hi, gu, 2);
    LI_BARRIER();

    matmul(c, &L->w_gate, n, c->g, F, ith, nth);
    matmul(c, &L->w_up, n, c->u, F, ith, nth);
    LI_BARRIER();

    gated_quantize(c, c->g, c->u, n, F, &L->w_down, m->act, ith, nth);
    LI_BARRIER();

    matmul(c, &L->w_down, n, c->o, E, ith, nth);
    LI_BARRIER();

    li_split(n, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *o = c->o + t * E, *x = c->x + t * E;
        if (L->post_ffn_norm) norm_row(o, L->post_ffn_norm, o, E, m->norm_eps);
        li_K->add_f32(x, o, x, E);
    }
    /* the next step splits rows the same way, so it needs no barrier here */
}

static void forward_team(li_context *c, const int32_t *tokens, int64_t n, int logits_all, float *logits) {
    const li_model_desc *m = c->m;
    const int ith = li_thread_index(), nth = li_thread_count();
    const int64_t E = m->n_embd;
    int64_t lo, hi;

    li_split(n, ith, nth, &lo, &hi);
    const li_matrix *emb = &m->tok_embd;
    const size_t emb_row = emb->nbytes / (size_t)emb->rows;
    for (int64_t t = lo; t < hi; t++) {
        float *x = c->x + t * E;
        li_K->dequant[emb->type]((const char *)emb->data + (size_t)tokens[t] * emb_row, x, E);
        if (m->embd_scale != 1.0f) li_K->scale_f32(x, m->embd_scale, E);
    }

    /* the embedding rows and each layer's first and last steps are split the
     * same way, so consecutive layers need no barrier between them */
    for (int il = 0; il < m->n_layer; il++) forward_layer(c, il, n, ith, nth);
    LI_BARRIER();

    /* logits for the rows asked for; those rows' normed inputs go to xb from row 0 */
    const int64_t r0 = logits_all ? 0 : n - 1, n_out = n - r0;
    li_split(n_out, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) norm_row(c->x + (r0 + t) * E, m->output_norm, c->xb + t * E, E, m->norm_eps);
    const li_matrix *out[1] = {&m->output};
    quantize_rows_for(c, c->xb, E, lo, hi, out, 1);
    LI_BARRIER();
    matmul(c, &m->output, n_out, logits, m->n_vocab, ith, nth);
}

int li_context_forward(li_context *c, const int32_t *tokens, int n, int pos0, int logits_all,
                       float *logits, size_t logits_size, int n_threads) {
    if (!c || !tokens || !logits) return LI_E_ARG;
    const li_model_desc *m = c->m;
    if (n <= 0 || n > c->n_batch) return LI_E_ARG;
    if (pos0 < 0 || (int64_t)pos0 + n > c->n_ctx) return LI_E_CONTEXT;
    const size_t need = (size_t)(logits_all ? n : 1) * (size_t)m->n_vocab;
    if (logits_size < need) return LI_E_SHAPE;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= m->n_vocab) return LI_E_TOKEN;
    int nt = n_threads <= 0 ? 1 : LI_MIN(n_threads, c->max_threads);

    for (int t = 0; t < n; t++) c->pos[t] = pos0 + t;
    for (int r = 0; r < c->n_rope; r++)
        li_rope_cache(c->pos, n, m->n_rot, &c->rope[r],
                      c->rope_cs + (size_t)r * (size_t)c->n_batch * (size_t)m->n_rot);
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    forward_team(c, tokens, n, logits_all, logits);
    return LI_OK;
}
