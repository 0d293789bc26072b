/* context.c: a context, what a model's passes run in (context.h): its KV
 * pools, its recurrent-state pool and the scratch for a batch, sized once
 * when it is created for the model, the batch size and the thread count;
 * the KV blocks' copy, read and write, and the state slots'.
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

static void *alloc_aligned(size_t size) { return li_alloc_aligned(size, 64); }
#define free_aligned li_free_aligned

/* ---- context ---- */

void li_context_free(li_context *c) {
    if (!c) return;
    if (c->be) c->be_ops->destroy(c->be);
    for (int il = 0; il < c->m->n_layer; il++) {
        if (c->k_pool) free_aligned(c->k_pool[il]);
        if (c->v_pool) free_aligned(c->v_pool[il]);
    }
    free(c->k_pool);
    free(c->v_pool);
    free(c->group);
    free(c->kv_src);
    free(c->k_rows);
    free(c->v_rows);
    free(c->lm);
    float *bufs[] = {c->x, c->xb /* att and o too */, c->q, c->k, c->v, c->g, c->u, c->scores, c->vrow, c->parts,
                     c->tparts, c->rope_cs, c->route, c->eo, c->wsel, c->tq, c->tout, c->pe_raw, c->pe_in,
                     c->pe_g, c->pe_row, c->gu};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free_aligned(bufs[i]);
    for (int a = 0; a < LI_ACT_COUNT; a++) {
        free_aligned(c->xq[a]);
        free_aligned(c->xd[a]);
        free_aligned(c->xe[a]);
    }
    free(c->sel);
    free(c->slot);
    free(c->slot_tok);
    free(c->e_off);
    free_aligned(c->qq);
    free_aligned(c->tqq);
    free(c->tile0);
    free_aligned(c->gemm_scratch);
    free_aligned(c->embd_rows);
    free_aligned(c->own);
    li_share_free(c->share);
    free(c->pos);
    free(c->vis);
    for (int g = 0; g < LI_KV_GROUPS; g++) free(c->kv_row[g]);
    free(c->out_rows);
    free(c->logit_part);
    free(c->n_spans);
    free(c->layer_rope);
    float *rbufs[] = {c->state, c->r_in, c->r_z, c->r_ab, c->r_conv, c->r_out, c->qg, c->gate,
                      c->sg, c->su, c->so, c->sgate};
    for (size_t i = 0; i < sizeof(rbufs) / sizeof(rbufs[0]); i++) free_aligned(rbufs[i]);
    free(c->state_off);
    free(c->seq_rows);
    free(c->seq_off);
    free(c->slot_mark);
    li_lora_free(c);
    free(c);
}

/* the prefill scratch a thread needs for w: its panels or its repacked terms */
static void need_scratch(li_context *c, const li_matrix *w) {
    const size_t g = LI_MAX(li_gemm_scratch_bytes(w->type, w->k, c->n_batch),
                            li_x16_scratch_ints(w->type, w->k, c->n_batch) * sizeof(int32_t));
    if (g > c->gemm_bytes) c->gemm_bytes = (g + 63) / 64 * 64;
}

/* note which activation formats the model's projections need, how wide, and
 * how much prefill scratch each thread needs */
static void need_act(li_context *c, const li_matrix *w) {
    const int a = li_types[w->type].act_type;
    const size_t row = li_act_row_bytes(a, w->k);
    if (row > c->xq_row[a]) c->xq_row[a] = row;
    need_scratch(c, w);
}

/* the same for an expert tensor: one expert's rows are [rows / n_expert, k],
 * and its activations are gathered per expert into xe (rows for k wide) */
static void need_expert_act(li_context *c, const li_matrix *w) {
    const int a = li_types[w->type].act_type;
    const size_t row = li_act_row_bytes(a, w->k);
    if (row > c->xe_row[a]) c->xe_row[a] = row;
    need_scratch(c, w);
}

/* The layout of one thread's region of c->own: x, xb, then xq in each
 * format, each on cache lines of its own. With r, fills it for thread ith
 * from the region at base (thread 0's x is c->x itself, which the head and
 * probes read); returns the region's size, which li_context_create
 * allocates for every thread by this same walk. */
