# Mirrors csrc/llminfer.h: the C core's public interface.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t

cdef extern from "llminfer.h" nogil:
    int LI_OK, LI_E_ARG, LI_E_TYPE, LI_E_SHAPE, LI_E_NOMEM, LI_E_ISA, LI_E_CONTEXT, LI_E_TOKEN, LI_E_KV, LI_E_DEVICE
    const char *li_status_name(int status)

    int LI_TYPE_COUNT
    int li_type_sizes(int type, int *block_size, int *type_size)
    size_t li_row_bytes(int type, int64_t k)
    const char *li_type_name(int type)

    int LI_ISA_COUNT
    const char *li_isa_name(int isa)
    void li_cpu_features(char *buf, size_t size)
    int li_isa_available(int isa)
    int li_isa_best()
    int li_isa_current()
    int li_isa_select(int isa)
    int LI_STREAM_COUNT
    const char *li_stream_hint_name(int kind)
    int li_stream_hint_default()
    int li_stream_hint_current()
    int li_stream_hint_select(int kind)
    int li_openmp_enabled()
    int li_max_threads()

    int li_dequantize(int type, const void *src, size_t src_bytes, int64_t rows, int64_t k,
                      float *dst, int n_threads)
    int li_quantize(int type, const float *src, int64_t rows, int64_t k, void *dst,
                    size_t dst_bytes, int n_threads)
    int li_matmul(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k,
                  const float *x, int64_t n, float *y, int n_threads)
    int li_x16_available(int type)
    ctypedef struct li_repacked:
        pass
    int li_repacked_create(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, int n_threads,
                           li_repacked **out)
    int li_repacked_matmul(const li_repacked *m, const float *x, int64_t n, float *y, int n_threads)
    int li_repacked_matmul_joint(const li_repacked *const *ms, const float *const *xs, const int64_t *ns,
                                 float *const *ys, int count, int n_threads)
    void li_repacked_free(li_repacked *m)
    double li_bench_int8_peak()
    int li_matmul_repacked(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k,
                           const float *x, int64_t n, float *y, int n_threads)
    ctypedef struct li_gemm_weight:
        pass
    int li_gemm_weight_create(int type, const void *w, size_t w_bytes, int64_t rows, int64_t k, int f32_panels,
                              int n_threads, li_gemm_weight **out)
    size_t li_gemm_weight_bytes(const li_gemm_weight *w)
    void li_gemm_weight_free(li_gemm_weight *w)
    int li_gemm(const li_gemm_weight *w, const float *x, int64_t m, const float *bias, const float *res, float *y,
                int n_threads)
    int li_attention_full(const float *q, const float *k, const float *v, size_t ld, int64_t n, int n_head,
                          int64_t d, float scale, float *out, size_t out_ld, void *scratch, size_t scratch_bytes,
                          int n_threads)
    size_t li_attention_full_scratch(int64_t n, int n_head, int64_t d, int n_threads)
    int li_layer_norm(const float *x, int64_t rows, int64_t k, const float *w, const float *b, float eps,
                      float *y, int n_threads)
    int li_activation_mt(int fn, const float *x, int64_t n, float *y, int n_threads)
    int li_rms_norm(const float *x, const float *w, int64_t rows, int64_t k, float eps,
                    float *y, int n_threads)
    int li_activation(int fn, const float *x, int64_t n, float *y)
    int li_gated_activation(int fn, const float *g, const float *u, int64_t n, float *y)
    int li_gated_activation_mt(int fn, const float *g, const float *u, int64_t n, float *y, int n_threads)
    int li_softmax(const float *x, int64_t rows, int64_t k, float *y)
    int li_value_range(const float *x, int64_t n, float *lo, float *hi)
    int li_top_k_f32(const float *x, int64_t n, int64_t k, int32_t *ids)
    int li_top_p_cut(const float *x, const float *e, int64_t n, double target, float floor_x, void *scratch,
                     float *v, int64_t *r)
    int li_add(const float *a, const float *b, int64_t n, float *y)
    int li_mul(const float *a, const float *b, int64_t n, float *y)
    int li_rope(float *x, int64_t n_tok, int64_t n_head, int64_t head_dim, int64_t n_rot,
                const int32_t *pos, float freq_base, float freq_scale, int mode)
    int li_rope_mt(float *x, int64_t n_tok, int64_t ld, int64_t n_head, int64_t head_dim, int64_t n_rot,
                   const int32_t *pos, int n_pos, float freq_base, float freq_scale, int mode, int n_threads)

    ctypedef struct li_matrix:
        const void *data
        int type
        int64_t rows, k
        size_t nbytes
        const void *packed


