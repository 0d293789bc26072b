/* backend.h: the layer-range backend interface, between the C core (model.c)
 * and a backend that runs some of the layers elsewhere (the GPU backend in
 * csrc/cuda/, built into its own extension module llminfer._cuda or
 * llminfer._hip).
 *
 * In the spirit of ggml's backend table: a small table of functions the core
 * calls without knowing what is behind it. A backend instance holds the layers
 * [first, last) of one model (its weights uploaded once at create, its own KV
 * pools, with the same block ids as the CPU pools, since the Python layer owns
 * one set of block tables for all layers), and optionally the output head.
 * The core runs the embedding on the CPU, hands the residual stream x [n,
 * n_embd] to the backend once per batch, and takes it back (or the logits,
 * when the backend holds the head) once: the stream crosses the boundary
 * twice per batch, never per layer.
 *
 * The table reaches the core as a pointer inside a Python capsule (named
 * LI_BACKEND_CAPSULE) that the GPU module hands out; the two modules share no
 * symbols, so the CPU build never links a GPU runtime. abi guards against a
 * GPU module built from other sources than the core.
 *
 * Errors: every function returns a status (LI_OK or an LI_E_* code of
 * llminfer.h, LI_E_DEVICE for a device-side failure) and writes its message
 * to err; none aborts.
 */
#ifndef LLMINFER_BACKEND_H
#define LLMINFER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "llminfer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LI_BACKEND_ABI 1
#define LI_BACKEND_CAPSULE "llminfer.li_backend_ops"

/* What a backend needs of one batch besides the residual stream. Every array
 * is host memory, valid during the call. */
typedef struct li_range_batch {
    int n;                                 /* tokens */
    const int32_t *pos;                    /* [n] */
    const int32_t *seq;                    /* [n] index into views */
    const int32_t *kv_row[LI_KV_GROUPS];   /* [n] per group: pool row (block * block_size + slot) a token writes */
    const li_seq_view *views;              /* [n_views] the sequences' block tables (checked by the core) */
    int n_views;
    const float *rope_cs;                  /* [n_rope, rope_stride, n_rot] cos/sin pairs, as the CPU uses them */
    int rope_stride;                       /* rows between two tables of rope_cs */
    const int *layer_rope;                 /* [n_layer] the table of each layer */
    int n_out;                             /* rows whose logits are wanted (a backend with the head) */
    const int32_t *out_rows;               /* [n_out] */
} li_range_batch;

struct li_backend_ops {
    int abi;          /* LI_BACKEND_ABI */
    const char *name; /* "cuda", "hip" */
    /* Hold layers [first, last) of m (and the output head when with_output:
     * then last == n_layer), with KV pools of kv->n_blocks blocks on device
     * `device`, for batches of up to n_batch tokens. */
    int (*create)(const li_model_desc *m, const li_kv_config *kv, int n_batch, int first, int last,
                  int with_output, int device, void **out, char *err, size_t err_size);
    void (*destroy)(void *be);
    /* x [n, n_embd]: the residual stream entering layer `first`; on return the
     * stream leaving layer last - 1, or, with the head, logits [n_out, n_vocab]
     * (logits_size floats) and x unspecified. */
    int (*run)(void *be, const li_range_batch *b, float *x, float *logits, size_t logits_size, char *err,
               size_t err_size);
    /* copy block src to dst in every held layer of the group */
    int (*copy_block)(void *be, int group, int src, int dst, char *err, size_t err_size);
    /* bytes of device KV pool held for layer il (0 for a layer not held) */
    size_t (*kv_bytes)(void *be, int il);
}; /* typedef'd as li_backend_ops in llminfer.h */

#ifdef __cplusplus
}
#endif
#endif
