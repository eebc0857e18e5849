/* test_server.c - the HTTP server in-process, over a generated "tiny" model,
 * through a plain-socket HTTP client written here.
 *
 *  1. The endpoints: chat (whole and streamed with include_usage), completions
 *     (whole and streamed), /v1/models, /health, /metrics.
 *  2. Caching seen through the API: a 10-turn conversation whose cached_tokens
 *     grow every turn, with timings.prompt_n = prompt_tokens - cached_tokens,
 *     and greedy replies equal to cold (cache_prompt: false) runs; two
 *     conversations at once on two threads, likewise.
 *  3. Every error status: 400 (bad JSON, bad fields, n, context length -
 *     streamed or not), 401, 404, 405, 413 (declared and chunked), 503; the
 *     engine-status mapping (500 included) directly.
 *  4. Hostile input (truncated JSON, wrong types, a 10 MB body, deep nesting,
 *     random bytes, slow clients, a client that leaves mid-stream), each
 *     followed by a request that must still succeed. */
#include <pthread.h>

#include "socket_client.h"
#include "kvchat.h"
#include "model_gen.h"
#include "server.h"
#include "test.h"

static int port;            /* the main server */
static kvc_engine *engine;
static char model_name[256];

static resp get(const char *path) { return http_to(port, "GET", path, NULL, NULL, 0); }
static resp post(const char *path, const char *json)
{
    return http_to(port, "POST", path, NULL, json, strlen(json));
}

/* =============================================================== chat */

typedef struct chat_out {
    int   status;
    char *content;      /* malloc'd */
    char  finish[32];
    int   prompt_tokens, cached_tokens, completion_tokens, prompt_n, cache_n;
} chat_out;

/* A greedy chat request over `msgs` (not taken). key may be NULL. */
static chat_out chat_at(int p, const cJSON *msgs, const char *key, int max_tokens, bool cache)
{
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "model", "whatever-model");
    cJSON_AddItemToObject(req, "messages", cJSON_Duplicate(msgs, true));
    cJSON_AddNumberToObject(req, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(req, "temperature", 0);
    if (key)
        cJSON_AddStringToObject(req, "prompt_cache_key", key);
    if (!cache)
        cJSON_AddFalseToObject(req, "cache_prompt");
    char *body = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    resp r = http_to(p, "POST", "/v1/chat/completions", NULL, body, strlen(body));
    free(body);
    chat_out o = { .status = r.status };
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    const char *c = jstr(j, "choices.0.message.content"), *f = jstr(j, "choices.0.finish_reason");
    o.content = strdup(c ? c : "<none>");
    snprintf(o.finish, sizeof(o.finish), "%s", f ? f : "");
    o.prompt_tokens = (int)jnum(j, "usage.prompt_tokens");
    o.cached_tokens = (int)jnum(j, "usage.prompt_tokens_details.cached_tokens");
    o.completion_tokens = (int)jnum(j, "usage.completion_tokens");
    o.prompt_n = (int)jnum(j, "timings.prompt_n");
    o.cache_n = (int)jnum(j, "timings.cache_n");
    cJSON_Delete(j);
    resp_free(&r);
    return o;
}

static void add_msg(cJSON *msgs, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

static const char *user_turns[] = {
    "Hello there, who are you?", "Tell me a story about a cat.", "What happened next?",
    "Why did the cat do that?", "Give it a happy ending.", "Now a story about a dog.",
    "Which animal do you prefer?", "Summarise both stories.", "Thank you very much.",
    "Goodbye, and see you soon.",
};

/* One conversation's outcome. Conversations run on threads, and test.h's
 * counters are not thread-safe: they count failures here (printing each) and
 * the main thread checks the counts. */
typedef struct conv {
    const char *key, *system;
    int         turns;
    int         failures;
    int         n_warm_cached;   /* turns in which a keyless request hit the cache */
} conv;

#define CONV_CHECK(c, cond, ...) do { if (!(cond)) { (c)->failures++; \
    fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, (c)->key); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* Cold and keyless-warm runs of the same messages: both see the prompt
 * tokenized whole, so their greedy replies must be equal. The keyed run `o`
 * reuses its reply tokens as generated (text prefix), which may tokenize
 * differently when re-read: it must equal the cold reply when the token
 * counts agree. */
static void compare_cold(conv *c, int p, const cJSON *msgs, int t, const chat_out *o)
{
    chat_out cold = chat_at(p, msgs, NULL, 12, false);
    chat_out warm = chat_at(p, msgs, NULL, 12, true);
    CONV_CHECK(c, cold.status == 200 && cold.cached_tokens == 0 &&
               cold.prompt_n == cold.prompt_tokens, "turn %d: cold run cached %d", t,
               cold.cached_tokens);
    CONV_CHECK(c, warm.status == 200 && !strcmp(warm.content, cold.content),
               "turn %d: keyless cached reply '%s' (%d cached) != cold '%s'", t, warm.content,
               warm.cached_tokens, cold.content);
    CONV_CHECK(c, warm.prompt_tokens == cold.prompt_tokens, "turn %d: %d vs %d prompt tokens", t,
               warm.prompt_tokens, cold.prompt_tokens);
    if (o->prompt_tokens == cold.prompt_tokens)
        CONV_CHECK(c, !strcmp(o->content, cold.content), "turn %d: cached reply '%s' != cold '%s'",
                   t, o->content, cold.content);
    c->n_warm_cached += warm.cached_tokens > 0;
    free(warm.content);
    free(cold.content);
}

