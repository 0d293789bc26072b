/* x86_gemm.h: what the x86 prefill kernels (x86_avx2_gemm.c, x86_avx512.c)
 * share. Include only from files built with at least the AVX2 flags. */
#ifndef LLMINFER_X86_GEMM_H
#define LLMINFER_X86_GEMM_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* the kernels' loops have constant trip counts once inlined; ask for them to
 * be unrolled so every accumulator lives in a register */
#if defined(__GNUC__)
#define UNROLL _Pragma("GCC unroll 16")
#else
#define UNROLL
#endif

/* 4 activation bytes in every 32-bit lane */
static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

#endif
