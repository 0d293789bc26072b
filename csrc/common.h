/* common.h: small helpers shared by every C file: float16/bfloat16 bit
 * conversions (exact, round-to-nearest-even, the same results as numpy and
 * F16C), the threading shims that hide whether OpenMP is compiled in, and
 * an L2 prefetch hint.
 */
#ifndef LLMINFER_COMMON_H
#define LLMINFER_COMMON_H

#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(_MSC_VER)
#define LI_INLINE static __forceinline
#else
#define LI_INLINE static inline __attribute__((always_inline))
#endif

#define LI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LI_MAX(a, b) ((a) > (b) ? (a) : (b))

/* The bit conversions below also run in the GPU backend's device code
 * (csrc/cuda/quant_units.h includes this file under nvcc and hipcc). */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define LI_BITS_FN static __host__ __device__ __forceinline__
#else
#define LI_BITS_FN LI_INLINE
#endif

LI_BITS_FN float li_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

LI_BITS_FN uint32_t li_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

LI_BITS_FN float li_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31;
    const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 31) return li_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        /* zero or subnormal: m units of 2^-24, exact in float */
        const float v = (float)m * 5.9604644775390625e-8f /* 2^-24 */;
        return sign ? -v : v;
    }
    return li_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

LI_BITS_FN uint16_t li_f32_to_f16(float f) {
    const uint32_t x = li_f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu)); /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
    if (ax < 0x38800000u) {
        /* below 2^-14: an f16 subnormal in units of 2^-24, rounded to nearest even */
        const float v = li_bits_f32(ax) * 16777216.0f /* 2^24 */;
        uint32_t q = (uint32_t)v;
        const float frac = v - (float)q;
        if (frac > 0.5f || (frac == 0.5f && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry rolls into the exponent */
    return (uint16_t)(sign | h);
}

LI_BITS_FN float li_bf16_to_f32(uint16_t h) { return li_bits_f32((uint32_t)h << 16); }

/* ---- threading: every parallel kernel is written as "thread ith of nth" ---- */
#ifdef _OPENMP
#if defined(_MSC_VER)
#define LI_BARRIER() __pragma(omp barrier)
#else
#define LI_BARRIER() _Pragma("omp barrier")
#endif
LI_INLINE int li_thread_index(void) { return omp_get_thread_num(); }
LI_INLINE int li_thread_count(void) { return omp_get_num_threads(); }
#else
#define LI_BARRIER() ((void)0)
LI_INLINE int li_thread_index(void) { return 0; }
LI_INLINE int li_thread_count(void) { return 1; }
#endif

/* The contiguous share [*lo, *hi) of n items that thread ith of nth takes. */
LI_INLINE void li_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    const int64_t per = (n + nth - 1) / nth;
    *lo = LI_MIN(n, per * ith);
    *hi = LI_MIN(n, *lo + per);
}

/* A hint that the line holding p will be read soon, into L2 (x86:
 * prefetcht1); nothing where the compiler offers no way to say it. */
#if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>
LI_INLINE void li_hint_l2(const void *p) { _mm_prefetch((const char *)p, _MM_HINT_T1); }
#elif defined(__GNUC__) || defined(__clang__)
LI_INLINE void li_hint_l2(const void *p) { __builtin_prefetch(p, 0, 2); }
#else
LI_INLINE void li_hint_l2(const void *p) { (void)p; }
#endif

#endif
