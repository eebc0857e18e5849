/* server_bulk.c - the heavy work of large bodies on one thread of the lowest
 * CPU priority (see server.h).
 *
 * Parsing, rendering and tokenizing a body of megabytes takes a core for a
 * second or more. On the connection's own thread, a few of them at once took
 * the cores the engine computes on, and a running stream's tokens stalled
 * (p99 of its inter-token gap 9.5x idle with eight 7.5 MB prompts in flight).
 * Here they run one at a time on a thread of nice 19, whose share of a
 * contended core is ~1.5% of a nice-0 thread's: the engine's threads preempt
 * it the moment they wake. The connection thread waits for its job and goes
 * on. Not SCHED_IDLE: that class gets a core only when no other thread of the
 * machine wants one, so any other busy process (another test, a build) held
 * a large request back for as long as it ran (2 minutes, and the client gave
 * up, in test_server beside 3 busy loops).
 *
 * Only this thread is lowered: Linux keeps scheduling class and nice value
 * per thread, and an unprivileged thread can lower its own but not raise it
 * back, so the work goes to a thread that stays low rather than lowering a
 * connection's thread. */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "server.h"

typedef struct bulk_job {
    struct bulk_job *next;
    void           (*fn)(void *);
    void            *arg;
    bool             done;
} bulk_job;

struct srv_bulk {
    pthread_mutex_t mu;
    pthread_cond_t  work_cv;   /* a job queued, or stop: for the bulk thread */
    pthread_cond_t  done_cv;   /* a job done: for the threads waiting on theirs */
    bulk_job       *head, *tail;
    bool            stop;
    pthread_t       thread;
};

static void lower_priority(void)
{
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
}

static void *bulk_main(void *arg)
{
    srv_bulk *b = arg;
    lower_priority();
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->head && !b->stop)
            pthread_cond_wait(&b->work_cv, &b->mu);
        bulk_job *j = b->head;
        if (!j)
            break;                                   /* stop, and nothing queued */
        pthread_mutex_unlock(&b->mu);
        j->fn(j->arg);
        pthread_mutex_lock(&b->mu);
        b->head = j->next;
        if (!b->head)
            b->tail = NULL;
        j->done = true;
        pthread_cond_broadcast(&b->done_cv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

srv_bulk *srv_bulk_new(void)
{
    srv_bulk *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->work_cv, NULL);
    pthread_cond_init(&b->done_cv, NULL);
    if (pthread_create(&b->thread, NULL, bulk_main, b) != 0) {
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->work_cv);
        pthread_cond_destroy(&b->done_cv);
        free(b);
        return NULL;
    }
    return b;
}

void srv_bulk_run(srv_bulk *b, void (*fn)(void *), void *arg)
{
    if (!b) {
        fn(arg);
        return;
    }
    bulk_job j = { NULL, fn, arg, false };
    pthread_mutex_lock(&b->mu);
    if (b->tail)
        b->tail->next = &j;
    else
        b->head = &j;
    b->tail = &j;
    pthread_cond_signal(&b->work_cv);
    while (!j.done)
        pthread_cond_wait(&b->done_cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

void srv_bulk_free(srv_bulk *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_signal(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);                   /* it runs what is queued first */
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->work_cv);
    pthread_cond_destroy(&b->done_cv);
    free(b);
}
