/* attention.c: the KV cache write and attention over the paged cache.
 *
 * A token at pos in a layer sees the positions [first, pos] (first = 0, or
 * pos - window + 1 in a sliding-window layer) whose blocks are in its
 * sequence's table; in a layer a non-causal batch makes non-causal
 * (li_context_set_causal: every layer, or the sliding-window ones), up to
 * the last position of its sequence in the batch instead of pos
 * (li_last_visible). Those positions are cut at multiples of c->span into
 * spans. A token whose keys all lie in one span takes the plain path:
 * scores, softmax, weights normalized (and rounded to f16 with an F16 cache,
 * as llama.cpp's V x softmax product takes them), then the weighted sum of
 * values. A token whose keys lie in several spans computes each span's
 * unnormalized result (its max, its sum, its weighted values) and combines
 * them in span order. Both depend on the positions and the table alone, so a
 * token's output is bitwise the same whatever batch it is in, however its
 * prompt was split, and at any thread count: the team only decides which
 * thread computes a span, never how.
 *
 * Work items are (tile, kv head): all the query heads of a kv head
 * (grouped-query attention) of a tile's tokens (consecutive positions of one
 * sequence, see attend_tile) are done together, so each cached row is read
 * and converted once for them. A small batch (a decoded token) has too few
 * items for the team, so its spans become items of their own, written to
 * c->parts and combined after a barrier.
 */
#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "context.h"
#include "quantize.h"

int li_first_visible(const li_layer_desc *L, int pos) {
    return L->sliding_window > 0 ? LI_MAX(0, pos - L->sliding_window + 1) : 0;
}

int li_last_visible(const li_context *c, const li_layer_desc *L, int64_t t) {
    const int open = c->non_causal == LI_OPEN_ALL || (c->non_causal == LI_OPEN_SWA && L->sliding_window > 0);
    return open ? c->vis[t] : c->pos[t];
}

/* With an F16 cache, queries and attention weights are rounded to float16
 * too, as llama.cpp does (its K.Q and V.softmax products take both operands
 * in F16). The error is far below that of the 8-bit activations, and keeping
 * the same roundings keeps our logits within reach of llama.cpp's. */
void li_round_to_f16(float *x, int64_t n) {
    uint16_t tmp[256];
    for (int64_t i = 0; i < n; i += 256) {
        const int64_t m = LI_MIN(256, n - i);
        li_K->f32_to_f16(x + i, tmp, m);
        li_K->f16_to_f32(tmp, x + i, m);
    }
}

static int kv_quantized(const li_context *c) {
    return c->kv.kv_type != LI_TYPE_F16 && c->kv.kv_type != LI_TYPE_F32;
}

/* the row of kv head h at pool row r (block * block_size + slot) */
static char *k_at(const li_context *c, int il, int64_t r, int h) {
    return c->k_pool[c->kv_src[il]] + ((size_t)r * (size_t)lm_of(c, il)->n_head_kv + (size_t)h) * c->k_rows[il];
}
static char *v_at(const li_context *c, int il, int64_t r, int h) {
    return c->v_pool[c->kv_src[il]] + ((size_t)r * (size_t)lm_of(c, il)->n_head_kv + (size_t)h) * c->v_rows[il];
}

static void store_row(const li_context *c, const float *x, char *dst, int64_t n) {
    switch (c->kv.kv_type) {
    case LI_TYPE_F16: li_K->f32_to_f16(x, (uint16_t *)(void *)dst, n); return;
    case LI_TYPE_F32: memcpy(dst, x, (size_t)n * sizeof(float)); return;
    case LI_TYPE_Q8_0:
    case LI_TYPE_Q4_0: li_weight_quantizer(c->kv.kv_type)(x, dst, n); return;
    default: return; /* refused by li_context_create */
    }
}

