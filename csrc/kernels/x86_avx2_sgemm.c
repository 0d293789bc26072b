/* x86_avx2_sgemm.c: the AVX2 register tile of the float GEMM (sgemm.h).
 * Built with -mavx2 -mfma -mf16c; filled into the AVX2 table (and so the
 * AVX-512 table, which starts from it) by li_kernels_fill_avx2.
 *
 * 6 rows x 16 columns of accumulators: twelve ymm registers, two for the
 * panel's 16 values at kk (widened from F16 by vcvtph2ps when the panel
 * holds F16) and one for the broadcast A value, 15 of the 16 registers.
 * Each kk costs 2 panel loads, 6 broadcasts and 12 fused multiply-adds, so
 * the two FMA pipes set the pace. Lane j of accumulator (r, h) is element
 * (r, 8h + j): one vfmadd per kk in order, the scalar tile's fmaf to the bit.
 */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX2__) && (defined(_MSC_VER) || (defined(__FMA__) && defined(__F16C__)))
#include <immintrin.h>

#include "x86_gemm.h"

#define MR LI_SGEMM_MR
#define NR LI_SGEMM_NR

/* two values per pass of the value loop: the loads of the next can issue
 * while the last FMAs of this one wait */
#if defined(__GNUC__)
#define UNROLL2 _Pragma("GCC unroll 2")
#else
#define UNROLL2
#endif

/* the tile over kc values; LOADB(kk, h) gives the panel's 8 floats h of value kk */
#define SGEMM_TILE(LOADB)                                                               \
    __m256 acc[MR][2];                                                                  \
    if (load) {                                                                         \
        UNROLL for (int r = 0; r < MR; r++) {                                           \
            acc[r][0] = _mm256_loadu_ps(c + (size_t)r * ldc);                           \
            acc[r][1] = _mm256_loadu_ps(c + (size_t)r * ldc + 8);                       \
        }                                                                               \
    } else {                                                                            \
        UNROLL for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps(); \
    }                                                                                   \
    UNROLL2 for (int64_t kk = 0; kk < kc; kk++) {                       \
        const __m256 b0 = LOADB(kk, 0), b1 = LOADB(kk, 1);                              \
        const float *ak = a + kk * MR;                                                  \
        UNROLL for (int r = 0; r < MR; r++) {                                           \
            const __m256 ar = _mm256_broadcast_ss(ak + r);                              \
            acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);                             \
            acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);                             \
        }                                                                               \
    }                                                                                   \
    UNROLL for (int r = 0; r < MR; r++) {                                               \
        _mm256_storeu_ps(c + (size_t)r * ldc, acc[r][0]);                               \
        _mm256_storeu_ps(c + (size_t)r * ldc + 8, acc[r][1]);                           \
    }

static void tile_f32(int64_t kc, const float *a, const void *bv, float *c, size_t ldc, int load) {
    const float *b = (const float *)bv;
#define LOAD_F32(kk, h) _mm256_loadu_ps(b + (kk) * NR + 8 * (h))
    SGEMM_TILE(LOAD_F32)
#undef LOAD_F32
}

static void tile_f16(int64_t kc, const float *a, const void *bv, float *c, size_t ldc, int load) {
    const uint16_t *b = (const uint16_t *)bv;
#define LOAD_F16(kk, h) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + (kk) * NR + 8 * (h))))
    SGEMM_TILE(LOAD_F16)
#undef LOAD_F16
}

void li_sgemm_fill_avx2(li_kernels *t) {
    t->sgemm_tile[LI_SGEMM_F32] = tile_f32;
    t->sgemm_tile[LI_SGEMM_F16] = tile_f16;
}
#elif defined(LI_ARCH_X86)
void li_sgemm_fill_avx2(li_kernels *t) { (void)t; } /* built without the AVX2 flags */
#else
typedef int li_empty_translation_unit;
#endif
