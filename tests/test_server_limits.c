/* test_server_limits.c - the server when pushed (issue 11): connection
 * floods, slow senders, per-address limits, authentication before routing, a
 * request that can never fit, invalid UTF-8 in every string field, and a
 * client that leaves a request answered whole.
 *
 *  1. Flood: more idle and trickling connections than the old fixed limit of
 *     256, held past the request deadline, while a normal client is served
 *     throughout (its latency is printed); every flooding connection is
 *     dropped by the deadline although the tricklers keep sending.
 *  2. Deadline: a request whose headers, or whose body, arrive one byte at a
 *     time is dropped before it completes; GETs keep the connection alive.
 *  3. Per-address limit: the connection past it is refused; one is accepted
 *     again when another closes.
 *  4. With an API key, unknown routes and wrong methods answer 401 too.
 *  5. A request larger than the whole KV pool: 400 with the sizes, no
 *     Retry-After.
 *  6. Invalid UTF-8 in every string field (and in the URL and the server's
 *     model name): every body, and every streamed event, is valid UTF-8 and
 *     valid JSON.
 *  7. A non-streaming request whose client disconnects stops generating. */
#include <errno.h>
#include <sys/resource.h>

#include "socket_client.h"
#include "kvchat.h"
#include "model_gen.h"
#include "server.h"
#include "test.h"
#include "unicode.h"

static kvc_engine *engine;
static int port;            /* the main server (its model name is not valid UTF-8) */
static const char chat_body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],"
                                "\"max_tokens\":4,\"temperature\":0}";

static kvc_server *start(kvc_engine *e, const kvc_server_params *tweak)
{
    kvc_server_params sp = tweak ? *tweak : kvc_server_default_params();
    sp.port = 0;
    kvc_server *s = NULL;
    char err[512];
    CHECKF(kvc_server_start(e, &sp, &s, err, sizeof(err)) == KVC_OK, "server start: %s", err);
    return s;
}

static double now_s(void) { return kvc_time_us() / 1e6; }

