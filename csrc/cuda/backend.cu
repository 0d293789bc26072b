/* backend.cu: the GPU layer-range backend (the li_backend_ops table of
 * csrc/backend.h) for CUDA, and for HIP through gpu_compat.h.
 *
 * create uploads the held layers' weights once (in their GGUF types, read
 * directly by the kernels), the norm and bias vectors as float32, and
 * allocates the layers' KV pools (F16, the same block ids as the CPU's
 * pools) and the scratch for n_batch tokens. run copies the batch's small
 * per-token arrays, block tables, RoPE table and residual stream to the
 * device, queues every layer's kernels on one stream, copies the stream (or
 * the logits) back and synchronizes once. Every runtime call is checked; a
 * failure is LI_E_DEVICE with the runtime's message, never an abort.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "kernels.cuh"

#define LI_GPU_SPAN 256       /* attention span, as LI_ATTN_SPAN in context.h (or the block size, if larger) */
#define LI_GPU_ROPE_TABLES 4  /* as MAX_ROPE_TABLES in context.h */

typedef struct {
    const void *data; /* device */
    int type;
    int64_t rows, k;
    size_t row_bytes;
} gpu_matrix;

typedef struct {
    float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
    gpu_matrix wq, wk, wv, wo, w_gate, w_up, w_down;
    uint16_t *kc, *vc; /* [n_blocks * block_size, n_head_kv, head_dim | head_dim_v] f16 */
    int group, window;
    size_t kv_bytes;
} gpu_layer;

/* the per-token arrays of a batch, one int32 region on host (pinned) and device */
enum { I_POS, I_ROW0, I_ROW1, I_OFF0, I_OFF1, I_LEN0, I_LEN1, I_OUT, I_COUNT };

typedef struct {
    const li_model_desc *m;
    int first, last, with_output, device, n_batch, block_size, span;
    int max_spans; /* spans the parts buffer holds per (token, head); grows with the positions seen */
    int n_blocks[LI_KV_GROUPS];
    cudaStream_t stream;
    gpu_layer *layers; /* [n_layer], [first, last) filled */
    gpu_matrix output;
    float *output_norm;
    void **allocs; /* every device allocation, freed by destroy */
    int n_allocs, cap_allocs;
    /* scratch */
    float *x, *xb, *q, *k, *v, *att, *o, *g, *u, *parts, *logits, *rope;
    act_q8_1 *xq;
    int32_t *ints, *h_ints;     /* [I_COUNT, n_batch] */
    int32_t *tables, *h_tables; /* the batch's block tables, capacity cap_tables */
    size_t cap_tables;
} gpu_backend;

#define FAIL(status, ...)                     \
    do {                                      \
        snprintf(err, err_size, __VA_ARGS__); \
        return (status);                      \
    } while (0)

#define CK(call, what)                                                                                   \
    do {                                                                                                 \
        const cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) FAIL(LI_E_DEVICE, "%s: %s", (what), cudaGetErrorString(e_)); \
    } while (0)

static int dev_alloc(gpu_backend *be, void **p, size_t bytes, const char *what, char *err, size_t err_size) {
    *p = NULL;
    if (be->n_allocs == be->cap_allocs) {
        const int cap = be->cap_allocs ? 2 * be->cap_allocs : 64;
        void **a = (void **)realloc(be->allocs, (size_t)cap * sizeof(void *));
        if (!a) FAIL(LI_E_NOMEM, "no host memory");
        be->allocs = a;
        be->cap_allocs = cap;
    }
    const cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError(); /* clear it */
        FAIL(LI_E_DEVICE, "out of device memory: %.1f MiB for %s (%s)", (double)bytes / 1048576.0, what,
             cudaGetErrorString(e));
    }
    be->allocs[be->n_allocs++] = *p;
    return LI_OK;
}

/* free a buffer dev_alloc made (before making a larger one) */
static void dev_free(gpu_backend *be, void *p) {
    for (int i = 0; p && i < be->n_allocs; i++)
        if (be->allocs[i] == p) {
            (void)cudaFree(p);
            be->allocs[i] = be->allocs[--be->n_allocs];
            return;
        }
}

static int upload(gpu_backend *be, void **dst, const void *src, size_t bytes, const char *what, char *err,
                  size_t err_size) {
    *dst = NULL;
    if (!src) return LI_OK;
    const int st = dev_alloc(be, dst, bytes, what, err, err_size);
    if (st != LI_OK) return st;
    CK(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice), what);
    return LI_OK;
}

