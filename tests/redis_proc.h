/* redis_proc.h - a redis-server of the tests' own: found on the PATH (or
 * /usr/bin, /usr/sbin), started on a free loopback port with nothing saved
 * and allkeys-lru, waited for, stopped. Header-only, for tests. */
#ifndef KVC_TEST_REDIS_PROC_H
#define KVC_TEST_REDIS_PROC_H

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct redis_proc {
    pid_t pid;
    int   port;
} redis_proc;

/* The path of an executable `name` on the PATH or in /usr/sbin, /usr/bin, or NULL. */
static const char *test_find_exe(const char *name)
{
    static char buf[4][1024];
    static int next;
    char *out = buf[next++ % 4];
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof(dirs), "%s:/usr/sbin:/usr/bin:/sbin", path ? path : "");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, 1024, "%s/%s", d, name);
        if (access(out, X_OK) == 0)
            return out;
    }
    return NULL;
}

/* A loopback TCP port free now (the kernel's pick). 0 on failure. */
static int test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* A PING answered within 200 ms. */
static bool redis_proc_ping(int port)
{
    struct timeval tv = { 0, 200 * 1000 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    bool ok = false;
    if (c && !c->err) {
        redisSetTimeout(c, tv);
        redisReply *r = redisCommand(c, "PING");
        ok = r && r->type == REDIS_REPLY_STATUS;
        if (r)
            freeReplyObject(r);
    }
    if (c)
        redisFree(c);
    return ok;
}

/* Start redis-server on `port` (0: a free one). false when it is not
 * installed (*absent) or did not answer within 10 s. */
static bool redis_proc_start(redis_proc *r, int port, bool *absent)
{
    const char *exe = test_find_exe("redis-server");
    *absent = exe == NULL;
    r->pid = 0;
    r->port = port ? port : test_free_port();
    if (!exe || r->port <= 0)
        return false;
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", r->port);
    fflush(NULL);                          /* the child must not write our buffers again */
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execl(exe, exe, "--port", ports, "--bind", "127.0.0.1", "--save", "", "--appendonly",
              "no", "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru", "--dir",
              "/tmp", (char *)NULL);
        _exit(127);
    }
    r->pid = pid;
    struct timespec nap = { 0, 20 * 1000 * 1000 };
    for (int i = 0; pid > 0 && i < 500; i++) {
        if (redis_proc_ping(r->port))
            return true;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            break;
        nanosleep(&nap, NULL);
    }
    if (pid > 0 && waitpid(pid, NULL, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    r->pid = 0;
    return false;
}

/* Stop it: SIGKILL (a crash, as the tests want) or SIGTERM; waits. */
static void redis_proc_stop(redis_proc *r, bool crash)
{
    if (r->pid > 0) {
        kill(r->pid, crash ? SIGKILL : SIGTERM);
        waitpid(r->pid, NULL, 0);
    }
    r->pid = 0;
}

/* ------------------------------------------------------------ slow proxy */

/* A TCP proxy on a loopback port to a loopback Redis that delays every chunk
 * the client sends by min_ms..max_ms (a far Redis: each round trip costs
 * that much more); replies go back at once. Loopback only. */
typedef struct slow_proxy {
    int       port, target, min_ms, max_ms;
    int       lfd;
    pthread_t thread;
    int       fds[64];     /* every socket opened, to shut at stop */
    int       n_fds;
    pthread_t pipes[64];   /* every pipe's thread, joined at stop */
    int       n_pipes;
    pthread_mutex_t mu;
    unsigned  seed;
} slow_proxy;

typedef struct slow_pipe {
    slow_proxy *px;
    int         from, to;
    bool        delay;
} slow_pipe;

static inline void *slow_pipe_main(void *arg)
{
    slow_pipe sp = *(slow_pipe *)arg;
    free(arg);
    char buf[65536];
    for (;;) {
        ssize_t r = read(sp.from, buf, sizeof(buf));
        if (r <= 0)
            break;
        if (sp.delay) {
            pthread_mutex_lock(&sp.px->mu);
            int span = sp.px->max_ms - sp.px->min_ms + 1;
            int ms = sp.px->min_ms + (int)(rand_r(&sp.px->seed) % (unsigned)span);
            pthread_mutex_unlock(&sp.px->mu);
            struct timespec t = { ms / 1000, (long)(ms % 1000) * 1000000L };
            nanosleep(&t, NULL);
        }
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(sp.to, buf + off, (size_t)(r - off));
            if (w <= 0)
                goto out;
            off += w;
        }
    }
out:
    shutdown(sp.to, SHUT_WR);
    return NULL;
}

static inline void slow_proxy_keep(slow_proxy *px, int fd)
{
    pthread_mutex_lock(&px->mu);
    if (px->n_fds < 64)
        px->fds[px->n_fds++] = fd;
    pthread_mutex_unlock(&px->mu);
}

static inline void slow_pipe_start(slow_proxy *px, int from, int to, bool delay)
{
    slow_pipe *sp = malloc(sizeof(*sp));
    *sp = (slow_pipe){ px, from, to, delay };
    pthread_mutex_lock(&px->mu);
    bool ok = px->n_pipes < 64 && pthread_create(&px->pipes[px->n_pipes], NULL,
                                                 slow_pipe_main, sp) == 0;
    px->n_pipes += ok;
    pthread_mutex_unlock(&px->mu);
    if (!ok)
        free(sp);
}

static inline void *slow_proxy_main(void *arg)
{
    slow_proxy *px = arg;
    for (;;) {
        int c = accept(px->lfd, NULL, NULL);
        if (c < 0)
            break;
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)px->target) };
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
            close(c);
            if (s >= 0)
                close(s);
            continue;
        }
        slow_proxy_keep(px, c);
        slow_proxy_keep(px, s);
        slow_pipe_start(px, c, s, true);
        slow_pipe_start(px, s, c, false);
    }
    return NULL;
}

/* Start a proxy to the Redis on `target`; false on failure. */
static inline bool slow_proxy_start(slow_proxy *px, int target, int min_ms, int max_ms)
{
    memset(px, 0, sizeof(*px));
    px->target = target;
    px->min_ms = min_ms;
    px->max_ms = max_ms;
    px->seed = 12345;
    pthread_mutex_init(&px->mu, NULL);
    px->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (px->lfd < 0 || bind(px->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(px->lfd, 16) != 0 || getsockname(px->lfd, (struct sockaddr *)&a, &len) != 0)
        return false;
    px->port = ntohs(a.sin_port);
    return pthread_create(&px->thread, NULL, slow_proxy_main, px) == 0;
}

/* Stop it: no more connections, every one open shut, its threads joined. */
static inline void slow_proxy_stop(slow_proxy *px)
{
    shutdown(px->lfd, SHUT_RDWR);
    close(px->lfd);
    pthread_join(px->thread, NULL);
    pthread_mutex_lock(&px->mu);
    for (int i = 0; i < px->n_fds; i++)
        shutdown(px->fds[i], SHUT_RDWR);
    pthread_mutex_unlock(&px->mu);
    for (int i = 0; i < px->n_pipes; i++)     /* they see EOF and end */
        pthread_join(px->pipes[i], NULL);
    for (int i = 0; i < px->n_fds; i++)
        close(px->fds[i]);
    pthread_mutex_destroy(&px->mu);
}

#endif
