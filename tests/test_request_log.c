/* test_request_log.c - `kvchat serve`'s line per request (issue 29): every
 * finished request gets one line on stderr with true figures - the prompt,
 * cached and computed tokens of a line are those the answer's usage and
 * timings report, a second turn's cached tokens are what the cache reused
 * (and /metrics counts the same), a stream's line has the streamed usage -,
 * errors carry their status and message, the session key appears only
 * hashed, successful /health probes are left out; --log-format json gives
 * one JSON object a line with the same figures; --quiet leaves out every
 * line of a request that did not fail; after a restart, the tokens read
 * from the disk tier are those the answer says.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include <cjson/cJSON.h>
#include <xxhash.h>

#include "http_client.h"
#include "kvchat.h"
#include "test.h"

static const char *bin;
static char model_path[64], log_path[64];

/* The lines of the log that contain `word`, waiting (at most 5 s) until
 * there are at least `want` of them: the line is written once the answer
 * went out, maybe after the client read it. A malloc'd text of those lines. */
static char *lines_with(const char *word, int want)
{
    char *out = NULL;
    for (int tries = 0; tries < 100; tries++) {
        free(out);
        out = NULL;
        size_t n = 0, len = 0;
        char *all = test_read_file(log_path, &n);
        out = calloc(1, n + 1);
        int found = 0;
        for (char *save = NULL, *l = all ? strtok_r(all, "\n", &save) : NULL; l && out;
             l = strtok_r(NULL, "\n", &save))
            if (strstr(l, word)) {
                len += (size_t)sprintf(out + len, "%s\n", l);
                found++;
            }
        free(all);
        if (found >= want)
            break;
        usleep(50000);
    }
    return out ? out : strdup("");
}

/* Line i (from 0) of text: a pointer into it; "" when there are fewer. */
static const char *nth_line(const char *text, int i)
{
    for (; i > 0 && text; i--)
        text = strchr(text, '\n') ? strchr(text, '\n') + 1 : NULL;
    return text ? text : "";
}

/* The integer after "key=" in line, -1 when absent. */
static long field(const char *line, const char *key)
{
    char pat[40];
    snprintf(pat, sizeof(pat), " %s=", key);
    const char *at = strstr(line, pat);
    return at ? strtol(at + strlen(pat), NULL, 10) : -1;
}

static cJSON *post(int port, const char *body, int *status)
{
    http_resp r = http_request(port, "POST", "/v1/chat/completions", body, 60);
    *status = r.status;
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    http_resp_free(&r);
    return j;
}

