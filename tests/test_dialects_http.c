/* test_dialects_http.c - the API dialects of `kvchat serve` over HTTP
 * (issue 28): OpenAI Responses (POST /v1/responses) and Anthropic Messages
 * (POST /v1/messages, /v1/messages/count_tokens), whole and streamed, with
 * tools; and one conversation sent through chat completions, Responses and
 * Messages: the same rendered prompt (/apply-template?api=...), the same
 * greedy reply, and the second API reusing the first's cache. Reasoning
 * (think tags, harmony channels) through the dialects is in
 * test_dialects_reasoning_http.c; the helpers both use in dialects_http.h.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include <cjson/cJSON.h>
#include <math.h>

#include "common.h"

#include "http_client.h"
#include "dialects_http.h"
#include "json_at.h"
#include "kvchat.h"
#include "test.h"

static const char *bin;
static char model_path[64];

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
    /* built-in tools (Codex always sends web_search) are left out, named */
    http_resp r = post(port, "/v1/responses", "{\"input\":\"x\",\"max_output_tokens\":2,"
                       "\"tools\":[{\"type\":\"web_search\"},{\"type\":\"namespace\",\"name\":"
                       "\"ns\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}]}");
    CHECKF(r.status == 200 && strstr(r.raw, "X-Kvchat-Ignored-Fields: tools[0] (web_search)"),
           "web_search tool: %d %s", r.status, r.raw ? r.raw : "");
    http_resp_free(&r);
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
    sse_check_order(&s, order, KVC_ARRAY_LEN(order));
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

/* A failure after the stream began (a grammar whose ambiguity is met only
 * mid-reply: a constant, then a pattern with 5000 ways to read one
 * character, as test_grammar_http makes it) ends in response.failed with
 * the response's id and an error object (once only a bare error event,
 * which leaves Codex and the Agents SDK waiting for the response's end). */
static void test_responses_failed(int port)
{
    char lit[400] = "";
    for (int i = 0; strlen(lit) < 300; i++)
        strcat(lit, (const char *const[]){ "alpha ", "bravo ", "charlie ", "delta " }[i % 4]);
    char body[1024];
    snprintf(body, sizeof(body), "{\"input\":\"Fill it in.\",\"max_output_tokens\":400,"
             "\"stream\":true,\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\","
             "\"schema\":{\"type\":\"object\",\"properties\":{\"c\":{\"const\":\"%s\"},\"p\":"
             "{\"type\":\"string\",\"pattern\":\"^(a?){1,5000}$\"}},\"required\":[\"c\",\"p\"]}}}}",
             lit);
    http_resp r = post(port, "/v1/responses", body);
    CHECKF(r.status == 200 && r.body, "failing stream: %d %s", r.status, r.body ? r.body : "");
    sse s;
    sse_parse(&s, r.body ? r.body : "");
    int last = s.n - 1, created = sse_find(&s, "response.created", 0);
    CHECKF(sse_find(&s, "response.output_text.delta", 0) >= 0, "no text before the failure");
    CHECKF(last >= 0 && s.name[last] && !strcmp(s.name[last], "response.failed"),
           "last event %s", last >= 0 && s.name[last] ? s.name[last] : "(none)");
    CHECK(sse_find(&s, "response.completed", 0) < 0 && sse_find(&s, "response.incomplete", 0) < 0);
    if (last >= 0 && created >= 0) {
        const cJSON *d = s.data[last];
        CHECK(str_at(d, "response.status") && !strcmp(str_at(d, "response.status"), "failed"));
        CHECK(str_at(d, "response.id") && str_at(s.data[created], "response.id") &&
              !strcmp(str_at(d, "response.id"), str_at(s.data[created], "response.id")));
        CHECKF(str_at(d, "response.error.code") &&
               !strcmp(str_at(d, "response.error.code"), "invalid_prompt") &&
               str_at(d, "response.error.message") &&
               strstr(str_at(d, "response.error.message"), "constrained decoding stopped"),
               "error %s", r.body ? r.body : "");
        CHECK(num_at(d, "sequence_number") == last);
        /* the open message item was closed before */
        CHECK(sse_find(&s, "response.output_item.done", 0) >= 0 &&
              sse_find(&s, "response.output_item.done", 0) < last);
    }
    sse_free(&s);
    http_resp_free(&r);
}

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

    /* parallel calls allowed and cut by max_tokens inside a second call: the
     * fragment ("</tool_ca" on this model) is not content, in any API */
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in "
             "Paris?\"}],\"tools\":%s,\"tool_choice\":\"required\",\"max_tokens\":60,"
             "\"temperature\":0}", tools_chat);
    j = post_json(port, "/v1/chat/completions", body, &st);
    CHECKF(at(j, "choices.0.message.tool_calls") && cJSON_IsNull(at(j, "choices.0.message.content")),
           "forced calls with a fragment: content %s",
           str_at(j, "choices.0.message.content") ? str_at(j, "choices.0.message.content") : "null");
    cJSON_Delete(j);
    snprintf(body, sizeof(body), "{\"input\":\"Weather in Paris?\",\"tools\":%s,\"tool_choice\":"
             "\"required\",\"max_output_tokens\":60,\"temperature\":0}", tools_resp);
    j = post_json(port, "/v1/responses", body, &st);
    CHECKF(str_at(j, "output.0.type") && !strcmp(str_at(j, "output.0.type"), "function_call"),
           "forced calls with a fragment: Responses output[0] is %s",
           str_at(j, "output.0.type") ? str_at(j, "output.0.type") : "none");
    cJSON_Delete(j);

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

