/* threadpool.c - persistent workers claiming tasks from a shared counter.
 *
 * The counter carries the run's number in its high 32 bits, so a worker that
 * wakes late never claims a task of a run it did not read the parameters of.
 * The caller claims tasks too and waits only for tasks claimed by others to
 * finish: a worker that is slow to wake (a busy machine) costs nothing.
 *
 * Waiting. A decode step is hundreds of runs of a few microseconds each, so
 * a worker between runs spins (PAUSE) for up to WORKER_SPIN_US of wall time
 * before it sleeps on the condition variable: bounded in time, not in PAUSE
 * iterations, whose cost differs ~10x between CPUs (Skylake ~140 cycles, Zen
 * ~65). An idle pool (a server between requests) is asleep after that. The
 * caller publishes a run without the mutex and takes it to broadcast only
 * when a worker sleeps (`sleeping`; seq_cst on both sides, so either the
 * caller sees the sleeper or the sleeper, under the mutex, sees the run). The
 * caller waiting for tasks claimed by others spins: those tasks run on other
 * cores, and a yield (tried) gave the core to other processes on a loaded
 * machine and made decode slower. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define WORKER_SPIN_US 500   /* a worker's spin between runs before it sleeps */
#define CLOCK_EVERY    64    /* PAUSEs between clock reads (a clock read costs ~25-100 ns) */

/* A stress test (tests/test_threadpool_race.c) defines this to widen the
 * windows between a worker's reads of a run and the next run's writes. */
#ifndef KVC_TP_RACE_HOOK
#define KVC_TP_RACE_HOOK() ((void)0)
#endif

struct kvc_threadpool {
    int              n_threads;
    pthread_t       *workers;        /* n_threads - 1 */
    pthread_mutex_t  mu;
    pthread_cond_t   wake;
    atomic_uint      run;            /* number of the current run */
    atomic_int       stop;
    atomic_int       sleeping;       /* workers in (or entering) pthread_cond_wait */

    /* the run in progress, published after `next` is reset and before `run`
     * is bumped; atomic because a worker that wakes late may read them while
     * the next run writes them (it then finds the run number changed in
     * `next` and claims nothing) */
    _Atomic(kvc_task_fn) fn;
    _Atomic(void *)      ctx;
    atomic_int_fast64_t  n_tasks;
    atomic_uint_fast64_t next;       /* run << 32 | next task index */
    atomic_int_fast64_t  done;       /* tasks finished */
};

typedef struct { kvc_threadpool *tp; int index; } worker_arg;

/* Claim and run tasks of run `run` until none are left. */
static void run_tasks(kvc_threadpool *tp, unsigned run, kvc_task_fn fn, void *ctx,
                      int64_t n_tasks, int thread)
{
    for (;;) {
        uint64_t v = atomic_load_explicit(&tp->next, memory_order_acquire);
        if ((unsigned)(v >> 32) != run || (int64_t)(v & 0xffffffffu) >= n_tasks)
            return;
        if (!atomic_compare_exchange_weak_explicit(&tp->next, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        KVC_ASSERT(thread < tp->n_threads);
        fn(ctx, (int64_t)(v & 0xffffffffu), thread);
        atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
    }
}

static void *worker_main(void *p)
{
    worker_arg *arg = p;
    kvc_threadpool *tp = arg->tp;
    int index = arg->index;
    free(arg);
    unsigned seen = 0;
    for (;;) {
        unsigned run;
        int spins = 0;
        int64_t until = 0;
        while ((run = atomic_load_explicit(&tp->run, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins % CLOCK_EVERY != 0) {
                __builtin_ia32_pause();
                continue;
            }
            const int64_t now = kvc_time_us();
            if (until == 0)
                until = now + WORKER_SPIN_US;
            if (now < until)
                continue;
            atomic_fetch_add(&tp->sleeping, 1);          /* seq_cst: see kvc_threadpool_run */
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->run) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->wake, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
            atomic_fetch_sub(&tp->sleeping, 1);
        }
        if (atomic_load(&tp->stop))
            return NULL;
        seen = run;
        KVC_TP_RACE_HOOK();
        /* read after `run` (acquire): these belong to run `run` or a later one,
         * and run_tasks checks the run number before claiming anything */
        run_tasks(tp, run, atomic_load_explicit(&tp->fn, memory_order_relaxed),
                  atomic_load_explicit(&tp->ctx, memory_order_relaxed),
                  atomic_load_explicit(&tp->n_tasks, memory_order_relaxed), index);
    }
}

kvc_threadpool *kvc_threadpool_new(int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    kvc_threadpool *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return NULL;
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    tp->workers = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!tp->workers) {
        free(tp);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof(*arg));
        if (!arg || (arg->tp = tp, arg->index = i,
                     pthread_create(&tp->workers[i - 1], NULL, worker_main, arg) != 0)) {
            free(arg);
            tp->n_threads = i;      /* the workers started so far */
            kvc_threadpool_free(tp);
            return NULL;
        }
    }
    return tp;
}

void kvc_threadpool_free(kvc_threadpool *tp)
{
    if (!tp)
        return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n_threads; i++)
        pthread_join(tp->workers[i - 1], NULL);
    pthread_cond_destroy(&tp->wake);
    pthread_mutex_destroy(&tp->mu);
    free(tp->workers);
    free(tp);
}

int kvc_threadpool_n_threads(const kvc_threadpool *tp) { return tp->n_threads; }

void kvc_threadpool_run(kvc_threadpool *tp, int64_t n_tasks, kvc_task_fn fn, void *ctx)
{
    if (n_tasks <= 0)
        return;
    KVC_ASSERT(n_tasks <= 0xffffffff);   /* a task index is the counter's low 32 bits */
    if (tp->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    unsigned run = atomic_load(&tp->run) + 1;
    /* The counter first: once it carries the new run's number, a worker still
     * in the previous run (or one that reads the parameters below on its way
     * into it) can claim nothing. Published the other way round, such a
     * worker could pair this run's function and task count with the old
     * counter and run a task that is then claimed again. No worker claims a
     * task of the new run before `run` is bumped (release, below). */
    atomic_store_explicit(&tp->next, (uint64_t)run << 32, memory_order_seq_cst);
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    KVC_TP_RACE_HOOK();
    atomic_store_explicit(&tp->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&tp->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&tp->n_tasks, n_tasks, memory_order_relaxed);
    /* seq_cst store, then seq_cst load of `sleeping`: a worker that counted
     * itself after this load reads the new `run` under the mutex and does
     * not wait; one counted before gets the broadcast (it holds the mutex
     * from its check of `run` until pthread_cond_wait releases it) */
    atomic_store(&tp->run, run);
    if (atomic_load(&tp->sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->wake);
        pthread_mutex_unlock(&tp->mu);
    }
    run_tasks(tp, run, fn, ctx, n_tasks, 0);
    while (atomic_load_explicit(&tp->done, memory_order_acquire) < n_tasks)
        __builtin_ia32_pause();
    KVC_ASSERT(atomic_load(&tp->done) == n_tasks);   /* no task ran twice */
}
