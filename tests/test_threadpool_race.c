/* test_threadpool_race.c - a stress test of the pool's hand-over between runs.
 *
 * A worker that wakes late reads the parameters of a run after the caller
 * has already started the next one. The pool must never let it claim a task
 * with them under the old run's counter: that task would run twice (once by
 * the stray worker, once after the counter is reset), and the stray "done"
 * could let the caller return before all tasks finished.
 *
 * The pool's source is compiled in here with a hook that yields at the two
 * places where those windows are (the worker between reading the run number
 * and its parameters; the caller between publishing them and resetting the
 * counter), so the race happens often instead of once in billions of runs.
 * Build with -DKVC_TSAN=ON to run it under ThreadSanitizer. */
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

static _Thread_local unsigned race_seed = 1;

/* Yield about one time in four: the other threads then run in the window. */
static void race_delay(void)
{
    race_seed = race_seed * 1103515245u + 12345u;
    if (((race_seed >> 16) & 3) == 0)
        sched_yield();
}

#define KVC_TP_RACE_HOOK() race_delay()
#include "threadpool.c"

#include "test.h"

typedef struct { atomic_int *hits; int64_t n; } job;

static void count(void *ctx, int64_t t, int thread)
{
    job *j = ctx;
    (void)thread;
    if (t >= 0 && t < j->n)
        atomic_fetch_add(&j->hits[t], 1);
}

/* A task that waits (up to 2 s) until every thread of the pool has run a
 * task of this run: it finishes early only if the sleeping workers woke. */
typedef struct { atomic_int seen; int n_threads; atomic_int timed_out; } gather;

static void meet(void *ctx, int64_t t, int thread)
{
    gather *g = ctx;
    (void)t;
    atomic_fetch_or(&g->seen, 1 << thread);
    const int all = (1 << g->n_threads) - 1;
    const int64_t until = kvc_time_us() + 2000000;
    while (atomic_load(&g->seen) != all)
        if (kvc_time_us() > until) {
            atomic_store(&g->timed_out, 1);
            return;
        }
}

/* Idle workers go to sleep after their bounded spin, use no CPU asleep, and
 * a run started while they sleep wakes every one of them (a lost wake-up
 * would leave a worker asleep and the run to the others). */
static void check_sleep_and_wake(int n_threads)
{
    kvc_threadpool *tp = kvc_threadpool_new(n_threads);
    CHECK(tp != NULL);
    if (!tp)
        return;
    for (int round = 0; round < 20; round++) {
        const int64_t until = kvc_time_us() + 2000000;
        while (atomic_load(&tp->sleeping) < n_threads - 1 && kvc_time_us() < until)
            sched_yield();
        CHECKF(atomic_load(&tp->sleeping) == n_threads - 1, "round %d: %d of %d idle workers asleep",
               round, atomic_load(&tp->sleeping), n_threads - 1);
        if (round == 0) {       /* asleep means not spinning: ~no CPU over 100 ms */
            struct timespec a, b;
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
            const int64_t t0 = kvc_time_us();
            while (kvc_time_us() < t0 + 100000)
                sched_yield(), nanosleep(&(struct timespec){ 0, 5000000 }, NULL);
            clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
            const double cpu_ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
            CHECKF(cpu_ms < 20.0, "an idle pool of %d threads used %.1f ms of CPU in 100 ms", n_threads, cpu_ms);
        }
        gather g = { 0, n_threads, 0 };
        kvc_threadpool_run(tp, n_threads, meet, &g);
        CHECKF(!atomic_load(&g.timed_out), "round %d: a sleeping worker was not woken", round);
        /* back to back: the workers spin and take the next run at once */
        gather g2 = { 0, n_threads, 0 };
        kvc_threadpool_run(tp, n_threads, meet, &g2);
        CHECK(!atomic_load(&g2.timed_out));
    }
    kvc_threadpool_free(tp);
}

int main(void)
{
    check_sleep_and_wake(2);
    check_sleep_and_wake(4);
    enum { N_THREADS = 6, RUNS = 40000, BIG = 64 };
    kvc_threadpool *tp = kvc_threadpool_new(N_THREADS);
    CHECK(tp != NULL);
    if (!tp)
        return test_done("test_threadpool_race");
    /* Runs alternate between few tasks and many: a stray worker holding a
     * small run's counter (at its end) and a big run's count finds tasks to
     * claim. Every run has its own counts, checked after it returns. */
    static atomic_int hits[2][BIG];
    int bad_runs = 0, first_bad = -1;
    for (int r = 0; r < RUNS; r++) {
        int64_t n = (r & 1) ? BIG : 2 + r % 3;
        atomic_int *h = hits[r & 1];
        for (int64_t i = 0; i < n; i++)
            atomic_store(&h[i], 0);
        job j = { h, n };
        kvc_threadpool_run(tp, n, count, &j);
        for (int64_t i = 0; i < n; i++)
            if (atomic_load(&h[i]) != 1) {
                if (first_bad < 0)
                    first_bad = r;
                bad_runs++;
                break;
            }
    }
    CHECKF(bad_runs == 0, "%d of %d runs ran a task other than once (first: run %d)", bad_runs,
           RUNS, first_bad);
    kvc_threadpool_free(tp);
    return test_done("test_threadpool_race");
}