static int upload_vec(gpu_backend *be, float **dst, const float *src, int64_t n, const char *what, char *err,
                      size_t err_size) {
    return upload(be, (void **)dst, src, (size_t)n * sizeof(float), what, err, err_size);
}

static const char *type_label(int t) {
    switch (t) {
    case LI_TYPE_F32: return "f32";
    case LI_TYPE_F16: return "f16";
    case LI_TYPE_Q4_0: return "q4_0";
    case LI_TYPE_Q4_1: return "q4_1";
    case LI_TYPE_Q5_0: return "q5_0";
    case LI_TYPE_Q5_1: return "q5_1";
    case LI_TYPE_Q8_0: return "q8_0";
    case LI_TYPE_Q2_K: return "q2_K";
    case LI_TYPE_Q3_K: return "q3_K";
    case LI_TYPE_Q4_K: return "q4_K";
    case LI_TYPE_Q5_K: return "q5_K";
    case LI_TYPE_Q6_K: return "q6_K";
    case LI_TYPE_BF16: return "bf16";
    default: return "unknown";
    }
}

static int upload_matrix(gpu_backend *be, gpu_matrix *g, const li_matrix *w, const char *name, int il, char *err,
                         size_t err_size) {
    char what[64];
    if (il >= 0)
        snprintf(what, sizeof(what), "layer %d's %s", il, name);
    else
        snprintf(what, sizeof(what), "%s", name);
    if (!li_u_supported(w->type) && w->type != LI_TYPE_F16 && w->type != LI_TYPE_F32)
        FAIL(LI_E_TYPE, "%s is %s, which the GPU backend does not run (it runs q4_0, q4_1, q5_0, q5_1, q8_0, "
                        "q4_K, q5_K, q6_K, f16, f32)", what, type_label(w->type));
    if (w->k % LI_UNIT != 0) FAIL(LI_E_SHAPE, "%s has rows of %lld values, not a multiple of 32", what, (long long)w->k);
    g->type = w->type;
    g->rows = w->rows;
    g->k = w->k;
    g->row_bytes = w->nbytes / (size_t)w->rows;
    return upload(be, (void **)&g->data, w->data, w->nbytes, what, err, err_size);
}

static void gpu_destroy(void *p) {
    gpu_backend *be = (gpu_backend *)p;
    if (!be) return;
    (void)cudaSetDevice(be->device);
    if (be->stream) {
        (void)cudaStreamSynchronize(be->stream);
        (void)cudaStreamDestroy(be->stream);
    }
    for (int i = 0; i < be->n_allocs; i++) (void)cudaFree(be->allocs[i]);
    if (be->h_ints) (void)cudaFreeHost(be->h_ints);
    if (be->h_tables) (void)cudaFreeHost(be->h_tables);
    (void)cudaGetLastError();
    free(be->allocs);
    free(be->layers);
    free(be);
}

