/* test_ollama_http.c - Ollama's API over plain HTTP (issue 29), and what
 * the server tells of its model (/props, /v1/models):
 *   - one conversation (with a tool call and its result in the history)
 *     through /api/chat and /v1/chat/completions renders to the same prompt,
 *     gives the same greedy reply, and the second API reuses the first's
 *     cache; /api/generate with raw is /v1/completions' prompt;
 *   - /api/chat and /api/generate stream NDJSON (application/x-ndjson, one
 *     object a line, done false until the last) whose text is the whole
 *     answer's; Ollama's fields (done_reason, eval_count, durations);
 *   - logprobs: an entry per token, whole and streamed;
 *   - options mapped (num_predict, stop, seed) and refused (a 400 naming
 *     each), runtime ones ignored and named, keep_alive ignored; images,
 *     suffix, template, context refused; an empty prompt loads;
 *   - /api/embed and /api/pull are 501s in Ollama's error shape;
 *   - the dialect's tool_calls (arguments as objects), whole and streamed;
 *   - /props and /v1/models tell the context, the defaults, the model.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include <cjson/cJSON.h>

#include "http_client.h"
#include "json_at.h"
#include "kvchat.h"
#include "server.h"
#include "test.h"

static const char *bin;
static char model_path[64], tmpl_path[4200];

static cJSON *post_json(int port, const char *path, const char *body, int *status)
{
    http_resp r = http_request(port, "POST", path, body, 60);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    *status = r.status;
    if (r.status != 200)
        fprintf(stderr, "%s %s -> %d %s\n", path, body, r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return j;
}

static const char *str_at(const cJSON *o, const char *path)
{
    const char *s = cJSON_GetStringValue(at(o, path));
    return s ? s : "";
}

static double num_at(const cJSON *o, const char *path)
{
    const cJSON *v = at(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* A 400 (or status) whose {"error": "..."} names `word`. */
static void check_refused(int port, const char *path, const char *body, int status,
                          const char *word)
{
    http_resp r = http_request(port, "POST", path, body, 30);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    CHECKF(r.status == status, "%s: status %d (%s)", body, r.status, r.body ? r.body : "");
    CHECKF(strstr(str_at(j, "error"), word), "%s: error '%s' lacks '%s'", body, str_at(j, "error"),
           word);
    cJSON_Delete(j);
    http_resp_free(&r);
}

/* The lines of an NDJSON body as JSON objects (at most max); the count. */
static int ndjson(const char *body, cJSON **out, int max)
{
    int n = 0;
    for (const char *p = body; p && *p && n < max;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char *line = strndup(p, len);
        out[n++] = cJSON_Parse(line);
        free(line);
        p = e ? e + 1 : NULL;
    }
    return n;
}

/* ================================================= the same conversation */

#define HISTORY_OLLAMA \
    "[{\"role\":\"system\",\"content\":\"You are terse.\"}," \
    "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"}," \
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":" \
    "\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}}]}," \
    "{\"role\":\"tool\",\"content\":\"sunny, 20 C\",\"tool_name\":\"get_weather\"}]"
#define HISTORY_OPENAI \
    "[{\"role\":\"system\",\"content\":\"You are terse.\"}," \
    "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"}," \
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_2_0\",\"type\":" \
    "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":" \
    "\\\"Oslo\\\"}\"}}]},{\"role\":\"tool\",\"content\":\"sunny, 20 C\",\"tool_call_id\":" \
    "\"call_2_0\",\"name\":\"get_weather\"}]"
#define TOOLS \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\"," \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]"