static double num(const cJSON *o, const char *a, const char *b)
{
    const cJSON *v = cJSON_GetObjectItem(o, a);
    v = b ? cJSON_GetObjectItem(v, b) : v;
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static double metric(int port, const char *name)
{
    http_resp r = http_request(port, "GET", "/metrics", NULL, 10);
    double v = r.body ? http_prom(r.body, name) : -1;
    http_resp_free(&r);
    return v;
}

#define TURN1 "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"}," \
              "{\"role\":\"user\",\"content\":\"Tell me about the sea and its tides.\"}]," \
              "\"max_tokens\":6,\"temperature\":0,\"prompt_cache_key\":\"conv-secret-1\"}"

/* The figures of a text line against the answer's usage; the second turn's
 * cached tokens against what the cache holds. */
static void test_text(void)
{
    const char *args[] = { "-m", model_path, "--parallel", "1", "--cache-disk", "0", "-t", "1",
                           NULL };
    http_server s;
    CHECK(http_server_start_logged(&s, bin, args, 60, log_path));
    if (s.port <= 0)
        return;
    int st;
    cJSON *a = post(s.port, TURN1, &st);
    CHECK_EQ_INT(st, 200);
    char *reply = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(a, "choices"), 0), "message"), "content"));
    char body[2048];
    snprintf(body, sizeof(body),
             "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
             "{\"role\":\"user\",\"content\":\"Tell me about the sea and its tides.\"},"
             "{\"role\":\"assistant\",\"content\":%s},{\"role\":\"user\",\"content\":\"More.\"}],"
             "\"max_tokens\":5,\"temperature\":0,\"prompt_cache_key\":\"conv-secret-1\"}",
             reply ? reply : "\"\"");
    free(reply);
    double cached_before = metric(s.port, "kvchat_cached_tokens_total");
    cJSON *b = post(s.port, body, &st);
    CHECK_EQ_INT(st, 200);
    double cached_after = metric(s.port, "kvchat_cached_tokens_total");
    char *lines = lines_with("POST /v1/chat/completions 200", 2);
    const char *second = nth_line(lines, 1);
    const cJSON *answers[2] = { a, b };
    const char *line[2] = { lines, second };
    for (int i = 0; i < 2; i++) {
        const cJSON *j = answers[i];
        CHECKF(field(line[i], "prompt") == (long)num(j, "usage", "prompt_tokens"),
               "turn %d prompt: %s", i + 1, line[i]);
        CHECKF(field(line[i], "cached") == (long)num(j, "timings", "cache_n") &&
               field(line[i], "cached") ==
                   (long)num(cJSON_GetObjectItem(j, "usage"), "prompt_tokens_details",
                             "cached_tokens"), "turn %d cached: %s", i + 1, line[i]);
        CHECKF(field(line[i], "computed") == (long)num(j, "timings", "prompt_n"),
               "turn %d computed: %s", i + 1, line[i]);
        CHECKF(field(line[i], "gen") == (long)num(j, "usage", "completion_tokens"),
               "turn %d gen: %s", i + 1, line[i]);
        CHECKF(strstr(line[i], " ttft=") && strstr(line[i], "tok/s") &&
               strstr(line[i], "finish=length") && strstr(line[i], " 127.0.0.1 POST "),
               "turn %d: %s", i + 1, line[i]);
    }
    /* the second turn reused the first: its whole prompt and reply (at least
     * the first turn's prompt), as /metrics counted it */
    long c2 = field(second, "cached");
    CHECKF(c2 >= (long)num(a, "usage", "prompt_tokens") && c2 < (long)num(b, "usage", "prompt_tokens"),
           "turn 2 cached %ld of %g (turn 1: %g)", c2, num(b, "usage", "prompt_tokens"),
           num(a, "usage", "prompt_tokens"));
    printf("request log: turn 2 cached %ld of %g prompt tokens (turn 1: %g)\n", c2,
           num(b, "usage", "prompt_tokens"), num(a, "usage", "prompt_tokens"));
    CHECKF(cached_after - cached_before == c2, "/metrics counted %g cached, the line %ld",
           cached_after - cached_before, c2);
    /* the session: hashed, the key itself never written */
    char want[40];
    snprintf(want, sizeof(want), "session=%016llx",
             (unsigned long long)XXH3_64bits("conv-secret-1", strlen("conv-secret-1")));
    CHECKF(strstr(lines, want) && !strstr(lines, "conv-secret"), "session: %s", lines);
    free(lines);
    cJSON_Delete(a);
    cJSON_Delete(b);

    /* a stream: its line has the usage the stream ended with */
    http_resp r = http_request(s.port, "POST", "/v1/chat/completions",
                               "{\"messages\":[{\"role\":\"user\",\"content\":\"Streams?\"}],"
                               "\"max_tokens\":7,\"temperature\":0,\"stream\":true,"
                               "\"stream_options\":{\"include_usage\":true}}", 60);
    CHECK(r.status == 200 && r.body && strstr(r.body, "\"completion_tokens\":7"));
    http_resp_free(&r);
    lines = lines_with("POST /v1/chat/completions 200", 3);
    const char *third = nth_line(lines, 2);
    CHECKF(field(third, "gen") == 7 && field(third, "prompt") > 0 &&
           !strstr(third, "session="), "stream line: %s", lines);
    free(lines);

    /* errors: status and message; a 404; /health left out */
    r = http_request(s.port, "POST", "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":9}", 10);
    CHECK_EQ_INT(r.status, 400);
    http_resp_free(&r);
    r = http_request(s.port, "GET", "/health", NULL, 10);
    http_resp_free(&r);
    r = http_request(s.port, "GET", "/no/such/path", NULL, 10);
    CHECK_EQ_INT(r.status, 404);
    http_resp_free(&r);
    lines = lines_with("GET /no/such/path 404", 1);
    CHECKF(*lines, "no 404 line");
    free(lines);
    lines = lines_with("POST /v1/chat/completions 400", 1);
    CHECKF(strstr(lines, "error=\"temperature must be a number between 0 and 2\""),
           "400 line: %s", lines);
    free(lines);
    /* a client that leaves before its answer: nginx's 499 */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s.port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const char *gone = "{\"messages\":[{\"role\":\"user\",\"content\":\"Go on.\"}],"
                       "\"max_tokens\":1900,\"temperature\":1}";
    char req[512];
    int len = snprintf(req, sizeof(req), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                       "Content-Length: %zu\r\n\r\n%s", strlen(gone), gone);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
          send(fd, req, (size_t)len, MSG_NOSIGNAL) == len);
    usleep(30000);
    close(fd);
    lines = lines_with("POST /v1/chat/completions 499", 1);
    CHECKF(strstr(lines, "error=\"the client went away\""), "no 499 line: %s", lines);
    free(lines);
    lines = lines_with("/health", 0);
    CHECKF(!*lines, "a /health probe logged: %s", lines);
    free(lines);
    http_server_stop(&s);
}