void li_prepare_head(li_context *c, const li_layer_desc *L, int il, int64_t t, int h) {
    const li_model_desc *m = lm_of(c, il);
    const int64_t hd = m->head_dim, hdv = m->head_dim_v;
    const float *cs = c->rope_cs + (size_t)c->layer_rope[il] * (size_t)c->n_batch * (size_t)c->n_rot_max +
                      (size_t)t * (size_t)m->n_rot;
    if (h < m->n_head) {
        float *qh = c->q + (t * m->n_head + h) * hd;
        if (L->bq) li_K->add_f32(qh, L->bq + h * hd, qh, hd);
        if (L->q_norm && !m->qk_norm_whole) li_K->rms_norm(qh, L->q_norm, qh, hd, m->norm_eps);
        if (!L->no_rope) li_rope_head(qh, cs, m->n_rot, m->rope_mode);
        if (m->attn_temp_scale != 0.0f) {
            const double steps = floor(((double)c->pos[t] + (double)m->attn_temp_offset) / (double)m->attn_temp_floor);
            const float s = (float)(log(steps + 1.0) * (double)m->attn_temp_scale + 1.0);
            for (int64_t d = 0; d < hd; d++) qh[d] *= s;
        }
        if (c->kv.kv_type == LI_TYPE_F16) li_round_to_f16(qh, hd);
        if (kv_quantized(c)) {
            const int a = li_types[c->kv.kv_type].act_type;
            li_K->quant_act[a](qh, (char *)c->qq + ((size_t)t * (size_t)m->n_head + (size_t)h) * c->qq_row, hd);
        }
        return;
    }
    h -= m->n_head;
    if (L->kv_reuse > 0) return; /* another layer's keys and values: nothing to write */
    float *kh = c->k + (t * m->n_head_kv + h) * hd;
    float *vh = c->v + (t * m->n_head_kv + h) * hdv;
    if (L->bk) li_K->add_f32(kh, L->bk + h * hd, kh, hd);
    if (L->bv) li_K->add_f32(vh, L->bv + h * hdv, vh, hdv);
    if (L->k_norm && !m->qk_norm_whole) li_K->rms_norm(kh, L->k_norm, kh, hd, m->norm_eps);
    if (!L->no_rope) li_rope_head(kh, cs, m->n_rot, m->rope_mode);
    if (L->v_norm) li_K->rms_norm(vh, L->v_norm, vh, hdv, m->norm_eps);
    const int64_t r = c->kv_row[c->group[il]][t];
    store_row(c, kh, k_at(c, il, r, h), hd);
    store_row(c, vh, v_at(c, il, r, h), hdv);
}

/* ---- one span ---- */

/* A run of consecutive pool rows [r0, r0 + n) holding consecutive positions. */
typedef struct {
    int64_t r0, n;
    int p; /* the position of row r0 */
} row_run;

/* The runs of pool rows that hold the present positions of [p0, p1). */
static int span_runs(const li_context *c, const int32_t *blocks, int n_blocks, int p0, int p1, row_run *runs) {
    const int bs = c->kv.block_size;
    int nr = 0;
    for (int p = p0; p < p1;) {
        const int b = p / bs, end = LI_MIN(p1, (b + 1) * bs);
        const int32_t id = b < n_blocks ? blocks[b] : -1;
        if (id >= 0) {
            runs[nr].r0 = (int64_t)id * bs + p % bs;
            runs[nr].n = end - p;
            runs[nr].p = p;
            nr++;
        }
        p = end;
    }
    return nr;
}

/* Hints run's rows of kv head kvh (K, or V when `v`) into L2, HINT_RUNS
 * runs ahead of the kernels that read them. A head's rows lie n_head_kv
 * rows apart in the pool, a stride the hardware prefetchers follow poorly,
 * and the kernels' own hints lead by 8 rows, within a run: runs are blocks
 * of 32 rows by default, and a hint past a run's end would land on rows of
 * whatever block follows in the pool. Two runs ahead gives the lines time to
 * arrive (docs/kernel-tuning.md#attention-hint-runs). */
#define HINT_RUNS 2
static void hint_run(const li_context *c, int il, int kvh, const row_run *run, int v) {
    const size_t row = v ? c->v_rows[il] : c->k_rows[il], stride = (size_t)lm_of(c, il)->n_head_kv * row;
    if (stride == row) return; /* one kv head: the rows are contiguous, and the prefetchers stream them */
    const char *p = v ? v_at(c, il, run->r0, kvh) : k_at(c, il, run->r0, kvh);
    for (int64_t j = 0; j < run->n; j++, p += stride)
        for (size_t b = 0; b < row; b += 64) li_hint_l2(p + b);
}

/* hint_run over runs[a, b), those of them that exist (nr in all) */
static void hint_runs(const li_context *c, int il, int kvh, const row_run *runs, int nr, int a, int b, int v) {
    for (int i = a; i < b && i < nr; i++) hint_run(c, il, kvh, &runs[i], v);
}

/* scores of the group's nh heads (queries q, or qq quantized) against rows
 * [r0, r0 + n) into out (row ld) */
static void run_scores(li_context *c, int il, int kvh, const float *q, const char *qq, int nh, int64_t r0, int64_t n,
                       float *out, size_t ld) {
    const li_model_desc *m = lm_of(c, il);
    const int64_t hd = m->head_dim;
    const size_t stride = (size_t)m->n_head_kv * c->k_rows[il]; /* bytes between a head's rows */
    const char *k0 = k_at(c, il, r0, kvh);
    switch (c->kv.kv_type) {
    case LI_TYPE_F16:
        li_K->attn_scores_f16(q, (size_t)hd, nh, (const uint16_t *)(const void *)k0, stride / 2, n, hd,
                              m->attn_scale, out, ld);
        return;
    case LI_TYPE_F32:
        for (int h = 0; h < nh; h++)
            for (int64_t j = 0; j < n; j++)
                out[(size_t)h * ld + (size_t)j] =
                    m->attn_scale * li_K->dot_f32(q + (size_t)h * (size_t)hd,
                                                  (const float *)(const void *)(k0 + (size_t)j * stride), hd);
        return;
    default: {
        /* the K row is a one-row weight of kv_type; the queries its activations */
        const li_dot_fn dot = li_K->dot[c->kv.kv_type];
        float s[LI_DOT_MAX_NC];
        for (int64_t j = 0; j < n; j++)
            for (int h0 = 0; h0 < nh; h0 += LI_DOT_MAX_NC) {
                const int nc = LI_MIN(LI_DOT_MAX_NC, nh - h0);
                dot(hd, k0 + (size_t)j * stride, qq + (size_t)h0 * c->qq_row, c->qq_row, nc, s);
                for (int h = 0; h < nc; h++) out[(size_t)(h0 + h) * ld + (size_t)j] = m->attn_scale * s[h];
            }
        return;
    }
    }
}