/* ============================================================ Messages */

static const char tools_msg[] =
    "[{\"name\":\"get_weather\",\"description\":\"Weather of a city\",\"input_schema\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}]";

/* The text of a message's first text block (malloc'd; NULL when none). */
static char *first_text(const cJSON *j)
{
    const cJSON *b;
    cJSON_ArrayForEach(b, at(j, "content"))
        if (str_at(b, "type") && !strcmp(str_at(b, "type"), "text"))
            return strdup(str_at(b, "text"));
    return NULL;
}

static void test_messages_plain(int port)
{
    int st;
    const char *body = "{\"model\":\"claude-x\",\"system\":[{\"type\":\"text\",\"text\":"
                       "\"Be brief.\",\"cache_control\":{\"type\":\"ephemeral\"}}],\"messages\":"
                       "[{\"role\":\"user\",\"content\":\"Tell me about the sea.\"}],"
                       "\"max_tokens\":10,\"temperature\":0}";
    cJSON *j = post_json(port, "/v1/messages?beta=true", body, &st);
    CHECKF(st == 200, "messages: %d", st);
    CHECK(str_at(j, "id") && !strncmp(str_at(j, "id"), "msg_", 4));
    CHECK(str_at(j, "type") && !strcmp(str_at(j, "type"), "message"));
    CHECK(str_at(j, "role") && !strcmp(str_at(j, "role"), "assistant"));
    CHECK(str_at(j, "stop_reason") && !strcmp(str_at(j, "stop_reason"), "max_tokens"));
    CHECK(num_at(j, "usage.output_tokens") == 10);
    double in = num_at(j, "usage.input_tokens") + num_at(j, "usage.cache_read_input_tokens");
    char *text = first_text(j);
    CHECK(text != NULL);
    cJSON_Delete(j);

    /* count_tokens: what the message's usage counted */
    j = post_json(port, "/v1/messages/count_tokens", body, &st);
    CHECKF(st == 200 && num_at(j, "input_tokens") == in, "count_tokens %g, usage %g",
           num_at(j, "input_tokens"), in);
    cJSON_Delete(j);

    /* a stop sequence taken from the greedy reply ends it there, and is named */
    size_t n = text ? strlen(text) : 0;
    CHECKF(n >= 3, "reply '%s' too short to take a stop sequence from", text ? text : "");
    if (n >= 3) {
        char stop[3] = { text[1], text[2], 0 }, b2[1024];
        size_t cut = (size_t)(strstr(text, stop) - text);
        cJSON *js = cJSON_CreateString(stop);
        char *q = cJSON_PrintUnformatted(js);
        snprintf(b2, sizeof(b2), "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about "
                 "the sea.\"}],\"system\":\"Be brief.\",\"max_tokens\":10,\"temperature\":0,"
                 "\"stop_sequences\":[\"zzz\",%s]}", q);
        free(q);
        cJSON_Delete(js);
        j = post_json(port, "/v1/messages", b2, &st);
        char *t2 = first_text(j);
        CHECKF(str_at(j, "stop_reason") && !strcmp(str_at(j, "stop_reason"), "stop_sequence"),
               "stop_reason %s", str_at(j, "stop_reason") ? str_at(j, "stop_reason") : "null");
        CHECK(str_at(j, "stop_sequence") && !strcmp(str_at(j, "stop_sequence"), stop));
        CHECKF(t2 && strlen(t2) == cut && !strncmp(t2, text, cut), "'%s' cut at '%s'", text, stop);
        free(t2);
        cJSON_Delete(j);
    }

    /* the same request streamed: the events, and the same text */
    char sbody[1024];
    snprintf(sbody, sizeof(sbody), "%.*s,\"stream\":true}", (int)strlen(body) - 1, body);
    http_resp r = post(port, "/v1/messages", sbody);
    sse s;
    sse_parse(&s, r.body ? r.body : "");
    static const char *const order[] = {
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    };
    sse_check_order(&s, order, KVC_ARRAY_LEN(order));
    char streamed[4096] = "";
    for (int i = 0; i < s.n; i++)
        if (s.name[i] && !strcmp(s.name[i], "content_block_delta"))
            strncat(streamed, str_at(s.data[i], "delta.text"), sizeof(streamed) - strlen(streamed) - 1);
    CHECKF(text && !strcmp(streamed, text), "streamed '%s' != whole '%s'", streamed, text ? text : "");
    /* message_start tells the prompt as the cache served it (once 0 input
     * tokens): the same prompt as before, so all of it but the token re-run */
    int ms = sse_find(&s, "message_start", 0);
    double ms_in = ms >= 0 ? num_at(s.data[ms], "message.usage.input_tokens") : -1;
    double ms_read = ms >= 0 ? num_at(s.data[ms], "message.usage.cache_read_input_tokens") : -1;
    CHECKF(ms_in >= 1 && ms_read >= 1 && ms_in + ms_read == in &&
           num_at(s.data[ms], "message.usage.output_tokens") == 0 &&
           num_at(s.data[ms], "message.usage.cache_creation_input_tokens") == 0,
           "message_start usage: input %g + cache read %g, the prompt is %g", ms_in, ms_read, in);
    int md = sse_find(&s, "message_delta", 0);
    CHECK(md >= 0 && !strcmp(str_at(s.data[md], "delta.stop_reason"), "max_tokens"));
    CHECK(md >= 0 && num_at(s.data[md], "usage.output_tokens") == 10);
    sse_free(&s);
    http_resp_free(&r);
    free(text);

    /* errors in Anthropic's shape; a missing key is a 401 */
    check_400(port, "/v1/messages", "{\"messages\":[{\"role\":\"user\",\"content\":"
              "[{\"type\":\"image\"}]}],\"max_tokens\":3}", "\"type\":\"invalid_request_error\"");
    r = post(port, "/v1/messages", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"max_tokens\":3,\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]}");
    CHECKF(r.status == 200 && strstr(r.raw, "tools[0] (web_search_20250305)"), "server tool: %d",
           r.status);
    http_resp_free(&r);
    r = http_request(port, "POST", "/v1/messages", "{}", 10);
    CHECKF(r.status == 401 && r.body && strstr(r.body, "authentication_error"), "no key: %d %s",
           r.status, r.body ? r.body : "");
    http_resp_free(&r);
}