/* A keyed conversation: cached tokens grow every turn, prompt_n is what was
 * not cached, and the replies agree with cold runs. */
static void conversation(int p, conv *c)
{
    cJSON *msgs = cJSON_CreateArray();
    add_msg(msgs, "system", c->system);
    int prev_cached = -1;
    for (int t = 0; t < c->turns; t++) {
        add_msg(msgs, "user", user_turns[t % 10]);
        chat_out o = chat_at(p, msgs, c->key, 12, true);
        CONV_CHECK(c, o.status == 200, "turn %d: status %d", t, o.status);
        CONV_CHECK(c, o.cached_tokens > prev_cached, "turn %d: cached %d, previous turn %d", t,
                   o.cached_tokens, prev_cached);
        CONV_CHECK(c, o.prompt_n == o.prompt_tokens - o.cached_tokens && o.cache_n == o.cached_tokens,
                   "turn %d: prompt_n %d cache_n %d, prompt %d cached %d", t, o.prompt_n, o.cache_n,
                   o.prompt_tokens, o.cached_tokens);
        CONV_CHECK(c, o.completion_tokens >= 1 && o.completion_tokens <= 12, "turn %d: %d tokens",
                   t, o.completion_tokens);
        compare_cold(c, p, msgs, t, &o);
        prev_cached = o.cached_tokens;
        add_msg(msgs, "assistant", o.content);
        free(o.content);
    }
    cJSON_Delete(msgs);
}

static void *conversation_thread(void *a)
{
    conversation(port, a);
    return NULL;
}

/* ============================================================ endpoints */

static const char simple_chat[] =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Say hello.\"}],"
    "\"max_tokens\":10,\"temperature\":0}";

static void test_basic_endpoints(void)
{
    resp r = get("/health");
    CHECK_EQ_INT(r.status, 200);
    CHECK(r.body && strstr(r.body, "\"status\":\"ok\""));
    resp_free(&r);

    r = get("/v1/models");
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    CHECK_EQ_INT(r.status, 200);
    CHECK(jstr(j, "object") && !strcmp(jstr(j, "object"), "list"));
    CHECKF(jstr(j, "data.0.id") && !strcmp(jstr(j, "data.0.id"), model_name), "models: %s",
           r.body);
    cJSON_Delete(j);
    resp_free(&r);
}

