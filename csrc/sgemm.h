/* sgemm.h: float products over weight panels packed once (sgemm.c), the
 * dense path of the vision encoder.
 *
 * C[m, n] = A[m, k] B[n, k]^T (+ bias), A float32 activations, B a weight
 * matrix. B is packed once, at load, into panels of LI_SGEMM_NR rows,
 * column-major within the panel: element (kk, c) of panel p is row p*NR + c,
 * value kk, at offset (p*k + kk)*NR, rows past the matrix zero. A panel keeps
 * F16 weights as F16 (the kernel widens them as it reads: half the bytes);
 * every other type is dequantized to F32 panels.
 *
 * The register tile (kernel table entry sgemm_tile) multiplies a strip of
 * LI_SGEMM_MR rows of A, packed value-major ([kk][MR]), by one panel over kc
 * values: per output element, one fused multiply-add per value, in value
 * order, into an accumulator that starts at zero or at what c holds. So an
 * element's bits depend only on its row of A, its panel column and how k is
 * cut into blocks (fixed, LI_SGEMM_KC) -- never on the thread that computes
 * it, and not on the level either: the scalar tile (fmaf) and the AVX2 tile
 * (vfmadd, lane by lane) give the same bits.
 */
#ifndef LLMINFER_SGEMM_H
#define LLMINFER_SGEMM_H

#include <stddef.h>
#include <stdint.h>

#define LI_SGEMM_MR 6   /* rows of A in a register tile */
#define LI_SGEMM_NR 16  /* weight rows in a panel: two 8-float vectors */

/* panel element types, the index of the kernel table's sgemm_tile */
enum li_sgemm_elem { LI_SGEMM_F32 = 0, LI_SGEMM_F16 = 1, LI_SGEMM_ELEMS = 2 };

/* c[r * ldc + j] (r < MR, j < NR) = (load ? c[r * ldc + j] : 0) + sum over
 * kk < kc of a[kk * MR + r] * b[kk * NR + j], one fma per kk in order; b is
 * float (LI_SGEMM_F32) or F16 bits (LI_SGEMM_F16) */
typedef void (*li_sgemm_tile_fn)(int64_t kc, const float *a, const void *b, float *c, size_t ldc, int load);

#endif