static void test_messages_tools(int port)
{
    char body[2048];
    int st;
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in "
             "Paris?\"}],\"tools\":%s,\"tool_choice\":{\"type\":\"tool\",\"name\":"
             "\"get_weather\",\"disable_parallel_tool_use\":true},\"max_tokens\":60,"
             "\"temperature\":0%%s}", tools_msg);
    char b[2100];
    snprintf(b, sizeof(b), body, "");
    cJSON *j = post_json(port, "/v1/messages", b, &st);
    const cJSON *blk, *use = NULL;
    cJSON_ArrayForEach(blk, at(j, "content"))
        if (str_at(blk, "type") && !strcmp(str_at(blk, "type"), "tool_use"))
            use = blk;
    CHECKF(st == 200 && use, "forced tool: no tool_use block");
    CHECK(use && !strcmp(str_at(use, "name"), "get_weather") && str_at(use, "id"));
    CHECK(use && cJSON_IsString(at(use, "input.city")));
    CHECK(str_at(j, "stop_reason") && !strcmp(str_at(j, "stop_reason"), "tool_use"));
    cJSON_Delete(j);

    snprintf(b, sizeof(b), body, ",\"stream\":true");
    http_resp r = post(port, "/v1/messages", b);
    sse s;
    sse_parse(&s, r.body ? r.body : "");
    int d = -1;
    for (int i = 0; i < s.n; i++)
        if (str_at(s.data[i], "delta.type") && !strcmp(str_at(s.data[i], "delta.type"), "input_json_delta"))
            d = i;
    cJSON *in = d >= 0 ? cJSON_Parse(str_at(s.data[d], "delta.partial_json")) : NULL;
    CHECKF(cJSON_IsString(at(in, "city")), "stream: input_json_delta");
    int md = sse_find(&s, "message_delta", 0);
    CHECK(md >= 0 && !strcmp(str_at(s.data[md], "delta.stop_reason"), "tool_use"));
    cJSON_Delete(in);
    sse_free(&s);
    http_resp_free(&r);
}