/* A chat completion, whole and streamed: the same greedy text both ways. */
static void test_chat(void)
{
    char hv[128];
    resp r = post("/v1/chat/completions", simple_chat);
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    CHECKF(r.status == 200, "chat: %d %s", r.status, r.body);
    CHECK(header(&r, "Content-Type", hv, sizeof(hv)) && strstr(hv, "application/json"));
    CHECK(jstr(j, "id") && !strncmp(jstr(j, "id"), "chatcmpl-", 9));
    CHECK(jstr(j, "object") && !strcmp(jstr(j, "object"), "chat.completion"));
    CHECK(jstr(j, "model") && !strcmp(jstr(j, "model"), "m"));
    CHECK(jnum(j, "created") > 1.6e9);
    CHECK(jstr(j, "choices.0.message.role") && !strcmp(jstr(j, "choices.0.message.role"), "assistant"));
    const char *text = jstr(j, "choices.0.message.content");
    const char *fin = jstr(j, "choices.0.finish_reason");
    CHECK(text && fin && (!strcmp(fin, "stop") || !strcmp(fin, "length")));
    int pt = (int)jnum(j, "usage.prompt_tokens"), ct = (int)jnum(j, "usage.completion_tokens");
    CHECK(pt > 5 && ct >= 1 && ct <= 10);
    CHECK_EQ_INT(jnum(j, "usage.total_tokens"), pt + ct);
    CHECK(jnum(j, "usage.prompt_tokens_details.cached_tokens") >= 0);
    CHECK_EQ_INT(jnum(j, "timings.predicted_n"), ct);
    CHECK(jnum(j, "timings.prompt_ms") >= 0 && jnum(j, "timings.predicted_per_second") >= 0);

    const char *sreq = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                       "\"text\":\"Say hello.\"}]}],"
                       "\"max_completion_tokens\":10,\"temperature\":0,\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true}}";
    resp s = post("/v1/chat/completions", sreq);
    CHECKF(s.status == 200, "stream: %d", s.status);
    CHECK(header(&s, "Content-Type", hv, sizeof(hv)) && strstr(hv, "text/event-stream"));
    /* Events: role chunk, content chunks, finish chunk, usage chunk, [DONE]. */
    char *acc = calloc(1, s.body_len + 1), *save = NULL;
    int n_ev = 0, n_done = 0, n_finish = 0, n_usage = 0, usage_ct = -1;
    bool role_first = false, done_last = false;
    for (char *ev = strtok_r(s.body, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
        CHECKF(!strncmp(ev, "data: ", 6), "SSE line '%.60s'", ev);
        done_last = !strcmp(ev + 6, "[DONE]");
        if (done_last) {
            n_done++;
            continue;
        }
        cJSON *c = cJSON_Parse(ev + 6);
        CHECKF(c && !strcmp(jstr(c, "object"), "chat.completion.chunk"), "chunk %.80s", ev);
        if (n_ev++ == 0)
            role_first = jstr(c, "choices.0.delta.role") &&
                         !strcmp(jstr(c, "choices.0.delta.role"), "assistant");
        if (jstr(c, "choices.0.delta.content"))
            strcat(acc, jstr(c, "choices.0.delta.content"));
        if (jstr(c, "choices.0.finish_reason"))
            n_finish++;
        if (cJSON_IsArray(jpath(c, "choices")) && !jpath(c, "choices.0") && jpath(c, "usage")) {
            n_usage++;
            usage_ct = (int)jnum(c, "usage.completion_tokens");
            CHECK(jnum(c, "usage.prompt_tokens") == pt && jpath(c, "timings.prompt_n"));
        }
        cJSON_Delete(c);
    }
    CHECK(role_first && done_last && n_done == 1 && n_finish == 1 && n_usage == 1);
    CHECK_EQ_INT(usage_ct, ct);
    CHECKF(text && !strcmp(acc, text), "streamed '%s' != whole '%s'", acc, text ? text : "");
    free(acc);
    cJSON_Delete(j);
    resp_free(&r);
    resp_free(&s);
}

static void test_completions(void)
{
    const char *req = "{\"model\":\"x\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                      "\"temperature\":0}";
    resp r = post("/v1/completions", req);
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    CHECKF(r.status == 200, "completions: %d %s", r.status, r.body);
    CHECK(jstr(j, "object") && !strcmp(jstr(j, "object"), "text_completion"));
    CHECK(jstr(j, "id") && !strncmp(jstr(j, "id"), "cmpl-", 5));
    const char *text = jstr(j, "choices.0.text");
    int ct = (int)jnum(j, "usage.completion_tokens");
    CHECK(text && ct >= 1 && ct <= 8);

    const char *sreq = "{\"prompt\":[\"Once upon a time\"],\"max_tokens\":8,\"temperature\":0,"
                       "\"stream\":true}";
    resp s = post("/v1/completions", sreq);
    CHECK_EQ_INT(s.status, 200);
    char *acc = calloc(1, s.body_len + 1), *save = NULL;
    bool done_last = false, usage_seen = false;
    for (char *ev = strtok_r(s.body, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
        done_last = !strcmp(ev, "data: [DONE]");
        cJSON *c = done_last ? NULL : cJSON_Parse(ev + 6);
        if (jstr(c, "choices.0.text"))
            strcat(acc, jstr(c, "choices.0.text"));
        usage_seen |= jpath(c, "usage") != NULL && !cJSON_IsNull(jpath(c, "usage"));
        cJSON_Delete(c);
    }
    CHECK(done_last && !usage_seen);   /* no include_usage: no usage chunk */
    CHECKF(text && !strcmp(acc, text), "streamed '%s' != whole '%s'", acc, text ? text : "");
    free(acc);
    cJSON_Delete(j);
    resp_free(&r);
    resp_free(&s);
}

/* The value of a Prometheus sample line `name` (with labels, if any). */
static double prom(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

static void test_metrics(int min_requests)
{
    resp r = get("/metrics");
    CHECK_EQ_INT(r.status, 200);
    const char *t = r.body ? r.body : "";
    static const char *names[] = {
        "kvchat_requests_total", "kvchat_requests_failed_total", "kvchat_prompt_tokens_total",
        "kvchat_cached_tokens_total", "kvchat_computed_tokens_total", "kvchat_output_tokens_total",
        "kvchat_cache_hit_ratio", "kvchat_kv_blocks_used", "kvchat_kv_blocks_free",
        "kvchat_kv_blocks_evicted_total", "kvchat_sessions", "kvchat_queue_depth",
        "kvchat_requests_running", "kvchat_ttft_seconds_count", "kvchat_ttft_seconds_sum",
        "kvchat_ttft_seconds_bucket{le=\"+Inf\"}", "kvchat_decode_tokens_per_second{stat=\"avg\"}",
        "kvchat_decode_tokens_per_second{stat=\"last\"}",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        CHECKF(prom(t, names[i]) >= 0, "metric %s missing", names[i]);
    CHECKF(prom(t, "kvchat_requests_total") >= min_requests, "requests_total %g < %d",
           prom(t, "kvchat_requests_total"), min_requests);
    double ratio = prom(t, "kvchat_cache_hit_ratio");
    CHECKF(ratio > 0.3 && ratio < 1, "cache hit ratio %g after the conversations", ratio);
    CHECK_EQ_INT(prom(t, "kvchat_cached_tokens_total") + prom(t, "kvchat_computed_tokens_total"),
                 prom(t, "kvchat_prompt_tokens_total"));
    double count = prom(t, "kvchat_ttft_seconds_count");
    CHECK(count >= 10 && prom(t, "kvchat_ttft_seconds_bucket{le=\"+Inf\"}") == count);
    CHECK(prom(t, "kvchat_ttft_seconds_bucket{le=\"0.005\"}") <= count);
    CHECK(prom(t, "kvchat_requests_failed_total") >= 1);
    CHECK(strstr(t, "# TYPE kvchat_ttft_seconds histogram"));
    resp_free(&r);
}


/* ============================================================== errors */

static void test_bad_fields(void)
{
    expect_error("bad JSON", post("/v1/chat/completions", "{\"messages\": ["), 400, NULL, NULL,
                 "JSON");
    expect_error("array body", post("/v1/chat/completions", "[1,2]"), 400, NULL, NULL, "object");
    expect_error("temperature 3",
                 post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"temperature\":3}"),
                 400, NULL, "temperature", "temperature must be a number between 0 and 2");
    expect_error("temperature str",
                 post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                      "\"temperature\":\"hot\"}"), 400, NULL, "temperature", "temperature");
    expect_error("top_p", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\","
                               "\"content\":\"x\"}],\"top_p\":1.5}"), 400, NULL, "top_p", "top_p");
    expect_error("max_tokens", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\","
                                    "\"content\":\"x\"}],\"max_tokens\":-5}"),
                 400, NULL, "max_tokens", "max_tokens");
    expect_error("n=17", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\","
                              "\"content\":\"x\"}],\"n\":17}"), 400, NULL, "n", "n must be");
    expect_error("no messages", post("/v1/chat/completions", "{\"model\":\"m\"}"), 400, NULL,
                 "messages", "messages");
    expect_error("empty messages", post("/v1/chat/completions", "{\"messages\":[]}"), 400, NULL,
                 "messages", "at least one");
    expect_error("content type", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\","
                                      "\"content\":5}]}"), 400, NULL, "messages[0].content", NULL);
    expect_error("role type", post("/v1/chat/completions", "{\"messages\":[{\"role\":7,"
                                   "\"content\":\"x\"}]}"), 400, NULL, "messages[0].role", NULL);
    expect_error("image part", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\","
                 "\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}"),
                 400, NULL, "messages[0].content", "image_url");
    char many[512] = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[";
    for (int i = 0; i < 17; i++)
        strcat(many, i ? ",\"s\"" : "\"s\"");
    strcat(many, "]}");
    expect_error("17 stops", post("/v1/chat/completions", many), 400, NULL, "stop", "stop");
    expect_error("include_usage", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],\"stream\":true,\"stream_options\":{\"include_usage\":1}}"),
                 400, NULL, "stream_options.include_usage", NULL);
    expect_error("no prompt", post("/v1/completions", "{\"max_tokens\":3}"), 400, NULL, "prompt",
                 "prompt");
    /* Valid extremes still work: 16 stops, seed -1, a user, developer role. */
    const char *ok = "{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                     "{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":4,\"seed\":-1,"
                     "\"user\":\"u1\",\"n\":1,\"temperature\":0.7,\"top_k\":5,\"min_p\":0.1,"
                     "\"stop\":[\"a1\",\"a2\",\"a3\",\"a4\",\"a5\",\"a6\",\"a7\",\"a8\",\"a9\","
                     "\"b1\",\"b2\",\"b3\",\"b4\",\"b5\",\"b6\",\"b7\"]}";
    resp r = post("/v1/chat/completions", ok);
    CHECKF(r.status == 200, "valid extremes: %d %s", r.status, r.body);
    resp_free(&r);
}

