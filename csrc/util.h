/* util.h: what any C file may use, below every other header: memory at an
 * aligned address (alloc.c) and the message behind a status code (errors.c).
 * It includes nothing of llminfer's, so a kernel, the file reader or the
 * fault watch can report and allocate without the model's context.
 */
#ifndef LLMINFER_UTIL_H
#define LLMINFER_UTIL_H

#include <stddef.h>

/* size bytes (rounded up to a multiple of align, a power of two from 64) at
 * an address aligned to align, or NULL; freed by li_free_aligned */
void *li_alloc_aligned(size_t size, size_t align);
void li_free_aligned(void *p);

/* record a message for li_last_error (llminfer.h) and return status */
int li_fail(int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
