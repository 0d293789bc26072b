/* lora.c: LoRA adapters on a context's projections (llminfer.h).
 *
 * A projection y = W x of a row whose sequence turns adapters on gets, after
 * the base product, y += s * B (A x) for each such adapter in the order the
 * context holds them (llama.cpp's build_lora_mm: its delta scaled, then
 * added). It runs in two steps around the base product, each split over the
 * team by whole items: li_lora_down, before it, writes each (row, adapter)'s
 * A x into lora_tmp (the base product may overwrite x: Wo's output shares
 * its input's buffer); li_lora_up, after it, adds each output element's
 * delta. Every element is computed by one thread with the same operations in
 * the same order (lora_dot) whatever the batch and the team, so a row's
 * result is the same batched or alone, and a row with every scale 0 is not
 * touched at all: the base model's bits.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "context.h"

#define CHECK(expr)                  \
    do {                             \
        const int st_ = (expr);      \
        if (st_ != LI_OK) return st_; \
    } while (0)

/* the most a pair's rank may be (the adapters convert_lora_to_gguf.py writes use 8 to 256) */
#define LORA_MAX_RANK 65536
/* output elements per li_lora_up item */
#define LORA_UP_CHUNK 64

/* a . b over n floats: eight partial sums, added in one fixed order */
static float lora_dot(const float *a, const float *b, int64_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static const li_lora_pair *pair_of(const li_lora *L, const li_lora_proj *p) {
    if (p->il < 0) return &L->output;
    return (const li_lora_pair *)(const void *)((const char *)&L->layers[p->il] + p->pair);
}

static const char *const PAIR_NAMES[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                         "ffn_down"};

static int check_pair(const li_lora_pair *p, const li_matrix *w, int j, int il, const char *name) {
    if (!p->a && !p->b) return LI_OK;
    if (!p->a || !p->b)
        return li_fail(LI_E_ARG, "LoRA adapter %d, layer %d %s: lora_%s is missing", j, il, name, p->a ? "b" : "a");
    if (p->rank < 1 || p->rank > LORA_MAX_RANK)
        return li_fail(LI_E_ARG, "LoRA adapter %d, layer %d %s: rank %d is outside 1..%d", j, il, name, p->rank,
                       LORA_MAX_RANK);
    if (!w->data || w->rows <= 0 || w->k <= 0)
        return li_fail(LI_E_ARG, "LoRA adapter %d, layer %d: the model has no %s projection to adapt", j, il, name);
    return LI_OK;
}

int li_context_set_loras(li_context *c, const li_lora *loras, int n) {
    if (!c || n < 0 || (n > 0 && !loras)) return li_fail(LI_E_ARG, "no context, or %d adapters without their list", n);
    const li_model_desc *m = c->m;
    if (n > 0 && c->be_layers > 0)
        return li_fail(LI_E_ARG, "LoRA adapters run on the CPU only, and this context offloads %d layers",
                       c->be_layers);
    int rank = 0;
    for (int j = 0; j < n; j++) {
        const li_lora *A = &loras[j];
        if (!isfinite(A->alpha)) return li_fail(LI_E_ARG, "LoRA adapter %d: alpha is not finite", j);
        if (!A->layers) return li_fail(LI_E_ARG, "LoRA adapter %d has no layer list", j);
        for (int il = 0; il < m->n_layer; il++) {
            const li_layer_desc *Ly = &m->layers[il];
            const li_lora_layer *P = &A->layers[il];
            const li_lora_pair *ps[7] = {&P->wq, &P->wk, &P->wv, &P->wo, &P->w_gate, &P->w_up, &P->w_down};
            const li_matrix *ws[7] = {&Ly->wq, &Ly->wk, &Ly->wv, &Ly->wo, &Ly->w_gate, &Ly->w_up, &Ly->w_down};
            for (int i = 0; i < 7; i++) {
                /* the attention projections only where attention runs; the dense feed-forward's only where the
                 * layer has one (a MoE layer's w_* are unused) */
                const li_matrix none = {0};
                const li_matrix *w = ws[i];
                if ((i < 4 && Ly->mixer != LI_MIX_ATTN) || (i >= 4 && Ly->router.data)) w = &none;
                CHECK(check_pair(ps[i], w, j, il, PAIR_NAMES[i]));
                if (ps[i]->a) rank = LI_MAX(rank, ps[i]->rank);
            }
        }
        CHECK(check_pair(&A->output, &m->output, j, -1, "output"));
        if (A->output.a) rank = LI_MAX(rank, A->output.rank);
        CHECK(check_pair(&A->tok_embd, &m->tok_embd, j, -1, "token_embd"));
    }
    free(c->lora_s);
    li_free_aligned(c->lora_tmp);
    c->lora_s = NULL;
    c->lora_tmp = NULL;
    c->loras = NULL;
    c->n_lora = c->lora_rank = 0;
    c->lora_any = 0;
    if (n == 0) return LI_OK;
    const size_t rows = (size_t)c->n_batch * (size_t)n;
    c->lora_s = calloc(rows, sizeof(float));
    c->lora_tmp = li_alloc_aligned(LI_LORA_PROJ * rows * (size_t)LI_MAX(rank, 1) * sizeof(float), 64);
    if (!c->lora_s || !c->lora_tmp) {
        free(c->lora_s);
        li_free_aligned(c->lora_tmp);
        c->lora_s = NULL;
        c->lora_tmp = NULL;
        return li_fail(LI_E_NOMEM, "no memory for %d LoRA adapters' scratch (rank %d)", n, rank);
    }
    c->loras = loras;
    c->n_lora = n;
    c->lora_rank = rank;
    return LI_OK;
}

void li_lora_free(li_context *c) {
    free(c->lora_s);
    li_free_aligned(c->lora_tmp);
}

int li_lora_prepare(li_context *c, const li_batch *b, const li_seq_view *views, int n_views) {
    c->lora_any = 0;
    for (int s = 0; s < n_views; s++) {
        const li_seq_view *v = &views[s];
        if (v->n_lora < 0 || v->n_lora > c->n_lora || (v->n_lora > 0 && !v->lora_scale))
            return li_fail(LI_E_ARG, "sequence %d: %d LoRA scales%s, but the context holds %d adapters", s,
                           v->n_lora, v->n_lora > 0 && !v->lora_scale ? " without their array" : "", c->n_lora);
        for (int j = 0; j < v->n_lora; j++)
            if (!isfinite(v->lora_scale[j]))
                return li_fail(LI_E_ARG, "sequence %d: LoRA adapter %d's scale is not finite", s, j);
    }
    if (c->n_lora == 0) return LI_OK;
    const int nl = c->n_lora;
    for (int t = 0; t < b->n; t++) {
        const li_seq_view *v = &views[b->seq[t]]; /* b->seq checked by group_rows */
        float *row = c->lora_s + (size_t)t * (size_t)nl;
        for (int j = 0; j < nl; j++) {
            row[j] = j < v->n_lora ? v->lora_scale[j] : 0.0f;
            if (row[j] != 0.0f) c->lora_any = 1;
        }
    }
    if (c->lora_any && c->be_layers > 0)
        return li_fail(LI_E_ARG, "LoRA adapters run on the CPU only, and this context offloads %d layers",
                       c->be_layers);
    return LI_OK;
}

int li_lora_covers(const li_context *c, const li_lora_proj *ps, int np) {
    if (!c->lora_any) return 0;
    for (int j = 0; j < c->n_lora; j++)
        for (int p = 0; p < np; p++)
            if (pair_of(&c->loras[j], &ps[p])->a) return 1;
    return 0;
}

static int64_t batch_row(const li_lora_proj *p, int64_t t) { return p->row_map ? p->row_map[t] : p->row0 + t; }

static float *tmp_of(const li_context *c, int p, int64_t t, int j) {
    return c->lora_tmp + (((size_t)p * (size_t)c->n_batch + (size_t)t) * (size_t)c->n_lora + (size_t)j) *
                             (size_t)c->lora_rank;
}

void li_lora_embed(const li_context *c, int32_t token, int64_t row, float *x) {
    const int nl = c->n_lora;
    const int64_t E = c->m->n_embd;
    const float *s = c->lora_s + row * nl;
    for (int j = 0; j < nl; j++) {
        const li_lora *A = &c->loras[j];
        const li_lora_pair *pr = &A->tok_embd;
        if (!pr->a || s[j] == 0.0f) continue;
        const float scale = A->alpha != 0.0f ? s[j] * A->alpha / (float)pr->rank : s[j];
        const float *arow = pr->a + (size_t)token * (size_t)pr->rank; /* token < n_vocab: prepare_batch */
        for (int64_t e = 0; e < E; e++) {
            const float d = lora_dot(pr->b + (size_t)e * (size_t)pr->rank, arow, pr->rank) * scale;
            x[e] = x[e] + d;
        }
    }
}

void li_lora_down(li_context *c, const li_lora_proj *ps, int np, int64_t n, int ith, int nth) {
    const int nl = c->n_lora;
    int64_t lo, hi;
    li_split((int64_t)np * n * nl, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int p = (int)(i / (n * nl)), j = (int)(i % nl);
        const int64_t t = (i / nl) % n;
        const li_lora_proj *P = &ps[p];
        const li_lora_pair *pr = pair_of(&c->loras[j], P);
        if (!pr->a || c->lora_s[batch_row(P, t) * nl + j] == 0.0f) continue;
        const int64_t k = P->w->k;
        const float *x = P->x + t * P->x_ld;
        float *tmp = tmp_of(c, p, t, j);
        for (int r = 0; r < pr->rank; r++) tmp[r] = lora_dot(pr->a + (size_t)r * (size_t)k, x, k);
    }
}

void li_lora_up(li_context *c, const li_lora_proj *ps, int np, int64_t n, int ith, int nth) {
    const int nl = c->n_lora;
    int64_t chunks[LI_LORA_PROJ], total = 0;
    for (int p = 0; p < np; p++) {
        chunks[p] = (ps[p].w->rows + LORA_UP_CHUNK - 1) / LORA_UP_CHUNK;
        total += n * chunks[p];
    }
    int64_t lo, hi;
    li_split(total, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        int p = 0;
        int64_t r = i;
        while (r >= n * chunks[p]) r -= n * chunks[p++];
        const int64_t t = r / chunks[p], ch = r % chunks[p];
        const li_lora_proj *P = &ps[p];
        const int64_t i0 = ch * LORA_UP_CHUNK, i1 = LI_MIN(i0 + LORA_UP_CHUNK, P->w->rows);
        const float *s = c->lora_s + batch_row(P, t) * nl;
        float *y = P->y + t * P->y_ld;
        for (int j = 0; j < nl; j++) {
            const li_lora *A = &c->loras[j];
            const li_lora_pair *pr = pair_of(A, P);
            if (!pr->b || s[j] == 0.0f) continue;
            /* llama.cpp's scale: the adapter's times alpha / rank, in float, in that order */
            const float scale = A->alpha != 0.0f ? s[j] * A->alpha / (float)pr->rank : s[j];
            const float *tmp = tmp_of(c, p, t, j);
            for (int64_t e = i0; e < i1; e++) {
                const float d = lora_dot(pr->b + (size_t)e * (size_t)pr->rank, tmp, pr->rank) * scale;
                y[e] = y[e] + d;
            }
        }
    }
}