/* --log-format json: one object a line, the same figures as the answer. */
static void test_json(void)
{
    const char *args[] = { "-m", model_path, "--parallel", "1", "--cache-disk", "0", "-t", "1",
                           "--log-format", "json", "--unknown-field-probe", NULL };
    http_server s;
    /* a bad option first: the server refuses to start */
    CHECK(!http_server_start_logged(&s, bin, args, 10, log_path));
    args[10] = NULL;
    char cmd[600];                                /* a format it does not know */
    snprintf(cmd, sizeof(cmd), "'%s' serve --log-format=xml 2>&1 | grep -q -e "
             "\"--log-format must be text or json, got 'xml'\"", bin);
    CHECK(system(cmd) == 0);
    CHECK(http_server_start_logged(&s, bin, args, 60, log_path));
    if (s.port <= 0)
        return;
    int st;
    char *lines = lines_with("listening on http://127.0.0.1:", 1);   /* a JSON notice too */
    cJSON *line = cJSON_Parse(lines);
    CHECKF(line && strstr(cJSON_GetStringValue(cJSON_GetObjectItem(line, "message")),
                          "listening on http://127.0.0.1:"), "%s", lines);
    cJSON_Delete(line);
    free(lines);
    cJSON *a = post(s.port, TURN1, &st);
    CHECK_EQ_INT(st, 200);
    lines = lines_with("\"path\":\"/v1/chat/completions\"", 1);
    line = cJSON_Parse(lines);
    CHECKF(line, "not one JSON object: %s", lines);
    CHECK(cJSON_IsString(cJSON_GetObjectItem(line, "time")));
    CHECK(num(line, "status", NULL) == 200);
    CHECK(num(line, "prompt_tokens", NULL) == num(a, "usage", "prompt_tokens"));
    CHECK(num(line, "cached_tokens", NULL) == num(a, "timings", "cache_n"));
    CHECK(num(line, "computed_tokens", NULL) == num(a, "timings", "prompt_n"));
    CHECK(num(line, "output_tokens", NULL) == 6);
    CHECK(num(line, "ttft_ms", NULL) >= 0 && num(line, "duration_ms", NULL) > 0);
    CHECK(cJSON_IsString(cJSON_GetObjectItem(line, "session")));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(line, "client")), "127.0.0.1"));
    cJSON_Delete(line);
    free(lines);
    /* a notice is a JSON line too */
    cJSON_Delete(post(s.port, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                              "\"max_tokens\":1,\"return_progress\":true}", &st));
    lines = lines_with("return_progress", 1);
    line = cJSON_Parse(lines);
    CHECKF(line && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(line, "level")), "warning"),
           "notice: %s", lines);
    cJSON_Delete(line);
    free(lines);
    cJSON_Delete(a);
    http_server_stop(&s);
}

