/* encoder.c: the forward pass of a BERT-style encoder (bert, nomic-bert):
 * every token of a sequence attends to every other (no causal mask), and the
 * output is the hidden state of each token, for embeddings.
 *
 * The graph, for one sequence of n tokens (x is [n, n_embd]), as llama.cpp
 * builds it for these architectures:
 *   x = tok_embd[token] + type_embd[type] (+ pos_embd[pos] for bert)
 *   x = layernorm(x) * embd_norm + embd_norm_b
 *   per layer (post-norm):
 *     q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv   (RoPE on q, k for nomic-bert)
 *     att = softmax(q k^T / sqrt(head_dim)) v          over all n positions
 *     x = layernorm(x + att Wo^T + bo) * attn_out_norm + attn_out_norm_b
 *     h = gelu(x Wup^T + bup)            (bert)
 *       | silu(x Wgate^T) * (x Wup^T)    (nomic-bert)
 *     x = layernorm(x + h Wdown^T + bdown) * out_norm + out_norm_b
 * One call runs one sequence: nothing of another sequence can reach its
 * rows, and each row's products do not depend on n (li_matmul, kernels.h),
 * nor does anything depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "context.h"
#include "llminfer.h"

#define CHECK(expr)                  \
    do {                             \
        const int st_ = (expr);      \
        if (st_ != LI_OK) return st_; \
    } while (0)

static int check_mat(const li_matrix *w, const char *name, int il, int64_t rows, int64_t k, int optional) {
    if (!w->data) {
        if (optional) return LI_OK;
        return li_fail(LI_E_ARG, "encoder layer %d: %s has no data", il, name);
    }
    if (li_type_sizes(w->type, NULL, NULL) != LI_OK)
        return li_fail(LI_E_TYPE, "encoder layer %d: %s has type %d, which is not supported", il, name, w->type);
    if (w->rows != rows || w->k != k)
        return li_fail(LI_E_SHAPE, "encoder layer %d: %s is [%lld, %lld], expected [%lld, %lld]", il, name,
                       (long long)w->rows, (long long)w->k, (long long)rows, (long long)k);
    const size_t row = li_row_bytes(w->type, k);
    if (row == 0 || w->nbytes != row * (size_t)rows)
        return li_fail(LI_E_SHAPE, "encoder layer %d: %s holds %zu bytes, expected %zu", il, name, w->nbytes,
                       row * (size_t)rows);
    return LI_OK;
}

int li_encoder_check(const li_encoder_desc *m) {
    li_fail(LI_OK, "%s", "");
    if (!m || !m->layers) return li_fail(LI_E_ARG, "no encoder description or no layers");
    if (m->n_vocab <= 0 || m->n_embd <= 0 || m->n_layer <= 0 || m->n_head <= 0 || m->head_dim <= 0 ||
        m->n_ff <= 0 || m->n_pos < 0 || m->n_types < 0)
        return li_fail(LI_E_SHAPE, "an encoder size is not positive (n_vocab %d, n_embd %d, n_layer %d, n_head %d, "
                       "head_dim %d, n_ff %d, n_pos %d, n_types %d)", m->n_vocab, m->n_embd, m->n_layer, m->n_head,
                       m->head_dim, m->n_ff, m->n_pos, m->n_types);
    if ((int64_t)m->n_head * m->head_dim != m->n_embd)
        return li_fail(LI_E_SHAPE, "n_head %d * head_dim %d is not n_embd %d", m->n_head, m->head_dim, m->n_embd);
    if (m->n_rot < 0 || m->n_rot % 2 || m->n_rot > m->head_dim)
        return li_fail(LI_E_SHAPE, "n_rot %d must be even and within head_dim %d", m->n_rot, m->head_dim);
    if (m->n_rot && (m->rope_mode != LI_ROPE_NORM && m->rope_mode != LI_ROPE_NEOX))
        return li_fail(LI_E_ARG, "unknown RoPE mode %d", m->rope_mode);
    if (m->n_rot && !(m->rope_base > 0.0f)) return li_fail(LI_E_ARG, "RoPE base %g out of range", (double)m->rope_base);
    if (!(m->norm_eps >= 0.0f)) return li_fail(LI_E_ARG, "norm_eps %g out of range", (double)m->norm_eps);
    if (!m->embd_norm || !m->embd_norm_b) return li_fail(LI_E_ARG, "the embedding norm is missing");
    if (!m->pos_embd.data && !m->n_rot) return li_fail(LI_E_ARG, "no positions: neither pos_embd nor RoPE");
    CHECK(check_mat(&m->tok_embd, "token_embd", -1, m->n_vocab, m->n_embd, 0));
    CHECK(check_mat(&m->pos_embd, "position_embd", -1, m->n_pos, m->n_embd, 1));
    CHECK(check_mat(&m->type_embd, "token_types", -1, m->n_types, m->n_embd, 1));
    const int64_t E = m->n_embd, F = m->n_ff;
    for (int il = 0; il < m->n_layer; il++) {
        const li_encoder_layer *L = &m->layers[il];
        CHECK(check_mat(&L->wq, "attn_q", il, E, E, 0));
        CHECK(check_mat(&L->wk, "attn_k", il, E, E, 0));
        CHECK(check_mat(&L->wv, "attn_v", il, E, E, 0));
        CHECK(check_mat(&L->wo, "attn_output", il, E, E, 0));
        CHECK(check_mat(&L->w_up, "ffn_up", il, F, E, 0));
        CHECK(check_mat(&L->w_gate, "ffn_gate", il, F, E, 1));
        CHECK(check_mat(&L->w_down, "ffn_down", il, E, F, 0));
        if (!L->attn_out_norm || !L->attn_out_norm_b || !L->out_norm || !L->out_norm_b)
            return li_fail(LI_E_ARG, "encoder layer %d lacks a layer norm weight or bias", il);
    }
    return LI_OK;
}

/* y[t] = (x[t] - mean) / sqrt(var + eps) * w + b, over rows of k */
static void layer_norm(float *x, const float *w, const float *b, int64_t n, int64_t k, float eps) {
    for (int64_t t = 0; t < n; t++) {
        float *r = x + t * k;
        double s = 0.0;
        for (int64_t i = 0; i < k; i++) s += r[i];
        const float mean = (float)(s / (double)k);
        double v = 0.0;
        for (int64_t i = 0; i < k; i++) {
            const double d = (double)r[i] - mean;
            v += d * d;
        }
        const float inv = (float)(1.0 / sqrt(v / (double)k + (double)eps));
        for (int64_t i = 0; i < k; i++) r[i] = (r[i] - mean) * inv * w[i] + b[i];
    }
}