/* =========================================================== field policy */

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3"

/* Request bodies common clients send (OpenAI SDKs, llama.cpp's web UI and
 * clients, vLLM clients, LangChain, the AI SDK, Ollama-minded tools), and
 * what each must get: 200, with the hint fields named in the
 * X-Kvchat-Ignored-Fields header, or a 400 naming a field that would change
 * the answer and cannot be honoured. */
static const struct {
    const char *path, *body;
    int         status;
    const char *named;     /* 200: in the header (NULL: no header); 400: error.param */
} bodies[] = {
    { "/v1/chat/completions", "{\"model\":\"gpt-4o\"," MSG ",\"stream\":false}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"store\":false,\"metadata\":{\"a\":\"b\"},"
      "\"service_tier\":\"auto\"}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"reasoning_effort\":\"low\"}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"reasoning_effort\":\"none\"}", 200, NULL },
    { "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
      "\"max_tokens\":-1,\"temperature\":0,\"stop\":[\"a\",\"e\",\"o\",\"i\",\" \"]}", 200,
      NULL },
    { "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
      "\"n_predict\":4,\"temperature\":0}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"repetition_penalty\":1.1}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"cache_prompt\":true,\"slot_id\":-1}", 200, "slot_id" },
    { "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
      "\"max_tokens\":8,\"grammar\":\"root ::= \\\"yes\\\" | \\\"no\\\"\"}", 200, NULL },
    { "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
      "\"max_tokens\":40,\"json_schema\":{\"type\":\"object\",\"properties\":{\"a\":"
      "{\"type\":\"boolean\"}},\"required\":[\"a\"]}}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"return_progress\":true}", 200, "return_progress" },
    { "/v1/chat/completions", "{" MSG ",\"timings_per_token\":true,\"id_slot\":0}", 200,
      "timings_per_token, id_slot" },
    { "/v1/chat/completions", "{" MSG ",\"samplers\":[\"top_k\",\"top_p\",\"min_p\","
      "\"temperature\"]}", 200, "samplers" },
    { "/v1/chat/completions", "{" MSG ",\"n_probs\":0,\"min_keep\":0,\"post_sampling_probs\":"
      "false}", 200, "n_probs, min_keep, post_sampling_probs" },
    { "/v1/chat/completions", "{" MSG ",\"typical_p\":1,\"tfs_z\":1,\"mirostat\":0,"
      "\"mirostat_tau\":5,\"mirostat_eta\":0.1}", 200, "mirostat_tau, mirostat_eta" },
    { "/v1/chat/completions", "{" MSG ",\"typical_p\":0.9}", 400, "typical_p" },
    { "/v1/chat/completions", "{" MSG ",\"mirostat\":2}", 400, "mirostat" },
    { "/v1/chat/completions", "{" MSG ",\"ignore_eos\":true}", 400, "ignore_eos" },
    { "/v1/chat/completions", "{" MSG ",\"dry_multiplier\":0,\"xtc_probability\":0,"
      "\"top_n_sigma\":-1,\"dynatemp_range\":0}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"dry_multiplier\":0.8}", 400, "dry_multiplier" },
    { "/v1/chat/completions", "{" MSG ",\"stream_options\":{\"include_usage\":true},"
      "\"stream\":true,\"user\":\"u1\",\"prompt_cache_key\":\"k1\"}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"prediction\":{\"type\":\"content\",\"content\":"
      "\"x\"}}", 200, "prediction" },
    { "/v1/chat/completions", "{" MSG ",\"modalities\":[\"text\"]}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"modalities\":[\"text\",\"audio\"]}", 400,
      "modalities" },
    { "/v1/chat/completions", "{" MSG ",\"functions\":[{\"name\":\"f\"}]}", 400, "functions" },
    { "/v1/chat/completions", "{" MSG ",\"chat_template_kwargs\":{\"enable_thinking\":false}}",
      200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"enable_thinking\":false}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"foo_bar\":1}", 200, "foo_bar" },
    { "/v1/chat/completions", "{" MSG ",\"skip_special_tokens\":true,"
      "\"spaces_between_special_tokens\":true}", 200, "spaces_between_special_tokens" },
    { "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
      "\"max_tokens\":40,\"guided_json\":{\"type\":\"object\",\"properties\":{\"a\":"
      "{\"type\":\"integer\"}},\"required\":[\"a\"]}}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"stop_token_ids\":[],\"include_stop_str_in_output\":"
      "false,\"min_tokens\":0}", 200, NULL },
    { "/v1/chat/completions", "{" MSG ",\"stop_token_ids\":[2]}", 400, "stop_token_ids" },
    { "/v1/chat/completions", "{" MSG ",\"keep_alive\":\"5m\"}", 200, "keep_alive" },
    { "/v1/chat/completions", "{" MSG ",\"verbosity\":\"low\",\"safety_identifier\":\"s\"}",
      200, "verbosity, safety_identifier" },
    { "/v1/chat/completions", "{" MSG ",\"parallel_tool_calls\":true,\"tools\":[{\"type\":"
      "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
      "\"tool_choice\":\"auto\"}", 200, NULL },
    { "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":3,\"echo\":false,\"logprobs\":"
      "null,\"suffix\":\"\",\"best_of\":1}", 200, NULL },
    { "/v1/completions", "{\"prompt\":\"Hi\",\"n_predict\":3,\"cache_prompt\":true,"
      "\"return_tokens\":true}", 200, "return_tokens" },
    { "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":3,\"echo\":true}", 400, "echo" },
    { "/v1/responses", "{\"model\":\"m\",\"input\":\"Hi\",\"max_output_tokens\":3,"
      "\"store\":false,\"include\":[\"reasoning.encrypted_content\"],\"reasoning\":"
      "{\"effort\":\"medium\",\"summary\":\"auto\"},\"prompt_cache_key\":\"x\"}", 200,
      "include" },
    { "/v1/responses", "{\"input\":\"Hi\",\"max_output_tokens\":3,\"truncation\":"
      "\"disabled\",\"text\":{\"verbosity\":\"low\"}}", 200, "truncation" },
    { "/v1/messages", "{\"model\":\"claude\",\"max_tokens\":3,\"messages\":[{\"role\":"
      "\"user\",\"content\":\"Hi\"}],\"metadata\":{\"user_id\":\"u\"},\"thinking\":"
      "{\"type\":\"enabled\",\"budget_tokens\":1024},\"context_management\":{}}", 200,
      "context_management" },
};

