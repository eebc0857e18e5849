/* test_dialects_reasoning_http.c - reasoning through the API dialects of
 * `kvchat serve` over HTTP (issue 28): <think> tags (a Qwen3.5-style
 * template) and gpt-oss's harmony channels come out of chat completions,
 * Responses and Messages, whole and streamed, as each API's reasoning and
 * content (and harmony's commentary calls as tool calls), and reasoning
 * sent back reaches the template. Replies are forced by a grammar on a tiny
 * generated model. The dialects themselves: test_dialects_http.c.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include <cjson/cJSON.h>

#include "common.h"
#include "reasoning.h"

#include "http_client.h"
#include "json_at.h"
#include "dialects_http.h"
#include "kvchat.h"
#include "test.h"

static const char *bin;
static char model_path[64];

/* ============================================================= helpers */

/* A Qwen3.5-style template: past reasoning in <think> tags, the generation
 * prompt opening the block unless enable_thinking is false. */
static const char think_template[] =
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n"
    "</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{%- endif -%}";

/* The token limit of forced()'s bodies. */
static int forced_max = 40;

/* A body whose reply is forced by a grammar to be `reply`, with extra
 * members (JSON text without braces, "" = none). malloc'd. */
static char *forced(const char *api, const char *reply, const char *extra)
{
    cJSON *o = cJSON_CreateObject(), *ms, *m;
    char g[256];
    snprintf(g, sizeof(g), "root ::= \"%s\"", reply);
    if (!strcmp(api, "responses")) {
        cJSON_AddStringToObject(o, "input", "Think first.");
        cJSON_AddNumberToObject(o, "max_output_tokens", forced_max);
    } else {
        ms = cJSON_AddArrayToObject(o, "messages");
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", "Think first.");
        cJSON_AddItemToArray(ms, m);
        cJSON_AddNumberToObject(o, "max_tokens", forced_max);
    }
    cJSON_AddStringToObject(o, "grammar", g);
    char *t = cJSON_PrintUnformatted(o), *out = malloc(strlen(t) + strlen(extra) + 4);
    size_t n = strlen(t);
    t[n - 1] = 0;
    sprintf(out, "%s%s%s}", t, *extra ? "," : "", extra);
    free(t);
    cJSON_Delete(o);
    return out;
}

/* The reasoning and content text of a stream, by the dialect's events. */
static void streamed_parts(const sse *s, char *reasoning, char *content, size_t cap)
{
    reasoning[0] = content[0] = 0;
    for (int i = 0; i < s->n; i++) {
        const cJSON *d = s->data[i];
        const char *r = str_at(d, "choices.0.delta.reasoning_content");
        const char *c = str_at(d, "choices.0.delta.content");
        const char *name = s->name[i] ? s->name[i] : "";
        if (!strcmp(name, "response.reasoning_text.delta"))
            r = str_at(d, "delta");
        if (!strcmp(name, "response.output_text.delta"))
            c = str_at(d, "delta");
        if (!strcmp(name, "content_block_delta")) {
            r = str_at(d, "delta.thinking");
            c = str_at(d, "delta.text");
        }
        if (r)
            strncat(reasoning, r, cap - strlen(reasoning) - 1);
        if (c)
            strncat(content, c, cap - strlen(content) - 1);
    }
}

/* Start a server (one slot) whose chat template is tmpl, written to
 * /tmp/kvc_<stem>_<pid>.jinja (its path in tpath, for the caller to unlink).
 * true when it runs; s is zeroed first, so http_server_stop is always safe. */
static bool start_with_template(http_server *s, const char *tmpl, const char *stem, char *tpath,
                                size_t cap)
{
    memset(s, 0, sizeof(*s));
    snprintf(tpath, cap, "/tmp/kvc_%s_%d.jinja", stem, (int)getpid());
    FILE *f = fopen(tpath, "w");
    if (f) {
        fputs(tmpl, f);
        fclose(f);
    }
    const char *args[] = { "-m", model_path, "--parallel", "1", "--cache-disk", "0",
                           "--api-key", KEY, "--chat-template-file", tpath, NULL };
    CHECK(f && http_server_start(s, bin, args, 60));
    return s->port > 0;
}