static void add_bias(float *y, const float *b, int64_t n, int64_t k) {
    if (!b) return;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < k; i++) y[t * k + i] += b[i];
}

/* y[n, rows] = x[n, k] W^T (+ b) */
static int linear(const li_matrix *w, const float *b, const float *x, int64_t n, float *y, int n_threads) {
    const int st = li_matmul(w->type, w->data, w->nbytes, w->rows, w->k, x, n, y, n_threads);
    if (st != LI_OK)
        return li_fail(st, "an encoder matmul of [%lld, %lld] in %s failed", (long long)w->rows, (long long)w->k,
                       li_type_name(w->type));
    add_bias(y, b, n, w->rows);
    return LI_OK;
}

/* att[t, h*d..] = softmax_j(q_t . k_j * scale) v_j, every j of the sequence;
 * one (head, token) per item, its scores in its thread's row of `scores` */
static void attend(const float *q, const float *k, const float *v, float *att, float *scores, int64_t n, int nh,
                   int d, int n_threads) {
    const int64_t E = (int64_t)nh * d;
    const float scale = 1.0f / sqrtf((float)d);
    const int64_t items = n * nh;
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads)
#endif
    {
        const int ith = li_thread_index(), nth = li_thread_count();
        float *s = scores + (size_t)ith * (size_t)n;
        int64_t lo, hi;
        li_split(items, ith, nth, &lo, &hi);
        for (int64_t it = lo; it < hi; it++) {
            const int64_t t = it / nh;
            const int h = (int)(it % nh);
            const float *qt = q + t * E + (int64_t)h * d;
            float top = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                const float *kj = k + j * E + (int64_t)h * d;
                float dot = 0.0f;
                for (int i = 0; i < d; i++) dot += qt[i] * kj[i];
                s[j] = dot * scale;
                if (s[j] > top) top = s[j];
            }
            double sum = 0.0;
            for (int64_t j = 0; j < n; j++) {
                s[j] = expf(s[j] - top);
                sum += s[j];
            }
            const float inv = (float)(1.0 / sum);
            float *out = att + t * E + (int64_t)h * d;
            for (int i = 0; i < d; i++) out[i] = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                const float p = s[j] * inv;
                const float *vj = v + j * E + (int64_t)h * d;
                for (int i = 0; i < d; i++) out[i] += p * vj[i];
            }
        }
    }
}

static int embed_row(const li_matrix *m, int64_t row, float *dst) {
    const size_t bytes = m->nbytes / (size_t)m->rows;
    return li_dequantize(m->type, (const char *)m->data + (size_t)row * bytes, bytes, 1, m->k, dst, 1);
}

