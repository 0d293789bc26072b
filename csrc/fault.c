/* fault.c: surviving a mapped model file that is truncated while in use.
 *
 * A read of a page past the new end of a mapped file raises SIGBUS, which
 * kills the process (a server with it). The holder of a mapping registers
 * its address range here (li_fault_watch); a SIGBUS whose faulting address
 * lies in a registered range maps anonymous zero pages over the rest of the
 * range (from the faulting page on: all of it lies past the new end), notes
 * the hit and returns, so the pass finishes on zeros and its caller, asking
 * li_fault_hit afterwards, discards it with an error naming the file. A
 * SIGBUS anywhere else goes to the handler installed before ours, or to the
 * default action: other crashes are never hidden.
 *
 * The handler runs on whichever thread faulted (an OpenMP worker as often
 * as not), so it takes no lock and allocates nothing: the registry is a
 * fixed array of slots read with atomic loads, and it calls only mmap,
 * sigaction and raise. A slot is published by storing its start last and
 * withdrawn by clearing it first. The handler is installed once, at the
 * first registration; a SIGBUS handler installed after it (faulthandler
 * enabled later, say) runs first, and one that ends the process still does.
 * Needs POSIX signals and mmap; elsewhere (Windows, which refuses to
 * truncate a mapped file) watching is a no-op.
 */
#if defined(_WIN32)
#include <stdint.h>

#include "llminfer.h"
#include "util.h"

int li_fault_watch(const void *start, size_t length, int64_t *token) {
    (void)start, (void)length;
    if (!token) return li_fail(LI_E_ARG, "no output for a watch's token");
    *token = -1;
    return LI_OK;
}
int li_fault_unwatch(int64_t token) { return (void)token, LI_OK; }
int li_fault_hit(int64_t token) { return (void)token, 0; }
#else
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, SA_ONSTACK */
#define _DARWIN_C_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "llminfer.h"
#include "util.h"

#define SLOTS 1024
#define GEN_SHIFT 16 /* a token: the slot's generation above its index */

typedef struct {
    _Atomic uintptr_t lo, hi; /* [lo, hi) watched; lo 0: the slot is free or being filled */
    _Atomic int hit;          /* a fault in the range was caught */
    _Atomic int64_t gen;      /* bumped on every reuse, so a stale token reads nothing */
    atomic_flag used;
} slot;

static slot slots[SLOTS];

static int slot_of(int64_t token) {
    if (token < 0) return -1;
    const int64_t i = token & ((1 << GEN_SHIFT) - 1);
    if (i >= SLOTS || atomic_load(&slots[i].gen) != token >> GEN_SHIFT) return -1;
    return (int)i;
}

static struct sigaction previous; /* what SIGBUS did before ours */
static struct sigaction default_action;
static uintptr_t page_size;
static atomic_int installed; /* 0: not yet, 1: being installed, 2: installed */

/* The fault at addr in a watched range: zero pages over the rest of it,
 * the hit noted. 0 when addr is in no range (or the pages cannot be mapped). */
static int catch_fault(uintptr_t addr) {
    for (int i = 0; i < SLOTS; i++) {
        const uintptr_t lo = atomic_load_explicit(&slots[i].lo, memory_order_acquire);
        if (lo == 0 || addr < lo) continue;
        const uintptr_t hi = atomic_load_explicit(&slots[i].hi, memory_order_acquire);
        if (addr >= hi) continue;
        const uintptr_t from = addr & ~(page_size - 1), to = (hi + page_size - 1) & ~(page_size - 1);
        /* other threads faulting on the same pages map them again: zeros either way */
        if (mmap((void *)from, to - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            return 0;
        atomic_store_explicit(&slots[i].hit, 1, memory_order_release);
        return 1;
    }
    return 0;
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
    const int saved = errno;
    const int fault = info != NULL && info->si_code > 0; /* raised by the kernel for an access, not sent */
    if (fault && catch_fault((uintptr_t)info->si_addr)) {
        errno = saved;
        return; /* the access is retried and reads zeros */
    }
    errno = saved;
    if (previous.sa_flags & SA_SIGINFO) {
        if (previous.sa_sigaction != NULL) {
            previous.sa_sigaction(sig, info, uctx);
            return;
        }
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    /* The default action (an ignored fault would only repeat): restored, a
     * fault then recurs at once and kills; a sent signal is sent again and
     * delivered when this handler returns. */
    sigaction(sig, &default_action, NULL);
    if (!fault) raise(sig);
}

static int install(void) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&installed, &expected, 1)) {
        while (atomic_load(&installed) == 1) { /* another thread is installing it: a few syscalls */
        }
        return LI_OK;
    }
    page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    memset(&default_action, 0, sizeof(default_action));
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    struct sigaction ours;
    memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = on_sigbus;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGBUS, &ours, &previous) != 0) {
        const int e = errno;
        atomic_store(&installed, 0);
        return li_fail(LI_E_ARG, "installing the SIGBUS handler: %s", strerror(e));
    }
    atomic_store(&installed, 2);
    return LI_OK;
}

int li_fault_watch(const void *start, size_t length, int64_t *token) {
    if (!token) return li_fail(LI_E_ARG, "no output for a watch's token");
    *token = -1;
    if (!start || length == 0 || (uintptr_t)start + length < (uintptr_t)start)
        return li_fail(LI_E_ARG, "a range to watch needs a start and a length that does not wrap");
    const int st = install();
    if (st != LI_OK) return st;
    for (int i = 0; i < SLOTS; i++) {
        if (atomic_flag_test_and_set(&slots[i].used)) continue;
        const int64_t gen = atomic_fetch_add(&slots[i].gen, 1) + 1;
        atomic_store(&slots[i].hit, 0);
        atomic_store_explicit(&slots[i].hi, (uintptr_t)start + length, memory_order_release);
        atomic_store_explicit(&slots[i].lo, (uintptr_t)start, memory_order_release);
        *token = gen << GEN_SHIFT | i;
        return LI_OK;
    }
    return li_fail(LI_E_NOMEM, "all %d watched mappings are in use", SLOTS);
}

int li_fault_unwatch(int64_t token) {
    const int i = slot_of(token);
    if (i < 0) return LI_OK; /* never watched, or already withdrawn */
    atomic_store_explicit(&slots[i].lo, 0, memory_order_release);
    atomic_store_explicit(&slots[i].hi, 0, memory_order_release);
    atomic_fetch_add(&slots[i].gen, 1);
    atomic_flag_clear(&slots[i].used);
    return LI_OK;
}

int li_fault_hit(int64_t token) {
    const int i = slot_of(token);
    return i >= 0 && atomic_load_explicit(&slots[i].hit, memory_order_acquire);
}
#endif