/* Whether the server closed fd (EOF or reset), without waiting. */
static bool closed_by_server(int fd)
{
    char c;
    ssize_t k = recv(fd, &c, 1, MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* ================================================================ flood */

enum { N_IDLE = 200, N_TRICKLE = 150 };

static void test_flood(void)
{
    int need = N_IDLE + N_TRICKLE + 64;
    if (kvc_server_default_max_connections() < need) {
        printf("flood: the descriptor limit allows %d connections; skipped\n",
               kvc_server_default_max_connections());
        return;
    }
    kvc_server_params sp = kvc_server_default_params();
    sp.request_timeout_s = 2;
    kvc_server *s = start(engine, &sp);
    if (!s)
        return;
    int p = kvc_server_port(s);
    static int fds[N_IDLE + N_TRICKLE];
    int opened = 0;
    for (int i = 0; i < N_IDLE + N_TRICKLE; i++)
        opened += (fds[i] = connect_to(p, 5)) >= 0;
    CHECKF(opened == N_IDLE + N_TRICKLE, "opened %d of %d connections", opened,
           N_IDLE + N_TRICKLE);
    /* Tricklers send a header that would take minutes at one byte a tick. */
    static char trickle[4096];
    int tn = snprintf(trickle, sizeof(trickle), "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ");
    memset(trickle + tn, 'a', sizeof(trickle) - (size_t)tn);
    int sent = 0, served = 0, tries = 0;
    double worst = 0, t_end = now_s() + 2.0 * sp.request_timeout_s + 1.5;
    while (now_s() < t_end) {
        for (int i = N_IDLE; i < N_IDLE + N_TRICKLE; i++)
            if (fds[i] >= 0)
                send(fds[i], trickle + sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        sent++;
        double t0 = now_s();
        resp r = tries % 4 == 3
               ? http_to(p, "POST", "/v1/chat/completions", NULL, chat_body, strlen(chat_body))
               : http_to(p, "GET", "/health", NULL, NULL, 0);
        double dt = now_s() - t0;
        worst = dt > worst ? dt : worst;
        served += r.status == 200;
        tries++;
        resp_free(&r);
        usleep(200000);
    }
    CHECKF(served == tries, "a normal client was served %d times of %d beside %d idle and %d "
           "trickling connections", served, tries, N_IDLE, N_TRICKLE);
    printf("flood: %d idle + %d trickling connections (1 byte per %.2f s each): a normal client "
           "served %d of %d times, slowest %.3f s\n", N_IDLE, N_TRICKLE,
           (2.0 * sp.request_timeout_s + 1.5) / sent, served, tries, worst);
    /* every one is dropped by the deadline (a slow machine: give it time) */
    int dropped = 0;
    for (int wait = 0; wait < 300 && dropped < opened; wait++) {
        for (int i = 0; i < N_IDLE + N_TRICKLE; i++)
            if (fds[i] >= 0 && closed_by_server(fds[i])) {
                close(fds[i]);
                fds[i] = -1;
                dropped++;
            }
        if (dropped < opened)
            usleep(100000);
    }
    for (int i = 0; i < N_IDLE + N_TRICKLE; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    CHECKF(dropped == opened, "%d of %d flooding connections were dropped by the deadline "
           "(tricklers had sent %d of %zu bytes)", dropped, opened, sent, sizeof(trickle));
    resp r = http_to(p, "GET", "/metrics", NULL, NULL, 0);
    static const char name[] = "\nkvchat_connections_dropped_total ";
    const char *d = r.body ? strstr(r.body, name) : NULL;
    CHECKF(d && atof(d + strlen(name)) >= N_IDLE + N_TRICKLE, "dropped_total: %.60s",
           d ? d : "absent");
    resp_free(&r);
    kvc_server_stop(s);
}

/* ============================================================= deadline */

/* Send `msg` one byte per 50 ms; the number of bytes sent before the server
 * closed the connection (all of them: it did not). */
static size_t trickle_until_closed(int fd, const char *msg, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (closed_by_server(fd) || send(fd, msg + i, 1, MSG_NOSIGNAL) != 1)
            return i;
        usleep(50000);
    }
    return n;
}

/* One response on a kept-alive connection (Content-Length framed): status. */
static int read_one(int fd)
{
    char buf[8192];
    size_t n = 0;
    char *end = NULL;
    while (!end && n < sizeof(buf) - 1) {
        ssize_t k = recv(fd, buf + n, sizeof(buf) - 1 - n, 0);
        if (k <= 0)
            return 0;
        n += (size_t)k;
        buf[n] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    const char *cl = end ? strcasestr(buf, "\r\nContent-Length:") : NULL;
    size_t want = (size_t)(end - buf) + 4 + (cl ? strtoul(cl + 17, NULL, 10) : 0);
    while (n < want && n < sizeof(buf) - 1) {
        ssize_t k = recv(fd, buf + n, sizeof(buf) - 1 - n, 0);
        if (k <= 0)
            return 0;
        n += (size_t)k;
    }
    int status = 0;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    return status;
}

static void test_deadline(void)
{
    kvc_server_params sp = kvc_server_default_params();
    sp.request_timeout_s = 1;
    kvc_server *s = start(engine, &sp);
    if (!s)
        return;
    int p = kvc_server_port(s);
    /* headers one byte at a time: 100 bytes would take 5 s */
    char head[128];
    snprintf(head, sizeof(head), "GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: %-58s\r\n\r\n", "a");
    int fd = connect_to(p, 10);
    size_t got = trickle_until_closed(fd, head, strlen(head));
    CHECKF(got < strlen(head), "slow headers: all %zu bytes sent, never dropped", got);
    close(fd);
    /* the body one byte at a time */
    char req[512], body[200];
    memset(body, ' ', sizeof(body));
    memcpy(body, "{}", 2);
    int hn = snprintf(req, sizeof(req), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      "Content-Length: %zu\r\n\r\n", sizeof(body));
    fd = connect_to(p, 10);
    send_all(fd, req, (size_t)hn);
    got = trickle_until_closed(fd, body, sizeof(body));
    CHECKF(got < sizeof(body), "slow body: all %zu bytes sent, never dropped", got);
    close(fd);
    /* GETs keep the connection: three on one, the last after most of a deadline */
    fd = connect_to(p, 10);
    const char *g = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < 3; i++) {
        if (i == 2)
            usleep(600000);
        CHECKF(send_all(fd, g, strlen(g)) && read_one(fd) == 200, "keep-alive GET %d", i);
    }
    close(fd);
    kvc_server_stop(s);
}

/* ================================================================ per IP */

static void test_per_ip(void)
{
    kvc_server_params sp = kvc_server_default_params();
    sp.max_connections_per_ip = 4;
    kvc_server *s = start(engine, &sp);
    if (!s)
        return;
    int p = kvc_server_port(s), fds[4];
    for (int i = 0; i < 4; i++)
        fds[i] = connect_to(p, 5);
    usleep(100000);
    resp r = http_to(p, "GET", "/health", NULL, NULL, 0);
    CHECKF(r.status == 0, "a 5th connection from one address was answered: %d", r.status);
    resp_free(&r);
    for (int i = 0; i < 4; i++) {   /* the four are still served */
        const char *g = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
        CHECKF(send_all(fds[i], g, strlen(g)) && read_one(fds[i]) == 200, "connection %d", i);
    }
    close(fds[0]);
    int status = 0;
    for (int i = 0; i < 250 && status != 200; i++, usleep(20000)) {
        r = http_to(p, "GET", "/health", NULL, NULL, 0);
        status = r.status;
        resp_free(&r);
    }
    CHECKF(status == 200, "after one closed, a new connection: %d", status);
    for (int i = 1; i < 4; i++)
        close(fds[i]);
    kvc_server_stop(s);
}

/* ================================================================== auth */

static void test_auth_first(void)
{
    kvc_server_params sp = kvc_server_default_params();
    sp.api_key = "sekrit";
    kvc_server *s = start(engine, &sp);
    if (!s)
        return;
    int p = kvc_server_port(s);
    const char *key = "Authorization: Bearer sekrit\r\n";
    struct { const char *method, *path, *extra; int status; } cases[] = {
        { "GET", "/nothing", NULL, 401 },      { "GET", "/v1/chat/completions", NULL, 401 },
        { "POST", "/health", NULL, 401 },      { "DELETE", "/v1/models", NULL, 401 },
        { "GET", "/health", NULL, 200 },       { "GET", "/nothing", key, 404 },
        { "GET", "/v1/chat/completions", key, 405 }, { "POST", "/health", key, 405 },
        { "GET", "/v1/models", key, 200 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        resp r = http_to(p, cases[i].method, cases[i].path, cases[i].extra, NULL, 0);
        CHECKF(r.status == cases[i].status, "%s %s %s: %d, expected %d", cases[i].method,
               cases[i].path, cases[i].extra ? "with key" : "without key", r.status,
               cases[i].status);
        resp_free(&r);
    }
    kvc_server_stop(s);
}

/* ============================================================ never fits */

static void test_never_fits(kvc_model *m)
{
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_parallel = 1;
    ep.n_threads = 1;
    ep.kv_budget_mib = 1;
    ep.n_ctx = 1 << 16;   /* the context allows what the pool cannot hold */
    kvc_engine *e = NULL;
    char err[512], body[256];
    CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "engine: %s", err);
    kvc_server *s = e ? start(e, NULL) : NULL;
    if (s) {
        kvc_engine_metrics em;
        kvc_engine_get_metrics(e, &em);
        int max_tokens = (int)(em.blocks_total * em.block_tokens) + 100;
        snprintf(body, sizeof(body), "{\"prompt\":\"hello\",\"max_tokens\":%d}", max_tokens);
        resp r = http_to(kvc_server_port(s), "POST", "/v1/completions", NULL, body, strlen(body));
        char hv[32];
        CHECK(!header(&r, "Retry-After", hv, sizeof(hv)));
        expect_error("never fits", r, 400, "context_length_exceeded", NULL, "KV cache holds");
        r = http_to(kvc_server_port(s), "POST", "/v1/chat/completions", NULL, chat_body,
                    strlen(chat_body));
        CHECKF(r.status == 200, "a request that fits, after: %d", r.status);
        resp_free(&r);
        kvc_server_stop(s);
    }
    kvc_engine_free(e);
}

/* ================================================================= UTF-8 */

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int r = kvc_utf8_decode(s + i, n - i, NULL);
        if (r <= 0)
            return false;
        i += (size_t)r;
    }
    return true;
}

/* The body (or each event of a stream) is valid UTF-8 and valid JSON. */
static void check_body(const char *what, const resp *r)
{
    CHECKF(r->status > 0, "%s: no answer", what);
    CHECKF(r->body && valid_utf8(r->body, r->body_len), "%s: the body is not valid UTF-8", what);
    if (!r->body || strncmp(r->body, "data: ", 6) != 0) {
        cJSON *j = cJSON_Parse(r->body ? r->body : "");
        CHECKF(j != NULL, "%s (%d): the body is not JSON: %.200s", what, r->status,
               r->body ? r->body : "");
        cJSON_Delete(j);
        return;
    }
    for (char *ev = r->body; (ev = strstr(ev, "data: ")); ev += 6) {
        char *end = strstr(ev, "\n\n");
        if (!strncmp(ev + 6, "[DONE]", 6))
            continue;
        cJSON *j = cJSON_ParseWithLength(ev + 6, end ? (size_t)(end - ev - 6) : strlen(ev + 6));
        CHECKF(j != NULL, "%s: a stream event is not JSON: %.100s", what, ev);
        cJSON_Delete(j);
    }
}

static void test_utf8(void)
{
    /* bytes no UTF-8 text holds: a stray continuation, a lone lead byte, a
     * surrogate, an overlong '/', a cut 3-byte sequence at the end */
    static const char bad[] = "\x80x\xff\xc3(\xed\xa0\x80\xc0\xaf\xe2\x82";
    static const char *const chat_fields[] = {
        "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]",
        "{\"user\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]",
        "{\"prompt_cache_key\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]",
        "{\"messages\":[{\"role\":\"%s\",\"content\":\"hi\"}]",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]",
        "{\"messages\":[{\"role\":\"user\",\"name\":\"%s\",\"content\":\"hi\"}]",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"%s\"}]}]",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"%s\",\"text\":\"x\"}]}]",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":\"%s\"",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":[\"a\",\"%s\"]",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"%s\":1",
    };
    static const char *const completion_fields[] = {
        "{\"prompt\":\"%s\"", "{\"prompt\":[\"%s\"]", "{\"model\":\"%s\",\"prompt\":\"x\"",
        "{\"prompt\":\"x\",\"stop\":[\"%s\"]",
    };
    char body[1024], tail[128], what[256];
    for (int stream = 0; stream < 2; stream++) {
        snprintf(tail, sizeof(tail), ",\"max_tokens\":6,\"temperature\":0,\"stream\":%s}",
                 stream ? "true" : "false");
        for (int kind = 0; kind < 2; kind++) {
            const char *const *f = kind ? completion_fields : chat_fields;
            size_t nf = kind ? sizeof(completion_fields) / sizeof(completion_fields[0])
                             : sizeof(chat_fields) / sizeof(chat_fields[0]);
            for (size_t i = 0; i < nf; i++) {
                int n = snprintf(body, sizeof(body), f[i], bad);
                snprintf(body + n, sizeof(body) - (size_t)n, "%s", tail);
                snprintf(what, sizeof(what), "%s field %zu%s", kind ? "completion" : "chat", i,
                         stream ? " (stream)" : "");
                resp r = http_to(port, "POST", kind ? "/v1/completions" : "/v1/chat/completions",
                                 NULL, body, strlen(body));
                check_body(what, &r);
                resp_free(&r);
            }
        }
    }
    /* the URL, and the server's own (invalid) model name */
    static const char *const paths[] = { "/v1/models", "/v1/models/m\xff\xc3", "/x\xed\xa0\x80",
                                         "/v1/models/random\xc0" };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        resp r = http_to(port, "GET", paths[i], NULL, NULL, 0);
        snprintf(what, sizeof(what), "GET path %zu", i);
        check_body(what, &r);
        resp_free(&r);
    }
}