size_t li_own_layout(const li_context *c, char *base, int ith, own_row *r) {
    const size_t e = ((size_t)c->m->n_embd * sizeof(float) + 63) / 64 * 64;
    if (r) {
        r->x = ith == 0 ? c->x : (float *)(void *)base;
        r->xb = (float *)(void *)(base + e);
    }
    size_t at = 2 * e;
    for (int a = 0; a < LI_ACT_COUNT; a++) {
        if (r) r->xq[a] = c->xq_row[a] ? base + at : NULL;
        at += (c->xq_row[a] + 63) / 64 * 64;
    }
    return at;
}

/* one RoPE table per distinct (base, scale, dims, divisors); s is the layer's view of the model */
static int rope_table(li_context *c, float keys[][2], const li_layer_desc *ly, const li_model_desc *s) {
    for (int t = 0; t < c->n_rope; t++)
        if (keys[t][0] == ly->rope_base && keys[t][1] == ly->rope_scale && c->rope_n_rot[t] == s->n_rot &&
            c->rope[t].factors == s->rope_factors)
            return t;
    if (c->n_rope == MAX_ROPE_TABLES) return -1;
    const int t = c->n_rope++;
    keys[t][0] = ly->rope_base;
    keys[t][1] = ly->rope_scale;
    c->rope_n_rot[t] = s->n_rot;
    li_rope_params_init(&c->rope[t], s->n_rot, ly->rope_base, ly->rope_scale, s->rope_factors);
    const int sect[4] = {s->rope_sect_t, s->rope_sect_h, s->rope_sect_w, s->rope_sect_e};
    li_rope_set_sections(&c->rope[t], sect, s->rope_sect_interleave);
    return t;
}

/* the state pool and the scratch of the recurrent mixers and gated attention */
static int make_recurrent(li_context *c, const li_model_desc *m, const li_kv_config *kv, size_t nb) {
    int gated = 0;
    c->state_off = calloc((size_t)m->n_layer, sizeof(size_t));
    if (!c->state_off) return LI_E_NOMEM;
    int64_t in_ld = 0, out_ld = 0;
    for (int il = 0; il < m->n_layer; il++) {
        const li_layer_desc *L = &m->layers[il];
        int64_t in_rows, channels, state;
        li_mixer_sizes(m, L, &in_rows, &channels, &state);
        c->state_off[il] = c->slot_floats;
        c->slot_floats += (size_t)state;
        in_ld = LI_MAX(in_ld, in_rows);
        if (L->mixer == LI_MIX_GDN || L->mixer == LI_MIX_MAMBA2) out_ld = LI_MAX(out_ld, (int64_t)m->ssm_d_inner);
        if (L->mixer == LI_MIX_SHORTCONV) out_ld = LI_MAX(out_ld, (int64_t)m->n_embd);
        gated |= L->mixer == LI_MIX_ATTN && L->attn_out_gate;
    }
    const size_t nq = (size_t)m->n_head * (size_t)m->head_dim;
    if (gated) {
        c->qg = alloc_aligned(nb * 2 * nq * sizeof(float));
        c->gate = alloc_aligned(nb * nq * sizeof(float));
        if (!c->qg || !c->gate) return LI_E_NOMEM;
    }
    c->seq_rows = malloc(nb * sizeof(int32_t));
    if (!c->seq_rows) return LI_E_NOMEM;
    if (c->slot_floats == 0) return LI_OK;
    c->r_in_ld = in_ld;
    c->r_out_ld = out_ld;
    const size_t H = (size_t)LI_MAX(m->ssm_n_head, 1), DI = (size_t)LI_MAX(m->ssm_d_inner, 1);
    c->state = alloc_aligned((size_t)kv->n_state_slots * c->slot_floats * sizeof(float));
    c->r_in = alloc_aligned(nb * (size_t)in_ld * sizeof(float));
    c->r_conv = alloc_aligned(nb * (size_t)in_ld * sizeof(float));
    c->r_out = alloc_aligned(nb * (size_t)out_ld * sizeof(float));
    c->r_z = alloc_aligned(nb * DI * sizeof(float));
    c->r_ab = alloc_aligned(nb * 2 * H * sizeof(float));
    c->slot_mark = calloc((size_t)kv->n_state_slots, 1);
    /* the pool's pages are touched as slots are cleared for their sequences (li_state_clear) */
    if (!c->state || !c->r_in || !c->r_conv || !c->r_out || !c->r_z || !c->r_ab || !c->slot_mark) return LI_E_NOMEM;
    return LI_OK;
}