static int gpu_create_into(gpu_backend *be, const li_model_desc *m, const li_kv_config *kv, int n_batch, int first,
                           int last, int with_output, int device, char *err, size_t err_size) {
    int count = 0;
    CK(cudaGetDeviceCount(&count), "looking for a GPU");
    if (device < 0 || device >= count) FAIL(LI_E_ARG, "device %d asked for, %d present", device, count);
    CK(cudaSetDevice(device), "selecting the device");
    be->device = device;
    if (kv->kv_type != LI_TYPE_F16)
        FAIL(LI_E_TYPE, "the GPU keeps its layers' KV cache in f16; kv_type %s is not supported with offloaded layers",
             type_label(kv->kv_type));
    if (m->head_dim > 1024 || m->head_dim_v > 1024) FAIL(LI_E_SHAPE, "head sizes above 1024 are not supported");
    /* what the CPU graph learned for gemma2, granite, olmo2, smollm3 and the
     * MoE models, the GPU kernels do not compute yet: refuse, never approximate */
    if (m->n_expert > 0) FAIL(LI_E_TYPE, "mixture-of-experts layers do not run on the GPU backend yet");
    if (m->attn_softcap != 0.0f || m->final_softcap != 0.0f || m->residual_scale != 1.0f || m->logit_scale != 1.0f ||
        m->qk_norm_whole || m->attn_temp_scale != 0.0f)
        FAIL(LI_E_TYPE, "soft-capping, residual or logit scales, whole-projection q/k norms and attention "
                        "temperature scaling do not run on the GPU backend yet");
    for (int il = first; il < last; il++)
        if (m->layers[il].no_rope || !m->layers[il].attn_norm || !m->layers[il].ffn_norm)
            FAIL(LI_E_TYPE, "layer %d (without RoPE or without a pre-norm) does not run on the GPU backend yet", il);
    CK(cudaStreamCreate(&be->stream), "creating a stream");
    be->block_size = kv->block_size;
    be->span = kv->block_size > LI_GPU_SPAN ? kv->block_size : LI_GPU_SPAN;
    int most_blocks = 0;
    for (int g = 0; g < LI_KV_GROUPS; g++) {
        be->n_blocks[g] = kv->n_blocks[g];
        most_blocks = kv->n_blocks[g] > most_blocks ? kv->n_blocks[g] : most_blocks;
    }
    /* a token sees at most the pool's positions; a window's range may start inside a span */
    be->max_spans = (int)(((int64_t)most_blocks * kv->block_size + be->span - 1) / be->span) + 1;
    be->layers = (gpu_layer *)calloc((size_t)m->n_layer, sizeof(gpu_layer));
    if (!be->layers) FAIL(LI_E_NOMEM, "no host memory");
    const int64_t E = m->n_embd, hd = m->head_dim, hdv = m->head_dim_v;
    int64_t widest = E > m->n_ff ? E : m->n_ff;
    if ((int64_t)m->n_head * hdv > widest) widest = (int64_t)m->n_head * hdv;
    int st;
#define TRY(expr)                  \
    do {                           \
        if ((st = (expr)) != LI_OK) return st; \
    } while (0)
    for (int il = first; il < last; il++) {
        const li_layer_desc *L = &m->layers[il];
        gpu_layer *G = &be->layers[il];
        char what[48];
        snprintf(what, sizeof(what), "layer %d's norms and biases", il);
        TRY(upload_vec(be, &G->attn_norm, L->attn_norm, E, what, err, err_size));
        TRY(upload_vec(be, &G->ffn_norm, L->ffn_norm, E, what, err, err_size));
        TRY(upload_vec(be, &G->post_attn_norm, L->post_attn_norm, E, what, err, err_size));
        TRY(upload_vec(be, &G->post_ffn_norm, L->post_ffn_norm, E, what, err, err_size));
        TRY(upload_vec(be, &G->bq, L->bq, (int64_t)m->n_head * hd, what, err, err_size));
        TRY(upload_vec(be, &G->bk, L->bk, (int64_t)m->n_head_kv * hd, what, err, err_size));
        TRY(upload_vec(be, &G->bv, L->bv, (int64_t)m->n_head_kv * hdv, what, err, err_size));
        TRY(upload_vec(be, &G->q_norm, L->q_norm, hd, what, err, err_size));
        TRY(upload_vec(be, &G->k_norm, L->k_norm, hd, what, err, err_size));
        TRY(upload_matrix(be, &G->wq, &L->wq, "attn_q", il, err, err_size));
        TRY(upload_matrix(be, &G->wk, &L->wk, "attn_k", il, err, err_size));
        TRY(upload_matrix(be, &G->wv, &L->wv, "attn_v", il, err, err_size));
        TRY(upload_matrix(be, &G->wo, &L->wo, "attn_output", il, err, err_size));
        TRY(upload_matrix(be, &G->w_gate, &L->w_gate, "ffn_gate", il, err, err_size));
        TRY(upload_matrix(be, &G->w_up, &L->w_up, "ffn_up", il, err, err_size));
        TRY(upload_matrix(be, &G->w_down, &L->w_down, "ffn_down", il, err, err_size));
        G->group = L->sliding_window > 0 ? LI_KV_SWA : LI_KV_FULL;
        G->window = L->sliding_window;
        const size_t rows = (size_t)kv->n_blocks[G->group] * (size_t)kv->block_size * (size_t)m->n_head_kv;
        snprintf(what, sizeof(what), "layer %d's KV cache", il);
        TRY(dev_alloc(be, (void **)&G->kc, rows * (size_t)hd * 2, what, err, err_size));
        TRY(dev_alloc(be, (void **)&G->vc, rows * (size_t)hdv * 2, what, err, err_size));
        G->kv_bytes = rows * (size_t)(hd + hdv) * 2;
    }
    if (with_output) {
        TRY(upload_matrix(be, &be->output, &m->output, "output", -1, err, err_size));
        TRY(upload_vec(be, &be->output_norm, m->output_norm, E, "output_norm", err, err_size));
    }
    const size_t nb = (size_t)n_batch;
    TRY(dev_alloc(be, (void **)&be->x, nb * E * 4, "the residual stream", err, err_size));
    TRY(dev_alloc(be, (void **)&be->xb, nb * E * 4, "scratch", err, err_size));
    TRY(dev_alloc(be, (void **)&be->q, nb * m->n_head * hd * 4, "scratch", err, err_size));
    TRY(dev_alloc(be, (void **)&be->k, nb * m->n_head_kv * hd * 4, "scratch", err, err_size));
    TRY(dev_alloc(be, (void **)&be->v, nb * m->n_head_kv * hdv * 4, "scratch", err, err_size));
    TRY(dev_alloc(be, (void **)&be->att, nb * m->n_head * hdv * 4, "scratch", err, err_size));
    TRY(dev_alloc(be, (void **)&be->o, nb * E * 4, "scratch", err, err_size));
    TRY(dev_alloc(be, (void **)&be->g, nb * m->n_ff * 4, "scratch", err, err_size));
    TRY(dev_alloc(be, (void **)&be->u, nb * m->n_ff * 4, "scratch", err, err_size));
    TRY(dev_alloc(be, (void **)&be->xq, nb * (size_t)(widest / LI_UNIT) * sizeof(act_q8_1), "scratch", err,
                  err_size));
    TRY(dev_alloc(be, (void **)&be->parts, nb * m->n_head * (size_t)be->max_spans * (size_t)(2 + hdv) * 4,
                  "attention spans", err, err_size));
    if (with_output) TRY(dev_alloc(be, (void **)&be->logits, nb * (size_t)m->n_vocab * 4, "logits", err, err_size));
    TRY(dev_alloc(be, (void **)&be->rope, LI_GPU_ROPE_TABLES * nb * (size_t)m->n_rot * 4, "RoPE tables", err,
                  err_size));
    TRY(dev_alloc(be, (void **)&be->ints, (size_t)I_COUNT * nb * 4, "batch arrays", err, err_size));
    CK(cudaMallocHost((void **)&be->h_ints, (size_t)I_COUNT * nb * 4), "pinned host memory");
#undef TRY
    be->m = m;
    be->first = first;
    be->last = last;
    be->with_output = with_output;
    be->n_batch = n_batch;
    CK(cudaStreamSynchronize(be->stream), "uploading the weights");
    return LI_OK;
}

