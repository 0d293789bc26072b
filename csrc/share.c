/* share.c: sharing a product's units among the team (share.h).
 *
 * Each thread's remaining share is one 64-bit word, on a cache line of its
 * own: the product's tag (32 bits), then the front and the back of the units
 * still untaken (16 bits each). The owner takes from the front, others from
 * the back, each by a compare-and-swap of the whole word, so a unit is taken
 * exactly once. A word with an earlier tag is left from a product before
 * (whose units are all taken): its owner has not opened this one yet, and its
 * share is then the owner's fixed share, which whoever opens the word first
 * writes. A word with a later tag belongs to an owner already past this
 * product, which then has nothing left there.
 * The claims need atomicity only: what a unit writes is ordered for its
 * readers by the barrier that follows the product.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* sched_getaffinity */
#endif
#include <stdlib.h>

#include "common.h"
#include "util.h"
#include "share.h"

#if defined(_MSC_VER)
#include <intrin.h>
static uint64_t load_word(volatile uint64_t *p) { return *p; } /* aligned 64-bit loads are atomic on x64 and arm64 */
static int swap_word(volatile uint64_t *p, uint64_t *seen, uint64_t want) {
    const uint64_t was = (uint64_t)_InterlockedCompareExchange64((volatile long long *)p, (long long)want,
                                                                 (long long)*seen);
    if (was == *seen) return 1;
    *seen = was;
    return 0;
}
#else
static uint64_t load_word(volatile uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
/* on failure *seen becomes what the word holds */
static int swap_word(volatile uint64_t *p, uint64_t *seen, uint64_t want) {
    return __atomic_compare_exchange_n(p, seen, want, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}
#endif

typedef struct {
    volatile uint64_t word; /* tag | front | back */
    char pad_[56];
    uint32_t seq;           /* products this thread has opened in the region (its own line: no other thread reads it) */
    char pad2_[60];
} share_slot;

/* li_share_sync's state: arrivals on one line, the generation the waiters
 * watch on another */
typedef struct {
    volatile int arrived;
    char pad_[60];
    volatile uint32_t gen; /* +1 as each barrier opens */
    volatile int sleepers; /* waiters asleep on gen, or about to be */
    char pad2_[56];
} team_barrier;

struct li_share {
    share_slot *slot; /* [max_threads] */
    team_barrier *bar;
    int spins; /* checks of gen before a waiter sleeps */
};

static uint64_t pack(uint32_t tag, int64_t front, int64_t back) {
    return (uint64_t)tag << 32 | (uint64_t)front << 16 | (uint64_t)back;
}
static uint32_t tag_of(uint64_t w) { return (uint32_t)(w >> 32); }
static int64_t front_of(uint64_t w) { return (int64_t)((w >> 16) & 0xffff); }
static int64_t back_of(uint64_t w) { return (int64_t)(w & 0xffff); }

#if defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && defined(_OPENMP)
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

/* How long a waiter spins before it sleeps. A pass's threads reach each
 * barrier within microseconds of each other, so a spin of some tens of
 * microseconds almost never ends in sleep; but with more threads than the
 * CPUs this process may run on, a spinner holds a CPU a late thread needs,
 * and it yields at once instead. */
static int team_spins(int max_threads) {
    cpu_set_t set;
    const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    return max_threads > cpus ? 16 : 1 << 15;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Hints while a thread waits (li_share_sync_ahead): at most AHEAD_MAX bytes,
 * LINES_PER_CHECK lines between two looks at the barrier, so that a waiter
 * whose barrier opens stops within a few lines. 1B Q4_K_M, 2 threads, tg128
 * in fresh processes alternating with and without (medians of 6 pairs):
 * +2.6% (5 of 6 faster); SmolLM2 +0.9%. A cap of 48 or 384 KiB did 2.5-2.7%
 * worse than 128 (the most a wait here gets through is about what one core
 * reads in the ~5 us a decoded row's norm takes the other). */
#define AHEAD_MAX ((size_t)128 << 10)
#define LINES_PER_CHECK 4
/* On arrival every thread, the last one too, hints one line per KiB of its
 * share's first ARRIVAL_SPAN bytes: the kernels' own hints run 8-16 KiB
 * ahead of the block they read (x86_avx512_x16.c's `ahead`), so a share's
 * first lines had only the hardware prefetchers. +0.8% (5 of 6 pairs). */
#define ARRIVAL_SPAN ((size_t)16 << 10)

/* The barrier; a waiter hints [p, end) line by line while it spins */
static void team_wait(li_share *s, const char *p, const char *end) {
    const int nth = li_thread_count();
    if (nth <= 1) return;
    team_barrier *b = s->bar;
    for (const char *q = p; q < end && q < p + ARRIVAL_SPAN; q += 1024) li_hint_l2(q);
    /* gen moves only when the whole team, this thread included, has arrived:
     * read before arriving, it is this barrier's generation */
    const uint32_t g = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == nth) {
        /* the last: reset the count for the next barrier (ordered before gen's
         * store, which every waiter reads before it arrives again), open */
        __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, g + 1, __ATOMIC_SEQ_CST);
        /* with the sleeper's increment and this load both sequentially
         * consistent, either it is seen here or the sleeper sees the new gen
         * in futex_wait's check and does not sleep */
        if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST) > 0)
            syscall(SYS_futex, (uint32_t *)&b->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        return;
    }
    for (int i = 0; i < s->spins; i++) {
        if (__atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) != g) return;
        if (p < end) {
            for (int l = 0; l < LINES_PER_CHECK && p < end; l++, p += 64) li_hint_l2(p);
        } else {
            cpu_relax();
        }
    }
    __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == g) /* woken, interrupted or gen moved on: look again */
        syscall(SYS_futex, (uint32_t *)&b->gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
    __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
}

