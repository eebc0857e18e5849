/* threadpool.h - a fixed set of worker threads that run one parallel loop at a time.
 *
 * kvc_threadpool_run(tp, n_tasks, fn, ctx) calls fn(ctx, task, thread) for every
 * task in [0, n_tasks) across the pool's threads (the caller's thread is thread
 * 0) and returns when all are done. Which thread runs which task varies from
 * run to run, so a task's result must depend only on the task index: this is
 * what keeps the engine's output independent of the thread count. `thread`
 * (in [0, n_threads)) exists only to pick per-thread scratch memory.
 *
 * Workers spin for up to half a millisecond between loops, because a forward
 * pass runs hundreds of short loops per token, then sleep: an idle pool uses
 * no CPU. One caller at a time. */
#ifndef KVC_THREADPOOL_H
#define KVC_THREADPOOL_H

#include "common.h"

typedef struct kvc_threadpool kvc_threadpool;
typedef void (*kvc_task_fn)(void *ctx, int64_t task, int thread);

/* n_threads >= 1 (1 = everything on the caller's thread). NULL on failure. */
kvc_threadpool *kvc_threadpool_new(int n_threads);
void kvc_threadpool_free(kvc_threadpool *tp);          /* NULL ok; joins the workers */
int  kvc_threadpool_n_threads(const kvc_threadpool *tp);
void kvc_threadpool_run(kvc_threadpool *tp, int64_t n_tasks, kvc_task_fn fn, void *ctx);

#endif