/* ============================================================ disconnect */

/* A client that leaves a request answered whole (not streamed) stops its
 * generation: the engine's forward passes after it left stay far below a
 * full run's. */
static void test_disconnect(void)
{
    static const char body[] = "{\"prompt\":\"the the the the the\",\"max_tokens\":1500,"
                               "\"temperature\":0}";
    kvc_engine_metrics m0, m1, m2;
    CHECK(wait_idle(engine));
    kvc_engine_get_metrics(engine, &m0);
    resp r = http_to(port, "POST", "/v1/completions", NULL, body, strlen(body));
    kvc_engine_get_metrics(engine, &m1);
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    const cJSON *u = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens");
    int full = cJSON_IsNumber(u) ? u->valueint : 0;
    uint64_t full_steps = m1.steps - m0.steps;
    cJSON_Delete(j);
    resp_free(&r);
    CHECKF(full >= 300, "the full run generated %d tokens; too few to see a cancellation", full);

    char req[512];
    int n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    int fd = connect_to(port, 30);
    send_all(fd, req, (size_t)n);
    kvc_engine_metrics em = { 0 };
    for (int i = 0; i < 5000 && em.running == 0; i++, usleep(1000))
        kvc_engine_get_metrics(engine, &em);
    CHECKF(em.running == 1, "the request is not running");
    close(fd);
    CHECK(wait_idle(engine));
    kvc_engine_get_metrics(engine, &m2);
    uint64_t steps = m2.steps - m1.steps;
    printf("disconnect: %llu forward passes after the client left a request of %llu\n",
           (unsigned long long)steps, (unsigned long long)full_steps);
    CHECKF(steps < full_steps / 2, "generation ran on after the client left: %llu of %llu "
           "forward passes", (unsigned long long)steps, (unsigned long long)full_steps);
}

