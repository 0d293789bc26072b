/* bench.c: helpers for bench/kernels.py and the kernel tests, not used by
 * the library itself: a memory read-bandwidth probe (the yardstick for
 * memory-bound decode), and a way to run the active level's vector kernels
 * on raw buffers (the attention helpers have no other public entry). */
#include "common.h"
#include "kernels/kernels.h"
#include "llminfer.h"
#include "share.h"

#include <stdlib.h>
#include <time.h>

uint64_t li_bench_read(const void *buf, size_t bytes, int n_threads) {
    li_init();
    const uint64_t *p = (const uint64_t *)buf;
    const int64_t n = buf ? (int64_t)(bytes / 8) : 0;
    uint64_t total = 0;
    (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads > 0 ? n_threads : li_max_threads()) reduction(+ : total)
#endif
    {
        int64_t lo, hi;
        li_split(n, li_thread_index(), li_thread_count(), &lo, &hi);
        /* eight independent sums: the loads, not an add chain, set the pace */
        uint64_t s[8] = {0};
        int64_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++) s[j] += p[i + j];
        for (; i < hi; i++) s[0] += p[i];
        total += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
    return total;
}

static double seconds(void) {
#ifdef _OPENMP
    return omp_get_wtime();
#else
    return (double)clock() / CLOCKS_PER_SEC;
#endif
}

/* A team of n_threads passes li_share_sync `rounds` times (after a warm-up
 * of rounds / 10); returns the seconds per pass. Its cost is the trip of a
 * cache line between the threads' cores: on a VM whose two CPUs are
 * sometimes one core's two hyperthreads and sometimes cores apart, it tells
 * which (bench/compare.py records it beside the read probe). */
double li_bench_sync(int n_threads, int rounds) {
    li_init();
    if (n_threads < 1 || rounds < 1) return -1.0;
    li_share *s = li_share_new(n_threads);
    if (!s) return -1.0;
    double dt = 0.0;
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads)
#endif
    {
        const int ith = li_thread_index();
        li_share_begin(s, ith);
        li_share_sync(s);
        for (int r = 0; r < rounds / 10; r++) li_share_sync(s);
        double t0 = 0.0;
        if (ith == 0) t0 = seconds();
        for (int r = 0; r < rounds; r++) li_share_sync(s);
        if (ith == 0) dt = (seconds() - t0) / rounds;
    }
    li_share_free(s);
    return dt;
}

int li_share_trace(int64_t units, int products, int n_threads, int slow_thread, int slow_spins, int64_t chunk,
                   int32_t *taken_by, int32_t *times_taken) {
    li_init();
    if (units < 0 || units > LI_SHARE_MAX_UNITS || products < 0 || n_threads < 1 || slow_spins < 0 || chunk < 1 ||
        !taken_by || !times_taken)
        return LI_E_ARG;
    li_share *s = li_share_new(n_threads);
    if (!s) return LI_E_NOMEM;
    const int64_t cells = units * (int64_t)products;
    for (int64_t i = 0; i < cells; i++) {
        taken_by[i] = -1;
        times_taken[i] = 0;
    }
    int team = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads)
#endif
    {
        const int ith = li_thread_index(), nth = li_thread_count();
        if (ith == 0) team = nth;
        li_share_begin(s, ith);
        LI_BARRIER();
        for (int p = 0; p < products; p++) { /* no barrier between products, as wq, wk and wv */
            li_share_turn t;
            int64_t u0, u1;
            li_share_open(s, units, ith, nth, &t);
            t.chunk = chunk;
            while (li_share_next(s, &t, &u0, &u1))
                for (int64_t u = u0; u < u1; u++) {
                    const int64_t i = (int64_t)p * units + u;
                    taken_by[i] = ith;
#if defined(_MSC_VER)
                    _InterlockedIncrement((volatile long *)&times_taken[i]);
#else
                    __atomic_fetch_add(&times_taken[i], 1, __ATOMIC_RELAXED);
#endif
                    if (ith == slow_thread)
                        for (volatile int spin = 0; spin < slow_spins; spin++) {
                        }
                }
        }
    }
    li_share_free(s);
    return team;
}

int li_share_barrier_check(int n_threads, int rounds, int slow_thread, int slow_spins, int slow_every,
                           int64_t *stale) {
    li_init();
    if (n_threads < 1 || rounds < 0 || slow_spins < 0 || slow_every < 1 || !stale) return LI_E_ARG;
    li_share *s = li_share_new(n_threads);
    volatile int *mark = calloc((size_t)n_threads, sizeof(int));
    /* what the first barrier of a round hints while it waits (li_share_sync_ahead) */
    const size_t ahead = (size_t)64 << 10;
    char *hinted = malloc(ahead * (size_t)n_threads);
    if (!s || !mark || !hinted) {
        li_share_free(s);
        free((void *)mark);
        free(hinted);
        return LI_E_NOMEM;
    }
    int64_t bad = 0;
    int team = 1;
    /* three parallel regions on the one li_share, the second a thread short
     * (when there is one to spare): a thread that sat a region out comes
     * back with its arrival line as the region before left it */
    const int teams[3] = {n_threads, n_threads > 1 ? n_threads - 1 : 1, n_threads};
    for (int q = 0, r0 = 0; q < 3; q++) {
        const int r1 = q == 2 ? rounds : r0 + rounds / 3; /* rounds [r0 + 1, r1] */
#ifdef _OPENMP
#pragma omp parallel num_threads(teams[q]) reduction(+ : bad)
#endif
        {
            const int ith = li_thread_index(), nth = li_thread_count();
            if (ith == 0 && q == 0) team = nth;
            li_share_begin(s, ith);
            li_share_sync(s);
            for (int r = r0 + 1; r <= r1; r++) {
                if (ith == slow_thread && r % slow_every == 0)
                    for (volatile int spin = 0; spin < slow_spins; spin++) {
                    }
                mark[ith] = r;
                li_share_sync_ahead(s, hinted + (size_t)ith * ahead, ahead);
                for (int j = 0; j < nth; j++) bad += mark[j] != r;
                li_share_sync(s); /* every slot is read before any is written again */
            }
        }
        r0 = r1;
    }
    *stale = bad;
    free(hinted);
    free((void *)mark);
    li_share_free(s);
    return team;
}

