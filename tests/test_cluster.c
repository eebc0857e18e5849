/* test_cluster.c - several `kvchat serve` processes sharing their KV cache in
 * Redis, with HAProxy in front (deploy/haproxy.cfg.in), all on loopback
 * ports picked free, every process stopped by the test. Skips (77) with a
 * message when redis-server or haproxy is not installed.
 *
 *  1. Without the router: a 10-turn conversation alternates between
 *     instances A and B. Each turn's reply equals that of a reference
 *     instance that served every turn itself; turns 2+ compute at most 1.05x
 *     what the reference computed (the ideal: one machine, all in RAM), and
 *     every one of them took blocks from Redis.
 *  2. Through the router: 6 conversations (keyed by prompt_cache_key or by
 *     user) x 5 turns: at least 95% of cached tokens come from the serving
 *     instance's own RAM (timings.cache_n - timings.cache_disk_n).
 *  3. A corrupted Redis: every value overwritten with one byte flipped; a
 *     turn on the instance that lacks the conversation detects it (checksum
 *     failures), recomputes, and answers as the reference.
 *  4. Redis killed: requests still succeed (and fast); Redis back: used again.
 *  5. An instance killed mid-conversation: the next turn, through the
 *     router, runs on the other instance with its prefix from Redis (at
 *     least the whole previous prompt cached), and its reply equals a cold
 *     run (a fresh process).
 * Needs $KVC_BIN (set by CTest). */
#include "test.h"

#include "http_client.h"
#include "model_gen.h"
#include "redis_proc.h"

#include <cjson/cJSON.h>

#define N_TURNS 10

static const char *bin;
static char root[256], model[320];
static int redis_port;

typedef struct result {
    int   status;
    char *content;          /* malloc'd */
    int   prompt, cached, cached_below;   /* cached_below: from disk or Redis */
} result;

static result chat(int port, cJSON *body)
{
    char *text = cJSON_PrintUnformatted(body);
    http_resp r = http_request(port, "POST", "/v1/chat/completions", text, 60);
    free(text);
    result out = { .status = r.status };
    cJSON *j = r.status == 200 ? cJSON_Parse(r.body) : NULL;
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message"), "content"));
    out.content = strdup(c ? c : "");
    cJSON *u = cJSON_GetObjectItem(j, "usage"), *t = cJSON_GetObjectItem(j, "timings");
    out.prompt = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens"));
    out.cached = (int)cJSON_GetNumberValue(
        cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"));
    out.cached_below = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(t, "cache_disk_n"));
    if (r.status != 200)
        fprintf(stderr, "HTTP %d: %s\n", r.status, r.body ? r.body : "(no answer)");
    cJSON_Delete(j);
    http_resp_free(&r);
    return out;
}

static double metric(int port, const char *name)
{
    http_resp r = http_request(port, "GET", "/metrics", NULL, 10);
    double v = r.body ? http_prom(r.body, name) : -1;
    http_resp_free(&r);
    return v;
}

/* Wait until the instance has finished its background work and written down
 * what it queued (both read live; 3 polls in a row, 50 ms apart; at most
 * 20 s): a conversation's next turn comes after that in the tests. A reply's
 * blocks are queued, and its canonicalization counted, before its answer. */
static bool settle(int port)
{
    struct timespec nap = { 0, 50 * 1000 * 1000 };
    for (int i = 0, idle = 0; i < 400; i++) {
        bool now = metric(port, "kvchat_background_pending") == 0 &&
                   metric(port, "kvchat_tier_writes_pending") == 0;
        idle = now ? idle + 1 : 0;
        if (idle >= 3)
            return true;
        nanosleep(&nap, NULL);
    }
    return false;
}

/* An instance: its own disk directory `tag`; with the shared tier unless
 * `alone`. */
static bool start(http_server *s, const char *tag, bool alone)
{
    char dir[300], url[64];
    snprintf(dir, sizeof(dir), "%s/%s", root, tag);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", redis_port);
    const char *const with[] = { "-m", model, "-t", "1", "--cache-dir", dir,
                                 "--cache-redis", url, "--cache-redis-timeout", "300", NULL };
    const char *const without[] = { "-m", model, "-t", "1", "--cache-dir", dir, NULL };
    return http_server_start(s, bin, alone ? without : with, 60);
}

/* A long message for turn `turn` (about 300 tokens): the block left partly
 * filled at the end of a turn, which only the instance that computed it
 * holds, is then small beside what is new. */