/* out_h (out_stride apart) += p_h . value rows [r0, r0 + n), for the group's nh heads */
static void run_accum(li_context *c, int il, int kvh, const float *p, size_t ld, int nh, int64_t r0, int64_t n,
                      float *out, size_t out_stride, float *vrow) {
    const li_model_desc *m = lm_of(c, il);
    const int64_t hdv = m->head_dim_v;
    const size_t stride = (size_t)m->n_head_kv * c->v_rows[il];
    const char *v0 = v_at(c, il, r0, kvh);
    switch (c->kv.kv_type) {
    case LI_TYPE_F16:
        li_K->attn_accum_f16(p, ld, nh, (const uint16_t *)(const void *)v0, stride / 2, n, hdv, out, out_stride);
        return;
    case LI_TYPE_F32:
        for (int h = 0; h < nh; h++)
            for (int64_t j = 0; j < n; j++)
                li_K->axpy_f32(p[(size_t)h * ld + (size_t)j], (const float *)(const void *)(v0 + (size_t)j * stride),
                               out + (size_t)h * out_stride, hdv);
        return;
    default:
        /* one row dequantized at a time into the thread's scratch, shared by the heads */
        for (int64_t j = 0; j < n; j++) {
            li_K->dequant[c->kv.kv_type](v0 + (size_t)j * stride, vrow, hdv);
            for (int h = 0; h < nh; h++) li_K->axpy_f32(p[(size_t)h * ld + (size_t)j], vrow, out + (size_t)h * out_stride, hdv);
        }
        return;
    }
}

/* the sink logit of query head h (of the token's n_head) in layer L, or NULL */
static const float *sink_of(const li_layer_desc *L, int64_t h) { return L->attn_sinks ? L->attn_sinks + h : NULL; }

/* One head's n scores: soft-capped (gemma2), then exp(score - max), with
 * that max and the sum kept; normalized by the sum when `normalize`, and
 * rounded to f16 with an F16 cache. A head with a sink (gpt-oss) that
 * normalizes here (the token's keys in one span) takes it into the max and
 * adds exp(sink - max) to the sum, as ggml's soft_max does; one whose spans
 * are combined takes it in combine_spans. */
static void softmax_row(const li_context *c, float *row, int64_t n, int normalize, const float *sink, float *mx,
                        float *sum) {
    const float cap = c->m->attn_softcap;
    if (cap > 0.0f)
        for (int64_t j = 0; j < n; j++) row[j] = cap * tanhf(row[j] / cap);
    float best = row[0];
    for (int64_t j = 1; j < n; j++) best = LI_MAX(best, row[j]);
    if (normalize && sink) best = LI_MAX(best, *sink);
    *mx = best;
    *sum = li_K->exp_sum(row, n, best);
    if (normalize && sink) *sum += expf(*sink - best);
    if (normalize) li_K->scale_f32(row, 1.0f / *sum, n);
    if (c->kv.kv_type == LI_TYPE_F16) li_round_to_f16(row, n);
}

/* Attention of query heads h0..h0 + nh - 1 of kv head kvh's group for
 * token t over the present positions of [p0, p1). With part == NULL they are
 * all the token sees: the result is normalized into att. Otherwise the
 * unnormalized result goes to part (head h0's), per head (part_stride apart):
 * max, sum, then head_dim_v values; a span with no present position is
 * marked by sum 0. Each head's scores, softmax and sum are its own (the
 * kernels compute every head on its own), so any cut of a group into head
 * ranges gives the same bits. */
