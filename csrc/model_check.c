/* model_check.c: the checks on a model description the Python layer hands
 * in (li_model_check: every matrix's shape and type, every option's range,
 * the recurrent mixers' sizes), and the sizes a description implies: a
 * layer's KV group and block bytes, a recurrent layer's state. The context
 * (context.c) and the forward pass (model.c) read the same sizes from here.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "context.h"
#include "kernels/kernels.h"
#include "recurrent.h"

/* ---- checking a description ---- */

static int check_matrix(const li_matrix *w, const char *name, int il, int64_t rows, int64_t k) {
    char where[48];
    if (il >= 0)
        snprintf(where, sizeof(where), "layer %d's %s", il, name);
    else
        snprintf(where, sizeof(where), "%s", name);
    if (!w->data) return li_fail(LI_E_ARG, "%s has no data", where);
    if (li_type_sizes(w->type, NULL, NULL) != LI_OK)
        return li_fail(LI_E_TYPE, "%s has type %d, which is not supported", where, w->type);
    if (w->rows != rows || w->k != k)
        return li_fail(LI_E_SHAPE, "%s is [%lld, %lld], expected [%lld, %lld]", where, (long long)w->rows,
                       (long long)w->k, (long long)rows, (long long)k);
    const size_t row = li_row_bytes(w->type, k);
    if (row == 0 || w->nbytes != row * (size_t)rows)
        return li_fail(LI_E_SHAPE, "%s holds %zu bytes, expected %zu for [%lld, %lld] in %s", where, w->nbytes,
                       row * (size_t)rows, (long long)rows, (long long)k, li_type_name(w->type));
    if (k % li_act_block_size(li_types[w->type].act_type) != 0)
        return li_fail(LI_E_SHAPE, "%s has rows of %lld values, not a multiple of its activation block", where,
                       (long long)k);
    return LI_OK;
}

/* ---- recurrent mixers' sizes ---- */

void li_mixer_sizes(const li_model_desc *m, const li_layer_desc *L, int64_t *in_rows, int64_t *channels,
                    int64_t *state) {
    const int64_t E = m->n_embd, K = m->ssm_d_conv, H = m->ssm_n_head, G = m->ssm_n_group, N = m->ssm_d_state,
                  DI = m->ssm_d_inner;
    *in_rows = *channels = *state = 0;
    switch (L->mixer) {
    case LI_MIX_GDN:
        *channels = 2 * G * N + DI;
        *in_rows = *channels;
        *state = *channels * (K - 1) + H * (DI / H) * N;
        break;
    case LI_MIX_SHORTCONV:
        *in_rows = 3 * E;
        *channels = E;
        *state = E * (K - 1);
        break;
    case LI_MIX_MAMBA2:
        *channels = DI + 2 * G * N;
        *in_rows = DI + *channels + H;
        *state = *channels * (K - 1) + DI * N;
        break;
    default:
        break;
    }
}

int li_has_recurrent(const li_model_desc *m) {
    for (int il = 0; il < m->n_layer; il++)
        if (m->layers[il].mixer == LI_MIX_GDN || m->layers[il].mixer == LI_MIX_SHORTCONV ||
            m->layers[il].mixer == LI_MIX_MAMBA2)
            return 1;
    return 0;
}

static int check_recurrent_sizes(const li_model_desc *m) {
    if (!li_has_recurrent(m)) return LI_OK;
    const int K = m->ssm_d_conv, H = m->ssm_n_head, G = m->ssm_n_group, N = m->ssm_d_state, DI = m->ssm_d_inner;
    if (K < 1 || K > 64) return li_fail(LI_E_SHAPE, "the recurrent layers' convolution has %d taps (1 to 64)", K);
    for (int il = 0; il < m->n_layer; il++) {
        if (m->layers[il].mixer != LI_MIX_MAMBA2) continue;
        if (H <= 0 || G <= 0 || N <= 0 || DI <= 0 || H > (1 << 12) || N > (1 << 12) || DI > (1 << 20) ||
            H % G != 0 || DI % H != 0)
            return li_fail(LI_E_SHAPE, "Mamba2 sizes do not fit: d_inner %d in %d heads, %d groups, d_state %d", DI, H,
                           G, N);
        break;
    }
    for (int il = 0; il < m->n_layer; il++) {
        if (m->layers[il].mixer != LI_MIX_GDN) continue;
        if (H <= 0 || G <= 0 || N <= 0 || DI <= 0 || H > (1 << 12) || N > (1 << 12) || DI > (1 << 20) ||
            H % G != 0 || DI % H != 0 || DI / H != N)
            return li_fail(LI_E_SHAPE, "Gated DeltaNet sizes do not fit: %d value heads of d_inner %d / heads, %d key "
                           "heads of d_state %d (value heads a multiple of key heads, head sizes equal)", H, DI, G, N);
        break;
    }
    return LI_OK;
}