/* The X-Kvchat-Ignored-Fields header of a raw answer into out ("" = none). */
static void ignored_header(const http_resp *r, char *out, size_t cap)
{
    const char *h = r->raw ? strcasestr(r->raw, "\r\nX-Kvchat-Ignored-Fields: ") : NULL;
    out[0] = 0;
    if (h && (!r->body || h < r->body)) {
        h += strlen("\r\nX-Kvchat-Ignored-Fields: ");
        size_t n = strcspn(h, "\r\n");
        snprintf(out, cap, "%.*s", (int)KVC_MIN(n, cap - 1), h);
    }
}

static void test_field_policy(int port)
{
    int refused = 0;
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        http_resp r = post(port, bodies[i].path, bodies[i].body);
        char hdr[256];
        ignored_header(&r, hdr, sizeof(hdr));
        CHECKF(r.status == bodies[i].status, "body %zu %s: status %d, wanted %d: %.300s", i,
               bodies[i].body, r.status, bodies[i].status, r.body ? r.body : "");
        if (bodies[i].status == 200) {
            CHECKF(bodies[i].named ? !strcmp(hdr, bodies[i].named) : !hdr[0],
                   "body %zu: ignored '%s', wanted '%s'", i, hdr,
                   bodies[i].named ? bodies[i].named : "");
        } else {
            char want[80];
            snprintf(want, sizeof(want), "\"param\":\"%s\"", bodies[i].named);
            CHECKF(r.body && strstr(r.body, want), "body %zu: %s lacks %s", i, r.body, want);
            refused++;
        }
        http_resp_free(&r);
    }
    printf("field policy: %zu bodies, %d refused (fields that would change the answer)\n",
           sizeof(bodies) / sizeof(bodies[0]), refused);
    /* what they honour */
    int st;
    cJSON *j = post_json(port, "/v1/chat/completions", bodies[8].body, &st);
    const char *c = str_at(j, "choices.0.message.content");
    CHECKF(c && (!strcmp(c, "yes") || !strcmp(c, "no")), "grammar: '%s'", c ? c : "");
    cJSON_Delete(j);
    j = post_json(port, "/v1/chat/completions", bodies[5].body, &st);
    CHECKF(num_at(j, "usage.completion_tokens") == 4, "n_predict 4: %g tokens",
           num_at(j, "usage.completion_tokens"));
    cJSON_Delete(j);
    j = post_json(port, "/v1/chat/completions", bodies[4].body, &st);
    CHECKF(num_at(j, "usage.completion_tokens") > 3, "max_tokens -1: %g tokens",
           num_at(j, "usage.completion_tokens"));
    cJSON_Delete(j);
}

