/* errors.c: the message behind the last status code, per thread, so that a
 * caller can say which tensor or which size was wrong rather than only the
 * kind of error. */
#include <stdarg.h>
#include <stdio.h>

#include "llminfer.h"
#include "util.h"

#if defined(_MSC_VER)
#define LI_THREAD_LOCAL __declspec(thread)
#else
#define LI_THREAD_LOCAL _Thread_local
#endif

static LI_THREAD_LOCAL char last_error[512];

int li_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return status;
}

const char *li_last_error(void) { return last_error; }