static void test_same_conversation(int port)
{
    int st;
    cJSON *p1 = post_json(port, "/apply-template?api=ollama.chat",
                          "{\"model\":\"m\",\"tools\":" TOOLS ",\"messages\":" HISTORY_OLLAMA "}",
                          &st);
    cJSON *p2 = post_json(port, "/apply-template",
                          "{\"tools\":" TOOLS ",\"messages\":" HISTORY_OPENAI "}", &st);
    CHECKF(*str_at(p1, "prompt") && !strcmp(str_at(p1, "prompt"), str_at(p2, "prompt")),
           "prompts differ:\n%s\n---\n%s", str_at(p1, "prompt"), str_at(p2, "prompt"));
    CHECKF(strstr(str_at(p1, "prompt"), "\"city\": \"Oslo\"") ||
           strstr(str_at(p1, "prompt"), "\"city\":\"Oslo\""), "no call in %s", str_at(p1, "prompt"));
    cJSON_Delete(p1);
    cJSON_Delete(p2);

    cJSON *o = post_json(port, "/api/chat",
                         "{\"model\":\"m\",\"stream\":false,\"tools\":" TOOLS ",\"messages\":"
                         HISTORY_OLLAMA ",\"options\":{\"temperature\":0,\"num_predict\":6}}", &st);
    CHECK_EQ_INT(st, 200);
    cJSON *c = post_json(port, "/v1/chat/completions",
                         "{\"model\":\"m\",\"tools\":" TOOLS ",\"messages\":" HISTORY_OPENAI
                         ",\"temperature\":0,\"max_tokens\":6}", &st);
    CHECK_EQ_INT(st, 200);
    CHECKF(!strcmp(str_at(o, "message.content"), str_at(c, "choices.0.message.content")),
           "replies differ: '%s' vs '%s'", str_at(o, "message.content"),
           str_at(c, "choices.0.message.content"));
    CHECK(num_at(o, "prompt_eval_count") == num_at(c, "usage.prompt_tokens"));
    CHECK(num_at(o, "eval_count") == 6 && !strcmp(str_at(o, "done_reason"), "length"));
    CHECK(cJSON_IsTrue(at(o, "done")) && !strcmp(str_at(o, "message.role"), "assistant"));
    CHECK(num_at(o, "total_duration") > 0 && num_at(o, "eval_duration") > 0 &&
          num_at(o, "prompt_eval_duration") >= 0 && num_at(o, "load_duration") == 0);
    /* the chat completion came second: the prompt Ollama's request computed
     * is in the cache (all but the last token, which is run again) */
    CHECKF(num_at(c, "usage.prompt_tokens_details.cached_tokens") >=
           num_at(o, "prompt_eval_count") - 1, "cached %g of %g",
           num_at(c, "usage.prompt_tokens_details.cached_tokens"), num_at(o, "prompt_eval_count"));
    printf("same conversation: %g prompt tokens; chat completions after /api/chat: %g cached\n",
           num_at(o, "prompt_eval_count"), num_at(c, "usage.prompt_tokens_details.cached_tokens"));
    cJSON_Delete(o);
    cJSON_Delete(c);

    /* generate raw: the completions prompt as it is */
    o = post_json(port, "/api/generate", "{\"model\":\"m\",\"prompt\":\"Once upon a time\","
                  "\"raw\":true,\"stream\":false,\"options\":{\"temperature\":0,"
                  "\"num_predict\":5}}", &st);
    c = post_json(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"temperature\":0,"
                  "\"max_tokens\":5}", &st);
    CHECK(!strcmp(str_at(o, "response"), str_at(c, "choices.0.text")));
    CHECK(num_at(o, "prompt_eval_count") == num_at(c, "usage.prompt_tokens"));
    cJSON_Delete(o);
    cJSON_Delete(c);
}

/* ================================================================ streams */

