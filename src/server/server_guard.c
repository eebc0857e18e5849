/* server_guard.c - watching connections' sockets (see server.h): a deadline
 * for receiving each request, that bytes do not extend, and whether a client
 * hung up.
 *
 * libmicrohttpd's connection time-out restarts with every byte, so a client
 * sending one byte every few seconds holds a connection (and its thread)
 * forever; a few hundred such clients used to lock everyone out. Here every
 * open connection is registered with the time its current request may take
 * until it has arrived whole; a watchdog thread shuts down the socket of one
 * past it. shutdown() (not close()) leaves the descriptor to libmicrohttpd,
 * whose connection thread then sees the end of the stream and closes it.
 *
 * The descriptor is valid while the connection is registered: libmicrohttpd
 * reports a connection closed before it closes its socket, and that report
 * (srv_guard_close) takes the same mutex the watchdog holds while it shuts
 * sockets down, so a descriptor number reused by a new connection is never
 * touched. */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "common.h"
#include "server.h"

struct srv_conn {
    srv_conn            *prev, *next;  /* the guard's list */
    int                  fd;
    atomic_int_least64_t deadline_ms;  /* monotonic; 0 = none (a request being answered) */
};

struct srv_guard {
    pthread_mutex_t mu;
    pthread_cond_t  cv;                /* signalled to stop the watchdog */
    pthread_t       thread;
    bool            stop;
    int64_t         deadline_ms;       /* for one request to arrive */
    srv_conn       *head;              /* open connections */
    int64_t         n_open;
    uint64_t        n_dropped;         /* shut down for missing the deadline */
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Shut down the sockets past their deadline. Called with g->mu held. */
static void drop_late(srv_guard *g, int64_t now)
{
    for (srv_conn *c = g->head; c; c = c->next) {
        int64_t d = atomic_load(&c->deadline_ms);
        if (d > 0 && d <= now) {
            shutdown(c->fd, SHUT_RDWR);
            atomic_store(&c->deadline_ms, 0);   /* once */
            g->n_dropped++;
        }
    }
}

static void *watchdog(void *p)
{
    srv_guard *g = p;
    /* a tenth of the deadline (at most 250 ms): a late sender is dropped
     * within 10% of it */
    int64_t tick = KVC_MAX(10, KVC_MIN(250, g->deadline_ms / 10));
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(tick % 1000) * 1000000;
        ts.tv_sec += tick / 1000 + ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (!g->stop)
            drop_late(g, now_ms());
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int srv_guard_new(int64_t deadline_ms, srv_guard **out)
{
    *out = NULL;
    srv_guard *g = calloc(1, sizeof(*g));
    if (!g)
        return KVC_ERR_NOMEM;
    g->deadline_ms = deadline_ms > 0 ? deadline_ms : 30000;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, watchdog, g) != 0) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g);
        return KVC_ERR_NOMEM;
    }
    *out = g;
    return KVC_OK;
}

void srv_guard_free(srv_guard *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    for (srv_conn *c = g->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

srv_conn *srv_guard_open(srv_guard *g, int fd)
{
    srv_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->fd = fd;
    atomic_init(&c->deadline_ms, now_ms() + g->deadline_ms);
    pthread_mutex_lock(&g->mu);
    c->next = g->head;
    if (g->head)
        g->head->prev = c;
    g->head = c;
    g->n_open++;
    pthread_mutex_unlock(&g->mu);
    return c;
}

void srv_guard_close(srv_guard *g, srv_conn *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&g->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        g->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    g->n_open--;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

void srv_guard_arm(srv_guard *g, srv_conn *c)
{
    if (c)
        atomic_store(&c->deadline_ms, now_ms() + g->deadline_ms);
}

void srv_guard_disarm(srv_conn *c)
{
    if (c)
        atomic_store(&c->deadline_ms, 0);
}

void srv_guard_counts(srv_guard *g, int64_t *open, uint64_t *dropped)
{
    pthread_mutex_lock(&g->mu);
    *open = g->n_open;
    *dropped = g->n_dropped;
    pthread_mutex_unlock(&g->mu);
}

bool srv_peer_gone(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    return fd >= 0 && poll(&p, 1, 0) > 0 &&
           (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}