static int gpu_create(const li_model_desc *m, const li_kv_config *kv, int n_batch, int first, int last,
                      int with_output, int device, void **out, char *err, size_t err_size) {
    *out = NULL;
    if (!m || !kv || first < 0 || last > m->n_layer || first >= last || n_batch <= 0 ||
        (with_output && last != m->n_layer))
        FAIL(LI_E_ARG, "layers [%d, %d) of %d cannot be held", first, last, m ? m->n_layer : 0);
    gpu_backend *be = (gpu_backend *)calloc(1, sizeof(gpu_backend));
    if (!be) FAIL(LI_E_NOMEM, "no host memory");
    const int st = gpu_create_into(be, m, kv, n_batch, first, last, with_output, device, err, err_size);
    if (st != LI_OK) {
        gpu_destroy(be);
        return st;
    }
    *out = be;
    return LI_OK;
}

/* ---- products ---- */

static int next_pow2(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

template <int TYPE>
static void launch_q(const gpu_backend *be, const gpu_matrix *w, int64_t n, float *y, int64_t ldy) {
    const int64_t units = w->k / LI_UNIT;
    const uint8_t *wd = (const uint8_t *)w->data;
    if (n <= LI_MMV_MAX) {
        const dim3 grid((unsigned)((w->rows + 3) / 4)), block(128);
        switch (next_pow2((int)n)) {
        case 1: k_mmv_q<TYPE, 1><<<grid, block, 0, be->stream>>>(wd, w->row_bytes, w->rows, units, be->xq, (int)n, y, ldy); break;
        case 2: k_mmv_q<TYPE, 2><<<grid, block, 0, be->stream>>>(wd, w->row_bytes, w->rows, units, be->xq, (int)n, y, ldy); break;
        case 4: k_mmv_q<TYPE, 4><<<grid, block, 0, be->stream>>>(wd, w->row_bytes, w->rows, units, be->xq, (int)n, y, ldy); break;
        default: k_mmv_q<TYPE, 8><<<grid, block, 0, be->stream>>>(wd, w->row_bytes, w->rows, units, be->xq, (int)n, y, ldy); break;
        }
        return;
    }
    const dim3 grid((unsigned)((w->rows + LI_TILE - 1) / LI_TILE), (unsigned)((n + LI_TILE - 1) / LI_TILE));
    k_mm_q<TYPE><<<grid, 256, 0, be->stream>>>(wd, w->row_bytes, w->rows, units, be->xq, n, y, ldy);
}

template <int F16>
static void launch_f(const gpu_backend *be, const gpu_matrix *w, const float *x, int64_t n, float *y, int64_t ldy) {
    if (n <= LI_MMV_MAX) {
        const dim3 grid((unsigned)((w->rows + 3) / 4)), block(128);
        switch (next_pow2((int)n)) {
        case 1: k_mmv_f<F16, 1><<<grid, block, 0, be->stream>>>(w->data, w->rows, w->k, x, (int)n, y, ldy); break;
        case 2: k_mmv_f<F16, 2><<<grid, block, 0, be->stream>>>(w->data, w->rows, w->k, x, (int)n, y, ldy); break;
        case 4: k_mmv_f<F16, 4><<<grid, block, 0, be->stream>>>(w->data, w->rows, w->k, x, (int)n, y, ldy); break;
        default: k_mmv_f<F16, 8><<<grid, block, 0, be->stream>>>(w->data, w->rows, w->k, x, (int)n, y, ldy); break;
        }
        return;
    }
    const dim3 grid((unsigned)((w->rows + LI_TILE - 1) / LI_TILE), (unsigned)((n + LI_TILE - 1) / LI_TILE));
    k_mm_f<F16><<<grid, 256, 0, be->stream>>>(w->data, w->rows, w->k, x, n, y, ldy);
}

static bool quantized(const gpu_matrix *w) { return w->type != LI_TYPE_F16 && w->type != LI_TYPE_F32; }

/* be->xq = x [n, k] in act_q8_1 */
static void quantize(const gpu_backend *be, const float *x, int64_t k, int64_t n) {
    const int64_t units = n * (k / LI_UNIT);
    k_quantize<<<(unsigned)((units + 127) / 128), 128, 0, be->stream>>>(x, k, n, be->xq);
}

/* y[n, rows] (row stride ldy) = x . W^T; a quantized W reads be->xq, which
 * the caller filled from x */
static void matmul(const gpu_backend *be, const gpu_matrix *w, const float *x, int64_t n, float *y, int64_t ldy) {
    switch (w->type) {
    case LI_TYPE_Q4_0: launch_q<LI_TYPE_Q4_0>(be, w, n, y, ldy); return;
    case LI_TYPE_Q4_1: launch_q<LI_TYPE_Q4_1>(be, w, n, y, ldy); return;
    case LI_TYPE_Q5_0: launch_q<LI_TYPE_Q5_0>(be, w, n, y, ldy); return;
    case LI_TYPE_Q5_1: launch_q<LI_TYPE_Q5_1>(be, w, n, y, ldy); return;
    case LI_TYPE_Q8_0: launch_q<LI_TYPE_Q8_0>(be, w, n, y, ldy); return;
    case LI_TYPE_Q4_K: launch_q<LI_TYPE_Q4_K>(be, w, n, y, ldy); return;
    case LI_TYPE_Q5_K: launch_q<LI_TYPE_Q5_K>(be, w, n, y, ldy); return;
    case LI_TYPE_Q6_K: launch_q<LI_TYPE_Q6_K>(be, w, n, y, ldy); return;
    case LI_TYPE_F16: launch_f<1>(be, w, x, n, y, ldy); return;
    case LI_TYPE_F32: launch_f<0>(be, w, x, n, y, ldy); return;
    default: return; /* refused by upload_matrix */
    }
}

/* ---- one layer ---- */

static void run_layer(const gpu_backend *be, int il, int n, int max_spans, int rope_table) {
    const li_model_desc *m = be->m;
    const gpu_layer *G = &be->layers[il];
    const int64_t E = m->n_embd, F = m->n_ff, hd = m->head_dim, hdv = m->head_dim_v;
    const int64_t nq = (int64_t)m->n_head * hd, nk = (int64_t)m->n_head_kv * hd, nv = (int64_t)m->n_head_kv * hdv;
    const int64_t na = (int64_t)m->n_head * hdv;
    const size_t nb = (size_t)be->n_batch;
    const int swa = G->group == LI_KV_SWA;

    /* attention half */
    k_rmsnorm<<<n, 256, 0, be->stream>>>(be->x, NULL, G->attn_norm, be->xb, E, m->norm_eps);
    if (quantized(&G->wq) || quantized(&G->wk) || quantized(&G->wv)) quantize(be, be->xb, E, n);
    matmul(be, &G->wq, be->xb, n, be->q, nq);
    matmul(be, &G->wk, be->xb, n, be->k, nk);
    matmul(be, &G->wv, be->xb, n, be->v, nv);

    li_heads_args h;
    h.q = be->q;
    h.k = be->k;
    h.v = be->v;
    h.bq = G->bq;
    h.bk = G->bk;
    h.bv = G->bv;
    h.q_norm = G->q_norm;
    h.k_norm = G->k_norm;
    h.cs = be->rope + (size_t)rope_table * nb * (size_t)m->n_rot;
    h.kv_row = be->ints + (swa ? I_ROW1 : I_ROW0) * nb;
    h.kc = G->kc;
    h.vc = G->vc;
    h.n_head = m->n_head;
    h.n_head_kv = m->n_head_kv;
    h.hd = (int)hd;
    h.hdv = (int)hdv;
    h.n_rot = m->n_rot;
    h.neox = m->rope_mode == LI_ROPE_NEOX;
    h.eps = m->norm_eps;
    k_prepare_heads<<<dim3((unsigned)n, (unsigned)(m->n_head + m->n_head_kv)), 128, 0, be->stream>>>(h);

    li_attn_args a;
    a.q = be->q;
    a.kc = G->kc;
    a.vc = G->vc;
    a.pos = be->ints + I_POS * nb;
    a.tab_off = be->ints + (swa ? I_OFF1 : I_OFF0) * nb;
    a.tab_len = be->ints + (swa ? I_LEN1 : I_LEN0) * nb;
    a.tables = be->tables;
    a.parts = be->parts;
    a.n_head = m->n_head;
    a.n_head_kv = m->n_head_kv;
    a.hd = (int)hd;
    a.hdv = (int)hdv;
    a.block_size = be->block_size;
    a.window = G->window;
    a.span = be->span;
    a.max_spans = max_spans;
    a.scale = m->attn_scale;
    const size_t smem = (size_t)(hd + 2 * be->span) * 4;
    k_attn_part<<<dim3((unsigned)(n * m->n_head), (unsigned)max_spans), LI_ATTN_THREADS, smem, be->stream>>>(a);
    k_attn_combine<<<(unsigned)(n * m->n_head), 128, 0, be->stream>>>(be->parts, max_spans, (int)hdv, be->att);

    if (quantized(&G->wo)) quantize(be, be->att, na, n);
    matmul(be, &G->wo, be->att, n, be->o, E);
    k_residual<<<n, 256, 0, be->stream>>>(be->x, be->o, G->post_attn_norm, E, m->norm_eps);

    /* feed-forward half */
    k_rmsnorm<<<n, 256, 0, be->stream>>>(be->x, NULL, G->ffn_norm, be->xb, E, m->norm_eps);
    if (quantized(&G->w_gate) || quantized(&G->w_up)) quantize(be, be->xb, E, n);
    matmul(be, &G->w_gate, be->xb, n, be->g, F);
    matmul(be, &G->w_up, be->xb, n, be->u, F);
    const int64_t count = (int64_t)n * F;
    k_gate<<<(unsigned)((count + 255) / 256), 256, 0, be->stream>>>(be->g, be->u, count, m->gate_fn == LI_FN_GELU);
    if (quantized(&G->w_down)) quantize(be, be->g, F, n);
    matmul(be, &G->w_down, be->g, n, be->o, E);
    k_residual<<<n, 256, 0, be->stream>>>(be->x, be->o, G->post_ffn_norm, E, m->norm_eps);
}

/* ---- a batch ---- */

/* room for `entries` table entries on host and device (grows between batches) */
static int reserve_tables(gpu_backend *be, size_t entries, char *err, size_t err_size) {
    if (entries <= be->cap_tables) return LI_OK;
    size_t cap = be->cap_tables ? be->cap_tables : 4096;
    while (cap < entries) cap *= 2;
    if (be->h_tables) (void)cudaFreeHost(be->h_tables);
    be->h_tables = NULL;
    be->cap_tables = 0;
    dev_free(be, be->tables);
    int st = dev_alloc(be, (void **)&be->tables, cap * 4, "block tables", err, err_size);
    if (st != LI_OK) return st;
    CK(cudaMallocHost((void **)&be->h_tables, cap * 4), "pinned host memory");
    be->cap_tables = cap;
    return LI_OK;
}

static int gpu_run(void *p, const li_range_batch *b, float *x, float *logits, size_t logits_size, char *err,
                   size_t err_size) {
    gpu_backend *be = (gpu_backend *)p;
    const li_model_desc *m = be->m;
    const int n = b->n;
    const size_t nb = (size_t)be->n_batch;
    if (n <= 0 || n > be->n_batch) FAIL(LI_E_ARG, "a batch of %d tokens; this backend takes 1 to %d", n, be->n_batch);
    if (be->with_output && b->n_out > 0 && (!logits || logits_size < (size_t)b->n_out * (size_t)m->n_vocab))
        FAIL(LI_E_SHAPE, "the logits buffer is too small for %d rows", b->n_out);
    CK(cudaSetDevice(be->device), "selecting the device");
    /* the previous batch's copies from the pinned buffers finished at its synchronize */
    size_t entries = 0;
    for (int v = 0; v < b->n_views; v++)
        for (int g = 0; g < LI_KV_GROUPS; g++) entries += (size_t)(b->views[v].n_blocks[g] > 0 ? b->views[v].n_blocks[g] : 0);
    int st = reserve_tables(be, entries + 1, err, err_size);
    if (st != LI_OK) return st;
    /* the views' tables, one after another; each token points at its sequence's */
    int32_t *hi = be->h_ints;
    size_t at = 0;
    for (int t = 0; t < n; t++) {
        hi[I_POS * nb + t] = b->pos[t];
        hi[I_ROW0 * nb + t] = b->kv_row[0][t];
        hi[I_ROW1 * nb + t] = b->kv_row[1][t];
    }
    for (int v = 0; v < b->n_views; v++) {
        int off[LI_KV_GROUPS], len[LI_KV_GROUPS];
        for (int g = 0; g < LI_KV_GROUPS; g++) {
            len[g] = b->views[v].n_blocks[g] > 0 && b->views[v].blocks[g] ? b->views[v].n_blocks[g] : 0;
            off[g] = (int)at;
            if (len[g]) memcpy(be->h_tables + at, b->views[v].blocks[g], (size_t)len[g] * 4);
            at += (size_t)len[g];
        }
        for (int t = 0; t < n; t++) {
            if (b->seq[t] != v) continue;
            hi[I_OFF0 * nb + t] = off[0];
            hi[I_OFF1 * nb + t] = off[1];
            hi[I_LEN0 * nb + t] = len[0];
            hi[I_LEN1 * nb + t] = len[1];
        }
    }
    for (int i = 0; i < b->n_out; i++) hi[I_OUT * nb + i] = b->out_rows[i];
    /* how many spans the widest token's visible range covers, over the held layers' windows */
    int max_spans = 1;
    for (int t = 0; t < n; t++)
        for (int il = be->first; il < be->last; il++) {
            const int w = be->layers[il].window, pos = b->pos[t];
            const int first = w > 0 ? (pos - w + 1 > 0 ? pos - w + 1 : 0) : 0;
            const int s = pos / be->span - first / be->span + 1;
            max_spans = s > max_spans ? s : max_spans;
        }
    if (max_spans > be->max_spans) { /* positions beyond the pool (after a context shift): a larger buffer */
        CK(cudaStreamSynchronize(be->stream), "waiting for the device");
        dev_free(be, be->parts);
        be->parts = NULL;
        be->max_spans = 0;
        st = dev_alloc(be, (void **)&be->parts, nb * m->n_head * (size_t)max_spans * (size_t)(2 + m->head_dim_v) * 4,
                       "attention spans", err, err_size);
        if (st != LI_OK) return st;
        be->max_spans = max_spans;
    }
    CK(cudaMemcpyAsync(be->ints, hi, (size_t)I_COUNT * nb * 4, cudaMemcpyHostToDevice, be->stream), "copying the batch");
    if (at) CK(cudaMemcpyAsync(be->tables, be->h_tables, at * 4, cudaMemcpyHostToDevice, be->stream), "copying the tables");
    int used[LI_GPU_ROPE_TABLES] = {0, 0, 0, 0};
    for (int il = be->first; il < be->last; il++) {
        const int r = b->layer_rope[il];
        if (r < 0 || r >= LI_GPU_ROPE_TABLES) FAIL(LI_E_ARG, "layer %d's RoPE table %d is out of range", il, r);
        used[r] = 1;
    }
    for (int r = 0; r < LI_GPU_ROPE_TABLES; r++)
        if (used[r])
            CK(cudaMemcpyAsync(be->rope + (size_t)r * nb * m->n_rot, b->rope_cs + (size_t)r * b->rope_stride * m->n_rot,
                               (size_t)n * m->n_rot * 4, cudaMemcpyHostToDevice, be->stream),
               "copying the RoPE table");
    CK(cudaMemcpyAsync(be->x, x, (size_t)n * m->n_embd * 4, cudaMemcpyHostToDevice, be->stream),
       "copying the residual stream");
    for (int il = be->first; il < be->last; il++) run_layer(be, il, n, max_spans, b->layer_rope[il]);
    if (be->with_output) {
        if (b->n_out > 0) {
            k_rmsnorm<<<b->n_out, 256, 0, be->stream>>>(be->x, be->ints + I_OUT * nb, be->output_norm, be->xb,
                                                        m->n_embd, m->norm_eps);
            if (quantized(&be->output)) quantize(be, be->xb, m->n_embd, b->n_out);
            matmul(be, &be->output, be->xb, b->n_out, be->logits, m->n_vocab);
            CK(cudaMemcpyAsync(logits, be->logits, (size_t)b->n_out * m->n_vocab * 4, cudaMemcpyDeviceToHost,
                               be->stream), "copying the logits");
        }
    } else {
        CK(cudaMemcpyAsync(x, be->x, (size_t)n * m->n_embd * 4, cudaMemcpyDeviceToHost, be->stream),
           "copying the residual stream back");
    }
    CK(cudaGetLastError(), "launching the layers' kernels");
    CK(cudaStreamSynchronize(be->stream), "running the layers");
    return LI_OK;
}

static int gpu_copy_block(void *p, int group, int src, int dst, char *err, size_t err_size) {
    gpu_backend *be = (gpu_backend *)p;
    const li_model_desc *m = be->m;
    if (group < 0 || group >= LI_KV_GROUPS || src < 0 || dst < 0 || src >= be->n_blocks[group] ||
        dst >= be->n_blocks[group])
        FAIL(LI_E_KV, "block %d or %d of group %d is outside the pool", src, dst, group);
    if (src == dst) return LI_OK;
    CK(cudaSetDevice(be->device), "selecting the device");
    const size_t rows = (size_t)be->block_size * (size_t)m->n_head_kv;
    for (int il = be->first; il < be->last; il++) {
        const gpu_layer *G = &be->layers[il];
        if (G->group != group) continue;
        const size_t kb = rows * (size_t)m->head_dim, vb = rows * (size_t)m->head_dim_v;
        CK(cudaMemcpyAsync(G->kc + (size_t)dst * kb, G->kc + (size_t)src * kb, kb * 2, cudaMemcpyDeviceToDevice,
                           be->stream), "copying a KV block");
        CK(cudaMemcpyAsync(G->vc + (size_t)dst * vb, G->vc + (size_t)src * vb, vb * 2, cudaMemcpyDeviceToDevice,
                           be->stream), "copying a KV block");
    }
    return LI_OK; /* ordered before the next batch's kernels on the same stream */
}

static size_t gpu_kv_bytes(void *p, int il) {
    const gpu_backend *be = (const gpu_backend *)p;
    return il >= be->first && il < be->last ? be->layers[il].kv_bytes : 0;
}

static const li_backend_ops gpu_ops = {LI_BACKEND_ABI, LI_GPU_NAME, gpu_create, gpu_destroy, gpu_run,
                                       gpu_copy_block, gpu_kv_bytes};

/* ---- what the Python module asks (module.c) ---- */

extern "C" const li_backend_ops *li_gpu_backend_ops(void) { return &gpu_ops; }

/* 0 and the device count, or: 1 no driver (or one too old), 2 no device, 3 another error; msg says which */
extern "C" int li_gpu_probe(int *count, char *msg, size_t size) {
    *count = 0;
    int runtime = 0, driver = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    const cudaError_t de = cudaDriverGetVersion(&driver);
    const cudaError_t e = cudaGetDeviceCount(count);
    (void)cudaGetLastError();
    if (e == cudaSuccess && *count > 0) {
        snprintf(msg, size, "%d device(s), driver %d, runtime %d", *count, driver, runtime);
        return 0;
    }
    *count = 0;
    if (e == cudaErrorInsufficientDriver || de != cudaSuccess || driver == 0) {
        snprintf(msg, size, "no usable GPU driver: %s (this build needs a driver for runtime %d.%d or newer)",
                 cudaGetErrorString(e), runtime / 1000, (runtime % 1000) / 10);
        return 1;
    }
    if (e == cudaErrorNoDevice || e == cudaSuccess) {
        snprintf(msg, size, "the driver (%d) reports no GPU device", driver);
        return 2;
    }
    snprintf(msg, size, "cannot use the GPU: %s", cudaGetErrorString(e));
    return 3;
}

extern "C" int li_gpu_device_info(int device, char *name, size_t size, size_t *total_mem, int *major, int *minor) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    snprintf(name, size, "%s", prop.name);
    *total_mem = prop.totalGlobalMem;
    *major = prop.major;
    *minor = prop.minor;
    return 0;
}

extern "C" int li_gpu_runtime_version(void) {
    int v = 0;
    (void)cudaRuntimeGetVersion(&v);
    return v;
}