static void attend_span(li_context *c, int il, int64_t t, int kvh, int h0, int nh, const int32_t *blocks,
                        int n_blocks, int p0, int p1, float *part, size_t part_stride, int ith) {
    const li_model_desc *m = lm_of(c, il);
    const int64_t hdv = m->head_dim_v;
    const int group = m->n_head / m->n_head_kv;
    const int64_t head = t * m->n_head + (int64_t)kvh * group + h0; /* the first head's index */
    row_run runs[LI_ATTN_SPAN + 1];
    const int nr = span_runs(c, blocks, n_blocks, p0, p1, runs);
    int64_t n = 0;
    for (int i = 0; i < nr; i++) n += runs[i].n;
    if (n == 0) {
        for (int h = 0; part && h < nh; h++) {
            part[(size_t)h * part_stride] = -INFINITY;
            part[(size_t)h * part_stride + 1] = 0.0f;
        }
        return;
    }
    float *scores = c->scores + (size_t)ith * (size_t)c->tile_max * (size_t)group * (size_t)c->span;
    float *vrow = c->vrow + (size_t)ith * (size_t)hdv;
    const size_t ld = (size_t)n;
    const float *q = c->q + head * m->head_dim;
    const char *qq = kv_quantized(c) ? (const char *)c->qq + (size_t)head * c->qq_row : NULL;
    hint_runs(c, il, kvh, runs, nr, 0, HINT_RUNS, 0);
    for (int i = 0, off = 0; i < nr; off += (int)runs[i].n, i++) {
        hint_runs(c, il, kvh, runs, nr, i + HINT_RUNS, i + HINT_RUNS + 1, 0);
        run_scores(c, il, kvh, q, qq, nh, runs[i].r0, runs[i].n, scores + off, ld);
    }
    hint_runs(c, il, kvh, runs, nr, 0, HINT_RUNS, 1);
    float mx[64], sum[64]; /* heads per group: checked in li_model_check */
    const li_layer_desc *L = &m->layers[il];
    for (int h = 0; h < nh; h++)
        softmax_row(c, scores + (size_t)h * ld, n, !part, sink_of(L, (int64_t)kvh * group + h0 + h), &mx[h],
                    &sum[h]);
    float *out = part ? part + 2 : c->att + head * hdv;
    const size_t out_stride = part ? part_stride : (size_t)hdv;
    for (int h = 0; h < nh; h++) memset(out + (size_t)h * out_stride, 0, (size_t)hdv * sizeof(float));
    for (int i = 0, off = 0; i < nr; off += (int)runs[i].n, i++) {
        hint_runs(c, il, kvh, runs, nr, i + HINT_RUNS, i + HINT_RUNS + 1, 1);
        run_accum(c, il, kvh, scores + off, ld, nh, runs[i].r0, runs[i].n, out, out_stride, vrow);
    }
    for (int h = 0; part && h < nh; h++) {
        part[(size_t)h * part_stride] = mx[h];
        part[(size_t)h * part_stride + 1] = sum[h];
    }
}

/* out = the spans' results combined, in span order: weights exp(max_s -
 * max); a sink (gpt-oss, or NULL) joins the max and, after the spans, the sum */
static void combine_spans(const float *part, size_t chunk_stride, int nchunks, int64_t hdv, const float *sink,
                          float *out) {
    float best = -INFINITY;
    for (int s = 0; s < nchunks; s++)
        if (part[(size_t)s * chunk_stride + 1] > 0.0f) best = LI_MAX(best, part[(size_t)s * chunk_stride]);
    if (sink) best = LI_MAX(best, *sink);
    memset(out, 0, (size_t)hdv * sizeof(float));
    float total = 0.0f;
    for (int s = 0; s < nchunks; s++) {
        const float *p = part + (size_t)s * chunk_stride;
        if (!(p[1] > 0.0f)) continue;
        const float w = expf(p[0] - best);
        total += w * p[1];
        li_K->axpy_f32(w, p + 2, out, hdv);
    }
    if (sink) total += expf(*sink - best);
    li_K->scale_f32(out, 1.0f / total, hdv);
}

int li_count_spans(const li_context *c, const li_layer_desc *L, const int32_t *blocks, int n_blocks, int pos,
                   int end) {
    const int bs = c->kv.block_size, span = c->span;
    const int first = li_first_visible(L, pos);
    int count = 0, last_span = -1;
    for (int b = first / bs; b <= end / bs; b++) {
        if (b >= n_blocks || blocks[b] < 0) continue;
        const int s = b * bs / span; /* a block lies within one span: span is a multiple of bs */
        if (s != last_span) count++;
        last_span = s;
    }
    return count;
}

/* the positions [*p0, *p1) of the first span holding keys visible at pos
 * (which sees up to end: pos itself, unless the batch is non-causal) */
static void first_span(const li_context *c, const li_layer_desc *L, const int32_t *blocks, int n_blocks, int pos,
                       int end, int *p0, int *p1) {
    const int bs = c->kv.block_size, span = c->span, first = li_first_visible(L, pos);
    int b = first / bs;
    while (b < end / bs && (b >= n_blocks || blocks[b] < 0)) b++;
    const int s = b * bs / span;
    *p0 = LI_MAX(first, s * span);
    *p1 = LI_MIN(end + 1, (s + 1) * span);
}

/* the token's table in layer il's group */
static void token_table(const li_context *c, int il, int64_t t, const int32_t **blocks, int *n_blocks) {
    const li_seq_view *v = &c->views[c->seq[t]];
    *blocks = v->blocks[c->group[il]];
    *n_blocks = v->n_blocks[c->group[il]];
}

