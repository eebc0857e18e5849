/* http_client.h - what the tests need to talk to `kvchat serve` as a separate
 * process: start it on a free loopback port, send a request, read the whole
 * answer, stop it. HTTP/1.0 with Connection: close, so an answer (even a
 * stream) ends when the server closes the connection: no chunked decoding.
 * Header-only, for tests. */
#ifndef KVC_TEST_HTTP_CLIENT_H
#define KVC_TEST_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct http_server {
    pid_t pid;
    int   port;
} http_server;

/* Start `bin serve --port 0 args...` (NULL-terminated), its stderr going to
 * the file open on fd (left open), and read from there the port it says it
 * listens on. false when it did not start within timeout_s (the process is
 * then killed). */
static bool http_server_start_fd(http_server *s, const char *bin, const char *const *args,
                                 int timeout_s, int fd)
{
    const char *argv[64] = { bin, "serve", "--port", "0" };
    int argc = 4;
    for (int i = 0; args && args[i] && argc < 62; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        close(fd);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    s->port = 0;
    char buf[4096] = "";
    struct timespec nap = { 0, 20 * 1000 * 1000 };
    for (int i = 0; pid > 0 && s->port == 0 && i < timeout_s * 50; i++) {
        ssize_t k = pread(fd, buf, sizeof(buf) - 1, 0);
        buf[k > 0 ? k : 0] = 0;
        const char *at = strstr(buf, "listening on http://127.0.0.1:");
        if (at)
            s->port = atoi(at + strlen("listening on http://127.0.0.1:"));
        else if (waitpid(pid, NULL, WNOHANG) == pid) {
            s->pid = pid = 0;
            break;
        } else
            nanosleep(&nap, NULL);
    }
    if (s->port > 0)
        return true;
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    s->pid = 0;
    fprintf(stderr, "server did not start: %s\n", buf);
    return false;
}

/* The same, its stderr to a temporary file (removed at once). */
static inline bool http_server_start(http_server *s, const char *bin, const char *const *args,
                              int timeout_s)
{
    char log[] = "/tmp/kvc_serve_log_XXXXXX";
    int fd = mkstemp(log);
    if (fd < 0)
        return false;
    unlink(log);                             /* the server keeps it open */
    bool ok = http_server_start_fd(s, bin, args, timeout_s, fd);
    close(fd);
    return ok;
}

/* The same, its stderr to the file log_path (created or emptied), which the
 * test reads. */
static inline bool http_server_start_logged(http_server *s, const char *bin,
                                            const char *const *args, int timeout_s,
                                            const char *log_path)
{
    int fd = open(log_path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0)
        return false;
    bool ok = http_server_start_fd(s, bin, args, timeout_s, fd);
    close(fd);
    return ok;
}

static void http_server_stop(http_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
}

typedef struct http_resp {
    int    status;          /* 0: no answer */
    char  *raw;             /* the whole answer, NUL-terminated */
    size_t len;
    char  *body;            /* into raw */
    size_t body_len;
} http_resp;

static void http_resp_free(http_resp *r)
{
    free(r->raw);
    memset(r, 0, sizeof(*r));
}

/* One request with extra header lines (each ending in "\r\n"; NULL = none);
 * the answer read until the server closes (at most timeout_s). */
static http_resp http_request_ex(int port, const char *method, const char *path,
                                 const char *headers, const char *body, int timeout_s)
{
    http_resp r = { 0 };
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return r;
    }
    size_t blen = body ? strlen(body) : 0;
    char head[2048];
    int hl = snprintf(head, sizeof(head), "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                      "Connection: close\r\nContent-Type: application/json\r\n%s"
                      "Content-Length: %zu\r\n\r\n", method, path, headers ? headers : "",
                      blen);
    bool ok = send(fd, head, (size_t)hl, MSG_NOSIGNAL) == hl;
    for (size_t off = 0; ok && off < blen;) {
        ssize_t k = send(fd, body + off, blen - off, MSG_NOSIGNAL);
        ok = k > 0;
        off += k > 0 ? (size_t)k : 0;
    }
    size_t cap = 1 << 16;
    r.raw = malloc(cap);
    time_t end = time(NULL) + timeout_s;
    while (ok && r.raw && time(NULL) < end) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 200) <= 0)
            continue;
        if (r.len + 4096 > cap) {
            char *g = realloc(r.raw, cap *= 2);
            if (!g)
                break;
            r.raw = g;
        }
        ssize_t k = recv(fd, r.raw + r.len, cap - r.len - 1, 0);
        if (k <= 0)
            break;
        r.len += (size_t)k;
    }
    close(fd);
    if (!r.raw)
        return r;
    r.raw[r.len] = 0;
    char *sep = strstr(r.raw, "\r\n\r\n");
    if (sep && sscanf(r.raw, "HTTP/%*s %d", &r.status) == 1) {
        r.body = sep + 4;
        r.body_len = r.len - (size_t)(r.body - r.raw);
    }
    return r;
}

static inline http_resp http_request(int port, const char *method, const char *path, const char *body,
                              int timeout_s)
{
    return http_request_ex(port, method, path, NULL, body, timeout_s);
}

/* The value of a Prometheus metric without labels in a /metrics text, or -1. */
static inline double http_prom(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

/* Wait until the server on port has no background work left
 * (kvchat_background_pending 0; polled every 50 ms, at most 20 s). */
static inline bool http_wait_background(int port)
{
    for (int i = 0; i < 400; i++) {
        http_resp r = http_request(port, "GET", "/metrics", NULL, 10);
        double pending = r.body ? http_prom(r.body, "kvchat_background_pending") : -1;
        http_resp_free(&r);
        if (pending == 0)
            return true;
        struct timespec nap = { 0, 50 * 1000 * 1000 };
        nanosleep(&nap, NULL);
    }
    return false;
}

#endif