# the model description's structs: generated from the header (tools/gen_desc.py)
include "_desc_types.pxi"

cdef extern from "llminfer.h" nogil:
    int li_model_check(const li_model_desc *m)
    int li_model_repack(li_model_desc *m, int first_layer, int with_output, int n_threads, int release,
                        size_t *bytes)
    size_t li_model_repack_size(li_model_desc *m, int first_layer, int with_output)
    void li_model_unpack(li_model_desc *m)
    int li_model_embd_file(li_model_desc *m, int fd, int64_t offset)
    int li_file_stamp(int fd, int64_t *size, int64_t *mtime_ns)
    int li_fault_watch(const void *start, size_t length, int64_t *token)
    int li_fault_unwatch(int64_t token)
    int li_fault_hit(int64_t token)
    int li_first_nonfinite(int type, const void *data, size_t nbytes, int release, int64_t *unit)

    ctypedef struct li_context:
        pass
    int LI_KV_FULL, LI_KV_SWA, LI_KV_GROUPS
    int LI_ATTN_NON_CAUSAL, LI_ATTN_CAUSAL, LI_ATTN_NON_CAUSAL_SWA
    ctypedef struct li_kv_config:
        int kv_type
        int block_size
        int n_blocks[2]
        int n_state_slots
    ctypedef struct li_seq_view:
        const int32_t *blocks[2]
        int n_blocks[2]
        int state_slot
        const float *lora_scale
        int n_lora
    ctypedef struct li_batch:
        int n
        const int32_t *token
        const float *embd
        const int32_t *pos
        const int32_t *seq
        const signed char *logits
        const int32_t *rope_pos
    int li_layer_kv_group(const li_model_desc *m, int il)
    size_t li_kv_block_bytes(const li_model_desc *m, int kv_type, int block_size, int il)
    size_t li_state_layer_floats(const li_model_desc *m, int il)
    size_t li_state_slot_bytes(const li_model_desc *m)
    int li_state_copy(li_context *c, int src, int dst)
    int li_state_clear(li_context *c, int slot)
    int li_state_read(const li_context *c, int slot, void *dst, size_t size)
    int li_state_write(li_context *c, int slot, const void *src, size_t size)
    int li_context_create(const li_model_desc *m, const li_kv_config *kv, int n_batch, int max_threads,
                          li_context **out)
    void li_context_free(li_context *c)
    ctypedef struct li_backend_ops:
        pass
    int li_context_create_offload(const li_model_desc *m, const li_kv_config *kv, int n_batch, int max_threads,
                                  const li_backend_ops *ops, int n_layers, int with_output, int device,
                                  li_context **out)
    size_t li_context_kv_bytes(const li_context *c, int il)
    int li_kv_copy_block(li_context *c, int group, int src, int dst)
    size_t li_kv_group_block_bytes(const li_context *c, int group)
    int li_kv_read_block(const li_context *c, int group, int block, void *dst, size_t size)
    int li_kv_write_block(li_context *c, int group, int block, const void *src, size_t size)
    int li_context_decode(li_context *c, const li_batch *b, const li_seq_view *views, int n_views,
                          float *logits, size_t logits_size, int n_threads)
    int li_context_logit_range(const li_context *c, float *lo_hi, int64_t n)
    ctypedef struct li_encoder_layer:
        li_matrix wq, wk, wv
        const float *bq
        const float *bk
        const float *bv
        li_matrix wo
        const float *bo
        const float *attn_out_norm
        const float *attn_out_norm_b
        li_matrix w_up
        const float *b_up
        li_matrix w_gate
        li_matrix w_down
        const float *b_down
        const float *out_norm
        const float *out_norm_b

    ctypedef struct li_encoder_desc:
        int n_vocab, n_embd, n_layer, n_head, head_dim, n_ff
        int n_pos
        int n_types
        int n_rot, rope_mode
        float rope_base, norm_eps
        li_matrix tok_embd
        li_matrix pos_embd
        li_matrix type_embd
        const float *embd_norm
        const float *embd_norm_b
        const li_encoder_layer *layers

    int li_encoder_check(const li_encoder_desc *m)
    int li_encode(const li_encoder_desc *m, const int32_t *tokens, const int32_t *types, int n, float *out,
                  size_t out_size, int n_threads)
    int li_context_set_hidden_output(li_context *c, int on)
    int li_context_set_causal(li_context *c, int mode)
    int LI_PLACEMENT_COUNT
    ctypedef struct li_tuning:
        int stream_hint
        int placement
    int li_context_set_tuning(li_context *c, const li_tuning *t)
    int li_context_get_tuning(const li_context *c, li_tuning *out, int *near)
    ctypedef struct li_lora_pair:
        const float *a
        const float *b
        int rank
    ctypedef struct li_lora_layer:
        li_lora_pair wq, wk, wv, wo, w_gate, w_up, w_down
    ctypedef struct li_lora:
        float alpha
        const li_lora_layer *layers
        li_lora_pair output
        li_lora_pair tok_embd
    int li_context_set_loras(li_context *c, const li_lora *loras, int n)
    int LI_PROBE_NONE, LI_PROBE_EMBED, LI_PROBE_ATTN, LI_PROBE_FFN, LI_PROBE_BACKEND
    int LI_PROBE_OUTPUT_NORM, LI_PROBE_LOGITS
    ctypedef struct li_probe_result:
        int step
        int layer
        int row
    int li_context_set_probe(li_context *c, int on)
    int li_context_probe_result(const li_context *c, li_probe_result *out)

    const char *li_last_error()

    # benchmark and test helpers (bench.c)
    uint64_t li_bench_read(const void *buf, size_t bytes, int n_threads)
    double li_bench_sync(int n_threads, int rounds)
    int li_share_trace(int64_t units, int products, int n_threads, int slow_thread, int slow_spins, int64_t chunk,
                       int32_t *taken_by, int32_t *times_taken)
    int li_share_barrier_check(int n_threads, int rounds, int slow_thread, int slow_spins, int slow_every,
                               int64_t *stale)
    int LI_VEC_DOT_F32, LI_VEC_DOT_F32_F16, LI_VEC_AXPY_F32, LI_VEC_AXPY_F16
    int LI_VEC_SCALE_F32, LI_VEC_F32_TO_F16, LI_VEC_F16_TO_F32, LI_VEC_SOFTCAP_F32
    int li_vec_kernel(int op, float alpha, const void *a, void *b, int64_t n, float *result)
    int li_attn_kernel(int accumulate, const float *a, size_t a_ld, int nh, const uint16_t *cache,
                       int64_t n, int64_t d, size_t stride, float scale, float *out, size_t out_ld)
    int li_conv_kernel(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                       const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act)
    int li_gdn_kernel(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q,
                      const float *k, size_t qk_ld, const float *v, size_t v_ld, const float *alpha,
                      const float *beta, size_t ab_ld, float dt_b, float a, float *o, size_t o_ld)
    int li_mamba2_kernel(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n, const float *x,
                         size_t x_ld, const float *B, const float *C, const float *dt, size_t dt_ld, float dt_b,
                         float a, float d, const float *z, size_t z_ld, float *y, size_t y_ld)