void li_share_sync(li_share *s) { team_wait(s, NULL, NULL); }

void li_share_sync_ahead(li_share *s, const void *p, size_t bytes) {
    const char *a = (const char *)((uintptr_t)p & ~(uintptr_t)63); /* from p's line */
    team_wait(s, a, p ? (const char *)p + LI_MIN(bytes, AHEAD_MAX) : a);
}
#else
static int team_spins(int max_threads) {
    (void)max_threads;
    return 0;
}

void li_share_sync(li_share *s) {
    (void)s;
    LI_BARRIER();
}

void li_share_sync_ahead(li_share *s, const void *p, size_t bytes) {
    (void)p;
    (void)bytes;
    li_share_sync(s);
}
#endif

li_share *li_share_new(int max_threads) {
    if (max_threads < 1) max_threads = 1;
    li_share *s = malloc(sizeof(*s));
    if (!s) return NULL;
    s->slot = li_alloc_aligned((size_t)max_threads * sizeof(share_slot), 64);
    if (!s->slot) {
        free(s);
        return NULL;
    }
    memset((void *)s->slot, 0, (size_t)max_threads * sizeof(share_slot));
    s->bar = li_alloc_aligned(sizeof(team_barrier), 64);
    if (!s->bar) {
        li_free_aligned(s->slot);
        free(s);
        return NULL;
    }
    memset((void *)s->bar, 0, sizeof(team_barrier));
    s->spins = team_spins(max_threads);
    return s;
}

void li_share_free(li_share *s) {
    if (!s) return;
    li_free_aligned(s->bar);
    li_free_aligned(s->slot);
    free(s);
}

void li_share_begin(li_share *s, int ith) {
    s->slot[ith].word = pack(0, 0, 0);
    s->slot[ith].seq = 0;
}

void li_share_open(li_share *s, int64_t units, int ith, int nth, li_share_turn *t) {
    t->tag = ++s->slot[ith].seq;
    t->units = units;
    t->ith = ith;
    t->nth = nth;
    t->victim = 0;
    t->chunk = 1;
}

int li_share_next(li_share *s, li_share_turn *t, int64_t *u0, int64_t *u1) {
    for (; t->victim < t->nth; t->victim++) {
        const int v = (t->ith + t->victim) % t->nth;
        volatile uint64_t *p = &s->slot[v].word;
        uint64_t seen = load_word(p);
        for (;;) {
            /* The word holds this product, a later one (its owner is past
             * this product, which then has nothing left there), or an earlier
             * one: the owner has not opened this product, and its share is
             * then the fixed one. An earlier product's units are all taken by
             * then: a thread leaves a product only when every word it can
             * take from is empty. */
            const int32_t age = (int32_t)(tag_of(seen) - t->tag);
            if (age > 0) break;
            int64_t f, b;
            if (age == 0) {
                f = front_of(seen);
                b = back_of(seen);
            } else {
                li_split(t->units, v, t->nth, &f, &b);
            }
            const int64_t left = b - f;
            if (left <= 0) break;
            int64_t take;
            uint64_t want;
            if (t->victim == 0) {
                /* the owner: an eighth of what is left, from the front, and
                 * at least a chunk while more than two are left; then one
                 * unit at a time, so that the last pieces of a product are
                 * small and a thread that runs out waits little at the
                 * barrier after it */
                take = left > 2 * t->chunk ? LI_MAX(t->chunk, left / 8) : 1;
                want = pack(t->tag, f + take, b);
            } else {              /* another's share: half of what is left, from the back */
                take = LI_MAX(1, left / 2);
                want = pack(t->tag, f, b - take);
            }
            if (swap_word(p, &seen, want)) {
                *u0 = t->victim == 0 ? f : b - take;
                *u1 = *u0 + take;
                return 1;
            }
        }
    }
    return 0;
}