/* --strict-fields: a field not used is a 400 again (OpenAI's bookkeeping
 * fields stay accepted). */
static void test_strict(void)
{
    const char *args[] = { "-m", model_path, "--parallel", "1", "--cache-disk", "0",
                           "--api-key", KEY, "--strict-fields", NULL };
    http_server s;
    CHECK(http_server_start(&s, bin, args, 60));
    if (s.port > 0) {
        check_400(s.port, "/v1/chat/completions", "{" MSG ",\"foo_bar\":1}", "foo_bar");
        check_400(s.port, "/v1/chat/completions", "{" MSG ",\"return_progress\":true}",
                  "return_progress");
        check_400(s.port, "/v1/messages", "{\"max_tokens\":3,\"messages\":[{\"role\":\"user\","
                  "\"content\":\"Hi\"}],\"context_management\":{}}", "context_management");
        http_resp r = post(s.port, "/v1/chat/completions", "{" MSG ",\"store\":false,"
                           "\"metadata\":{},\"reasoning_effort\":\"low\",\"n_predict\":2}");
        CHECKF(r.status == 200, "strict: bookkeeping and used fields: %d %s", r.status,
               r.body ? r.body : "");
        http_resp_free(&r);
    }
    http_server_stop(&s);
}

/* ============================================ one conversation, three APIs */

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
    char msg[4096];
    snprintf(msg, sizeof(msg),
             "{\"system\":\"You are terse.\",\"messages\":["
             "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"call_1\","
             "\"name\":\"get_weather\",\"input\":{\"city\":\"Oslo\"}}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
             "\"call_1\",\"content\":\"sunny\"},{\"type\":\"text\",\"text\":\"And tomorrow?\"}]}],"
             "\"tools\":%s,\"max_tokens\":12,\"temperature\":0%%s}", tools_msg);
    char b1[4200], b2[4200], b3[4200];
    snprintf(b1, sizeof(b1), chat, "");
    snprintf(b2, sizeof(b2), resp, "");
    snprintf(b3, sizeof(b3), msg, "");
    char *p1 = rendered(port, "chat.completions", b1), *p2 = rendered(port, "responses", b2);
    char *p3 = rendered(port, "messages", b3);
    CHECKF(p1 && p2 && !strcmp(p1, p2), "chat and Responses render differently:\n%s\n---\n%s",
           p1 ? p1 : "", p2 ? p2 : "");
    CHECKF(p1 && p3 && !strcmp(p1, p3), "chat and Messages render differently:\n%s\n---\n%s",
           p1 ? p1 : "", p3 ? p3 : "");
    free(p1);
    free(p2);
    free(p3);

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
    cJSON *m = post_json(port, "/v1/messages", b3, &st);
    char *t3 = first_text(m);
    double read = num_at(m, "usage.cache_read_input_tokens");
    CHECKF(t3 && t1 && !strcmp(t3, t1), "Messages reply '%s' != chat '%s'", t3 ? t3 : "",
           t1 ? t1 : "");
    CHECKF(read + num_at(m, "usage.input_tokens") == pt && read >= pt - 16,
           "Messages after Responses: %g read, %g not", read, num_at(m, "usage.input_tokens"));
    printf("same conversation: %g prompt tokens; Responses after chat: %g cached; Messages "
           "after both: %g cached\n", pt, cached, read);
    free(t3);
    cJSON_Delete(m);
    cJSON_Delete(cold);
    cJSON_Delete(c);
    cJSON_Delete(r);
}

int main(void)
{
    if (!dialects_setup(&bin, model_path, sizeof(model_path), "dialects"))
        return TEST_SKIP;
    const char *args[] = { "-m", model_path, "--parallel", "2", "--cache-disk", "0",
                           "--api-key", KEY, NULL };
    http_server s;
    CHECK(http_server_start(&s, bin, args, 60));
    if (s.port > 0) {
        test_responses_plain(s.port);
        test_responses_stream(s.port);
        test_responses_failed(s.port);
        test_responses_tools(s.port);
        test_messages_plain(s.port);
        test_messages_tools(s.port);
        test_same_conversation(s.port);
        test_field_policy(s.port);
    }
    http_server_stop(&s);
    test_strict();
    unlink(model_path);
    return test_done("test_dialects_http");
}