static void add_user(cJSON *msgs, int conv, int turn)
{
    static const char *const words[] = { "river", "lantern", "copper", "meadow", "signal",
                                          "harbor", "thistle", "orbit", "pebble", "canyon",
                                          "violet", "engine", "marble", "falcon", "ember" };
    char text[4096];
    int n = snprintf(text, sizeof(text), "Conversation %d, turn %d. Tell me about", conv, turn);
    for (int i = 0; i < 150 && n < (int)sizeof(text) - 32; i++)
        n += snprintf(text + n, sizeof(text) - (size_t)n, " %s%s",
                      words[(size_t)(i * 7 + turn * 3 + conv) % KVC_ARRAY_LEN(words)],
                      i % 11 == 10 ? "." : "");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", text);
    cJSON_AddItemToArray(msgs, m);
}

static void add_reply(cJSON *msgs, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

static cJSON *new_conv(const char *key_field, const char *key)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddArrayToObject(b, "messages");
    cJSON_AddNumberToObject(b, "temperature", 0);
    cJSON_AddNumberToObject(b, "max_tokens", 16);
    if (key_field)
        cJSON_AddStringToObject(b, key_field, key);
    return b;
}

/* ---------------------------------------------------------------- 1 */

static void alternating(http_server *a, http_server *b, http_server *ref)
{
    cJSON *conv = new_conv("prompt_cache_key", "alternating"), *msgs;
    msgs = cJSON_GetObjectItem(conv, "messages");
    long long computed = 0, ideal = 0;
    int from_redis = 0;
    for (int turn = 0; turn < N_TURNS; turn++) {
        add_user(msgs, 1, turn);
        http_server *x = turn % 2 ? b : a;
        double before = metric(x->port, "kvchat_redis_blocks_read_total");
        result w = chat(x->port, conv), r = chat(ref->port, conv);
        CHECK(w.status == 200 && r.status == 200);
        CHECKF(!strcmp(w.content, r.content), "turn %d: \"%s\" vs the reference's \"%s\"", turn,
               w.content, r.content);
        CHECK(settle(x->port) && settle(ref->port));
        if (turn > 0) {
            computed += w.prompt - w.cached;
            ideal += r.prompt - r.cached;
            bool got = metric(x->port, "kvchat_redis_blocks_read_total") > before;
            from_redis += got;
            CHECKF(got && w.cached_below > 0, "turn %d: nothing came from Redis", turn);
        }
        add_reply(msgs, r.content);
        free(w.content);
        free(r.content);
    }
    printf("  alternating A/B: turns 2+ computed %lld tokens, one instance %lld (%.3fx); "
           "%d/%d turns took blocks from Redis\n", computed, ideal,
           ideal ? (double)computed / (double)ideal : 0.0, from_redis, N_TURNS - 1);
    CHECKF(computed <= ideal * 105 / 100, "computed %lld, ideal %lld", computed, ideal);
    cJSON_Delete(conv);
}

/* ---------------------------------------------------------------- 2 */

static void routed(int router, http_server *a, http_server *b)
{
    enum { N_CONV = 6, TURNS = 5 };
    cJSON *conv[N_CONV];
    char key[32];
    for (int i = 0; i < N_CONV; i++) {
        snprintf(key, sizeof(key), "routed-%d", i);
        conv[i] = new_conv(i % 2 ? "user" : "prompt_cache_key", key);
    }
    long long cached = 0, ram = 0;
    int ok = 0;
    for (int turn = 0; turn < TURNS; turn++)
        for (int i = 0; i < N_CONV; i++) {
            cJSON *msgs = cJSON_GetObjectItem(conv[i], "messages");
            add_user(msgs, 10 + i, turn);
            result w = chat(router, conv[i]);
            ok += w.status == 200;
            if (turn > 0) {
                cached += w.cached;
                ram += w.cached - w.cached_below;
            }
            add_reply(msgs, w.content);
            free(w.content);
        }
    CHECK(settle(a->port) && settle(b->port));
    double share = cached ? (double)ram / (double)cached : 0;
    printf("  through HAProxy: %d/%d requests answered; of %lld cached tokens on turns 2+, "
           "%.1f%% from the instance's own RAM (A served %.0f, B %.0f)\n", ok, N_CONV * TURNS,
           cached, 100 * share, metric(a->port, "kvchat_requests_total"),
           metric(b->port, "kvchat_requests_total"));
    CHECK_EQ_INT(ok, N_CONV * TURNS);
    CHECKF(share >= 0.95, "%.3f of cached tokens from RAM", share);
    for (int i = 0; i < N_CONV; i++)
        cJSON_Delete(conv[i]);
}

/* ---------------------------------------------------------------- 3 */