/* A reply forced to `reply` comes out of each API, whole and streamed, as
 * reasoning "abc" and content "hello" (Responses: a reasoning item first);
 * label names the case in failures. */
static void check_split(int port, const char *reply, const char *label)
{
    static const char *const apis[] = { "chat.completions", "responses", "messages" };
    static const char *const paths[] = { "/v1/chat/completions", "/v1/responses", "/v1/messages" };
    int st;
    for (int a = 0; a < 3; a++) {
        /* whole */
        char *b = forced(apis[a], reply, "\"temperature\":0");
        cJSON *j = post_json(port, paths[a], b, &st);
        const char *r = a == 0 ? str_at(j, "choices.0.message.reasoning_content")
                      : a == 1 ? str_at(j, "output.0.content.0.text") : str_at(j, "content.0.thinking");
        const char *c = a == 0 ? str_at(j, "choices.0.message.content")
                      : a == 1 ? str_at(j, "output.1.content.0.text") : str_at(j, "content.1.text");
        CHECKF(r && !strcmp(r, "abc") && c && !strcmp(c, "hello"), "%s %s: reasoning '%s' "
               "content '%s'", label, apis[a], r ? r : "(none)", c ? c : "(none)");
        if (a == 1)
            CHECK(str_at(j, "output.0.type") && !strcmp(str_at(j, "output.0.type"), "reasoning"));
        cJSON_Delete(j);
        free(b);
        /* streamed */
        b = forced(apis[a], reply, "\"temperature\":0,\"stream\":true");
        http_resp h = post(port, paths[a], b);
        sse ev;
        sse_parse(&ev, h.body ? h.body : "");
        char rs[256], cs[256];
        streamed_parts(&ev, rs, cs, sizeof(rs));
        CHECKF(!strcmp(rs, "abc") && !strcmp(cs, "hello"), "%s %s stream: reasoning '%s' "
               "content '%s'", label, apis[a], rs, cs);
        sse_free(&ev);
        http_resp_free(&h);
        free(b);
    }
}

/* ============================================================= <think> tags */