/* ================================================================= main */

#define RUN(call) do { int64_t t0_ = kvc_time_us(); call; \
    fprintf(stderr, "%-28s %7.2f s\n", #call, (kvc_time_us() - t0_) / 1e6); } while (0)

int main(void)
{
    /* the flood needs descriptors, as serve takes them */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    char dir[] = "/tmp/kvc_test_limits_XXXXXX", path[512], err[512];
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof(path), "%s/tiny.gguf", dir);
    kvc_gen_params g;
    kvc_gen_preset("tiny", &g);
    kvc_err e = { 0 };
    kvc_model *m = NULL;
    CHECKF(kvc_gen_model(&g, path, &e) == KVC_OK, "gen: %s", e.msg);
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load: %s", err);
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_parallel = 4;
    ep.n_threads = 2;
    if (m)
        CHECKF(kvc_engine_new(m, &ep, &engine, err, sizeof(err)) == KVC_OK, "engine: %s", err);
    kvc_server_params sp = kvc_server_default_params();
    sp.model_name = "random\xff\xc3";   /* a model file may name itself anything */
    kvc_server *s = engine ? start(engine, &sp) : NULL;
    if (s) {
        port = kvc_server_port(s);
        RUN(test_flood());
        RUN(test_deadline());
        RUN(test_per_ip());
        RUN(test_auth_first());
        RUN(test_never_fits(m));
        RUN(test_utf8());
        RUN(test_disconnect());
        kvc_server_stop(s);
    }
    kvc_engine_free(engine);
    kvc_model_free(m);
    unlink(path);
    rmdir(dir);
    return test_done("test_server_limits");
}
