/* share.h: a product's row groups shared among the team as it works.
 *
 * Split into fixed equal shares, a product takes as long as its slowest
 * thread, and on a shared machine one core is often slower for a while (a
 * neighbour's load, an interrupt): the other then waits at the next barrier.
 * With a li_share, each thread still starts on its own contiguous share and
 * walks it front to back (its stream stays one stream for the prefetchers),
 * taking a shrinking piece at a time; one that runs out takes pieces from the
 * back of another's share. Which thread computes a group changes nothing in
 * the group's result, so the bits are the same as with fixed shares.
 *
 * Use: every thread of the team calls li_share_begin(s, ith) and then passes
 * a barrier before the first product of a parallel region; then each thread
 * takes the same products in the same order (the products of a pass are the
 * same for every thread), each as
 *     li_share_open(s, units, ith, nth, &t);
 *     while (li_share_next(s, &t, &u0, &u1)) ... units [u0, u1) ...
 * Consecutive products need no barrier between them: a thread may take a
 * product's pieces while another still works on the one before.
 */
#ifndef LLMINFER_SHARE_H
#define LLMINFER_SHARE_H

#include <stddef.h>
#include <stdint.h>

/* the most units a shared product may have; a larger one keeps fixed shares */
#define LI_SHARE_MAX_UNITS 0xffff

typedef struct li_share li_share;

/* state for a team of up to max_threads; NULL if out of memory */
li_share *li_share_new(int max_threads);
void li_share_free(li_share *s);
/* thread ith starts a parallel region's products (a barrier must follow) */
void li_share_begin(li_share *s, int ith);

/* one thread's place in one product */
typedef struct {
    uint32_t tag;      /* which product of the region: 1, 2, ... */
    int64_t units;
    int ith, nth;
    int victim;        /* 0: own share; then the other threads in turn */
    int64_t chunk;     /* the owner's least piece while more than two are left (1 from li_share_open) */
} li_share_turn;

/* thread ith of nth begins a product of `units` units (<= LI_SHARE_MAX_UNITS) */
void li_share_open(li_share *s, int64_t units, int ith, int nth, li_share_turn *t);
/* the next piece [*u0, *u1) for this thread, or 0 when none is left to take */
int li_share_next(li_share *s, li_share_turn *t, int64_t *u0, int64_t *u1);

/* A barrier for the team that called li_share_begin, at a point every thread
 * of the region reaches: what each thread wrote before it is seen by all after
 * it. On Linux (GCC, Clang) the team's own: a waiter spins a while, then sleeps
 * on a futex, and the last to arrive makes the wake-up system call only when
 * someone sleeps (libgomp's barrier makes it at every barrier, ~0.3 us, and a
 * decode pass of a small model has hundreds of barriers). Elsewhere, the
 * OpenMP barrier. */
void li_share_sync(li_share *s);

/* li_share_sync for the barrier just before a product: while this thread
 * waits for the others, it hints the lines of [p, p + bytes) (the start of
 * its own share of that product, li_x16_parts_head) into L2, up to 128 KiB
 * (share.c's AHEAD_MAX), so that the memory reads its weights during a
 * wait in which it read nothing. A hint changes no result, only when a line
 * arrives. p NULL (or bytes 0): li_share_sync. */
void li_share_sync_ahead(li_share *s, const void *p, size_t bytes);

#endif
