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

int main(void)
{
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