int li_context_create(const li_model_desc *m, const li_kv_config *kv, int n_batch, int max_threads,
                      li_context **out) {
    return li_context_create_offload(m, kv, n_batch, max_threads, NULL, 0, 0, 0, out);
}

int li_context_create_offload(const li_model_desc *m, const li_kv_config *kv, int n_batch, int max_threads,
                              const li_backend_ops *ops, int n_be_layers, int be_output, int device,
                              li_context **out) {
    li_init();
    if (!out || !kv) return li_fail(LI_E_ARG, "no output pointer or no KV configuration");
    *out = NULL;
    CHECK(li_model_check(m));
    if (!ops) n_be_layers = be_output = 0;
    if (n_be_layers < 0 || n_be_layers > m->n_layer || (be_output && n_be_layers != m->n_layer))
        return li_fail(LI_E_ARG, "a backend takes layers [0, %d) of %d%s: the head only goes with every layer",
                       n_be_layers, m->n_layer, be_output ? " and the head" : "");
    if (n_be_layers > 0 && ops->abi != LI_BACKEND_ABI)
        return li_fail(LI_E_DEVICE, "the %s backend was built for interface %d, this core has %d: rebuild both",
                       ops->name ? ops->name : "GPU", ops->abi, LI_BACKEND_ABI);
    if (n_batch <= 0 || max_threads <= 0)
        return li_fail(LI_E_ARG, "n_batch %d and max_threads %d must be positive", n_batch, max_threads);
    if (!li_kv_type_ok(kv->kv_type))
        return li_fail(LI_E_TYPE, "KV cache type %s is not one of f32, f16, q8_0, q4_0", li_type_name(kv->kv_type));
    for (int il = 0; il < m->n_layer; il++) {
        li_model_desc s;
        li_layer_view(m, &m->layers[il], &s);
        if (kv->kv_type != LI_TYPE_F32 && kv->kv_type != LI_TYPE_F16 && (s.head_dim % 32 || s.head_dim_v % 32))
            return li_fail(LI_E_SHAPE, "a %s KV cache needs head sizes that are multiples of 32, not %d and %d",
                           li_type_name(kv->kv_type), s.head_dim, s.head_dim_v);
    }
    if (kv->block_size < 1 || kv->block_size > 1024 || (kv->block_size & (kv->block_size - 1)))
        return li_fail(LI_E_ARG, "KV block size %d is not a power of two from 1 to 1024", kv->block_size);
    for (int g = 0; g < LI_KV_GROUPS; g++)
        if (kv->n_blocks[g] < 0 || (int64_t)kv->n_blocks[g] * kv->block_size > INT32_MAX)
            return li_fail(LI_E_ARG, "KV pool %d of %d blocks is out of range", g, kv->n_blocks[g]);
    for (int il = 0; il < m->n_layer; il++)
        if (li_layer_kv_group(m, il) < LI_KV_GROUPS && kv->n_blocks[li_layer_kv_group(m, il)] == 0)
            return li_fail(LI_E_ARG, "layer %d's KV pool (%s) has no blocks", il,
                           li_layer_kv_group(m, il) == LI_KV_SWA ? "sliding-window" : "full");
    if (kv->n_state_slots < 0 || kv->n_state_slots > (1 << 20) || (li_has_recurrent(m) && kv->n_state_slots == 0))
        return li_fail(LI_E_ARG, "%d state slots: a model with recurrent layers needs 1 to %d", kv->n_state_slots,
                       1 << 20);
    for (int il = 0; il < n_be_layers; il++)
        if (m->layers[il].mixer != LI_MIX_ATTN || m->layers[il].attn_out_gate || m->layers[il].gate_shexp.data ||
            (!m->layers[il].w_gate.data && !m->layers[il].router.data))
            return li_fail(LI_E_DEVICE, "layer %d is a hybrid model's layer (recurrent, gated attention, a shared "
                           "expert or an ungated feed-forward), which the GPU backend does not run; keep it on the "
                           "CPU (fewer GPU layers)", il);
    if (n_be_layers > 0 && m->n_embd_pe > 0)
        return li_fail(LI_E_DEVICE, "the model has per-layer embeddings (Gemma 4's E models), which the GPU backend "
                       "does not run; keep every layer on the CPU");
    for (int il = 0; il < n_be_layers; il++) {
        const li_layer_desc *ly = &m->layers[il];
        if (li_own_sizes(ly) || ly->v_norm || ly->kv_reuse || ly->out_scale != 0.0f || ly->router_in_scale ||
            ly->gate_up_exps.data || ly->down_exps_s)
            return li_fail(LI_E_DEVICE, "layer %d has attention sizes of its own, value norms, another layer's keys "
                           "and values or an output scale (Gemma 4), which the GPU backend does not run; keep it on "
                           "the CPU (fewer GPU layers)", il);
        if (ly->attn_sinks || ly->bo || ly->router_b || ly->gate_exps_b || ly->up_exps_b || ly->down_exps_b ||
            ly->router_sel_b ||
            m->gate_fn == LI_FN_SWIGLU_OAI || (ly->router.data && m->expert_gating != LI_GATING_SOFTMAX))
            return li_fail(LI_E_DEVICE, "layer %d has attention sinks, output or expert biases, the clamped SwiGLU "
                           "or top-k-then-softmax routing (gpt-oss), which the GPU backend does not run; keep it "
                           "on the CPU (fewer GPU layers)", il);
    }

    li_context *c = calloc(1, sizeof(*c));
    if (!c) return li_fail(LI_E_NOMEM, "no memory for a context");
    c->m = m;
    c->tuning = (li_tuning){li_stream_hint_current(), LI_PLACEMENT_PROBE};
    c->kv = *kv;
    c->n_batch = n_batch;
    c->max_threads = max_threads;
    c->span = LI_MAX(LI_ATTN_SPAN, kv->block_size);
    {
        int64_t most = 0; /* positions of the largest pool: a token sees no more keys */
        for (int g = 0; g < LI_KV_GROUPS; g++) most = LI_MAX(most, (int64_t)kv->n_blocks[g] * kv->block_size);
        c->max_chunks = (int)((most + c->span - 1) / c->span) + 1;
    }

    const int L = m->n_layer;
    const size_t nb = (size_t)n_batch, nth = (size_t)max_threads;
    c->k_pool = calloc((size_t)L, sizeof(char *));
    c->v_pool = calloc((size_t)L, sizeof(char *));
    c->group = calloc((size_t)L, sizeof(int));
    c->layer_rope = calloc((size_t)L, sizeof(int));
    c->kv_src = calloc((size_t)L, sizeof(int));
    c->k_rows = calloc((size_t)L, sizeof(size_t));
    c->v_rows = calloc((size_t)L, sizeof(size_t));
    c->lm = calloc((size_t)L, sizeof(li_model_desc));
    float rope_keys[MAX_ROPE_TABLES][2];
    if (!c->k_pool || !c->v_pool || !c->group || !c->layer_rope || !c->kv_src || !c->k_rows || !c->v_rows || !c->lm)
        goto nomem;
    /* the largest of the layers' sizes, for the scratch */
    size_t hd_max = 0, hdv_max = 0, nk_max = 0, nv_max = 0, nh = 1, ff_max = 0;
    int gu_fused = 0;

    for (int il = 0; il < L; il++) {
        const li_layer_desc *ly = &m->layers[il];
        li_model_desc *s = &c->lm[il];
        li_layer_view(m, ly, s);
        hd_max = LI_MAX(hd_max, (size_t)s->head_dim);
        hdv_max = LI_MAX(hdv_max, (size_t)s->head_dim_v);
        nk_max = LI_MAX(nk_max, (size_t)s->n_head_kv * (size_t)s->head_dim);
        nv_max = LI_MAX(nv_max, (size_t)s->n_head_kv * (size_t)s->head_dim_v);
        nh = LI_MAX(nh, (size_t)(m->n_head / s->n_head_kv));
        ff_max = LI_MAX(ff_max, (size_t)s->n_ff);
        c->n_rot_max = LI_MAX(c->n_rot_max, s->n_rot);
        c->no_own |= ly->out_scale != 0.0f || m->n_embd_pe > 0 || m->n_deepstack > 0;
        c->group[il] = li_layer_kv_group(m, il);
        c->kv_src[il] = il - ly->kv_reuse;
        c->k_rows[il] = li_row_bytes(kv->kv_type, s->head_dim);
        c->v_rows[il] = li_row_bytes(kv->kv_type, s->head_dim_v);
        /* pages are only touched as blocks are used, so resident memory grows with the text */
        const size_t rows = c->group[il] == LI_KV_GROUPS || ly->kv_reuse > 0 ? 0 :
                            (size_t)kv->n_blocks[c->group[il]] * (size_t)kv->block_size * (size_t)s->n_head_kv;
        if (il >= n_be_layers && rows > 0) { /* a backend's layers keep their keys and values in its memory */
            c->k_pool[il] = alloc_aligned(rows * c->k_rows[il]);
            c->v_pool[il] = alloc_aligned(rows * c->v_rows[il]);
            if (!c->k_pool[il] || !c->v_pool[il]) goto nomem;
        }
        c->layer_rope[il] = rope_table(c, rope_keys, ly, s);
        if (c->layer_rope[il] < 0) {
            li_context_free(c);
            return li_fail(LI_E_ARG, "more than %d distinct RoPE settings", MAX_ROPE_TABLES);
        }
        const li_matrix *ws[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        const li_matrix *moe[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->router, &ly->gate_exps, &ly->up_exps};
        const int is_moe = ly->router.data != NULL;
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
            if ((is_moe ? moe[i] : ws[i])->data) need_act(c, is_moe ? moe[i] : ws[i]);
        const li_matrix *rs[] = {&ly->ssm_in,     &ly->ssm_z,     &ly->ssm_beta,  &ly->ssm_alpha,
                                 &ly->ssm_out,    &ly->gate_shexp, &ly->up_shexp, &ly->down_shexp};
        for (size_t i = 0; i < sizeof(rs) / sizeof(rs[0]); i++)
            if (rs[i]->data) need_act(c, rs[i]);
        if (is_moe) {
            /* gate/up read the token rows of xq (gathered), down reads rows of n_ff_exp */
            const li_matrix *ex[] = {&ly->gate_exps, &ly->up_exps, &ly->down_exps, &ly->gate_up_exps};
            for (size_t i = 0; i < sizeof(ex) / sizeof(ex[0]); i++)
                if (ex[i]->data) need_expert_act(c, ex[i]);
            if (ly->gate_up_exps.data) {
                need_act(c, &ly->gate_up_exps);
                gu_fused = 1;
            }
        }
        if (ly->pe_gate.data) {
            need_act(c, &ly->pe_gate);
            need_act(c, &ly->pe_proj);
        }
    }
    need_act(c, &m->output);
    if (m->n_embd_pe > 0) need_act(c, &m->pe_model_proj);

    const size_t ps = hdv_max + 2;
    c->x = alloc_aligned(nb * (size_t)m->n_embd * sizeof(float));
    /* xb, att and o share one buffer: a layer's normed input is spent (quantized
     * into xq) before attention writes att, att is spent before Wo writes o, and
     * o is spent (added to x) row by row by the thread that next writes those
     * rows of xb; the output norm comes after a barrier */
    const size_t h_row = LI_MAX((size_t)m->n_embd, (size_t)m->n_head * hdv_max);
    c->xb = alloc_aligned(nb * h_row * sizeof(float));
    c->att = c->xb;
    c->o = c->xb;
    c->q = alloc_aligned(nb * (size_t)m->n_head * hd_max * sizeof(float));
    c->k = alloc_aligned(nb * nk_max * sizeof(float));
    c->v = alloc_aligned(nb * nv_max * sizeof(float));
    if (m->n_embd_pe > 0) {
        const size_t P = (size_t)m->n_embd_pe, NP = (size_t)L * P;
        c->pe_raw = alloc_aligned(nb * NP * sizeof(float));
        c->pe_in = alloc_aligned(nb * NP * sizeof(float));
        c->pe_g = alloc_aligned(nb * P * sizeof(float));
        c->pe_row = alloc_aligned(nth * NP * sizeof(float));
        if (!c->pe_raw || !c->pe_in || !c->pe_g || !c->pe_row) goto nomem;
    }
    /* g and u hold [LI_FFN_CHUNK, n_ff] for a dense layer, [n_batch * n_expert_used, n_ff_exp] for a MoE one */
    const size_t gu = LI_MAX(LI_MIN(nb, (size_t)LI_FFN_CHUNK) * ff_max,
                             nb * (size_t)m->n_expert_used * (size_t)m->n_ff_exp);
    c->g = alloc_aligned(gu * sizeof(float));
    c->u = alloc_aligned(gu * sizeof(float));
    if (m->n_expert > 0) {
        const size_t slots = nb * (size_t)m->n_expert_used;
        c->route = alloc_aligned(nb * (size_t)m->n_expert * sizeof(float));
        c->eo = alloc_aligned(slots * (size_t)m->n_embd * sizeof(float));
        c->wsel = alloc_aligned(slots * sizeof(float));
        c->sel = malloc(slots * sizeof(int32_t));
        c->slot = malloc(slots * sizeof(int32_t));
        c->slot_tok = malloc(slots * sizeof(int32_t));
        c->e_off = malloc(((size_t)m->n_expert + 1) * sizeof(int32_t));
        if (!c->route || !c->eo || !c->wsel || !c->sel || !c->slot || !c->slot_tok || !c->e_off) goto nomem;
        if (gu_fused) {
            c->gu = alloc_aligned(slots * 2 * (size_t)m->n_ff_exp * sizeof(float));
            if (!c->gu) goto nomem;
        }
        if (m->n_ff_shexp > 0) {
            const size_t chunk = LI_MIN(nb, (size_t)LI_FFN_CHUNK) * (size_t)m->n_ff_shexp;
            c->sg = alloc_aligned(chunk * sizeof(float));
            c->su = alloc_aligned(chunk * sizeof(float));
            c->so = alloc_aligned(nb * (size_t)m->n_embd * sizeof(float));
            c->sgate = alloc_aligned(nb * sizeof(float));
            if (!c->sg || !c->su || !c->so || !c->sgate) goto nomem;
        }
        for (int a = 0; a < LI_ACT_COUNT; a++) {
            if (c->xe_row[a] == 0) continue;
            c->xe[a] = alloc_aligned(slots * c->xe_row[a]);
            if (!c->xe[a]) goto nomem;
        }
    }
    {
        /* a tile's parts are its tokens' spans; keep them to a few MiB a thread */
        const size_t token_parts = nh * (size_t)c->max_chunks * ps * sizeof(float);
        c->tile_max = LI_MAX(1, LI_MIN(LI_ATTN_TILE, LI_ATTN_TILE_QUERIES / (int)nh));
        c->tile_max = LI_MAX(1, LI_MIN(c->tile_max, (int)((size_t)(4 << 20) / token_parts)));
    }
    const size_t tmax = (size_t)c->tile_max;
    c->scores = alloc_aligned(nth * tmax * nh * (size_t)c->span * sizeof(float));
    c->tq = alloc_aligned(nth * tmax * nh * hd_max * sizeof(float));
    c->tout = alloc_aligned(nth * tmax * nh * hdv_max * sizeof(float));
    c->tile0 = malloc((nb + 1) * sizeof(int32_t));
    c->vrow = alloc_aligned(nth * hdv_max * sizeof(float));
    c->parts = alloc_aligned((size_t)LI_ATTN_SPLIT_TOKENS * (size_t)m->n_head * (size_t)c->max_chunks * ps *
                             sizeof(float));
    c->tparts = alloc_aligned(nth * tmax * nh * (size_t)c->max_chunks * ps * sizeof(float));
    c->gemm_scratch = alloc_aligned(nth * LI_MAX(c->gemm_bytes, 64));
    c->embd_row_bytes = (m->tok_embd.nbytes / (size_t)m->tok_embd.rows + 63) / 64 * 64;
    c->embd_rows = alloc_aligned(nth * c->embd_row_bytes);
    c->own_bytes = li_own_layout(c, NULL, 0, NULL);
    c->own = alloc_aligned(nth * c->own_bytes);
    c->share = li_share_new((int)nth);
    c->pos = malloc(nb * sizeof(int32_t));
    c->vis = malloc(nb * sizeof(int32_t));
    for (int g = 0; g < LI_KV_GROUPS; g++) c->kv_row[g] = malloc(nb * sizeof(int32_t));
    c->out_rows = malloc(nb * sizeof(int32_t));
    c->logit_part = malloc(nb * nth * 2 * sizeof(float));
    c->range_rows = -1;
    c->n_spans = malloc(nb * 2 * sizeof(int32_t));
    c->rope_cs = alloc_aligned((size_t)c->n_rope * nb * (size_t)c->n_rot_max * sizeof(float));
    if (!c->x || !c->xb || !c->q || !c->k || !c->v || !c->att || !c->o || !c->g || !c->u || !c->scores ||
        !c->vrow || !c->parts || !c->tparts || !c->gemm_scratch || !c->embd_rows || !c->own || !c->share || !c->pos || !c->vis || !c->kv_row[0] ||
        !c->kv_row[1] || !c->out_rows || !c->logit_part || !c->n_spans || !c->rope_cs || !c->tq || !c->tout || !c->tile0)
        goto nomem;
    for (int a = 0; a < LI_ACT_COUNT; a++) {
        if (c->xq_row[a] == 0) continue;
        c->xq[a] = alloc_aligned(nb * c->xq_row[a]);
        c->xd[a] = alloc_aligned(LI_MIN(nb, (size_t)LI_FFN_CHUNK) * c->xq_row[a]);
        if (!c->xq[a] || !c->xd[a]) goto nomem;
    }
    if (make_recurrent(c, m, kv, nb) != LI_OK) goto nomem;
    if (kv->kv_type != LI_TYPE_F32 && kv->kv_type != LI_TYPE_F16) {
        c->qq_row = li_act_row_bytes(li_types[kv->kv_type].act_type, (int64_t)hd_max);
        c->qq = alloc_aligned(nb * (size_t)m->n_head * c->qq_row);
        c->tqq = alloc_aligned(nth * tmax * nh * c->qq_row);
        if (!c->qq || !c->tqq) goto nomem;
    }
    if (n_be_layers > 0) {
        char err[400] = "";
        const int st = ops->create(m, kv, n_batch, 0, n_be_layers, be_output, device, &c->be, err, sizeof(err));
        if (st != LI_OK) {
            c->be = NULL;
            li_context_free(c);
            return li_fail(st, "%s backend: %s", ops->name, err);
        }
        c->be_ops = ops;
        c->be_layers = n_be_layers;
        c->be_output = be_output;
    }
    *out = c;
    return LI_OK;
nomem:
    li_context_free(c);
    return li_fail(LI_E_NOMEM, "no memory for the KV pools and scratch (%d + %d blocks of %d positions)",
                   kv->n_blocks[0], kv->n_blocks[1], kv->block_size);
}

size_t li_context_kv_bytes(const li_context *c, int il) {
    if (!c || il < 0 || il >= c->m->n_layer) return 0;
    if (c->group[il] == LI_KV_GROUPS || c->kv_src[il] != il) return 0;
    if (il < c->be_layers) return c->be_ops->kv_bytes(c->be, il);
    return (size_t)c->kv.n_blocks[c->group[il]] * li_kv_block_bytes(c->m, c->kv.kv_type, c->kv.block_size, il);
}

/* the rows one block holds in layer il's pool: a row per position and kv head */
static size_t block_rows(const li_context *c, int il) {
    return (size_t)c->kv.block_size * (size_t)lm_of(c, il)->n_head_kv;
}

int li_kv_copy_block(li_context *c, int group, int src, int dst) {
    if (!c || group < 0 || group >= LI_KV_GROUPS) return li_fail(LI_E_ARG, "no context or bad KV group %d", group);
    const int nb = c->kv.n_blocks[group];
    if (src < 0 || src >= nb || dst < 0 || dst >= nb)
        return li_fail(LI_E_KV, "block %d or %d is outside the pool of %d blocks", src, dst, nb);
    if (src == dst) return LI_OK;
    if (c->be) {
        char err[400] = "";
        const int st = c->be_ops->copy_block(c->be, group, src, dst, err, sizeof(err));
        if (st != LI_OK) return li_fail(st, "%s backend: %s", c->be_ops->name, err);
    }
    for (int il = c->be_layers; il < c->m->n_layer; il++) {
        if (c->group[il] != group || c->kv_src[il] != il) continue;
        const size_t rows = block_rows(c, il), kr = c->k_rows[il], vr = c->v_rows[il];
        memcpy(c->k_pool[il] + (size_t)dst * rows * kr, c->k_pool[il] + (size_t)src * rows * kr, rows * kr);
        memcpy(c->v_pool[il] + (size_t)dst * rows * vr, c->v_pool[il] + (size_t)src * rows * vr, rows * vr);
    }
    return LI_OK;
}

size_t li_kv_group_block_bytes(const li_context *c, int group) {
    if (!c || group < 0 || group >= LI_KV_GROUPS) return 0;
    size_t total = 0;
    for (int il = 0; il < c->m->n_layer; il++)
        if (c->group[il] == group && c->kv_src[il] == il) total += block_rows(c, il) * (c->k_rows[il] + c->v_rows[il]);
    return total;
}

/* The checks li_kv_read_block and li_kv_write_block share. */
static int check_block_io(const li_context *c, int group, int block, const void *buf, size_t size) {
    if (!c || !buf || group < 0 || group >= LI_KV_GROUPS)
        return li_fail(LI_E_ARG, "no context, no buffer or bad KV group %d", group);
    if (block < 0 || block >= c->kv.n_blocks[group])
        return li_fail(LI_E_KV, "block %d is outside the pool of %d blocks", block, c->kv.n_blocks[group]);
    const size_t want = li_kv_group_block_bytes(c, group);
    if (size != want)
        return li_fail(LI_E_SHAPE, "a block of group %d takes %zu bytes, the buffer has %zu", group, want, size);
    for (int il = 0; il < c->be_layers; il++) /* their pools are the backend's: no k_pool[il] here */
        if (c->group[il] == group)
            return li_fail(LI_E_ARG,
                           "the KV cache of layers 0-%d is on the %s backend; KV blocks (saved states) are read "
                           "and written only with every layer on the CPU (n_gpu_layers=0)",
                           c->be_layers - 1, c->be_ops->name);
    return LI_OK;
}

int li_kv_read_block(const li_context *c, int group, int block, void *dst, size_t size) {
    int st = check_block_io(c, group, block, dst, size);
    if (st != LI_OK) return st;
    char *out = (char *)dst;
    for (int il = 0; il < c->m->n_layer; il++) {
        if (c->group[il] != group || c->kv_src[il] != il) continue;
        const size_t rows = block_rows(c, il), kr = c->k_rows[il], vr = c->v_rows[il];
        memcpy(out, c->k_pool[il] + (size_t)block * rows * kr, rows * kr);
        out += rows * kr;
        memcpy(out, c->v_pool[il] + (size_t)block * rows * vr, rows * vr);
        out += rows * vr;
    }
    return LI_OK;
}

int li_kv_write_block(li_context *c, int group, int block, const void *src, size_t size) {
    int st = check_block_io(c, group, block, src, size);
    if (st != LI_OK) return st;
    const char *in = (const char *)src;
    for (int il = 0; il < c->m->n_layer; il++) {
        if (c->group[il] != group || c->kv_src[il] != il) continue;
        const size_t rows = block_rows(c, il), kr = c->k_rows[il], vr = c->v_rows[il];
        memcpy(c->k_pool[il] + (size_t)block * rows * kr, in, rows * kr);
        in += rows * kr;
        memcpy(c->v_pool[il] + (size_t)block * rows * vr, in, rows * vr);
        in += rows * vr;
    }
    return LI_OK;
}

/* ---- the state pool ---- */

static int check_slot(const li_context *c, int slot) {
    if (!c) return li_fail(LI_E_ARG, "no context");
    if (c->slot_floats == 0) return li_fail(LI_E_ARG, "the model has no recurrent layers: there is no state pool");
    if (slot < 0 || slot >= c->kv.n_state_slots)
        return li_fail(LI_E_KV, "state slot %d is outside the pool of %d slots", slot, c->kv.n_state_slots);
    return LI_OK;
}

static float *slot_at(const li_context *c, int slot) { return c->state + (size_t)slot * c->slot_floats; }

int li_state_copy(li_context *c, int src, int dst) {
    CHECK(check_slot(c, src));
    CHECK(check_slot(c, dst));
    if (src != dst) memcpy(slot_at(c, dst), slot_at(c, src), c->slot_floats * sizeof(float));
    return LI_OK;
}

int li_state_clear(li_context *c, int slot) {
    CHECK(check_slot(c, slot));
    memset(slot_at(c, slot), 0, c->slot_floats * sizeof(float));
    return LI_OK;
}

int li_state_read(const li_context *c, int slot, void *dst, size_t size) {
    CHECK(check_slot(c, slot));
    if (!dst || size != c->slot_floats * sizeof(float))
        return li_fail(LI_E_SHAPE, "a state slot is %zu bytes, not %zu", c->slot_floats * sizeof(float), size);
    memcpy(dst, slot_at(c, slot), size);
    return LI_OK;
}

int li_state_write(li_context *c, int slot, const void *src, size_t size) {
    CHECK(check_slot(c, slot));
    if (!src || size != c->slot_floats * sizeof(float))
        return li_fail(LI_E_SHAPE, "a state slot is %zu bytes, not %zu", c->slot_floats * sizeof(float), size);
    memcpy(slot_at(c, slot), src, size);
    return LI_OK;
}