static int check_vector(const float *v, const char *name, int il) {
    return v ? LI_OK : li_fail(LI_E_ARG, "layer %d: %s is missing", il, name);
}

static int check_mixer(const li_model_desc *m, const li_layer_desc *L, int il) {
    const int64_t E = m->n_embd, H = m->ssm_n_head, DI = m->ssm_d_inner;
    int64_t in_rows, channels, state;
    li_mixer_sizes(m, L, &in_rows, &channels, &state);
    switch (L->mixer) {
    case LI_MIX_NONE:
        return LI_OK;
    case LI_MIX_GDN:
        CHECK(check_matrix(&L->ssm_in, "attn_qkv", il, in_rows, E));
        CHECK(check_matrix(&L->ssm_z, "attn_gate", il, DI, E));
        CHECK(check_matrix(&L->ssm_beta, "ssm_beta", il, H, E));
        CHECK(check_matrix(&L->ssm_alpha, "ssm_alpha", il, H, E));
        CHECK(check_matrix(&L->ssm_out, "ssm_out", il, E, DI));
        CHECK(check_vector(L->ssm_conv, "ssm_conv1d", il));
        CHECK(check_vector(L->ssm_dt_b, "ssm_dt.bias", il));
        CHECK(check_vector(L->ssm_a, "ssm_a", il));
        return check_vector(L->ssm_norm, "ssm_norm", il);
    case LI_MIX_SHORTCONV:
        CHECK(check_matrix(&L->ssm_in, "shortconv.in_proj", il, in_rows, E));
        CHECK(check_matrix(&L->ssm_out, "shortconv.out_proj", il, E, E));
        return check_vector(L->ssm_conv, "shortconv.conv", il);
    default: /* LI_MIX_MAMBA2 */
        CHECK(check_matrix(&L->ssm_in, "ssm_in", il, in_rows, E));
        CHECK(check_matrix(&L->ssm_out, "ssm_out", il, E, DI));
        CHECK(check_vector(L->ssm_conv, "ssm_conv1d", il));
        CHECK(check_vector(L->ssm_dt_b, "ssm_dt.bias", il));
        CHECK(check_vector(L->ssm_a, "ssm_a", il));
        return check_vector(L->ssm_d, "ssm_d", il);
    }
}

size_t li_state_layer_floats(const li_model_desc *m, int il) {
    if (!m || il < 0 || il >= m->n_layer) return 0;
    int64_t in_rows, channels, state;
    li_mixer_sizes(m, &m->layers[il], &in_rows, &channels, &state);
    return (size_t)state;
}

size_t li_state_slot_bytes(const li_model_desc *m) {
    if (!m) return 0;
    size_t total = 0;
    for (int il = 0; il < m->n_layer; il++) total += li_state_layer_floats(m, il);
    return total * sizeof(float);
}

/* The model as layer L sees it: its own attention sizes and RoPE divisors
 * where it gives them (gemma4), else the model's. */
void li_layer_view(const li_model_desc *m, const li_layer_desc *L, li_model_desc *out) {
    *out = *m;
    if (L->head_dim) out->head_dim = L->head_dim;
    if (L->head_dim_v) out->head_dim_v = L->head_dim_v;
    if (L->n_head_kv) out->n_head_kv = L->n_head_kv;
    if (L->n_rot) out->n_rot = L->n_rot;
    if (L->n_ff) out->n_ff = L->n_ff;
    if (L->rope_factors) out->rope_factors = L->rope_factors;
}