static void test_streams(int port)
{
    static const char *const bodies[][2] = {
        { "/api/chat", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
                       "\"Tell me about the sea.\"}],\"options\":{\"temperature\":0,"
                       "\"num_predict\":7}%s}" },
        { "/api/generate", "{\"model\":\"m\",\"prompt\":\"Tell me about the sea.\","
                           "\"system\":\"Be brief.\",\"options\":{\"temperature\":0,"
                           "\"num_predict\":7}%s}" },
    };
    for (int k = 0; k < 2; k++) {
        bool chat = k == 0;
        char body[512];
        snprintf(body, sizeof(body), bodies[k][1], ",\"stream\":false");
        int st;
        cJSON *whole = post_json(port, bodies[k][0], body, &st);
        snprintf(body, sizeof(body), bodies[k][1], "");          /* streamed by default */
        http_resp r = http_request(port, "POST", bodies[k][0], body, 60);
        CHECK_EQ_INT(r.status, 200);
        CHECKF(r.raw && strstr(r.raw, "Content-Type: application/x-ndjson"), "%s", r.raw);
        cJSON *lines[64];
        int n = r.body ? ndjson(r.body, lines, 64) : 0;
        char text[4096] = "";
        bool ok = n >= 2;
        for (int i = 0; i < n; i++) {
            ok = ok && lines[i] && cJSON_IsTrue(at(lines[i], "done")) == (i == n - 1);
            ok = ok && !strcmp(str_at(lines[i], "model"), "m") && *str_at(lines[i], "created_at");
            strncat(text, str_at(lines[i], chat ? "message.content" : "response"),
                    sizeof(text) - strlen(text) - 1);
        }
        CHECKF(ok, "%s: %d lines:\n%s", bodies[k][0], n, r.body ? r.body : "");
        CHECKF(!strcmp(text, str_at(whole, chat ? "message.content" : "response")),
               "%s: streamed '%s', whole '%s'", bodies[k][0], text,
               str_at(whole, chat ? "message.content" : "response"));
        if (n > 0) {
            CHECK(num_at(lines[n - 1], "eval_count") == 7);
            CHECK(!strcmp(str_at(lines[n - 1], "done_reason"), "length"));
            CHECK(num_at(lines[n - 1], "prompt_eval_count") == num_at(whole, "prompt_eval_count"));
        }
        for (int i = 0; i < n; i++)
            cJSON_Delete(lines[i]);
        http_resp_free(&r);
        cJSON_Delete(whole);
    }
}

/* logprobs: one entry per generated token, whole and streamed, whose
 * tokens spell the text. */
