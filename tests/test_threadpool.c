/* test_threadpool.c - every task runs exactly once, for any thread count. */
#include <stdatomic.h>

#include "threadpool.h"
#include "test.h"

typedef struct { atomic_int *hits; int n_threads; atomic_int bad_thread; } job;

static void task(void *ctx, int64_t t, int thread)
{
    job *j = ctx;
    atomic_fetch_add(&j->hits[t], 1);
    if (thread < 0 || thread >= j->n_threads)
        atomic_store(&j->bad_thread, 1);
}

int main(void)
{
    for (int nt = 1; nt <= 4; nt++) {
        kvc_threadpool *tp = kvc_threadpool_new(nt);
        CHECK(tp != NULL);
        CHECK_EQ_INT(kvc_threadpool_n_threads(tp), nt);
        for (int round = 0; round < 200; round++) {
            int n = 1 + (round * 37) % 300;
            atomic_int hits[300];
            for (int i = 0; i < n; i++)
                atomic_init(&hits[i], 0);
            job j = { hits, nt, 0 };
            kvc_threadpool_run(tp, n, task, &j);
            int ok = 1;
            for (int i = 0; i < n; i++)
                ok &= atomic_load(&hits[i]) == 1;
            CHECKF(ok, "threads %d round %d: a task ran other than once", nt, round);
            CHECK(atomic_load(&j.bad_thread) == 0);
        }
        kvc_threadpool_run(tp, 0, task, NULL);   /* nothing to do */
        kvc_threadpool_free(tp);
    }
    kvc_threadpool_free(NULL);
    return test_done("test_threadpool");
}