static void test_context_length(void)
{
    const char *big = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":100000%s}";
    char body[256];
    snprintf(body, sizeof(body), big, "");
    expect_error("context", post("/v1/chat/completions", body), 400, "context_length_exceeded",
                 NULL, NULL);
    snprintf(body, sizeof(body), big, ",\"stream\":true");
    resp r = post("/v1/chat/completions", body);
    char hv[128];
    CHECKF(header(&r, "Content-Type", hv, sizeof(hv)) && strstr(hv, "application/json"),
           "streamed context error is not plain JSON: %s", r.head);
    expect_error("context stream", r, 400, "context_length_exceeded", NULL, NULL);
    /* A prompt longer than the context by itself (about 3000 words). */
    size_t n = 40000;
    char *huge = malloc(n + 200);
    int k = sprintf(huge, "{\"prompt\":\"");
    while ((size_t)k < n)
        k += sprintf(huge + k, "word%d ", k % 997);
    strcpy(huge + k, "\",\"max_tokens\":4}");
    expect_error("long prompt", post("/v1/completions", huge), 400, "context_length_exceeded",
                 NULL, NULL);
    free(huge);
}

/* Engine statuses to HTTP, and the error JSON, without a connection. */
static void test_error_mapping(void)
{
    static const struct { int status, http; const char *code; } map[] = {
        { KVC_ERR_INVALID_ARG, 400, NULL }, { KVC_ERR_CONTEXT_LENGTH, 400, "context_length_exceeded" },
        { KVC_ERR_BUSY, 503, "server_busy" }, { KVC_ERR_KV_FULL, 400, "context_length_exceeded" },
        { KVC_ERR_NOMEM, 500, NULL }, { KVC_ERR_IO, 500, NULL },
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        srv_error e;
        CHECK_EQ_INT(srv_error_from_status(&e, map[i].status, "engine says \"no\""), map[i].http);
        char *j = srv_error_json(&e);
        resp r = { .status = e.http_status, .body = j, .body_len = strlen(j) };
        expect_error("mapping", r, map[i].http, map[i].code, NULL, "engine says \"no\"");
    }
}

