/* redis_proc.h - a redis-server of the tests' own: found on the PATH (or
 * /usr/bin, /usr/sbin), started on a free loopback port with nothing saved
 * and allkeys-lru, waited for, stopped. Header-only, for tests. */
#ifndef KVC_TEST_REDIS_PROC_H
#define KVC_TEST_REDIS_PROC_H

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
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

#endif