int li_encode(const li_encoder_desc *m, const int32_t *tokens, const int32_t *types, int n, float *out,
              size_t out_size, int n_threads) {
    CHECK(li_encoder_check(m));
    if (!tokens || !out || n <= 0) return li_fail(LI_E_ARG, "an encoder call needs tokens (n %d) and an output", n);
    if (m->pos_embd.data && n > m->n_pos)
        return li_fail(LI_E_CONTEXT, "%d tokens, but the encoder has %d positions", n, m->n_pos);
    const int64_t E = m->n_embd, F = m->n_ff;
    if (out_size < (size_t)n * (size_t)E)
        return li_fail(LI_E_SHAPE, "the output holds %zu floats, %d rows of %lld need more", out_size, n, (long long)E);
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= m->n_vocab)
            return li_fail(LI_E_TOKEN, "token %d: id %d is outside the vocabulary [0, %d)", t, tokens[t], m->n_vocab);
        if (types && (types[t] < 0 || (types[t] > 0 && types[t] >= m->n_types)))
            return li_fail(LI_E_ARG, "token %d: type %d, but the encoder has %d token types", t, types[t], m->n_types);
    }
    const int nt = n_threads <= 0 ? 1 : n_threads;
    const size_t nE = (size_t)n * (size_t)E, nF = (size_t)n * (size_t)F;
    float *x = malloc(nE * sizeof(float)), *q = malloc(nE * sizeof(float)), *k = malloc(nE * sizeof(float));
    float *v = malloc(nE * sizeof(float)), *att = malloc(nE * sizeof(float)), *o = malloc(nE * sizeof(float));
    float *g = malloc(nF * sizeof(float)), *u = malloc(nF * sizeof(float)), *row = malloc((size_t)E * sizeof(float));
    float *scores = malloc((size_t)nt * (size_t)n * sizeof(float));
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    int st = LI_OK;
    if (!x || !q || !k || !v || !att || !o || !g || !u || !row || !scores || !pos) {
        st = li_fail(LI_E_NOMEM, "no memory for an encoder pass of %d tokens", n);
        goto done;
    }

    for (int t = 0; t < n; t++) {
        pos[t] = t;
        float *xt = x + (size_t)t * E;
        if ((st = embed_row(&m->tok_embd, tokens[t], xt)) != LI_OK) goto done;
        if (m->type_embd.data) {
            if ((st = embed_row(&m->type_embd, types ? types[t] : 0, row)) != LI_OK) goto done;
            for (int64_t i = 0; i < E; i++) xt[i] += row[i];
        }
        if (m->pos_embd.data) {
            if ((st = embed_row(&m->pos_embd, t, row)) != LI_OK) goto done;
            for (int64_t i = 0; i < E; i++) xt[i] += row[i];
        }
    }
    layer_norm(x, m->embd_norm, m->embd_norm_b, n, E, m->norm_eps);

    for (int il = 0; il < m->n_layer; il++) {
        const li_encoder_layer *L = &m->layers[il];
        if ((st = linear(&L->wq, L->bq, x, n, q, nt)) != LI_OK) goto done;
        if ((st = linear(&L->wk, L->bk, x, n, k, nt)) != LI_OK) goto done;
        if ((st = linear(&L->wv, L->bv, x, n, v, nt)) != LI_OK) goto done;
        if (m->n_rot) {
            if ((st = li_rope(q, n, m->n_head, m->head_dim, m->n_rot, pos, m->rope_base, 1.0f, m->rope_mode)) ||
                (st = li_rope(k, n, m->n_head, m->head_dim, m->n_rot, pos, m->rope_base, 1.0f, m->rope_mode))) {
                st = li_fail(st, "encoder layer %d: RoPE failed", il);
                goto done;
            }
        }
        attend(q, k, v, att, scores, n, m->n_head, m->head_dim, nt);
        if ((st = linear(&L->wo, L->bo, att, n, o, nt)) != LI_OK) goto done;
        for (size_t i = 0; i < nE; i++) x[i] += o[i];
        layer_norm(x, L->attn_out_norm, L->attn_out_norm_b, n, E, m->norm_eps);

        if ((st = linear(&L->w_up, L->b_up, x, n, u, nt)) != LI_OK) goto done;
        if (L->w_gate.data) {
            if ((st = linear(&L->w_gate, NULL, x, n, g, nt)) != LI_OK) goto done;
            st = li_gated_activation(LI_FN_SILU, g, u, (int64_t)nF, u);
        } else {
            st = li_activation(LI_FN_GELU, u, (int64_t)nF, u);
        }
        if (st != LI_OK) {
            st = li_fail(st, "encoder layer %d: the feed-forward activation failed", il);
            goto done;
        }
        if ((st = linear(&L->w_down, L->b_down, u, n, o, nt)) != LI_OK) goto done;
        for (size_t i = 0; i < nE; i++) x[i] += o[i];
        layer_norm(x, L->out_norm, L->out_norm_b, n, E, m->norm_eps);
    }
    memcpy(out, x, nE * sizeof(float));
done:
    free(x), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(row), free(scores), free(pos);
    return st;
}