/* whether a layer has sizes or RoPE divisors of its own */
int li_own_sizes(const li_layer_desc *L) {
    return L->head_dim || L->head_dim_v || L->n_head_kv || L->n_rot || L->rope_factors || L->n_ff;
}

/* Gemma 4's additions to a layer: its own sizes, shared keys and values,
 * the output scale and the per-layer embedding's weights */
static int check_gemma4_parts(const li_model_desc *m, const li_layer_desc *L, int il) {
    li_model_desc s;
    li_layer_view(m, L, &s);
    if (L->head_dim < 0 || L->head_dim_v < 0 || L->n_head_kv < 0 || L->n_rot < 0 || L->n_ff < 0 || s.head_dim <= 0 ||
        s.head_dim_v <= 0 || s.n_head_kv <= 0)
        return li_fail(LI_E_SHAPE, "layer %d: head sizes %d, %d or %d kv heads out of range", il, L->head_dim,
                       L->head_dim_v, L->n_head_kv);
    if (m->n_head % s.n_head_kv != 0 || m->n_head / s.n_head_kv > 64)
        return li_fail(LI_E_SHAPE, "layer %d: n_head %d is not a multiple (at most 64 times) of its %d kv heads", il,
                       m->n_head, s.n_head_kv);
    if (s.n_rot <= 0 || s.n_rot % 2 != 0 || s.n_rot > s.head_dim)
        return li_fail(LI_E_SHAPE, "layer %d: n_rot %d must be even and within its head_dim %d", il, s.n_rot,
                       s.head_dim);
    if (L->n_ff && L->router.data) return li_fail(LI_E_ARG, "layer %d: a width of its own for a MoE layer", il);
    if (li_own_sizes(L) && (L->mixer != LI_MIX_ATTN || L->attn_out_gate || m->qk_norm_whole))
        return li_fail(LI_E_ARG, "layer %d: sizes of its own go with plain attention only", il);
    if (!isfinite(L->out_scale)) return li_fail(LI_E_ARG, "layer %d: output scale %g", il, (double)L->out_scale);
    if (L->kv_reuse < 0 || L->kv_reuse > il)
        return li_fail(LI_E_ARG, "layer %d: it reads the keys and values of layer %d, which does not come before "
                       "it", il, il - L->kv_reuse);
    if (L->kv_reuse > 0) {
        const li_layer_desc *S = &m->layers[il - L->kv_reuse];
        li_model_desc ss;
        li_layer_view(m, S, &ss);
        if (L->mixer != LI_MIX_ATTN || S->mixer != LI_MIX_ATTN || S->kv_reuse != 0 ||
            (L->sliding_window > 0) != (S->sliding_window > 0) || L->sliding_window != S->sliding_window ||
            ss.head_dim != s.head_dim || ss.head_dim_v != s.head_dim_v || ss.n_head_kv != s.n_head_kv)
            return li_fail(LI_E_ARG, "layer %d reads the keys and values of layer %d, which has its own of another "
                           "kind (mixer, window or sizes)", il, il - L->kv_reuse);
        if (L->wk.data || L->wv.data || L->bk || L->bv || L->k_norm || L->v_norm)
            return li_fail(LI_E_ARG, "layer %d reads another layer's keys and values, yet has key or value weights",
                           il);
    }
    const int64_t P = m->n_embd_pe;
    if (P > 0) {
        CHECK(check_matrix(&L->pe_gate, "inp_gate", il, P, m->n_embd));
        CHECK(check_matrix(&L->pe_proj, "proj", il, m->n_embd, P));
        if (!L->pe_post_norm) return li_fail(LI_E_ARG, "layer %d: the per-layer embedding's post_norm is missing", il);
    } else if (L->pe_gate.data || L->pe_proj.data || L->pe_post_norm) {
        return li_fail(LI_E_ARG, "layer %d has per-layer embedding weights, but the model no per-layer width", il);
    }
    return LI_OK;
}