static void test_logprobs(int port)
{
    int st;
    const char *body = "{\"model\":\"m\",\"prompt\":\"Once upon a time\",\"logprobs\":true,"
                       "\"top_logprobs\":2,\"stream\":%s,\"options\":{\"temperature\":0,"
                       "\"num_predict\":6}}";
    char b[512];
    snprintf(b, sizeof(b), body, "false");
    cJSON *w = post_json(port, "/api/generate", b, &st);
    const cJSON *lp = at(w, "logprobs"), *x;
    CHECKF(cJSON_GetArraySize(lp) == 6 && cJSON_GetArraySize(at(w, "logprobs.0.top_logprobs")) == 2,
           "whole: %d entries", cJSON_GetArraySize(lp));
    char text[1024] = "";
    cJSON_ArrayForEach(x, lp)
        strncat(text, str_at(x, "token"), sizeof(text) - strlen(text) - 1);
    CHECKF(!strcmp(text, str_at(w, "response")), "tokens '%s', response '%s'", text,
           str_at(w, "response"));
    snprintf(b, sizeof(b), body, "true");
    http_resp r = http_request(port, "POST", "/api/generate", b, 60);
    cJSON *lines[32];
    int n = r.body ? ndjson(r.body, lines, 32) : 0, entries = 0;
    char streamed[1024] = "";
    for (int i = 0; i < n; i++) {
        cJSON_ArrayForEach(x, at(lines[i], "logprobs")) {
            entries++;
            strncat(streamed, str_at(x, "token"), sizeof(streamed) - strlen(streamed) - 1);
        }
        cJSON_Delete(lines[i]);
    }
    CHECKF(entries == 6 && !strcmp(streamed, text), "streamed: %d entries, '%s'", entries,
           streamed);
    http_resp_free(&r);
    cJSON_Delete(w);
    check_refused(port, "/api/chat", "{\"model\":\"m\",\"top_logprobs\":2,\"messages\":"
                  "[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "top_logprobs");
}

/* ========================================================= the fields */

static void test_fields(int port)
{
    int st;
    /* stop: the reply ends before it, as the chat API's stop does */
    cJSON *a = post_json(port, "/api/chat", "{\"model\":\"m\",\"stream\":false,\"messages\":"
                         "[{\"role\":\"user\",\"content\":\"Count.\"}],\"options\":"
                         "{\"temperature\":0,\"num_predict\":12}}", &st);
    const char *full = str_at(a, "message.content");
    if (strlen(full) > 4) {
        char body[1024], stop[8];
        snprintf(stop, sizeof(stop), "%.3s", full + strlen(full) / 2);
        cJSON *s = cJSON_CreateString(stop);
        char *sj = cJSON_PrintUnformatted(s);
        snprintf(body, sizeof(body), "{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":"
                 "\"user\",\"content\":\"Count.\"}],\"options\":{\"temperature\":0,"
                 "\"num_predict\":12,\"stop\":[%s]}}", sj);
        cJSON *b = post_json(port, "/api/chat", body, &st);
        const char *cut = str_at(b, "message.content");
        CHECKF(strlen(cut) < strlen(full) && !strncmp(cut, full, strlen(cut)) && !strstr(cut, stop),
               "stop '%s': '%s' of '%s'", stop, cut, full);
        CHECK(!strcmp(str_at(b, "done_reason"), "stop"));
        free(sj);
        cJSON_Delete(s);
        cJSON_Delete(b);
    }
    cJSON_Delete(a);
    /* a seed makes a sampled reply repeat */
    const char *seeded = "{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":\"user\","
                         "\"content\":\"Go.\"}],\"options\":{\"temperature\":1,\"seed\":42,"
                         "\"num_predict\":8}}";
    a = post_json(port, "/api/chat", seeded, &st);
    cJSON *b = post_json(port, "/api/chat", seeded, &st);
    CHECK(!strcmp(str_at(a, "message.content"), str_at(b, "message.content")));
    cJSON_Delete(a);
    cJSON_Delete(b);

    /* runtime options and keep_alive: accepted, named */
    http_resp r = http_request(port, "POST", "/api/chat", "{\"model\":\"m\",\"stream\":false,"
                               "\"keep_alive\":\"5m\",\"messages\":[{\"role\":\"user\",\"content\":"
                               "\"x\"}],\"options\":{\"num_predict\":1,\"num_gpu\":99,"
                               "\"num_thread\":4,\"typical_p\":1}}", 30);
    CHECK_EQ_INT(r.status, 200);
    CHECKF(r.raw && strstr(r.raw, "X-Kvchat-Ignored-Fields: ") && strstr(r.raw, "keep_alive") &&
           strstr(r.raw, "options.num_gpu") && strstr(r.raw, "options.num_thread") &&
           !strstr(r.raw, "typical_p"), "%s", r.raw ? r.raw : "");
    http_resp_free(&r);

    /* refused, each named */
    const char *msg = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char body[512];
    static const char *const refused[][2] = {
        { "{\"mirostat\":1}", "options.mirostat" }, { "{\"typical_p\":0.5}", "options.typical_p" },
        { "{\"tfs_z\":0.9}", "options.tfs_z" }, { "{\"num_ctx\":100000}", "options.num_ctx" },
        { "{\"temperature\":\"hot\"}", "temperature" }, { "{\"num_predict\":\"x\"}", "num_predict" },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(refused); i++) {
        snprintf(body, sizeof(body), "{\"model\":\"m\",%s,\"options\":%s}", msg, refused[i][0]);
        check_refused(port, "/api/chat", body, 400, refused[i][1]);
    }
    check_refused(port, "/api/chat", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                  "\"content\":\"x\",\"images\":[\"aGk=\"]}]}", 400, "messages[0].images");
    check_refused(port, "/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                  400, "model is required");
    check_refused(port, "/api/chat", "{\"model\":\"m\",\"format\":\"yaml\",\"messages\":"
                  "[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "format");
    check_refused(port, "/api/chat", "{\"model\":\"m\",\"think\":\"very\",\"messages\":"
                  "[{\"role\":\"user\",\"content\":\"x\"}]}", 400, "think");
    static const char *const gen_refused[][2] = {
        { "\"suffix\":\"end\"", "suffix" }, { "\"template\":\"{{ .Prompt }}\"", "template" },
        { "\"context\":[1,2,3]", "context" }, { "\"images\":[\"aGk=\"]", "images" },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(gen_refused); i++) {
        snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"x\",%s}", gen_refused[i][0]);
        check_refused(port, "/api/generate", body, 400, gen_refused[i][1]);
    }
    check_refused(port, "/api/generate", "{\"model\":\"m\",\"prompt\":\"x\",\"raw\":true,"
                  "\"system\":\"s\"}", 400, "system");
    /* the empty ones change nothing: accepted */
    a = post_json(port, "/api/generate", "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":false,"
                  "\"context\":[],\"images\":[],\"suffix\":\"\",\"options\":{\"num_predict\":1}}",
                  &st);
    CHECK_EQ_INT(st, 200);
    cJSON_Delete(a);
    /* nothing to generate: loaded */
    a = post_json(port, "/api/generate", "{\"model\":\"m\"}", &st);
    CHECK(st == 200 && !strcmp(str_at(a, "done_reason"), "load") && cJSON_IsTrue(at(a, "done")));
    cJSON_Delete(a);
    a = post_json(port, "/api/chat", "{\"model\":\"m\",\"messages\":[]}", &st);
    CHECK(st == 200 && !strcmp(str_at(a, "done_reason"), "load"));
    CHECKF(!strcmp(str_at(a, "message.role"), "assistant") && !at(a, "response"),
           "a chat's load answer is a chat answer");
    cJSON_Delete(a);
    /* what kvchat does not do: 501s in Ollama's shape */
    check_refused(port, "/api/embed", "{\"model\":\"m\",\"input\":\"x\"}", 501, "embeddings");
    check_refused(port, "/api/embeddings", "{\"model\":\"m\",\"prompt\":\"x\"}", 501, "embeddings");
    check_refused(port, "/api/pull", "{\"model\":\"llama3\"}", 501, "-m MODEL.gguf");
    r = http_request(port, "DELETE", "/api/delete", "{\"model\":\"m\"}", 10);
    CHECK_EQ_INT(r.status, 501);
    http_resp_free(&r);
    r = http_request(port, "GET", "/api/nothing", NULL, 10);
    CHECKF(r.status == 404 && r.body && !strncmp(r.body, "{\"error\":\"", 10), "%s", r.raw);
    http_resp_free(&r);
}

/* ================================================== the model described */

static void test_described(int port)
{
    http_resp r = http_request(port, "GET", "/props", NULL, 10);
    cJSON *p = r.body ? cJSON_Parse(r.body) : NULL;
    CHECK_EQ_INT(r.status, 200);
    CHECK(num_at(p, "default_generation_settings.n_ctx") == 512 && num_at(p, "n_ctx") == 512);
    CHECK(num_at(p, "total_slots") == 2);
    CHECK(num_at(p, "default_generation_settings.params.temperature") == 0.7);  /* --temp */
    CHECK(num_at(p, "default_generation_settings.params.top_k") == 40);
    CHECK(num_at(p, "default_generation_settings.params.seed") == -1);   /* random per request */
    CHECK(!strcmp(str_at(p, "model_path"), model_path));
    CHECK(!strcmp(str_at(p, "model_alias"), "tiny-served"));
    CHECK(strstr(str_at(p, "chat_template"), "tool_call") != NULL);   /* hermes.jinja's */
    CHECK(strstr(str_at(p, "build_info"), "0.") == str_at(p, "build_info"));
    cJSON_Delete(p);
    http_resp_free(&r);

    r = http_request(port, "GET", "/v1/models", NULL, 10);
    p = r.body ? cJSON_Parse(r.body) : NULL;
    CHECK(!strcmp(str_at(p, "data.0.id"), "tiny-served"));
    CHECK(!strcmp(str_at(p, "data.0.owned_by"), "kvchat"));
    CHECK(num_at(p, "data.0.created") > 1e9);
    CHECK(num_at(p, "data.0.context_length") == 512 && num_at(p, "data.0.max_model_len") == 512);
    CHECK(num_at(p, "data.0.meta.n_ctx_train") == 2048 && num_at(p, "data.0.meta.n_params") > 1e5);
    CHECK(num_at(p, "data.0.meta.size") > 0 && num_at(p, "data.0.meta.n_vocab") > 100);
    cJSON_Delete(p);
    http_resp_free(&r);

    r = http_request(port, "GET", "/api/tags", NULL, 10);
    p = r.body ? cJSON_Parse(r.body) : NULL;
    CHECK(!strcmp(str_at(p, "models.0.name"), "tiny-served:latest"));
    CHECK(!strcmp(str_at(p, "models.0.details.quantization_level"), "Q8_0"));
    CHECK(!strcmp(str_at(p, "models.0.details.family"), "qwen2"));
    struct stat sb;
    CHECK(stat(model_path, &sb) == 0 && num_at(p, "models.0.size") == (double)sb.st_size);
    cJSON_Delete(p);
    http_resp_free(&r);

    int st;
    p = post_json(port, "/api/show", "{\"model\":\"tiny-served\"}", &st);
    const cJSON *info = at(p, "model_info");   /* its keys have dots */
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(info, "qwen2.context_length")) == 2048);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(info, "qwen2.block_count")) == 2);
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(info, "general.architecture")),
                  "qwen2"));
    CHECK(cJSON_IsArray(at(p, "capabilities")));
    cJSON_Delete(p);
    check_refused(port, "/api/show", "{}", 400, "model");
    r = http_request(port, "GET", "/api/ps", NULL, 10);
    p = r.body ? cJSON_Parse(r.body) : NULL;
    CHECK(num_at(p, "models.0.context_length") == 512);
    cJSON_Delete(p);
    http_resp_free(&r);
}