int li_vec_kernel(int op, float alpha, const void *a, void *b, int64_t n, float *result) {
    li_init();
    if (!a || !b || n < 0) return LI_E_ARG;
    float r = 0.0f;
    switch (op) {
    case LI_VEC_DOT_F32: r = li_K->dot_f32((const float *)a, (const float *)b, n); break;
    case LI_VEC_DOT_F32_F16: r = li_K->dot_f32_f16((const float *)a, (const uint16_t *)b, n); break;
    case LI_VEC_AXPY_F32: li_K->axpy_f32(alpha, (const float *)a, (float *)b, n); break;
    case LI_VEC_AXPY_F16: li_K->axpy_f16(alpha, (const uint16_t *)a, (float *)b, n); break;
    case LI_VEC_SCALE_F32: li_K->scale_f32((float *)b, alpha, n); break;
    case LI_VEC_F32_TO_F16: li_K->f32_to_f16((const float *)a, (uint16_t *)b, n); break;
    case LI_VEC_F16_TO_F32: li_K->f16_to_f32((const uint16_t *)a, (float *)b, n); break;
    case LI_VEC_SOFTCAP_F32:
        if (!(alpha > 0.0f)) return LI_E_ARG;
        li_K->softcap_f32((float *)b, n, 1.0f, alpha);
        break;
    default: return LI_E_ARG;
    }
    if (result) *result = r;
    return LI_OK;
}

int li_attn_kernel(int accumulate, const float *a, size_t a_ld, int nh, const uint16_t *cache,
                   int64_t n, int64_t d, size_t stride, float scale, float *out, size_t out_ld) {
    li_init();
    if (!a || !cache || !out || n < 0 || d <= 0 || nh <= 0 || stride < (size_t)d) return LI_E_ARG;
    if (accumulate)
        li_K->attn_accum_f16(a, a_ld, nh, cache, stride, n, d, out, out_ld);
    else
        li_K->attn_scores_f16(a, a_ld, nh, cache, stride, n, d, scale, out, out_ld);
    return LI_OK;
}

int li_conv_kernel(const float *x, size_t x_ld, float *y, size_t y_ld, const int32_t *rows, int64_t n,
                   const float *w, const float *bias, int K, float *state, int64_t c0, int64_t c1, int act) {
    li_init();
    if (!x || !y || !w || (n > 0 && !rows) || (K > 1 && !state) || n < 0 || K < 1 || c0 < 0 || c1 < c0)
        return LI_E_ARG;
    li_K->conv_rows(x, x_ld, y, y_ld, rows, n, w, bias, K, state, c0, c1, act);
    return LI_OK;
}

int li_gdn_kernel(float *S, int64_t dk, int64_t dv, const int32_t *rows, int64_t n, const float *q,
                  const float *k, size_t qk_ld, const float *v, size_t v_ld, const float *alpha,
                  const float *beta, size_t ab_ld, float dt_b, float a, float *o, size_t o_ld) {
    li_init();
    if (!S || !q || !k || !v || !alpha || !beta || !o || (n > 0 && !rows) || n < 0 || dk < 0 || dv < 0)
        return LI_E_ARG;
    li_K->gdn_head(S, dk, dv, rows, n, q, k, qk_ld, v, v_ld, alpha, beta, ab_ld, dt_b, a, o, o_ld);
    return LI_OK;
}

int li_mamba2_kernel(float *S, int64_t hd, int64_t ds, const int32_t *rows, int64_t n, const float *x,
                     size_t x_ld, const float *B, const float *C, const float *dt, size_t dt_ld, float dt_b,
                     float a, float d, const float *z, size_t z_ld, float *y, size_t y_ld) {
    li_init();
    if (!S || !x || !B || !C || !dt || !z || !y || (n > 0 && !rows) || n < 0 || hd < 0 || ds < 0) return LI_E_ARG;
    li_K->mamba2_head(S, hd, ds, rows, n, x, x_ld, B, C, dt, dt_ld, dt_b, a, d, z, z_ld, y, y_ld);
    return LI_OK;
}

double li_bench_int8_peak(void) {
    li_init();
#if defined(LI_ARCH_X86)
    if (li_K->isa != LI_ISA_AVX512) return 0.0;
    (void)li_x16_peak_probe(1000000); /* warm the unit up */
    double best = 0.0;
    for (int r = 0; r < 5; r++) {
        const double t0 = seconds();
        const int64_t ops = li_x16_peak_probe(20000000);
        const double dt = seconds() - t0;
        if (dt > 0 && (double)ops / dt > best) best = (double)ops / dt;
    }
    return best;
#else
    return 0.0;
#endif
}
