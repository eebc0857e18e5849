/* socket_client.h - a plain-socket HTTP/1.1 client for the in-process server tests, JSON
 * helpers, and waiting for an engine to go idle: one request per connection,
 * the answer parsed (status, headers, de-chunked body). Header-only (static
 * functions) so that each test binary takes what it uses. */
#ifndef KVC_SOCKET_CLIENT_H
#define KVC_SOCKET_CLIENT_H

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "kvchat.h"
#include "test.h"

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

/* ========================================================== HTTP client */

typedef struct resp {
    int    status;       /* 0: no response (connection failed or closed) */
    char  *head;         /* status line and headers */
    char  *body;         /* de-chunked, NUL-terminated */
    size_t body_len;
} resp;

static void resp_free(resp *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof(*r));
}

static int connect_to(int p, int timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = { .tv_sec = timeout_s };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}

/* Everything until EOF, error or time-out. */
static char *recv_all(int fd, size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    for (;;) {
        if (len + 4096 > cap)
            b = realloc(b, cap *= 2);
        ssize_t k = recv(fd, b + len, cap - len - 1, 0);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    b[len] = 0;
    *n = len;
    return b;
}

/* Value of header `name` in r->head (NULL when absent), up to the line end. */
static const char *header(const resp *r, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = r->head ? strstr(r->head, "\r\n") : NULL; p; p = strstr(p + 2, "\r\n"))
        if (!strncasecmp(p + 2, name, n) && p[2 + n] == ':') {
            const char *v = p + 3 + n, *e = strstr(v, "\r\n");
            while (*v == ' ')
                v++;
            snprintf(out, cap, "%.*s", (int)(e ? e - v : (long)strlen(v)), v);
            return out;
        }
    return NULL;
}

static void dechunk(resp *r)
{
    char *out = malloc(r->body_len + 1), *p = r->body, *end = r->body + r->body_len;
    size_t n = 0;
    while (p < end) {
        size_t k = strtoul(p, &p, 16);
        p = strstr(p, "\r\n");
        if (!k || !p)
            break;
        p += 2;
        if (p + k > end)
            k = (size_t)(end - p);
        memcpy(out + n, p, k);
        n += k;
        p += k + 2;
    }
    out[n] = 0;
    free(r->body);
    r->body = out;
    r->body_len = n;
}

static resp parse_raw(char *raw, size_t n)
{
    resp r = { 0 };
    char *sep = strstr(raw, "\r\n\r\n"), hv[64];
    if (!sep || sscanf(raw, "HTTP/1.%*d %d", &r.status) != 1) {
        free(raw);
        return r;
    }
    r.head = strndup(raw, (size_t)(sep - raw));
    r.body_len = n - (size_t)(sep + 4 - raw);
    r.body = malloc(r.body_len + 1);
    memcpy(r.body, sep + 4, r.body_len);
    r.body[r.body_len] = 0;
    free(raw);
    if (header(&r, "Transfer-Encoding", hv, sizeof(hv)) && strstr(hv, "chunked"))
        dechunk(&r);
    return r;
}

/* One request on a new connection; extra: more header lines ("K: V\r\n"). */
static resp http_to(int p, const char *method, const char *path, const char *extra,
                    const char *body, size_t body_len)
{
    resp r = { 0 };
    int fd = connect_to(p, 120);
    if (fd < 0)
        return r;
    char head[1024];
    int hn = snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s"
                      "Connection: close\r\n", method, path, extra ? extra : "");
    if (body)
        hn += snprintf(head + hn, sizeof(head) - (size_t)hn,
                       "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    hn += snprintf(head + hn, sizeof(head) - (size_t)hn, "\r\n");
    send_all(fd, head, (size_t)hn);
    if (body)
        send_all(fd, body, body_len);   /* may fail when the server answers early */
    size_t n;
    char *raw = recv_all(fd, &n);
    close(fd);
    return parse_raw(raw, n);
}

/* ============================================================ JSON help */

static const cJSON *jpath(const cJSON *o, const char *path)
{
    char key[64];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof(key), "%.*s", (int)n, path);
        o = (key[0] >= '0' && key[0] <= '9') ? cJSON_GetArrayItem(o, atoi(key))
                                             : cJSON_GetObjectItemCaseSensitive(o, key);
        path += n + (path[n] == '.');
    }
    return o;
}

static double jnum(const cJSON *o, const char *path)
{
    const cJSON *v = jpath(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : -1e300;
}

static const char *jstr(const cJSON *o, const char *path)
{
    const cJSON *v = jpath(o, path);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A POST expecting an OpenAI error: checks status, shape, type, and that
 * the message mentions `mention` and param equals `param` (when non-NULL). */
static void expect_error(const char *what, resp r, int status, const char *code,
                         const char *param, const char *mention)
{
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    CHECKF(r.status == status, "%s: status %d, expected %d (%.200s)", what, r.status, status,
           r.body ? r.body : "");
    const char *msg = jstr(j, "error.message"), *type = jstr(j, "error.type");
    CHECKF(msg && *msg && type && *type, "%s: no error.message/type: %.200s", what,
           r.body ? r.body : "");
    CHECKF(cJSON_GetObjectItem(jpath(j, "error"), "param") &&
           cJSON_GetObjectItem(jpath(j, "error"), "code"), "%s: param/code missing", what);
    if (code)
        CHECKF(jstr(j, "error.code") && !strcmp(jstr(j, "error.code"), code),
               "%s: code %s, expected %s", what, jstr(j, "error.code"), code);
    if (param)
        CHECKF(jstr(j, "error.param") && !strcmp(jstr(j, "error.param"), param),
               "%s: param %s, expected %s", what, jstr(j, "error.param"), param);
    if (mention)
        CHECKF(msg && strstr(msg, mention), "%s: message '%s' does not mention '%s'", what,
               msg, mention);
    cJSON_Delete(j);
    resp_free(&r);
}

/* Wait until the engine is idle (nothing running or queued); false after 20 s. */
static bool wait_idle(kvc_engine *e)
{
    for (int i = 0; i < 2000; i++) {
        kvc_engine_metrics m;
        kvc_engine_get_metrics(e, &m);
        if (m.running == 0 && m.queue_depth == 0)
            return true;
        usleep(10000);
    }
    return false;
}

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#endif