static void test_routes(void)
{
    char hv[64];
    expect_error("404 GET", get("/v1/nothing"), 404, NULL, NULL, "/v1/nothing");
    expect_error("404 POST", post("/v2/chat/completions", simple_chat), 404, NULL, NULL, NULL);
    resp r = get("/v1/chat/completions");
    CHECK(header(&r, "Allow", hv, sizeof(hv)) && !strcmp(hv, "POST"));
    expect_error("405", r, 405, NULL, NULL, "GET");
    expect_error("405 health", post("/health", "{}"), 405, NULL, NULL, NULL);
}

/* An exchange of raw bytes; the answer parsed. */
static resp raw_to(int p, const char *data, size_t n)
{
    resp r = { 0 };
    int fd = connect_to(p, 60);
    if (fd < 0)
        return r;
    send_all(fd, data, n);
    size_t got;
    char *raw = recv_all(fd, &got);
    close(fd);
    return parse_raw(raw, got);
}

static void test_too_large(void)
{
    /* Declared: answered from the headers alone, before any body byte. */
    const char *head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                       "Content-Type: application/json\r\nContent-Length: 10485760\r\n\r\n";
    expect_error("413 declared", raw_to(port, head, strlen(head)), 413, "request_too_large",
                 NULL, NULL);
    /* Chunked (no length known up front): counted while reading. */
    size_t cn = 64 << 10, n_chunks = 160;   /* 10 MiB */
    size_t cap = strlen(head) + n_chunks * (cn + 16) + 16, len = 0;
    char *req = malloc(cap);
    len += (size_t)sprintf(req, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    for (size_t i = 0; i < n_chunks; i++) {
        len += (size_t)sprintf(req + len, "%zx\r\n", cn);
        memset(req + len, i ? 'a' : '[', cn);
        len += cn;
        len += (size_t)sprintf(req + len, "\r\n");
    }
    len += (size_t)sprintf(req + len, "0\r\n\r\n");
    expect_error("413 chunked", raw_to(port, req, len), 413, "request_too_large", NULL, NULL);
    free(req);
}

/* =============================================================== hostile */

static void expect_400(const char *what, const char *body, size_t n)
{
    resp r = http_to(port, "POST", "/v1/chat/completions", NULL, body, n);
    CHECKF(r.status == 400, "%s: status %d (%.100s)", what, r.status, r.body ? r.body : "");
    resp_free(&r);
}

static void expect_alive(const char *after)
{
    chat_out o;
    cJSON *msgs = cJSON_CreateArray();
    add_msg(msgs, "user", "Are you still there?");
    o = chat_at(port, msgs, NULL, 4, true);
    CHECKF(o.status == 200 && o.completion_tokens >= 1, "after %s: status %d", after, o.status);
    free(o.content);
    cJSON_Delete(msgs);
}

static void test_hostile(void)
{
    size_t n = strlen(simple_chat);
    for (size_t cut = 0; cut < n; cut++)
        expect_400("truncated", simple_chat, cut);
    static const char *wrong[] = {
        "null", "true", "123", "\"str\"", "{\"messages\":\"hi\"}", "{\"messages\":[1]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":{\"a\":1}}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":5}]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":[7]}]}",
        "{\"messages\":[{\"role\":\"us er\",\"content\":\"x\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":\"5\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1e999}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":5}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",3]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":1.5}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":5}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"user\":[]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prompt_cache_key\":{}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":-1}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":\"x\"}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]} trailing",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":\"1\"}",
    };
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++)
        expect_400(wrong[i], wrong[i], strlen(wrong[i]));
    expect_alive("wrong types");

    /* Deep nesting: beyond cJSON's limit (400), and 500 deep in an ignored field (200:
     * "metadata" is accepted for compatibility and ignored; unknown fields are 400s). */
    size_t depth = 200000;
    char *deep = malloc(2 * depth + 64);
    memset(deep, '[', depth);
    expect_400("deep arrays", deep, depth);
    int k = sprintf(deep, "{\"messages\":");
    memset(deep + k, '[', depth);
    expect_400("deep messages", deep, (size_t)k + depth);
    k = sprintf(deep, "{\"metadata\":");
    memset(deep + k, '[', 500);
    memset(deep + k + 500, ']', 500);
    sprintf(deep + k + 1000, ",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2}");
    resp r = post("/v1/chat/completions", deep);
    CHECKF(r.status == 200, "500-deep ignored field: %d %.100s", r.status, r.body);
    resp_free(&r);
    free(deep);

    /* A 1 MB model name (400), random bytes (400 each). */
    char *bigf = malloc((1 << 20) + 128);
    k = sprintf(bigf, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":\"");
    memset(bigf + k, 'm', 1 << 20);
    strcpy(bigf + k + (1 << 20), "\"}");
    expect_error("1 MB model", post("/v1/chat/completions", bigf), 400, NULL, "model", "model");
    free(bigf);
    /* A 1.5 MB prompt: parsed, rendered and tokenized on the bulk thread, and
     * too long for the context */
    size_t bn = 3 << 19;
    char *bigp = malloc(bn + 128);
    k = sprintf(bigp, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    while ((size_t)k < bn)
        k += sprintf(bigp + k, "word%d ", k % 997);
    strcpy(bigp + k, "\"}],\"max_tokens\":4}");
    expect_error("1.5 MB prompt", post("/v1/chat/completions", bigp), 400,
                 "context_length_exceeded", NULL, NULL);
    free(bigp);
    unsigned seed = 1234;
    char junk[4096];
    for (int i = 0; i < 200; i++) {
        size_t len = (size_t)rand_r(&seed) % sizeof(junk);
        for (size_t j = 0; j < len; j++)
            junk[j] = (char)rand_r(&seed);
        if (len && i % 2)
            junk[0] = '{';
        expect_400("random bytes", junk, len);
    }
    expect_alive("hostile bodies");
}