/* Flip one byte in the middle of every value in Redis. Returns how many. */
static int corrupt_all(void)
{
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    redisReply *keys = c && !c->err ? redisCommand(c, "KEYS kvc:*") : NULL;
    int n = 0;
    for (size_t i = 0; keys && keys->type == REDIS_REPLY_ARRAY && i < keys->elements; i++) {
        const char *k = keys->element[i]->str;
        redisReply *v = redisCommand(c, "GET %s", k);
        if (v && v->type == REDIS_REPLY_STRING && v->len > 200) {
            v->str[v->len / 2] ^= 0x01;
            redisReply *w = redisCommand(c, "SET %s %b", k, v->str, v->len);
            n += w && w->type == REDIS_REPLY_STATUS;
            if (w)
                freeReplyObject(w);
        }
        if (v)
            freeReplyObject(v);
    }
    if (keys)
        freeReplyObject(keys);
    if (c)
        redisFree(c);
    return n;
}

static void corrupted(http_server *a, http_server *b, http_server *ref)
{
    cJSON *conv = new_conv("prompt_cache_key", "corrupt"), *msgs;
    msgs = cJSON_GetObjectItem(conv, "messages");
    add_user(msgs, 30, 0);
    result w = chat(a->port, conv);
    CHECK(w.status == 200 && settle(a->port));
    add_reply(msgs, w.content);
    add_user(msgs, 30, 1);
    free(w.content);
    int n = corrupt_all();
    double fails = metric(b->port, "kvchat_redis_checksum_failures_total");
    w = chat(b->port, conv);
    result r = chat(ref->port, conv);
    double now = metric(b->port, "kvchat_redis_checksum_failures_total");
    printf("  corrupted Redis (%d values): B found %.0f bad, computed %d of %d prompt tokens\n",
           n, now - fails, w.prompt - w.cached, w.prompt);
    CHECK(n > 0 && now > fails);
    CHECK(w.status == 200 && w.cached_below == 0);
    CHECKF(!strcmp(w.content, r.content), "\"%s\" vs the reference's \"%s\"", w.content,
           r.content);
    free(w.content);
    free(r.content);
    cJSON_Delete(conv);
}

/* ---------------------------------------------------------------- 4 */

static void redis_outage(redis_proc *rp, http_server *a)
{
    cJSON *conv = new_conv("prompt_cache_key", "outage"), *msgs;
    msgs = cJSON_GetObjectItem(conv, "messages");
    redis_proc_stop(rp, true);
    int ok = 0;
    int64_t t0 = kvc_time_us();
    for (int turn = 0; turn < 3; turn++) {
        add_user(msgs, 40, turn);
        result w = chat(a->port, conv);
        ok += w.status == 200;
        add_reply(msgs, w.content);
        free(w.content);
        CHECK(settle(a->port));
    }
    double secs = (double)(kvc_time_us() - t0) / 1e6;
    CHECK_EQ_INT(ok, 3);
    CHECK(metric(a->port, "kvchat_redis_up") == 0);
    CHECK(metric(a->port, "kvchat_redis_failures_total") > 0);
    bool absent;
    CHECK(redis_proc_start(rp, redis_port, &absent));
    struct timespec nap = { 1, 200 * 1000 * 1000 };         /* past the 1 s retry */
    nanosleep(&nap, NULL);
    double written = metric(a->port, "kvchat_redis_blocks_written_total");
    add_user(msgs, 40, 3);
    result w = chat(a->port, conv);
    CHECK(w.status == 200 && settle(a->port));
    double after = metric(a->port, "kvchat_redis_blocks_written_total");
    printf("  Redis killed: %d/3 requests answered (%.1f s with settling); back: up %.0f, %.0f "
           "blocks written again\n", ok, secs, metric(a->port, "kvchat_redis_up"),
           after - written);
    CHECK(metric(a->port, "kvchat_redis_up") == 1 && after > written);
    /* the tiers' failures are exported (issue 30 item 7) */
    CHECK(metric(a->port, "kvchat_tier_write_failures_total") >= 0);
    CHECK(metric(a->port, "kvchat_tier_fetch_failures_total") >= 0);
    CHECK(metric(a->port, "kvchat_disk_full_total") == 0);
    free(w.content);
    cJSON_Delete(conv);
}

/* ---------------------------------------------------------------- 5 */

