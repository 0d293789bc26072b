/* x86_avx2.c: kernels for x86-64 with AVX2, FMA and F16C (Haswell, Zen and
 * later). Built with -mavx2 -mfma -mf16c (/arch:AVX2); reached only after
 * dispatch.c has seen those features in cpuid. */
#include "kernels.h"

#if defined(LI_ARCH_X86) && defined(__AVX2__) && (defined(_MSC_VER) || (defined(__FMA__) && defined(__F16C__)))
#include <immintrin.h>

void li_kernels_fill_avx2(li_kernels *t) {
    li_kernels_fill_scalar(t);
    t->isa = LI_ISA_AVX2;
}
#elif defined(LI_ARCH_X86)
/* built without the AVX2 flags: the table stays scalar and dispatch skips it */
void li_kernels_fill_avx2(li_kernels *t) { li_kernels_fill_scalar(t); }
#else
typedef int li_empty_translation_unit;
#endif