int li_model_check(const li_model_desc *m) {
    li_fail(LI_OK, "%s", "");
    if (!m || !m->layers) return li_fail(LI_E_ARG, "no model description or no layers");
    if (m->n_vocab <= 0 || m->n_embd <= 0 || m->n_layer <= 0 || m->n_head <= 0 || m->n_head_kv <= 0 ||
        m->head_dim <= 0 || m->head_dim_v <= 0 || m->n_ff <= 0)
        return li_fail(LI_E_SHAPE, "a model size is not positive (n_vocab %d, n_embd %d, n_layer %d, n_head %d, "
                       "n_head_kv %d, head_dim %d, head_dim_v %d, n_ff %d)", m->n_vocab, m->n_embd, m->n_layer,
                       m->n_head, m->n_head_kv, m->head_dim, m->head_dim_v, m->n_ff);
    if (m->n_head % m->n_head_kv != 0 || m->n_head / m->n_head_kv > 64)
        return li_fail(LI_E_SHAPE, "n_head %d is not a multiple (at most 64 times) of n_head_kv %d", m->n_head,
                       m->n_head_kv);
    if (m->n_rot <= 0 || m->n_rot % 2 != 0 || m->n_rot > m->head_dim)
        return li_fail(LI_E_SHAPE, "n_rot %d must be even and within head_dim %d", m->n_rot, m->head_dim);
    if (m->rope_mode != LI_ROPE_NORM && m->rope_mode != LI_ROPE_NEOX)
        return li_fail(LI_E_ARG, "unknown RoPE mode %d", m->rope_mode);
    {
        const int st = m->rope_sect_t, sh = m->rope_sect_h, sw = m->rope_sect_w, se = m->rope_sect_e;
        if (st < 0 || sh < 0 || sw < 0 || se < 0 || (int64_t)st + sh + sw + se > m->n_rot)
            return li_fail(LI_E_ARG, "rope sections %d, %d, %d, %d: negative, or more than n_rot %d", st, sh, sw, se,
                           m->n_rot);
        if (m->rope_sect_interleave && !(st + sh + sw + se))
            return li_fail(LI_E_ARG, "interleaved rope sections, but no sections");
        if (st + sh + sw + se && m->rope_mode != LI_ROPE_NEOX)
            return li_fail(LI_E_ARG, "rope sections (M-RoPE) rotate NeoX pairs; the RoPE mode is %d", m->rope_mode);
    }
    if (m->n_deepstack < 0 || m->n_deepstack > m->n_layer || m->n_deepstack > 64)
        return li_fail(LI_E_ARG, "n_deepstack %d out of range (0 to n_layer %d, at most 64)", m->n_deepstack,
                       m->n_layer);
    if (m->gate_fn != LI_FN_SILU && m->gate_fn != LI_FN_GELU && m->gate_fn != LI_FN_RELU_SQR &&
        m->gate_fn != LI_FN_SWIGLU_OAI)
        return li_fail(LI_E_ARG, "unknown gate function %d", m->gate_fn);
    if (m->expert_gating < 0 || m->expert_gating >= LI_GATING_COUNT)
        return li_fail(LI_E_ARG, "unknown expert gating %d", m->expert_gating);
    if (!(m->norm_eps >= 0.0f) || !(m->attn_scale > 0.0f) || !(m->embd_scale > 0.0f))
        return li_fail(LI_E_ARG, "norm_eps %g, attn_scale %g or embd_scale %g out of range", (double)m->norm_eps,
                       (double)m->attn_scale, (double)m->embd_scale);
    if (!(m->residual_scale > 0.0f) || !isfinite(m->residual_scale) || !(m->logit_scale > 0.0f) ||
        !isfinite(m->logit_scale) || !(m->attn_softcap >= 0.0f) || !isfinite(m->attn_softcap) ||
        !(m->final_softcap >= 0.0f) || !isfinite(m->final_softcap))
        return li_fail(LI_E_ARG, "residual_scale %g, logit_scale %g, attn_softcap %g or final_softcap %g out of range",
                       (double)m->residual_scale, (double)m->logit_scale, (double)m->attn_softcap,
                       (double)m->final_softcap);
    if (!isfinite(m->attn_temp_scale) || !isfinite(m->attn_temp_offset) ||
        (m->attn_temp_scale != 0.0f && m->attn_temp_floor <= 0))
        return li_fail(LI_E_ARG, "attention temperature scale %g, offset %g and floor %d out of range",
                       (double)m->attn_temp_scale, (double)m->attn_temp_offset, m->attn_temp_floor);
    if (m->n_expert < 0 || m->n_expert > LI_MAX_EXPERTS || m->n_expert_used < 0 ||
        m->n_expert_used > m->n_expert || (m->n_expert > 0 && (m->n_expert_used == 0 || m->n_ff_exp <= 0)))
        return li_fail(LI_E_SHAPE, "%d experts (at most %d), %d used per token and expert width %d do not fit",
                       m->n_expert, LI_MAX_EXPERTS, m->n_expert_used, m->n_ff_exp);
    if (!m->output_norm) return li_fail(LI_E_ARG, "output_norm is missing");
    CHECK(check_matrix(&m->tok_embd, "token_embd", -1, m->n_vocab, m->n_embd));
    CHECK(check_matrix(&m->output, "output", -1, m->n_vocab, m->n_embd));
    CHECK(check_recurrent_sizes(m));
    if (m->n_embd_pe < 0 || m->n_embd_pe > (1 << 16))
        return li_fail(LI_E_SHAPE, "per-layer embedding width %d out of range", m->n_embd_pe);
    if (m->n_embd_pe > 0) {
        const int64_t NP = (int64_t)m->n_layer * m->n_embd_pe;
        CHECK(check_matrix(&m->pe_tok_embd, "per_layer_token_embd", -1, m->n_vocab, NP));
        CHECK(check_matrix(&m->pe_model_proj, "per_layer_model_proj", -1, NP, m->n_embd));
        if (!m->pe_proj_norm) return li_fail(LI_E_ARG, "per_layer_proj_norm is missing");
    }
    for (int il = 0; il < m->n_layer; il++) {
        const li_layer_desc *L = &m->layers[il];
        if (L->mixer < 0 || L->mixer >= LI_MIX_COUNT) return li_fail(LI_E_ARG, "layer %d: unknown mixer %d", il, L->mixer);
        CHECK(check_gemma4_parts(m, L, il));
        li_model_desc s;
        li_layer_view(m, L, &s);
        const int64_t nq = (int64_t)m->n_head * s.head_dim, nk = (int64_t)s.n_head_kv * s.head_dim;
        const int64_t nv = (int64_t)s.n_head_kv * s.head_dim_v, na = (int64_t)m->n_head * s.head_dim_v;
        if (L->mixer == LI_MIX_ATTN) {
            if (L->attn_out_gate && m->head_dim_v != m->head_dim)
                return li_fail(LI_E_SHAPE, "layer %d: a gated attention needs equal key and value head sizes", il);
            CHECK(check_matrix(&L->wq, "attn_q", il, L->attn_out_gate ? 2 * nq : nq, m->n_embd));
            if (L->kv_reuse == 0) {
                CHECK(check_matrix(&L->wk, "attn_k", il, nk, m->n_embd));
                CHECK(check_matrix(&L->wv, "attn_v", il, nv, m->n_embd));
            }
            CHECK(check_matrix(&L->wo, "attn_output", il, m->n_embd, na));
        } else {
            CHECK(check_mixer(m, L, il));
        }
        if (L->router.data) {
            if (m->n_expert == 0) return li_fail(LI_E_ARG, "layer %d has a router, but the model no experts", il);
            const int64_t ne = m->n_expert, fe = m->n_ff_exp;
            CHECK(check_matrix(&L->router, "ffn_gate_inp", il, ne, m->n_embd));
            if (L->gate_up_exps.data) {
                if (L->gate_exps.data || L->up_exps.data || L->gate_exps_b || L->up_exps_b)
                    return li_fail(LI_E_ARG, "layer %d has fused and separate gate and up experts", il);
                CHECK(check_matrix(&L->gate_up_exps, "ffn_gate_up_exps", il, ne * 2 * fe, m->n_embd));
            } else {
                CHECK(check_matrix(&L->gate_exps, "ffn_gate_exps", il, ne * fe, m->n_embd));
                CHECK(check_matrix(&L->up_exps, "ffn_up_exps", il, ne * fe, m->n_embd));
            }
            if (L->router_in_scale && (!L->moe_norm || !L->moe_post_norm || !L->shexp_post_norm ||
                                       !L->gate_shexp.data || L->gate_inp_shexp || L->router_b || L->router_sel_b))
                return li_fail(LI_E_ARG, "layer %d: a Gemma 4 MoE layer needs its experts' norms and an ungated shared "
                               "expert, and has no router biases", il);
            CHECK(check_matrix(&L->down_exps, "ffn_down_exps", il, ne * m->n_embd, fe));
            if (L->gate_shexp.data || L->up_shexp.data || L->down_shexp.data) {
                if (m->n_ff_shexp <= 0) return li_fail(LI_E_SHAPE, "layer %d has a shared expert of width %d", il,
                                                       m->n_ff_shexp);
                CHECK(check_matrix(&L->gate_shexp, "ffn_gate_shexp", il, m->n_ff_shexp, m->n_embd));
                CHECK(check_matrix(&L->up_shexp, "ffn_up_shexp", il, m->n_ff_shexp, m->n_embd));
                CHECK(check_matrix(&L->down_shexp, "ffn_down_shexp", il, m->n_embd, m->n_ff_shexp));
            }
        } else if (!L->w_gate.data && L->w_up.data) { /* ungated: act(x Wu^T) Wd^T (nemotron_h) */
            if (m->gate_fn == LI_FN_SWIGLU_OAI)
                return li_fail(LI_E_ARG, "layer %d: the clamped SwiGLU gates a feed-forward; this one has no gate", il);
            CHECK(check_matrix(&L->w_up, "ffn_up", il, s.n_ff, m->n_embd));
            CHECK(check_matrix(&L->w_down, "ffn_down", il, m->n_embd, s.n_ff));
        } else if (L->w_gate.data || L->mixer == LI_MIX_NONE) {
            /* a layer may be its mixer alone (mamba2, nemotron_h), not nothing */
            if (m->gate_fn == LI_FN_RELU_SQR)
                return li_fail(LI_E_ARG, "layer %d: a squared ReLU gates no feed-forward (ungated ones only)", il);
            CHECK(check_matrix(&L->w_gate, "ffn_gate", il, s.n_ff, m->n_embd));
            CHECK(check_matrix(&L->w_up, "ffn_up", il, s.n_ff, m->n_embd));
            CHECK(check_matrix(&L->w_down, "ffn_down", il, m->n_embd, s.n_ff));
        }
        if (!(L->rope_base > 0.0f) || !(L->rope_scale > 0.0f) || L->sliding_window < 0)
            return li_fail(LI_E_ARG, "layer %d: RoPE base %g, scale %g or window %d out of range", il,
                           (double)L->rope_base, (double)L->rope_scale, L->sliding_window);
    }
    return LI_OK;
}

int li_layer_kv_group(const li_model_desc *m, int il) {
    if (!m || il < 0 || il >= m->n_layer) return LI_E_ARG;
    if (m->layers[il].mixer != LI_MIX_ATTN) return LI_KV_GROUPS; /* no keys and values */
    return m->layers[il].sliding_window > 0 ? LI_KV_SWA : LI_KV_FULL;
}

int li_kv_type_ok(int t) {
    return t == LI_TYPE_F32 || t == LI_TYPE_F16 || t == LI_TYPE_Q8_0 || t == LI_TYPE_Q4_0;
}

size_t li_kv_block_bytes(const li_model_desc *m, int kv_type, int block_size, int il) {
    if (!m || il < 0 || il >= m->n_layer || !li_kv_type_ok(kv_type) || block_size <= 0) return 0;
    if (li_layer_kv_group(m, il) == LI_KV_GROUPS || m->layers[il].kv_reuse > 0) return 0;
    li_model_desc s;
    li_layer_view(m, &m->layers[il], &s);
    const size_t k = li_row_bytes(kv_type, s.head_dim), v = li_row_bytes(kv_type, s.head_dim_v);
    return (size_t)block_size * (size_t)s.n_head_kv * (k + v);
}