static void instance_killed(int router, http_server *a, http_server *b)
{
    cJSON *conv = new_conv("user", "killed"), *msgs;
    msgs = cJSON_GetObjectItem(conv, "messages");
    double ra = metric(a->port, "kvchat_requests_total");
    int last_prompt = 0;                    /* of the last turn before the kill */
    for (int turn = 0; turn < 3; turn++) {
        add_user(msgs, 50, turn);
        result w = chat(router, conv);
        CHECK(w.status == 200);
        last_prompt = w.prompt;
        add_reply(msgs, w.content);
        free(w.content);
    }
    http_server *x = metric(a->port, "kvchat_requests_total") > ra ? a : b;
    http_server *y = x == a ? b : a;
    CHECK(settle(x->port));
    kill(x->pid, SIGKILL);
    waitpid(x->pid, NULL, 0);
    x->pid = 0;
    add_user(msgs, 50, 3);
    double before = metric(y->port, "kvchat_redis_blocks_read_total");
    result w = chat(router, conv);
    double got = metric(y->port, "kvchat_redis_blocks_read_total") - before;
    http_server fresh;
    result r = { 0 };
    if (start(&fresh, "fresh", true)) {
        cJSON_AddBoolToObject(conv, "cache_prompt", false);
        r = chat(fresh.port, conv);
        http_server_stop(&fresh);
    }
    printf("  instance %s killed: the next turn ran on %s, %d of %d prompt tokens cached "
           "(%.0f blocks from Redis); reply %s a fresh process's\n", x == a ? "A" : "B",
           y == a ? "A" : "B", w.cached, w.prompt, got,
           r.content && w.content && !strcmp(w.content, r.content) ? "equals" : "DIFFERS from");
    CHECK(w.status == 200 && r.status == 200);
    CHECKF(got > 0 && w.cached_below > 0 && w.cached >= last_prompt,
           "cached %d, the last turn's prompt was %d", w.cached, last_prompt);
    CHECK(r.content && w.content && !strcmp(w.content, r.content));
    free(w.content);
    free(r.content);
    cJSON_Delete(conv);
}

/* ------------------------------------------------------------- HAProxy */

static pid_t start_haproxy(const char *exe, int port, int pa, int pb)
{
    char path[600], cfg[300], *tmpl = NULL;
    snprintf(path, sizeof(path), "%s/deploy/haproxy.cfg.in", KVC_SOURCE_DIR);
    snprintf(cfg, sizeof(cfg), "%s/haproxy.cfg", root);
    tmpl = test_read_file(path, NULL);
    FILE *f = tmpl ? fopen(cfg, "w") : NULL;
    if (!f) {
        free(tmpl);
        return 0;
    }
    for (char *line = strtok(tmpl, "\n"); line; line = strtok(NULL, "\n")) {
        if (strstr(line, "@ROUTER_ADDR@"))
            fprintf(f, "    bind 127.0.0.1:%d\n", port);
        else if (strstr(line, "@SERVERS@"))
            fprintf(f, "    server a 127.0.0.1:%d check\n    server b 127.0.0.1:%d check\n", pa,
                    pb);
        else
            fprintf(f, "%s\n", line);
    }
    fclose(f);
    free(tmpl);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl(exe, exe, "-db", "-f", cfg, (char *)NULL);    /* -db: foreground */
        _exit(127);
    }
    for (int i = 0; pid > 0 && i < 200; i++) {                /* up, and both servers checked */
        http_resp r = http_request(port, "GET", "/health", NULL, 2);
        int st = r.status;
        http_resp_free(&r);
        if (st == 200)
            return pid;
        usleep(50 * 1000);
    }
    return pid;
}

int main(void)
{
    bin = getenv("KVC_BIN");
    const char *haproxy = test_find_exe("haproxy");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_cluster: SKIP: $KVC_BIN not set\n");
        return TEST_SKIP;
    }
    if (!haproxy || !test_find_exe("redis-server")) {
        printf("test_cluster: SKIP: needs redis-server and haproxy (scripts/install-deps.sh "
               "installs them)\n");
        return TEST_SKIP;
    }
    snprintf(root, sizeof(root), "/tmp/kvc_cluster_XXXXXX");
    if (!mkdtemp(root))
        return 1;
    snprintf(model, sizeof(model), "%s/tiny.gguf", root);
    kvc_gen_params g;
    kvc_gen_preset("tiny", &g);
    g.n_ctx = 8192;
    char err[512];
    CHECKF(kvc_gen_write(&g, model, err, sizeof(err)) == KVC_OK, "%s", err);
    redis_proc rp;
    bool absent;
    CHECK(redis_proc_start(&rp, 0, &absent));
    redis_port = rp.port;
    http_server a = { 0 }, b = { 0 }, ref = { 0 };
    pid_t hp = 0;
    int router = test_free_port();
    if (rp.pid && start(&a, "a", false) && start(&b, "b", false) && start(&ref, "ref", true) &&
        (hp = start_haproxy(haproxy, router, a.port, b.port)) > 0) {
        alternating(&a, &b, &ref);
        routed(router, &a, &b);
        corrupted(&a, &b, &ref);
        redis_outage(&rp, &a);
        instance_killed(router, &a, &b);
    } else {
        CHECKF(false, "the cluster did not start");
    }
    if (hp > 0) {
        kill(hp, SIGTERM);
        waitpid(hp, NULL, 0);
    }
    http_server_stop(&a);
    http_server_stop(&b);
    http_server_stop(&ref);
    redis_proc_stop(&rp, false);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    return test_done("test_cluster");
}