/* --quiet: no line for a request that did not fail (a 200, a 400). */
static void test_quiet(void)
{
    const char *args[] = { "-m", model_path, "--parallel", "1", "--cache-disk", "0", "-t", "1",
                           "-q", NULL };
    http_server s;
    CHECK(http_server_start_logged(&s, bin, args, 60, log_path));
    if (s.port <= 0)
        return;
    int st;
    cJSON_Delete(post(s.port, TURN1, &st));
    CHECK_EQ_INT(st, 200);
    cJSON_Delete(post(s.port, "{\"messages\":[],\"max_tokens\":1}", &st));
    CHECK_EQ_INT(st, 400);
    usleep(300000);
    char *lines = lines_with("/v1/chat/completions", 0);
    CHECKF(!*lines, "--quiet logged: %s", lines);
    free(lines);
    http_server_stop(&s);
}

/* After a restart the prompt comes from the disk tier: the line's disk
 * figure is the answer's cache_disk_n, and all of cached. */
static void test_disk(void)
{
    char dir[64], cmd[128];
    snprintf(dir, sizeof(dir), "/tmp/kvc_reqlog_kv_%d", (int)getpid());
    const char *args[] = { "-m", model_path, "--parallel", "1", "--cache-disk", "64",
                           "--cache-dir", dir, "-t", "1", NULL };
    cJSON *a = NULL;
    for (int run = 0; run < 2; run++) {
        http_server s;
        CHECK(http_server_start_logged(&s, bin, args, 60, log_path));
        if (s.port <= 0)
            break;
        int st;
        cJSON_Delete(a);
        a = post(s.port, TURN1, &st);
        CHECK_EQ_INT(st, 200);
        for (int i = 0; run == 0 && i < 100 &&
                        metric(s.port, "kvchat_disk_blocks_written_total") < 2; i++)
            usleep(50000);                   /* written through before the stop */
        char *lines = lines_with("POST /v1/chat/completions 200", 1);
        long disk = field(lines, "disk");
        if (run == 1)
            CHECKF(disk > 0 && disk == (long)num(a, "timings", "cache_disk_n") &&
                   disk == field(lines, "cached"), "after a restart: %s", lines);
        else
            CHECKF(disk == 0, "first run: %s", lines);
        if (run == 1)
            printf("request log: after a restart, %ld of %ld prompt tokens from disk\n", disk,
                   field(lines, "prompt"));
        free(lines);
        http_server_stop(&s);
    }
    cJSON_Delete(a);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || !*bin) {
        printf("test_request_log: KVC_BIN not set, skipped\n");
        return TEST_SKIP;
    }
    kvc_gen_params gp;
    kvc_gen_preset("tiny", &gp);
    snprintf(model_path, sizeof(model_path), "/tmp/kvc_reqlog_%d.gguf", (int)getpid());
    snprintf(log_path, sizeof(log_path), "/tmp/kvc_reqlog_%d.log", (int)getpid());
    char err[256];
    CHECK(kvc_gen_write(&gp, model_path, err, sizeof(err)) == KVC_OK);
    test_text();
    test_json();
    test_quiet();
    test_disk();
    unlink(model_path);
    unlink(log_path);
    return test_done("test_request_log");
}
