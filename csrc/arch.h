/* arch.h: which CPU family this translation unit is compiled for, from the
 * compiler's own macros (never from build-machine flags), so that a file of
 * one family's intrinsics compiles to nothing on another. */
#ifndef LLMINFER_ARCH_H
#define LLMINFER_ARCH_H

#if defined(__x86_64__) || defined(_M_X64) || defined(_M_AMD64)
#define LI_ARCH_X86 1
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
#define LI_ARCH_ARM64 1
#endif

#endif
