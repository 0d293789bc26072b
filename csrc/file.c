/* file.c: the stamp of an open file, its size and modification time.
 *
 * A mapped model's holder (llminfer.gguf_file.GGUFFile.check_unchanged)
 * compares it before every pass: a file truncated under its mapping would
 * kill the process with SIGBUS at the first page it lost. One fstat, without
 * the stat_result os.fstat builds, which cost ~9 us of a 135M model's token
 * on caches the pass before had left cold. Needs fstat (POSIX) or _fstat64
 * (Windows, whole seconds).
 */
#if !defined(__APPLE__) && !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L /* st_mtim under -std=c11 */
#endif
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "llminfer.h"
#include "util.h"

/* glibc 2.33 made fstat a symbol of its own, versioned GLIBC_2.33; before it,
 * <sys/stat.h> turned fstat into a call of __fxstat@GLIBC_2.2.5 (aarch64:
 * @GLIBC_2.17), which every glibc since still exports. A build on a newer
 * glibc calls that one too, so that the extension runs on the glibc of its
 * wheel's tag (manylinux_2_28) and not only on the build machine's
 * (tools/check_wheel.sh checks it with auditwheel). The first argument is the
 * struct stat layout: _STAT_VER, 1 on x86-64 and 0 on aarch64, as the
 * pre-2.33 headers define it. Other targets call fstat. */
#if defined(__GLIBC__) && defined(__GLIBC_PREREQ) && (defined(__x86_64__) || defined(__aarch64__))
#if __GLIBC_PREREQ(2, 33)
#if defined(__x86_64__)
#define LI_STAT_VER 1
#else
#define LI_STAT_VER 0
#endif
extern int __fxstat(int ver, int fd, struct stat *buf);
#define LI_FSTAT(fd, st) __fxstat(LI_STAT_VER, (fd), (st))
#endif
#endif
#ifndef LI_FSTAT
#define LI_FSTAT(fd, st) fstat((fd), (st))
#endif

int li_file_stamp(int fd, int64_t *size, int64_t *mtime_ns) {
    if (!size || !mtime_ns) return li_fail(LI_E_ARG, "no output for a file's stamp");
#if defined(_WIN32)
    struct _stat64 st;
    if (_fstat64(fd, &st) != 0) return li_fail(LI_E_ARG, "fstat of descriptor %d: %s", fd, strerror(errno));
    *mtime_ns = (int64_t)st.st_mtime * 1000000000;
#else
    struct stat st;
    if (LI_FSTAT(fd, &st) != 0) return li_fail(LI_E_ARG, "fstat of descriptor %d: %s", fd, strerror(errno));
#if defined(__APPLE__)
    *mtime_ns = (int64_t)st.st_mtimespec.tv_sec * 1000000000 + st.st_mtimespec.tv_nsec;
#else
    *mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
#endif
#endif
    *size = (int64_t)st.st_size;
    return LI_OK;
}