/* kvc_think_find on replies as they come: nothing that may be a tag goes out. */
static void test_think_find(void)
{
    kvc_think_span sp = kvc_think_find(" \n<thi", 6, false, false);
    CHECK(sp.state == KVC_THINK_UNDECIDED);
    sp = kvc_think_find(" \n<thi", 6, false, true);
    CHECK(sp.state == KVC_THINK_NONE && sp.c_begin == 0);
    sp = kvc_think_find("Hello", 5, false, false);
    CHECK(sp.state == KVC_THINK_NONE && sp.c_begin == 0);
    /* longer than "<think>": compared as far as the tag goes (an over-read
     * of the tag the sanitizer build caught) */
    sp = kvc_think_find("Hello there, a longer reply", 26, false, false);
    CHECK(sp.state == KVC_THINK_NONE && sp.c_begin == 0);
    sp = kvc_think_find("<think>ab</th", 13, false, false);
    CHECK(sp.state == KVC_THINK_OPEN && sp.r_begin == 7 && sp.r_end == 9);
    sp = kvc_think_find("ab</think>\n\nhi", 14, true, false);
    CHECK(sp.state == KVC_THINK_CLOSED && sp.r_begin == 0 && sp.r_end == 2 && sp.c_begin == 12);
    sp = kvc_think_find("ab<", 3, true, true);
    CHECK(sp.state == KVC_THINK_OPEN && sp.r_end == 3);
    CHECK(kvc_think_prompt_open("<|im_start|>assistant\n<think>\n"));
    CHECK(!kvc_think_prompt_open("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

/* Reasoning in <think> tags (a Qwen3.5-style template) through each API,
 * whole and streamed; reasoning_format none; thinking off; reasoning sent
 * back reaching the template. Replies forced by a grammar. */
static void test_reasoning(void)
{
    char tpath[64];
    http_server s;
    int port = 0, st;
    if (!start_with_template(&s, think_template, "think", tpath, sizeof(tpath)))
        goto done;
    port = s.port;
    check_split(port, "abc</think>\\n\\nhello", "think");
    /* reasoning_format none: the reply as it came */
    char *b = forced("chat.completions", "abc</think>\\n\\nhello", "\"reasoning_format\":\"none\"");
    cJSON *j = post_json(port, "/v1/chat/completions", b, &st);
    const char *c = str_at(j, "choices.0.message.content");
    CHECKF(c && !strcmp(c, "abc</think>\n\nhello") &&
           !at(j, "choices.0.message.reasoning_content"), "reasoning_format none: '%s'", c ? c : "");
    cJSON_Delete(j);
    free(b);
    /* thinking off: the prompt closes the block, the reply is content */
    b = forced("chat.completions", "hello", "\"reasoning_effort\":\"none\"");
    j = post_json(port, "/v1/chat/completions", b, &st);
    c = str_at(j, "choices.0.message.content");
    CHECKF(c && !strcmp(c, "hello") && !at(j, "choices.0.message.reasoning_content"),
           "thinking off: '%s'", c ? c : "");
    cJSON_Delete(j);
    free(b);
    /* reasoning sent back reaches the template, from each API */
    char *p1 = rendered(port, "chat.completions", "{\"messages\":[{\"role\":\"user\",\"content\":"
                        "\"Q\"},{\"role\":\"assistant\",\"content\":\"A\",\"reasoning_content\":"
                        "\"R1\"}]}");
    char *p2 = rendered(port, "responses", "{\"input\":[{\"role\":\"user\",\"content\":\"Q\"},"
                        "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":"
                        "\"reasoning_text\",\"text\":\"R1\"}]},{\"type\":\"message\",\"role\":"
                        "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"A\"}]}]}");
    char *p3 = rendered(port, "messages", "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
                        "\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":[{\"type\":"
                        "\"thinking\",\"thinking\":\"R1\",\"signature\":\"\"},{\"type\":\"text\","
                        "\"text\":\"A\"}]}]}");
    CHECKF(p1 && strstr(p1, "<think>\nR1\n</think>"), "reasoning not rendered: %s", p1 ? p1 : "");
    CHECKF(p1 && p2 && p3 && !strcmp(p1, p2) && !strcmp(p1, p3),
           "reasoning history renders differently:\n%s\n%s\n%s", p1 ? p1 : "", p2 ? p2 : "",
           p3 ? p3 : "");
    free(p1);
    free(p2);
    free(p3);
done:
    http_server_stop(&s);
    unlink(tpath);
}

/* ============================================================= harmony */

/* A harmony template (gpt-oss's format, cut down): past reasoning as
 * message.thinking in an analysis message, calls as commentary messages
 * addressed to=functions.NAME, the generation prompt "<|start|>assistant". */
static const char harmony_template[] =
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary"
    "<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' -%}"
    "{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>"
    "{%- endif -%}"
    "{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}<|start|>assistant<|channel|>commentary "
    "to=functions.{{ c.function.name }} <|constrain|>json<|message|>{{ c.function.arguments }}"
    "<|call|>{%- endfor -%}"
    "{%- else -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}";

static void test_harmony_find(void)
{
    const char *full = "<|channel|>analysis<|message|>abc<|end|><|start|>assistant<|channel|>final"
                       "<|message|>hello";
    kvc_think_span sp = kvc_think_find(full, strlen(full), KVC_THINK_HARMONY, false);
    CHECK(sp.state == KVC_THINK_CLOSED && sp.r_begin == 30 && sp.r_end == 33 &&
          !strcmp(full + sp.c_begin, "hello"));
    /* a tag cut short holds back; an analysis without its end is open */
    sp = kvc_think_find(full, 20, KVC_THINK_HARMONY, false);
    CHECK(sp.state == KVC_THINK_UNDECIDED);
    sp = kvc_think_find(full, 36, KVC_THINK_HARMONY, false);          /* "abc<|e" */
    CHECK(sp.state == KVC_THINK_OPEN && sp.r_end == 33 && sp.c_begin == 36);
    /* the final channel not begun yet: no content */
    sp = kvc_think_find(full, 70, KVC_THINK_HARMONY, false);
    CHECK(sp.state == KVC_THINK_CLOSED && sp.r_end == 33 && sp.c_begin == 70);
    /* straight to the final channel; no channel at all */
    sp = kvc_think_find("<|channel|>final<|message|>hi", 29, KVC_THINK_HARMONY, true);
    CHECK(sp.state == KVC_THINK_CLOSED && sp.r_end == sp.r_begin && sp.c_begin == 27);
    sp = kvc_think_find("plain", 5, KVC_THINK_HARMONY, true);
    CHECK(sp.state == KVC_THINK_NONE && sp.c_begin == 0);
}

/* gpt-oss's harmony channels (issue 28): analysis -> reasoning, final ->
 * content, a commentary message to=functions.NAME -> a tool call, through
 * each API, whole and streamed; the reasoning sent back reaches the
 * template as message.thinking. Replies forced by a grammar. */
static void test_harmony(void)
{
    test_harmony_find();
    forced_max = 200;                          /* the markers are text in this vocabulary */
    char tpath[64];
    http_server s;
    int port = 0;
    if (!start_with_template(&s, harmony_template, "harmony", tpath, sizeof(tpath)))
        goto done;
    port = s.port;
    static const char reply[] = "<|channel|>analysis<|message|>abc<|end|><|start|>assistant"
                                "<|channel|>final<|message|>hello";
    check_split(port, reply, "harmony");
    /* a call in a commentary message: tool_calls, no content, finish tool_calls */
    static const char call[] = "<|channel|>analysis<|message|>abc<|end|><|start|>assistant"
                               "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                               "<|message|>{\\\"city\\\": \\\"Paris\\\"}";
    char extra[1024];
    snprintf(extra, sizeof(extra), "\"temperature\":0,\"tools\":%s", tools_chat);
    for (int stream = 0; stream < 2; stream++) {
        char ex[1100];
        snprintf(ex, sizeof(ex), "%s%s", extra, stream ? ",\"stream\":true" : "");
        char *b = forced("chat.completions", call, ex);
        http_resp h = post(port, "/v1/chat/completions", b);
        CHECKF(h.status == 200 && h.body && strstr(h.body, "\"name\":\"get_weather\"") &&
               strstr(h.body, "Paris") && strstr(h.body, "\"finish_reason\":\"tool_calls\"") &&
               strstr(h.body, stream ? "\"reasoning_content\":\"" : "\"reasoning_content\":\"abc\"") &&
               !strstr(h.body, "commentary") && !strstr(h.body, "<|"),
               "harmony call%s: %d %s", stream ? " streamed" : "", h.status, h.body ? h.body : "");
        http_resp_free(&h);
        free(b);
    }
    /* reasoning sent back renders as the template's thinking */
    char *p1 = rendered(port, "chat.completions", "{\"messages\":[{\"role\":\"user\",\"content\":"
                        "\"Q\"},{\"role\":\"assistant\",\"content\":\"A\",\"reasoning_content\":"
                        "\"R1\"}]}");
    CHECKF(p1 && strstr(p1, "<|channel|>analysis<|message|>R1<|end|>"), "thinking not rendered: %s",
           p1 ? p1 : "");
    free(p1);
done:
    forced_max = 40;
    http_server_stop(&s);
    unlink(tpath);
}

int main(void)
{
    if (!dialects_setup(&bin, model_path, sizeof(model_path), "dialects_reasoning"))
        return TEST_SKIP;
    test_think_find();
    test_reasoning();
    test_harmony();
    unlink(model_path);
    return test_done("test_dialects_reasoning_http");
}
