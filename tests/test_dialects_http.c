/* test_dialects_http.c - the API dialects of `kvchat serve` over HTTP
 * (issue 28): OpenAI Responses (POST /v1/responses) and Anthropic Messages
 * (POST /v1/messages, /v1/messages/count_tokens), whole and streamed, with
 * tools; and one conversation sent through chat completions, Responses and
 * Messages: the same rendered prompt (/apply-template?api=...), the same
 * greedy reply, and the second API reusing the first's cache.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include <cjson/cJSON.h>
#include <math.h>

#include "http_client.h"
#include "kvchat.h"
#include "test.h"

static const char *bin;
static char model_path[64];

static http_resp post(int port, const char *path, const char *body)
{
    return http_request(port, "POST", path, body, 60);
}

/* The JSON body of a POST (NULL when not JSON); *status its status. */
static cJSON *post_json(int port, const char *path, const char *body, int *status)
{
    http_resp r = post(port, path, body);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    *status = r.status;
    if (!j || r.status != 200)
        fprintf(stderr, "%s %s -> %d %s\n", path, body, r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return j;
}

static const cJSON *at(const cJSON *o, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *v = o;
    for (char *save, *k = strtok_r(buf, ".", &save); v && k; k = strtok_r(NULL, ".", &save))
        v = k[0] >= '0' && k[0] <= '9' ? cJSON_GetArrayItem(v, atoi(k))
                                       : cJSON_GetObjectItemCaseSensitive(v, k);
    return v;
}

static const char *str_at(const cJSON *o, const char *path)
{
    return cJSON_GetStringValue(at(o, path));
}

static double num_at(const cJSON *o, const char *path)
{
    const cJSON *v = at(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* The 400 of body at path names param (error.param, or Anthropic's message). */
static void check_400(int port, const char *path, const char *body, const char *word)
{
    http_resp r = post(port, path, body);
    CHECKF(r.status == 400, "%s: status %d (%s)", body, r.status, r.body ? r.body : "");
    CHECKF(r.body && strstr(r.body, word), "%s: answer '%s' lacks '%s'", body,
           r.body ? r.body : "", word);
    http_resp_free(&r);
}

/* ============================================================ SSE events */

typedef struct sse {
    int    n;
    char  *name[512];      /* the event: line (NULL = none) */
    cJSON *data[512];      /* the data: JSON (NULL = not JSON) */
} sse;

static void sse_parse(sse *s, const char *body)
{
    memset(s, 0, sizeof(*s));
    const char *p = body;
    while (p && *p && s->n < 512) {
        const char *end = strstr(p, "\n\n");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *ev = strndup(p, len), *save = NULL;
        for (char *line = strtok_r(ev, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            if (!strncmp(line, "event: ", 7))
                s->name[s->n] = strdup(line + 7);
            else if (!strncmp(line, "data: ", 6))
                s->data[s->n] = cJSON_Parse(line + 6);
        }
        free(ev);
        if (s->name[s->n] || s->data[s->n])
            s->n++;
        p = end ? end + 2 : NULL;
    }
}

static void sse_free(sse *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->name[i]);
        cJSON_Delete(s->data[i]);
    }
}

/* The index of the first event named `name` from `from`, -1 when none. */
static int sse_find(const sse *s, const char *name, int from)
{
    for (int i = from; i < s->n; i++)
        if (s->name[i] && !strcmp(s->name[i], name))
            return i;
    return -1;
}

/* ============================================================ Responses */

static void test_responses_plain(int port)
{
    int st;
    cJSON *j = post_json(port, "/v1/responses",
                         "{\"model\":\"m\",\"input\":\"Tell me about the sea.\","
                         "\"instructions\":\"Be brief.\",\"max_output_tokens\":6,"
                         "\"temperature\":0,\"store\":false}", &st);
    CHECKF(st == 200, "responses: %d", st);
    CHECK(str_at(j, "id") && !strncmp(str_at(j, "id"), "resp_", 5));
    CHECK(str_at(j, "object") && !strcmp(str_at(j, "object"), "response"));
    CHECK(str_at(j, "output.0.type") && !strcmp(str_at(j, "output.0.type"), "message"));
    CHECK(str_at(j, "output.0.content.0.type") &&
          !strcmp(str_at(j, "output.0.content.0.type"), "output_text"));
    CHECK(str_at(j, "output.0.content.0.text") != NULL);
    CHECK(num_at(j, "usage.input_tokens") > 5 && num_at(j, "usage.output_tokens") == 6);
    CHECK(num_at(j, "usage.input_tokens_details.cached_tokens") >= 0);
    /* six tokens of a random model never reach its end: cut by max_output_tokens */
    CHECK(str_at(j, "status") && !strcmp(str_at(j, "status"), "incomplete"));
    CHECK(str_at(j, "incomplete_details.reason") &&
          !strcmp(str_at(j, "incomplete_details.reason"), "max_output_tokens"));
    cJSON_Delete(j);

    check_400(port, "/v1/responses", "{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}",
              "send the whole conversation");
    check_400(port, "/v1/responses", "{\"max_output_tokens\":3}", "input is required");
    check_400(port, "/v1/responses", "{\"input\":[{\"type\":\"input_image\"}]}", "input[0]");
    check_400(port, "/v1/responses",
              "{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "web_search");
}

static void test_responses_stream(int port)
{
    http_resp r = post(port, "/v1/responses",
                       "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\","
                       "\"text\":\"Hello\"}]}],\"max_output_tokens\":7,\"temperature\":0,"
                       "\"stream\":true}");
    CHECKF(r.status == 200 && r.body, "stream: %d", r.status);
    sse s;
    sse_parse(&s, r.body ? r.body : "");
    static const char *const order[] = {
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.incomplete",
    };
    int k = 0;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        int f = sse_find(&s, order[i], k);
        CHECKF(f >= k, "event %s missing or out of order", order[i]);
        k = f >= 0 ? f : k;
    }
    char text[4096] = "";
    for (int i = 0; i < s.n; i++) {
        CHECKF(num_at(s.data[i], "sequence_number") == i, "event %d: sequence_number %g", i,
               num_at(s.data[i], "sequence_number"));
        CHECKF(s.name[i] && str_at(s.data[i], "type") && !strcmp(s.name[i], str_at(s.data[i], "type")),
               "event %d: name and type differ", i);
        if (s.name[i] && !strcmp(s.name[i], "response.output_text.delta"))
            strncat(text, str_at(s.data[i], "delta"), sizeof(text) - strlen(text) - 1);
    }
    int done = sse_find(&s, "response.output_text.done", 0);
    int last = s.n - 1;
    CHECKF(done >= 0 && !strcmp(str_at(s.data[done], "text"), text), "deltas '%s' != done", text);
    CHECK(last >= 0 && str_at(s.data[last], "response.output.0.content.0.text") &&
          !strcmp(str_at(s.data[last], "response.output.0.content.0.text"), text));
    CHECK(last >= 0 && num_at(s.data[last], "response.usage.output_tokens") == 7);
    sse_free(&s);
    http_resp_free(&r);
}

static const char tools_chat[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather "
    "of a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
    "\"string\"}},\"required\":[\"city\"]}}}]";
static const char tools_resp[] =
    "[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Weather of a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}]";

static void test_responses_tools(int port)
{
    char body[2048];
    int st;
    snprintf(body, sizeof(body), "{\"input\":\"Weather in Paris?\",\"tools\":%s,"
             "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,\"max_output_tokens\":60,"
             "\"temperature\":0}",
             tools_resp);
    cJSON *j = post_json(port, "/v1/responses", body, &st);
    const cJSON *out = at(j, "output"), *it, *call = NULL;
    cJSON_ArrayForEach(it, out)
        if (str_at(it, "type") && !strcmp(str_at(it, "type"), "function_call"))
            call = it;
    CHECKF(st == 200 && call, "forced tool call: no function_call item");
    CHECK(call && !strcmp(str_at(call, "name"), "get_weather"));
    CHECK(call && str_at(call, "call_id") && !strncmp(str_at(call, "call_id"), "call_", 5));
    cJSON *args = call ? cJSON_Parse(str_at(call, "arguments")) : NULL;
    CHECKF(cJSON_IsString(at(args, "city")), "arguments %s", call ? str_at(call, "arguments") : "");
    cJSON_Delete(args);
    cJSON_Delete(j);

    snprintf(body, sizeof(body), "{\"input\":\"Weather in Paris?\",\"tools\":%s,\"tool_choice\":"
             "{\"type\":\"function\",\"name\":\"get_weather\"},\"parallel_tool_calls\":false,"
             "\"max_output_tokens\":60,"
             "\"temperature\":0,\"stream\":true}", tools_resp);
    http_resp r = post(port, "/v1/responses", body);
    sse s;
    sse_parse(&s, r.body ? r.body : "");
    int d = sse_find(&s, "response.function_call_arguments.done", 0);
    int a = sse_find(&s, "response.function_call_arguments.delta", 0);
    CHECKF(a >= 0 && d > a, "stream: function_call_arguments delta %d done %d", a, d);
    CHECK(d >= 0 && !strcmp(str_at(s.data[d], "arguments"), str_at(s.data[a], "delta")));
    /* (a random model may run on to the limit after its call: src/grammar's to close) */
    CHECK(sse_find(&s, "response.completed", 0) == s.n - 1 ||
          sse_find(&s, "response.incomplete", 0) == s.n - 1);
    sse_free(&s);
    http_resp_free(&r);

    /* structured output through text.format */
    j = post_json(port, "/v1/responses",
                  "{\"input\":\"A person\",\"max_output_tokens\":80,\"temperature\":0,"
                  "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"p\",\"strict\":true,"
                  "\"schema\":{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\"}},"
                  "\"required\":[\"age\"],\"additionalProperties\":false}}}}", &st);
    const char *t = str_at(j, "output.0.content.0.text");
    cJSON *obj = t ? cJSON_Parse(t) : NULL;
    CHECKF(st == 200 && cJSON_IsNumber(at(obj, "age")), "json_schema output '%s'", t ? t : "");
    cJSON_Delete(obj);
    cJSON_Delete(j);
}

/* ============================================ one conversation, three APIs */

/* The prompt body renders to through `api`'s /apply-template. malloc'd. */
static char *rendered(int port, const char *api, const char *body)
{
    char path[64];
    int st;
    snprintf(path, sizeof(path), "/apply-template?api=%s", api);
    cJSON *j = post_json(port, path, body, &st);
    char *p = str_at(j, "prompt") ? strdup(str_at(j, "prompt")) : NULL;
    cJSON_Delete(j);
    return p;
}

static void test_same_conversation(int port)
{
    /* system, user, assistant with a tool call, its result, user */
    char chat[4096], resp[4096];
    snprintf(chat, sizeof(chat),
             "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
             "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
             "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
             "\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"},"
             "{\"role\":\"user\",\"content\":\"And tomorrow?\"}],\"tools\":%s,"
             "\"max_tokens\":12,\"temperature\":0%%s}", tools_chat);
    snprintf(resp, sizeof(resp),
             "{\"instructions\":\"You are terse.\",\"input\":["
             "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
             "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"get_weather\","
             "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"},"
             "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"And tomorrow?\"}]}],"
             "\"tools\":%s,\"max_output_tokens\":12,\"temperature\":0%%s}", tools_resp);
    char b1[4200], b2[4200];
    snprintf(b1, sizeof(b1), chat, "");
    snprintf(b2, sizeof(b2), resp, "");
    char *p1 = rendered(port, "chat.completions", b1), *p2 = rendered(port, "responses", b2);
    CHECKF(p1 && p2 && !strcmp(p1, p2), "chat and Responses render differently:\n%s\n---\n%s",
           p1 ? p1 : "", p2 ? p2 : "");
    free(p1);
    free(p2);

    /* a cold reference, then chat, then Responses hitting chat's cache */
    int st;
    snprintf(b1, sizeof(b1), chat, ",\"cache_prompt\":false");
    cJSON *cold = post_json(port, "/v1/chat/completions", b1, &st);
    snprintf(b1, sizeof(b1), chat, "");
    cJSON *c = post_json(port, "/v1/chat/completions", b1, &st);
    cJSON *r = post_json(port, "/v1/responses", b2, &st);
    const char *tc = str_at(cold, "choices.0.message.content");
    const char *t1 = str_at(c, "choices.0.message.content");
    const char *t2 = str_at(r, "output.0.content.0.text");
    CHECKF(tc && t1 && t2 && !strcmp(tc, t1) && !strcmp(t1, t2),
           "replies differ: cold '%s' chat '%s' responses '%s'", tc ? tc : "", t1 ? t1 : "",
           t2 ? t2 : "");
    double pt = num_at(c, "usage.prompt_tokens"), cached = num_at(r, "usage.input_tokens_details.cached_tokens");
    CHECKF(num_at(r, "usage.input_tokens") == pt, "prompt tokens %g vs %g", pt,
           num_at(r, "usage.input_tokens"));
    CHECKF(cached >= pt - 16 && cached > 0, "Responses after chat: %g of %g tokens cached", cached, pt);
    printf("same conversation: %g prompt tokens; Responses after chat: %g cached\n", pt, cached);
    cJSON_Delete(cold);
    cJSON_Delete(c);
    cJSON_Delete(r);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || !*bin)
        return TEST_SKIP;
    kvc_gen_params gp;
    kvc_gen_preset("tiny", &gp);
    snprintf(model_path, sizeof(model_path), "/tmp/kvc_dialects_%d.gguf", (int)getpid());
    char err[256];
    CHECK(kvc_gen_write(&gp, model_path, err, sizeof(err)) == KVC_OK);
    const char *args[] = { "-m", model_path, "--parallel", "2", "--cache-disk", "0", NULL };
    http_server s;
    CHECK(http_server_start(&s, bin, args, 60));
    if (s.port > 0) {
        test_responses_plain(s.port);
        test_responses_stream(s.port);
        test_responses_tools(s.port);
        test_same_conversation(s.port);
    }
    http_server_stop(&s);
    unlink(model_path);
    return test_done("test_dialects_http");
}