/* ---- a tile: consecutive tokens of one sequence at consecutive positions ----
 *
 * The tokens of a tile read each span's cached rows once: the scores of all
 * their query heads against the rows any of them sees, then each token's
 * softmax over its own rows, then the weighted values, shared over the rows
 * all of them see. Each score and each weighted sum is the one attend_span
 * computes for the token alone (the kernels compute every score on its own,
 * and add a value row to a head's sum in position order, in one call or in
 * several), so a token's result does not depend on its tile. */

/* present rows of [a, b) among the runs */
static int64_t present_in(const row_run *runs, int nr, int a, int b) {
    int64_t k = 0;
    for (int i = 0; i < nr; i++) {
        const int lo = LI_MAX(a, runs[i].p), hi = LI_MIN(b, runs[i].p + (int)runs[i].n);
        if (hi > lo) k += hi - lo;
    }
    return k;
}

/* out_h += p_h . the present value rows of [a, b), for nq heads; p's column
 * 0 is the runs' first row */
static void accum_range(li_context *c, int il, int kvh, const row_run *runs, int nr, int a, int b, const float *p,
                        size_t ld, int nq, float *out, size_t out_stride, float *vrow) {
    int64_t off = 0;
    for (int i = 0; i < nr; off += runs[i].n, i++) {
        const int lo = LI_MAX(a, runs[i].p), hi = LI_MIN(b, runs[i].p + (int)runs[i].n);
        if (hi > lo && i + HINT_RUNS < nr && runs[i + HINT_RUNS].p < b)
            hint_run(c, il, kvh, &runs[i + HINT_RUNS], 1);
        if (hi > lo)
            run_accum(c, il, kvh, p + off + (lo - runs[i].p), ld, nq, runs[i].r0 + (lo - runs[i].p), hi - lo, out,
                      out_stride, vrow);
    }
}

