/* gemm.h: prefill matrix products over packed weight panels.
 *
 * For a batch of activation rows, each group of LI_PANEL_ROWS weight rows is
 * first unpacked (plain C, gemm.c) into a panel whose rows are interleaved
 * four values at a time: chunk j of block b holds values 4j..4j+3 of each of
 * the 8 rows side by side, 32 bytes. A SIMD kernel then broadcasts 4
 * activation bytes to all lanes and multiplies them with a chunk, so 32-bit
 * lane r accumulates row r's integer dot product without any horizontal sum,
 * and scales apply once per block (per super-block for K-quants, whose
 * integer sub-scales ride in the multiply-add). The panel stays in L1 while
 * every activation row passes over it.
 *
 * Values are stored unsigned; an offset (Q4_0: q - 8) is taken out as
 * offset * sum(activation block). MXFP4's levels (at most 12 in magnitude)
 * are stored as level + 12, so its products need no sign instruction and
 * sum four chunks in int16 like Q5_0's. Q8_0's signed values (and IQ4_NL's
 * table levels) keep their magnitudes beside them: the AVX2
 * kernel multiplies |w| by a with w's sign, the VNNI kernel flips the sign
 * bit (w + 128) and takes out 128 * sum(a). IQ4_XS's levels are stored as
 * level + 128 in a KSUPER panel, the offset taken out like Q6_K's; the AVX2
 * kernel, whose int16 pair sums 255 * 127 * 2 would overflow, flips them back
 * to signed levels and multiplies as for Q8_0, with no offset to take out.
 *
 * Per row, a kernel does what scalar.c's dot product does, to the bit: the
 * block's (super-block's) exact integer sum, then acc = fma(isum, d * dx,
 * acc), and acc = fma(m, sx, acc) (BLK32 with a min) or acc = fma(-imin,
 * m * dx, acc) (KSUPER with a min), blocks in order. So a row's result does
 * not depend on whether it went through a panel or through the dot kernels.
 */
#ifndef LLMINFER_GEMM_H
#define LLMINFER_GEMM_H

#include <stddef.h>
#include <stdint.h>

#define LI_PANEL_ROWS 8
/* MXFP4's levels (E2M1 doubled) reach +-12: a panel (and AVX2's x16 kernel) takes level + 12, 0..24 */
#define LI_MXFP4_OFFSET 12

enum li_panel_kind {
    LI_PANEL_NONE = 0,   /* the type has no panel form: use the dot kernels */
    LI_PANEL_BLK32 = 1,  /* 32-value blocks with a float scale: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the
                            table levels of IQ4_NL and MXFP4 */
    LI_PANEL_KSUPER = 2  /* 256-value super-blocks with integer sub-scales: Q2_K..Q6_K, IQ4_XS */
};

typedef struct li_panel {
    int kind;
    int offset;   /* BLK32: value = d * (w - offset) (+ m), 0 for none: the kernel
                     subtracts offset * sum(a) */
    int sign;     /* BLK32 (Q8_0, IQ4_NL): w holds signed values and wa their magnitudes */
    int has_min;  /* BLK32: add m * s of the Q8_1 activation; KSUPER: subtract the mc terms
                     in float, scaled by m (Q2_K, Q4_K, Q5_K); 0: they are Q3_K's or Q6_K's
                     offsets, taken out of the integer sum */
    int bits;     /* the stored values are below 2^bits (bounds the int16 partial sums); KSUPER
                     8: IQ4_XS's level + 128 */
    int64_t nb;   /* blocks of 32 (BLK32) or super-blocks of 256 (KSUPER) */
    uint8_t *w;   /* BLK32 [nb][8][ROWS][4]; KSUPER [nb][64][ROWS][4] */
    uint8_t *wa;  /* BLK32 with sign: |w| in the same layout */
    float *d;     /* [nb][ROWS] block (super-block) scale */
    float *m;     /* BLK32 [nb][ROWS] min; KSUPER [nb][ROWS] the float factor of the mc terms */
    int16_t *sc;  /* KSUPER [nb][16 groups of 16][ROWS][2]: the group's sub-scale, twice */
    int16_t *mc;  /* KSUPER [nb][8 pairs of groups][ROWS][2]: (group 2p, group 2p+1) corrections */
    int16_t *mc32; /* Q4_K [nb][4 pairs of sub-blocks of 32][ROWS][2]: (min 2q, min 2q+1), to meet
                      the activation's sums of 32 (asum) in half as many multiply-adds as mc */
} li_panel;

/* the panel form of a weight type */
int li_panel_kind(int type);
/* bytes of scratch one panel of rows of k values takes */
size_t li_panel_bytes(int type, int64_t k);
/* unpack nr <= LI_PANEL_ROWS rows (row r at w + r * row_bytes) into scratch;
 * missing rows are zero */
void li_panel_pack(int type, const void *w, size_t row_bytes, int nr, int64_t k, void *scratch,
                   li_panel *p);

/* y[c * ys + r] = dot(panel row r, activation row c) for r < nr, c < n.
 * xq: activation rows (stride xs) in the format of the panel's weight type;
 * asum: for BLK32 panels whose activations are Q8_0 (Q4_0, Q5_0, Q8_0), the
 * sum of each activation block's values, [n][nb]; for Q4_K panels, per
 * activation row [n][8 nb], entry 8s + q (q < 4) of super-block s holds the
 * sums of its values 64q..64q+31 and 64q+32..64q+63 as two int16 (the low
 * half first). */
typedef void (*li_gemm_fn)(const li_panel *p, int nr, const void *xq, size_t xs, int64_t n,
                           const int32_t *asum, float *y, size_t ys);

/* The values of a panel (p->w, and p->wa for a signed BLK32 panel) written
 * straight from nr <= 8 rows (row r at w + r * row_bytes) of nb blocks
 * (super-blocks for KSUPER), rows past nr zero, by a level that has a
 * vector form for the type; returns 0 (and writes nothing) for a type it
 * leaves to gemm.c's plain packing. The scales are packed by gemm.c either
 * way. */
typedef int (*li_panel_values_fn)(int type, const void *w, size_t row_bytes, int nr, int64_t nb, uint8_t *dst,
                                  uint8_t *dst_abs);

#endif
