/* x86_gemm.h: what the x86 prefill kernels (x86_avx2_gemm.c, x86_avx512.c)
 * and the repacked ones (x86_avx2_x16.c, x86_avx512_x16.c) share. Include
 * only from files built with at least the AVX2 flags. */
#ifndef LLMINFER_X86_GEMM_H
#define LLMINFER_X86_GEMM_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* the kernels' loops have constant trip counts once inlined; ask for them to
 * be unrolled so every accumulator lives in a register */
#if defined(__GNUC__)
#define UNROLL _Pragma("GCC unroll 16")
/* v stays in its register here: the sums it carries are added in order as
 * they come, not gathered on the stack first */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define UNROLL
#define KEEP_IN_REGISTER(v) ((void)0)
#endif

/* lanes 0..n-1 of v into y[0..n) (n <= 8): a whole store when all 8 are wanted */
static inline void store_lanes8(float *y, __m256 v, int n) {
    if (n >= 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, v);
    for (int r = 0; r < n; r++) y[r] = t[r];
}

/* 4 activation bytes in every 32-bit lane */
static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* the 32 values of 16 bytes of 4-bit indices (Q4_0's nibble order) through
 * a 16-entry byte table held in both 128-bit halves of table */
static inline __m256i nl4_lookup(const uint8_t *qs, __m256i table) {
    /* the 16 bytes in both halves, the high half shifted down a nibble */
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)qs));
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                         _mm256_set1_epi8(15));
    return _mm256_shuffle_epi8(table, idx);
}

/* acc + one super-block of 8 rows against one activation row, scalar.c's
 * steps lane by lane: ia, im the exact integer sums and mins, dw, mw the
 * rows' d and dmin, dx the activation's scale. With a min (Q2_K, Q4_K,
 * Q5_K): fma(ia, dw*dx), then fnma(im, mw*dx); without (Q3_K, Q6_K): the
 * offsets im come out of the integer sum first. */
static inline __m256 ksuper_accumulate(__m256 acc, __m256i ia, __m256i im, __m256 dw, __m256 mw, float dx,
                                       int min) {
    const __m256 vdx = _mm256_set1_ps(dx);
    if (!min) return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ia, im)), _mm256_mul_ps(dw, vdx), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_mul_ps(dw, vdx), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(mw, vdx), acc);
}

#endif