static void attend_tile(li_context *c, int il, const li_layer_desc *L, int64_t t0, int ntok, int kvh, int ith) {
    const li_model_desc *m = lm_of(c, il);
    const int nh = m->n_head / m->n_head_kv, g = c->group[il], span = c->span, tmax = c->tile_max;
    const int64_t hd = m->head_dim, hdv = m->head_dim_v;
    const size_t ps = (size_t)hdv + 2, head_stride = (size_t)c->max_chunks * ps;
    if (ntok <= 0) return; /* make_tiles gives none empty; the spans below read token 0 */
    const int32_t *blocks;
    int n_blocks;
    token_table(c, il, t0, &blocks, &n_blocks);
    float *tq = c->tq + (size_t)ith * (size_t)tmax * (size_t)nh * (size_t)hd;
    char *tqq = kv_quantized(c) ? c->tqq + (size_t)ith * (size_t)tmax * (size_t)nh * c->qq_row : NULL;
    float *tout = c->tout + (size_t)ith * (size_t)tmax * (size_t)nh * (size_t)hdv;
    float *scores = c->scores + (size_t)ith * (size_t)tmax * (size_t)nh * (size_t)span;
    float *vrow = c->vrow + (size_t)ith * (size_t)hdv;
    float *tp = c->tparts + (size_t)ith * (size_t)tmax * (size_t)nh * head_stride; /* token i, head h: (i nh + h) */
    /* end: the last position a token sees (its own, or later in a non-causal batch); it rises with pos */
    int first[LI_ATTN_TILE], end[LI_ATTN_TILE], kept[LI_ATTN_TILE], lo[LI_ATTN_TILE], hi[LI_ATTN_TILE];
    int64_t present[LI_ATTN_TILE]; /* token i's present rows in the span */
    float mx[LI_ATTN_TILE * 64], sum[LI_ATTN_TILE * 64]; /* heads per group: checked in li_model_check */
    for (int i = 0; i < ntok; i++) {
        const int64_t t = t0 + i;
        end[i] = li_last_visible(c, L, t);
        first[i] = li_first_visible(L, c->pos[t]);
        kept[i] = 0;
        memcpy(tq + (size_t)i * (size_t)nh * (size_t)hd, c->q + (t * m->n_head + (int64_t)kvh * nh) * hd,
               (size_t)nh * (size_t)hd * sizeof(float));
        if (tqq)
            memcpy(tqq + (size_t)i * (size_t)nh * c->qq_row,
                   (const char *)c->qq + ((size_t)t * (size_t)m->n_head + (size_t)kvh * (size_t)nh) * c->qq_row,
                   (size_t)nh * c->qq_row);
    }
    for (int s = first[0] / span; s <= end[ntok - 1] / span; s++) {
        int ia = ntok, ib = -1; /* the tokens that see span s: positions rise, so a range */
        for (int i = 0; i < ntok; i++)
            if (first[i] / span <= s && s <= end[i] / span) {
                ia = LI_MIN(ia, i);
                ib = i;
            }
        if (ib < 0) continue;
        for (int i = ia; i <= ib; i++) {
            lo[i] = LI_MAX(first[i], s * span);
            hi[i] = LI_MIN(end[i] + 1, (s + 1) * span);
        }
        row_run runs[LI_ATTN_SPAN + 1];
        const int nr = span_runs(c, blocks, n_blocks, lo[ia], hi[ib], runs);
        const int64_t n = present_in(runs, nr, lo[ia], hi[ib]);
        if (n == 0) continue;
        const int nq = (ib - ia + 1) * nh;
        const size_t ld = (size_t)n;
        hint_runs(c, il, kvh, runs, nr, 0, HINT_RUNS, 0);
        for (int r = 0, off = 0; r < nr; off += (int)runs[r].n, r++) {
            hint_runs(c, il, kvh, runs, nr, r + HINT_RUNS, r + HINT_RUNS + 1, 0);
            run_scores(c, il, kvh, tq + (size_t)ia * (size_t)nh * (size_t)hd,
                       tqq ? tqq + (size_t)ia * (size_t)nh * c->qq_row : NULL, nq, runs[r].r0, runs[r].n, scores + off,
                       ld);
        }
        hint_runs(c, il, kvh, runs, nr, 0, HINT_RUNS, 1);
        for (int i = ia; i <= ib; i++) {
            const int64_t off = present_in(runs, nr, lo[ia], lo[i]);
            present[i] = present_in(runs, nr, lo[i], hi[i]);
            if (present[i] == 0) continue;
            const int single = c->n_spans[(t0 + i) * 2 + g] <= 1;
            for (int h = 0; h < nh; h++)
                softmax_row(c, scores + ((size_t)(i - ia) * (size_t)nh + (size_t)h) * ld + (size_t)off, present[i],
                            single, sink_of(L, (int64_t)kvh * nh + h), &mx[i * nh + h], &sum[i * nh + h]);
        }
        memset(tout, 0, (size_t)nq * (size_t)hdv * sizeof(float));
        const int c0 = lo[ib], c1 = hi[ia]; /* the rows every token of the range sees */
        for (int i = ia; i <= ib; i++) {
            const float *p = scores + (size_t)(i - ia) * (size_t)nh * ld;
            float *o = tout + (size_t)(i - ia) * (size_t)nh * (size_t)hdv;
            accum_range(c, il, kvh, runs, nr, lo[i], c0 < c1 ? c0 : hi[i], p, ld, nh, o, (size_t)hdv, vrow);
        }
        if (c0 < c1) {
            accum_range(c, il, kvh, runs, nr, c0, c1, scores, ld, nq, tout, (size_t)hdv, vrow);
            for (int i = ia; i <= ib; i++)
                accum_range(c, il, kvh, runs, nr, c1, hi[i], scores + (size_t)(i - ia) * (size_t)nh * ld, ld, nh,
                            tout + (size_t)(i - ia) * (size_t)nh * (size_t)hdv, (size_t)hdv, vrow);
        }
        for (int i = ia; i <= ib; i++) {
            if (present[i] == 0) continue;
            const float *o = tout + (size_t)(i - ia) * (size_t)nh * (size_t)hdv;
            if (c->n_spans[(t0 + i) * 2 + g] <= 1) {
                memcpy(c->att + ((t0 + i) * m->n_head + (int64_t)kvh * nh) * hdv, o,
                       (size_t)nh * (size_t)hdv * sizeof(float));
                continue;
            }
            if (!(sum[i * nh] > 0.0f)) continue; /* as token_spans keeps a span */
            for (int h = 0; h < nh; h++) {
                float *part = tp + (size_t)(i * nh + h) * head_stride + (size_t)kept[i] * ps;
                part[0] = mx[i * nh + h];
                part[1] = sum[i * nh + h];
                memcpy(part + 2, o + (size_t)h * (size_t)hdv, (size_t)hdv * sizeof(float));
            }
            kept[i]++;
        }
    }
    for (int i = 0; i < ntok; i++) {
        if (c->n_spans[(t0 + i) * 2 + g] <= 1) continue;
        for (int h = 0; h < nh; h++)
            combine_spans(tp + (size_t)(i * nh + h) * head_stride, ps, kept[i], hdv, sink_of(L, (int64_t)kvh * nh + h),
                          c->att + ((t0 + i) * m->n_head + (int64_t)kvh * nh + h) * hdv);
    }
}

/* the span items of token t in split mode: 1 when its keys lie in one span
 * (group g's count), else every span of its range */
static int64_t split_spans(const li_context *c, const li_layer_desc *L, int64_t t, int g) {
    if (c->n_spans[t * 2 + g] <= 1) return 1;
    return li_last_visible(c, L, t) / c->span - li_first_visible(L, c->pos[t]) / c->span + 1;
}

/* A thread's run of split mode's items (token, kv head, span, query head),
 * those that compute something: a token whose keys lie in one span has one
 * span item, another has every span of its range, empty or not. Each thread
 * takes a contiguous run of items (li_split), and the heads of one (token,
 * kv head, span) in its run come as one. */
typedef struct {
    int64_t i, hi;            /* the run's next item and its end */
    int64_t t, base, per_tok; /* the token of item i, its first item and its count */
} split_walk;