/* ===================================================== tool calls out */

/* The dialect's answer to a reply with tool calls: Ollama's shape (the
 * arguments an object), whole and streamed. */
static void test_tool_calls_out(void)
{
    srv_reply_id id = { .id = "x", .model = "m" };
    kvc_event done = { .type = KVC_EVENT_DONE };
    done.stats.finish_reason = "stop";
    done.stats.output_tokens = 9;
    srv_reply rp = { .done = &done, .content = "", .tool_calls =
        "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]" };
    srv_request rq = { .dialect = &srv_dialect_ollama_chat, .n = 1, .n_prompts = 1 };
    char *s = srv_dialect_ollama_chat.response(&id, &rq, &rp, 1, 1, NULL, false);
    cJSON *o = s ? cJSON_Parse(s) : NULL;
    CHECKF(!strcmp(str_at(o, "message.tool_calls.0.function.name"), "get_weather") &&
           !strcmp(str_at(o, "message.tool_calls.0.function.arguments.city"), "Oslo") &&
           num_at(o, "eval_count") == 9 && !strcmp(str_at(o, "done_reason"), "stop"), "%s", s);
    cJSON_Delete(o);
    free(s);

    srv_emit em = { .head = { .dialect = &srv_dialect_ollama_chat, .id = &id }, .open = -1 };
    srv_buf out = { 0 };
    CHECK(srv_dialect_ollama_chat.sse_finish(&em, &rp, NULL, &out));
    cJSON *lines[4];
    int n = out.p ? ndjson(out.p, lines, 4) : 0;
    CHECKF(n == 2 && !cJSON_IsTrue(at(lines[0], "done")) &&
           !strcmp(str_at(lines[0], "message.tool_calls.0.function.arguments.city"), "Oslo") &&
           cJSON_IsTrue(at(lines[1], "done")), "%s", out.p ? out.p : "");
    for (int i = 0; i < n; i++)
        cJSON_Delete(lines[i]);
    free(out.p);
}