/* Clients that stall mid-headers and mid-body do not hold up others. */
static void test_slow_clients(void)
{
    int a = connect_to(port, 10), b = connect_to(port, 10);
    const char *ha = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le";
    const char *hb = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Length: 100\r\n\r\n{\"messa";
    send_all(a, ha, strlen(ha));
    send_all(b, hb, strlen(hb));
    int64_t t0 = kvc_time_us();
    expect_alive("slow clients");
    CHECKF(kvc_time_us() - t0 < 5000000, "a request took %.1f s beside slow clients",
           (kvc_time_us() - t0) / 1e6);
    close(a);
    close(b);
}

static const char long_gen[] = "{\"prompt\":\"the the the the the\",\"max_tokens\":1500,"
                               "\"temperature\":0%s}";

/* A client that leaves mid-stream cancels its generation. */
static void test_disconnect(void)
{
    char body[256], buf[4096];
    kvc_engine_metrics m0, m1;
    CHECK(wait_idle(engine));
    kvc_engine_get_metrics(engine, &m0);
    snprintf(body, sizeof(body), long_gen, ",\"stream\":true");
    char req[512];
    int n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    int fd = connect_to(port, 30);
    send_all(fd, req, (size_t)n);
    ssize_t got = recv(fd, buf, sizeof(buf) - 1, 0);
    CHECKF(got > 0, "no stream bytes");
    buf[got > 0 ? got : 0] = 0;
    CHECKF(strstr(buf, "text/event-stream"), "not a stream: %.200s", buf);
    close(fd);
    CHECK(wait_idle(engine));
    kvc_engine_get_metrics(engine, &m1);
    /* forward passes, not output_tokens: a cancelled request's tokens are not counted there */
    uint64_t cancelled_tokens = m1.steps - m0.steps;

    snprintf(body, sizeof(body), long_gen, "");
    resp r = post("/v1/completions", body);
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    int full = (int)jnum(j, "usage.completion_tokens");
    CHECKF(r.status == 200 && full > 0, "full run: %d", r.status);
    if (full >= 300)   /* it would have run long: the disconnect must have cut it */
        CHECKF(cancelled_tokens < (uint64_t)full, "disconnected stream generated %llu of %d",
               (unsigned long long)cancelled_tokens, full);
    else
        fprintf(stderr, "note: greedy run stops after %d tokens; cancellation not measurable\n",
                full);
    cJSON_Delete(j);
    resp_free(&r);
    expect_alive("a client left mid-stream");
}

/* ============================================== other server instances */

static kvc_server *start(kvc_engine *e, const char *key, int timeout_s)
{
    kvc_server_params sp = kvc_server_default_params();
    sp.port = 0;
    sp.model_name = model_name;
    sp.api_key = key;
    sp.timeout_s = timeout_s;
    kvc_server *s = NULL;
    char err[512];
    int rc = kvc_server_start(e, &sp, &s, err, sizeof(err));
    CHECKF(rc == KVC_OK, "server start: %s", err);
    return s;
}

static void test_auth(void)
{
    kvc_server *s = start(engine, "sekrit", 0);
    if (!s)
        return;
    int p = kvc_server_port(s);
    char hv[64];
    resp r = http_to(p, "POST", "/v1/chat/completions", NULL, simple_chat, strlen(simple_chat));
    CHECK(header(&r, "WWW-Authenticate", hv, sizeof(hv)) && strstr(hv, "Bearer"));
    expect_error("no key", r, 401, "invalid_api_key", NULL, NULL);
    expect_error("wrong key", http_to(p, "POST", "/v1/chat/completions",
                                      "Authorization: Bearer sekrix\r\n", simple_chat,
                                      strlen(simple_chat)), 401, "invalid_api_key", NULL, NULL);
    expect_error("prefix of key", http_to(p, "GET", "/v1/models",
                                          "Authorization: Bearer sekri\r\n", NULL, 0), 401,
                 NULL, NULL, NULL);
    expect_error("metrics no key", http_to(p, "GET", "/metrics", NULL, NULL, 0), 401, NULL, NULL,
                 NULL);
    r = http_to(p, "POST", "/v1/chat/completions", "Authorization: Bearer sekrit\r\n",
                simple_chat, strlen(simple_chat));
    CHECKF(r.status == 200, "right key: %d %s", r.status, r.body);
    resp_free(&r);
    r = http_to(p, "GET", "/health", NULL, NULL, 0);
    CHECK_EQ_INT(r.status, 200);
    resp_free(&r);
    kvc_server_stop(s);
}

/* A full queue answers 503 (the engine's KVC_ERR_BUSY). */
static void test_busy(kvc_model *m)
{
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_parallel = 1;
    ep.max_queue = 1;
    ep.n_threads = 1;
    kvc_engine *e = NULL;
    char err[512], body[256];
    CHECKF(kvc_engine_new(m, &ep, &e, err, sizeof(err)) == KVC_OK, "engine: %s", err);
    kvc_server *s = e ? start(e, NULL, 0) : NULL;
    if (!s) {
        kvc_engine_free(e);
        return;
    }
    kvc_request_params rp = { .prompt = "the the the the the", .chat = kvc_chat_default_params() };
    rp.chat.max_tokens = 1500;
    rp.chat.sampling.temperature = 0;
    /* A runs, B waits (the queue is then full), C is refused. */
    kvc_request *a = kvc_engine_submit(e, &rp, NULL, err, sizeof(err)), *b = NULL;
    kvc_engine_metrics em = { 0 };
    for (int i = 0; i < 5000 && em.running == 0; i++, usleep(1000))
        kvc_engine_get_metrics(e, &em);
    CHECKF(em.running == 1, "the first request is not running");
    b = kvc_engine_submit(e, &rp, NULL, err, sizeof(err));
    CHECKF(a && b, "submit: %s", err);
    snprintf(body, sizeof(body), long_gen, "");
    resp r = http_to(kvc_server_port(s), "POST", "/v1/completions", NULL, body, strlen(body));
    char hv[32];
    CHECK(header(&r, "Retry-After", hv, sizeof(hv)));
    expect_error("busy", r, 503, NULL, NULL, NULL);
    kvc_request_free(a);   /* cancels */
    kvc_request_free(b);
    CHECK(wait_idle(e));
    /* choices are queued all or none: two never fit a queue of one */
    kvc_request_params two[2] = { rp, rp };
    kvc_request *out[2] = { a, a };
    CHECK_EQ_INT(kvc_engine_submit_all(e, two, 2, out, err, sizeof(err)), KVC_ERR_BUSY);
    CHECKF(!out[0] && !out[1] && strstr(err, "busy"), "refused choices: %p %p %s",
           (void *)out[0], (void *)out[1], err);
    r = http_to(kvc_server_port(s), "POST", "/v1/chat/completions", NULL, simple_chat,
                strlen(simple_chat));
    CHECKF(r.status == 200, "after the queue drained: %d", r.status);
    resp_free(&r);
    kvc_server_stop(s);
    kvc_engine_free(e);
}

typedef struct stream_arg { int port; size_t got; } stream_arg;

static void *long_stream(void *p)
{
    stream_arg *a = p;
    char body[256];
    snprintf(body, sizeof(body), long_gen, ",\"stream\":true");
    resp r = http_to(a->port, "POST", "/v1/completions", NULL, body, strlen(body));
    a->got = r.body_len;
    resp_free(&r);
    return NULL;
}

/* An idle connection is closed after the time-out; stopping a server with a
 * stream in flight returns promptly and ends the stream. */
static void test_timeout_and_stop(void)
{
    kvc_server *s = start(engine, NULL, 1);
    if (!s)
        return;
    int fd = connect_to(kvc_server_port(s), 10);
    char c;
    int64_t t0 = kvc_time_us();
    ssize_t k = recv(fd, &c, 1, 0);
    double waited = (kvc_time_us() - t0) / 1e6;
    CHECKF(k == 0 && waited > 0.5 && waited < 5, "idle connection: recv %zd after %.2f s", k,
           waited);
    close(fd);

    stream_arg a = { .port = kvc_server_port(s) };
    pthread_t th;
    pthread_create(&th, NULL, long_stream, &a);
    usleep(100000);
    t0 = kvc_time_us();
    kvc_server_stop(s);
    pthread_join(th, NULL);
    waited = (kvc_time_us() - t0) / 1e6;
    CHECKF(waited < 3, "stopping with a stream in flight took %.2f s", waited);
    CHECK(wait_idle(engine));
}

/* ================================================================= main */

/* Run one part and say how long it took (the log shows where time goes). */
#define RUN(call) do { int64_t t0_ = kvc_time_us(); call; \
    fprintf(stderr, "%-32s %7.2f s\n", #call, (kvc_time_us() - t0_) / 1e6); } while (0)

static void test_conversations(void)
{
    conv solo = { "conv-solo", "You are a helpful assistant.", 10, 0, 0 };
    conversation(port, &solo);
    CHECKF(solo.failures == 0, "solo conversation: %d failures", solo.failures);
    CHECKF(solo.n_warm_cached >= 9, "keyless requests found a cached prefix in %d of 10 turns",
           solo.n_warm_cached);
    conv two[2] = { { "conv-a", "You are a pirate. Answer like one.", 5, 0, 0 },
                    { "conv-b", "You are a poet who writes in rhyme.", 5, 0, 0 } };
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, conversation_thread, &two[i]);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECKF(two[i].failures == 0, "%s (concurrent): %d failures", two[i].key, two[i].failures);
    }
}