/* one step of a split_walk: query heads [h0, h0 + cnt) of kv head kvh of
 * token t, over the positions [p0, p1) of its span s_idx (of its range), or
 * all it sees when `single` */
typedef struct {
    int64_t t;
    int kvh, h0, cnt, s_idx, single, p0, p1;
    const int32_t *blocks;
    int n_blocks;
} split_item;

/* The positions [*p0, *p1) that span item s_idx of token t covers (blocks:
 * the token's table): the one span first_span finds for a token whose keys
 * lie in one span, else span s_idx of its range. Returns whether the token's
 * keys lie in one span. */
static int split_item_span(const li_context *c, const li_layer_desc *L, int il, int64_t t, const int32_t *blocks,
                           int n_blocks, int s_idx, int *p0, int *p1) {
    const int pos = c->pos[t], end = li_last_visible(c, L, t);
    if (c->n_spans[t * 2 + c->group[il]] <= 1) {
        first_span(c, L, blocks, n_blocks, pos, end, p0, p1);
        return 1;
    }
    const int first = li_first_visible(L, pos), s = first / c->span + s_idx;
    *p0 = LI_MAX(first, s * c->span);
    *p1 = LI_MIN(end + 1, (s + 1) * c->span);
    return 0;
}

/* The positions span item s_idx of token t covers, plus SPLIT_ITEM_COST for
 * the item's own setup: what it costs. */
#define SPLIT_ITEM_COST 8
static int64_t split_item_cost(const li_context *c, const li_layer_desc *L, int il, int64_t t, int s_idx) {
    const int32_t *blocks;
    int n_blocks, p0, p1;
    token_table(c, il, t, &blocks, &n_blocks);
    (void)split_item_span(c, L, il, t, blocks, n_blocks, s_idx, &p0, &p1);
    return LI_MAX(0, p1 - p0) + SPLIT_ITEM_COST;
}

/* The first item whose middle (the cost of the items before it and half its
 * own) is at or past `at`, or the items' count when none is. Items are
 * (token, kv head, span, query head) in that order, an item costs what its
 * span does (split_item_cost), and costs[t] is all of token t's items. */
static int64_t split_item_at(const li_context *c, const li_layer_desc *L, int il, int64_t n, const int64_t *costs,
                             int64_t at) {
    const li_model_desc *m = lm_of(c, il);
    const int nh = m->n_head / m->n_head_kv, g = c->group[il];
    int64_t before = 0, base = 0;
    for (int64_t t = 0; t < n; t++) {
        const int64_t spans = split_spans(c, L, t, g);
        if (before + costs[t] <= at) { /* the whole token before at */
            before += costs[t];
            base += (int64_t)m->n_head * spans;
            continue;
        }
        for (int64_t r = 0; r < (int64_t)m->n_head * spans; r++) {
            const int64_t cost = split_item_cost(c, L, il, t, (int)(r / nh % spans));
            if (2 * before + cost >= 2 * at) return base + r; /* its middle at or past at */
            before += cost;
        }
        base += (int64_t)m->n_head * spans;
    }
    return base;
}

/* Each thread takes a contiguous run of the items, the runs as near equal
 * in cost as whole items allow; which thread computes an item changes
 * nothing in what it computes. Runs of equal counts gave one thread more
 * full spans and the other more short last ones, and the first to finish
 * waited at the barrier (docs/kernel-tuning.md#attention-split-by-cost). */
static void split_walk_begin(const li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth,
                             split_walk *w) {
    const int g = c->group[il];
    int64_t total = 0;
    for (int64_t t = 0; t < n; t++) total += (int64_t)c->m->n_head * split_spans(c, L, t, g);
    if (nth > 1 && n <= LI_ATTN_SPLIT_TOKENS) {
        int64_t costs[LI_ATTN_SPLIT_TOKENS], all = 0;
        for (int64_t t = 0; t < n; t++) {
            const int64_t spans = split_spans(c, L, t, g);
            costs[t] = 0;
            for (int64_t s = 0; s < spans; s++) costs[t] += split_item_cost(c, L, il, t, (int)s);
            costs[t] *= c->m->n_head;
            all += costs[t];
        }
        w->i = split_item_at(c, L, il, n, costs, all * ith / nth);
        w->hi = ith == nth - 1 ? total : split_item_at(c, L, il, n, costs, all * (ith + 1) / nth);
    } else {
        li_split(total, ith, nth, &w->i, &w->hi);
    }
    w->t = 0;
    w->base = 0;
    w->per_tok = (int64_t)c->m->n_head * split_spans(c, L, 0, g);
}