int main(void)
{
    test_tool_calls_out();
    bin = getenv("KVC_BIN");
    if (!bin || !*bin) {
        printf("test_ollama_http: KVC_BIN not set, HTTP part skipped\n");
        return test_failures ? 1 : TEST_SKIP;
    }
    snprintf(model_path, sizeof(model_path), "/tmp/kvc_ollama_%d.gguf", (int)getpid());
    snprintf(tmpl_path, sizeof(tmpl_path), "%s/tests/node/hermes.jinja", KVC_SOURCE_DIR);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "'%s' make-model --preset tiny --type q8_0 -o %s 2>/dev/null", bin,
             model_path);
    CHECK(system(cmd) == 0);
    const char *args[] = { "-m", model_path, "--parallel", "2", "--cache-disk", "0", "-c", "512",
                           "--temp", "0.7", "--alias", "tiny-served", "--chat-template-file",
                           tmpl_path, NULL };
    http_server s;
    CHECK(http_server_start(&s, bin, args, 60));
    if (s.port > 0) {
        test_same_conversation(s.port);
        test_streams(s.port);
        test_logprobs(s.port);
        test_fields(s.port);
        test_described(s.port);
    }
    http_server_stop(&s);
    unlink(model_path);
    return test_done("test_ollama_http");
}
