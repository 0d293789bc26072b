/* alloc.c: memory at an aligned address (util.h), for the KV pools, the
 * scratch, the repacked weights and the thread shares.
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c11 */
#include <stdlib.h>
#if defined(_WIN32)
#include <malloc.h> /* _aligned_malloc */
#endif

#include "util.h"

void *li_alloc_aligned(size_t size, size_t align) {
    if (size == 0) size = align;
    size = (size + align - 1) / align * align;
#if defined(_WIN32)
    return _aligned_malloc(size, align);
#else
    void *p = NULL;
    return posix_memalign(&p, align, size) == 0 ? p : NULL;
#endif
}

void li_free_aligned(void *p) {
#if defined(_WIN32)
    _aligned_free(p);
#else
    free(p);
#endif
}