static int split_walk_next(const li_context *c, const li_layer_desc *L, int il, split_walk *w, split_item *it) {
    const li_model_desc *m = lm_of(c, il);
    const int nh = m->n_head / m->n_head_kv, g = c->group[il];
    if (w->i >= w->hi) return 0;
    while (w->i >= w->base + w->per_tok) {
        w->base += w->per_tok;
        w->t++;
        w->per_tok = (int64_t)m->n_head * split_spans(c, L, w->t, g);
    }
    const int64_t spans = w->per_tok / m->n_head, r = w->i - w->base; /* r: (kv head, span index, head) */
    it->t = w->t;
    it->kvh = (int)(r / (spans * nh));
    it->s_idx = (int)(r / nh % spans);
    it->h0 = (int)(r % nh);
    it->cnt = (int)LI_MIN((int64_t)(nh - it->h0), w->hi - w->i);
    w->i += it->cnt;
    token_table(c, il, it->t, &it->blocks, &it->n_blocks);
    it->single = split_item_span(c, L, il, it->t, it->blocks, it->n_blocks, it->s_idx, &it->p0, &it->p1);
    return 1;
}

/* Hints into L2 the cached rows (keys and values) that li_attention's split
 * mode (a decoded token) will read in this thread, its own row too, which
 * li_prepare_head writes: up to PREFETCH_MAX bytes, from the first. Called
 * as the thread ends its share of the q, k and v products, the rows arrive
 * while the team passes the barrier and prepares the heads; without it,
 * attention read them from memory a few rows ahead at a time, the weights'
 * stream having pushed them out of every cache
 * (docs/kernel-tuning.md#attention-prefetch). */
#define PREFETCH_MAX ((size_t)96 << 10)
void li_attention_prefetch(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth) {
    if (!c->split) return;
    const int64_t kv_heads = lm_of(c, il)->n_head_kv;
    size_t budget = PREFETCH_MAX;
    split_walk w;
    split_item it;
    split_walk_begin(c, L, il, n, ith, nth, &w);
    while (budget > 0 && split_walk_next(c, L, il, &w, &it)) {
        row_run runs[LI_ATTN_SPAN + 1];
        const int nr = span_runs(c, it.blocks, it.n_blocks, it.p0, it.p1, runs);
        for (int k = 0; k < nr && budget > 0; k++)
            for (int v = 0; v < 2; v++) {
                const size_t row = v ? c->v_rows[il] : c->k_rows[il], stride = (size_t)kv_heads * row;
                const char *p = v ? v_at(c, il, runs[k].r0, it.kvh) : k_at(c, il, runs[k].r0, it.kvh);
                for (int64_t j = 0; j < runs[k].n && budget > 0; j++, p += stride, budget -= LI_MIN(budget, row))
                    for (size_t b = 0; b < row; b += 64) li_hint_l2(p + b);
            }
    }
}

void li_attention(li_context *c, const li_layer_desc *L, int il, int64_t n, int ith, int nth) {
    const li_model_desc *m = lm_of(c, il);
    const int nh = m->n_head / m->n_head_kv, g = c->group[il];
    const int64_t hdv = m->head_dim_v;
    const size_t ps = (size_t)hdv + 2;
    if (!c->split) {
        /* one item per (tile, kv head), dealt round-robin: later tiles see more */
        (void)n;
        const int64_t items = (int64_t)c->n_tiles * m->n_head_kv;
        for (int64_t i = ith; i < items; i += nth) {
            const int tile = (int)(i / m->n_head_kv);
            attend_tile(c, il, L, c->tile0[tile], c->tile0[tile + 1] - c->tile0[tile], (int)(i % m->n_head_kv), ith);
        }
        return;
    }
    /* split: split_walk's items. Dealing whole kv heads round-robin left a
     * thread idle: a decoded token short of 256 positions has n_head_kv items
     * (1 in Gemma 3, 3 in SmolLM2), which all fell to thread 0 when
     * max_chunks was even. The parts of head h of token t are at
     * parts + ((t * n_head + h) * max_chunks + span index) * ps */
    const size_t head_stride = (size_t)c->max_chunks * ps;
    int combine = 0; /* whether some token's spans are combined below */
    for (int64_t t = 0; t < n; t++) combine |= c->n_spans[t * 2 + g] > 1;
    split_walk w;
    split_item it;
    split_walk_begin(c, L, il, n, ith, nth, &w);
    while (split_walk_next(c, L, il, &w, &it)) {
        float *part = it.single ? NULL
                                : c->parts + ((size_t)it.t * (size_t)m->n_head + (size_t)it.kvh * (size_t)nh +
                                              (size_t)it.h0) * head_stride + (size_t)it.s_idx * ps;
        attend_span(c, il, it.t, it.kvh, it.h0, it.cnt, it.blocks, it.n_blocks, it.p0, it.p1, part,
                    it.single ? 0 : head_stride, ith);
    }
    if (!combine) return; /* the same for every thread: the barrier is everyone's or no one's */
    li_share_sync(c->share);
    int64_t lo, hi;
    li_split(n * m->n_head, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const int64_t t = i / m->n_head;
        if (c->n_spans[t * 2 + g] <= 1) continue;
        const int first = li_first_visible(L, c->pos[t]);
        const int spans = li_last_visible(c, L, t) / c->span - first / c->span + 1;
        combine_spans(c->parts + (size_t)i * head_stride, ps, spans, hdv, sink_of(L, i % m->n_head), c->att + i * hdv);
    }
}