static kvc_model *load_tiny(char *dir, char *path, size_t cap)
{
    kvc_gen_params g;
    kvc_err e = { 0 };
    kvc_model *m = NULL;
    char err[512];
    if (!mkdtemp(dir))
        return NULL;
    snprintf(path, cap, "%s/tiny.gguf", dir);
    kvc_gen_preset("tiny", &g);
    CHECKF(kvc_gen_model(&g, path, &e) == KVC_OK, "gen: %s", e.msg);
    CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "load: %s", err);
    return m;
}

/* POST /apply-template: the prompt the model's Jinja template renders; its
 * errors are 400s naming the field. */
static void test_apply_template(void)
{
    resp r = post("/apply-template",
                  "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
                  "\"content\":\"hi <|im_end|>\",\"name\":\"bob\"},{\"role\":\"assistant\",\"content\":null,"
                  "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                  "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}],"
                  "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                  "\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    cJSON *j = cJSON_Parse(r.body ? r.body : "");
    const char *prompt = jstr(j, "prompt");
    CHECKF(r.status == 200 && prompt, "apply-template: %d %.200s", r.status, r.body ? r.body : "");
    CHECKF(prompt && !strcmp(prompt, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi <|im_end|><|im_end|>\n"
                                    "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n"
                                    "<|im_start|>assistant\n"), "prompt «%s»", prompt);
    cJSON_Delete(j);
    resp_free(&r);
    expect_error("apply-template tools", post("/apply-template",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}"),
                 400, NULL, "tools", "array");
    expect_error("apply-template tool_calls", post("/apply-template",
                 "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":1}]}]}"),
                 400, NULL, "messages[0].tool_calls", "function");
    expect_error("apply-template kwargs", post("/apply-template",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":1}"),
                 400, NULL, "chat_template_kwargs", "object");
    expect_error("apply-template name", post("/apply-template",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":5}]}"),
                 400, NULL, "messages[0].name", "string");
    resp g = get("/apply-template");
    CHECK(g.status == 405);
    resp_free(&g);
}

int main(void)
{
    char dir[] = "/tmp/kvc_test_server_XXXXXX", path[512], err[512];
    kvc_model *m = load_tiny(dir, path, sizeof(path));
    if (!m)
        return test_done("test_server");
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    snprintf(model_name, sizeof(model_name), "%s", info.name);
    kvc_engine_params ep = kvc_engine_default_params();
    ep.n_parallel = 4;
    ep.n_threads = 2;
    CHECKF(kvc_engine_new(m, &ep, &engine, err, sizeof(err)) == KVC_OK, "engine: %s", err);
    kvc_server *s = engine ? start(engine, NULL, 0) : NULL;
    if (s) {
        port = kvc_server_port(s);
        CHECK(port > 0);
        RUN(test_basic_endpoints());
        RUN(test_chat());
        RUN(test_completions());
        RUN(test_conversations());
        RUN(test_bad_fields());
        RUN(test_apply_template());
        RUN(test_context_length());
        RUN(test_routes());
        RUN(test_error_mapping());
        RUN(test_too_large());
        RUN(test_hostile());
        RUN(test_slow_clients());
        RUN(test_disconnect());
        RUN(test_auth());
        RUN(test_busy(m));
        RUN(test_timeout_and_stop());
        RUN(test_metrics(30));
        kvc_server_stop(s);
    }
    kvc_engine_free(engine);
    kvc_model_free(m);
    unlink(path);
    rmdir(dir);
    return test_done("test_server");
}
