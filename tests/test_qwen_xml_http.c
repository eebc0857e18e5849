/* test_qwen_xml_http.c - the XML tool calls of Qwen3-Coder / Qwen3.5 / 3.6
 * (tool format "qwen3-coder-xml") end to end through `kvchat serve`, with
 * Qwen3-Coder's and Qwen3.5's own chat templates (tests/templates/, as the
 * GGUFs ship them; Qwen3.5's with thinking on: its replies begin with the
 * thought and "</think>") on a tiny random-weight model.
 *
 * What is checked: a reply spelled by a grammar (text, then a call) comes
 * back in every dialect (OpenAI chat, Responses, Anthropic Messages, Ollama),
 * whole and streamed, as the dialect's tool call with arguments typed by the
 * tool's schema, the text before it as content and no XML anywhere;
 * tool_choice "required" / a named function / Anthropic's "any" force a call
 * the schema allows; a tool without parameters is served (its call's
 * arguments are {}); and the next turn (the call sent back, then the tool's
 * result) renders the call exactly as the model wrote it, so every token
 * before the result is reused.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include <cjson/cJSON.h>
#include <unistd.h>

#include "answer_http.h"
#include "http_client.h"
#include "json_at.h"
#include "kvchat.h"
#include "test.h"

static int port;
static bool think;      /* Qwen3.5's template (thinking on), else Qwen3-Coder's */

static http_resp post(const char *path, const char *body)
{
    return http_request_ex(port, "POST", path, NULL, body, 60);
}

static const char *const apis[] = { "chat", "responses", "messages", "ollama" };
static const char *const paths[] = { "/v1/chat/completions", "/v1/responses", "/v1/messages",
                                     "/api/chat" };

#define SCHEMA "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"enum\":" \
               "[\"Paris\",\"Oslo\"]},\"days\":{\"type\":\"integer\"}},\"required\":" \
               "[\"city\",\"days\"]}"
static const char tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                            "\"description\":\"Weather\",\"parameters\":" SCHEMA "}}]";
static const char tools_responses[] = "[{\"type\":\"function\",\"name\":\"get_weather\","
                                      "\"description\":\"Weather\",\"parameters\":" SCHEMA "}]";
static const char tools_anthropic[] = "[{\"name\":\"get_weather\",\"description\":\"Weather\","
                                      "\"input_schema\":" SCHEMA "}]";

/* What a thinking model writes before its answer (GBNF-escaped). */
#define THOUGHT(t) ((t) ? "Hmm.\\n</think>\\n\\n" : "")

/* The call as the model writes it (GBNF-escaped for the grammar field). */
#define CALL_G "<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>" \
               "\\n<parameter=days>\\n3\\n</parameter>\\n</function>\\n</tool_call>"

/* A request body for `api` whose reply the grammar spells (reply in GBNF
 * literal escapes), with the api's tools and more fields (extra, "" for
 * none). malloc'd. */
static char *forced(int api, const char *reply, const char *extra)
{
    char *out = malloc(8192);
    const char *q = "\"What is the weather in Paris?\"";
    char g[1024], msgs[256];
    snprintf(g, sizeof(g), "root ::= \\\"%s\\\"", reply);
    snprintf(msgs, sizeof(msgs), api == 1 ? "\"input\":%s" : "\"messages\":[{\"role\":\"user\","
             "\"content\":%s}]", q);
    snprintf(out, 8192, "{%s,\"%s\":200,%s\"grammar\":\"%s\",\"tools\":%s%s%s}", msgs,
             api == 1 ? "max_output_tokens" : "max_tokens",
             api == 3 ? "\"model\":\"q\",\"options\":{\"temperature\":0}," : "\"temperature\":0,",
             g, api == 1 ? tools_responses : api == 2 ? tools_anthropic : tools,
             *extra ? "," : "", extra);
    return out;
}

/* What marks a finished call in each dialect's answer. */
static const char *const call_mark[] = { "\"finish_reason\":\"tool_calls\"",
                                         "\"type\":\"function_call\"",
                                         "\"stop_reason\":\"tool_use\"", "\"tool_calls\"" };

/* No XML of the format anywhere in an answer. */
static bool no_xml(const char *body)
{
    return body && !strstr(body, "<tool_call") && !strstr(body, "<function=") &&
           !strstr(body, "parameter>") && !strstr(body, "<parameter=");
}

/* Text, then a call: in every dialect, whole and streamed, the call with
 * "days" a number (the schema's integer), the text as content. */
static void test_dialects(void)
{
    for (int a = 0; a < 4; a++)
        for (int stream = 0; stream < 2; stream++) {
            char reply[1024];
            snprintf(reply, sizeof(reply), "%sLet me check.\\n\\n%s", THOUGHT(think), CALL_G);
            char *b = forced(a, reply, stream ? "\"stream\":true" : "\"stream\":false");
            http_resp h = post(paths[a], b);
            char c[512];
            answer_parts(h.body, NULL, c, sizeof(c));
            bool typed = h.body && (strstr(h.body, "\"days\":3") ||
                                    strstr(h.body, "\\\"days\\\":3"));
            CHECKF(h.status == 200 && h.body && strstr(h.body, "get_weather") &&
                   strstr(h.body, "Paris") && typed && strstr(h.body, call_mark[a]) &&
                   !strcmp(c, "Let me check.") && no_xml(h.body),
                   "%s%s%s: %d content '%s': %s", think ? "qwen3.5 " : "", apis[a], stream ? " streamed" : "", h.status, c,
                   h.body ? h.body : "");
            http_resp_free(&h);
            free(b);
        }
}

/* tool_choice forcing a call (chat: "required" and a named function;
 * Responses: "required"; Messages: "any"): the grammar lets the random
 * model write only a call whose parameters the schema allows. */
static void test_forced(void)
{
    static const char *const choices[] = {
        "\"required\"", "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}",
        "\"required\"", "{\"type\":\"any\"}",
    };
    static const int api_of[] = { 0, 0, 1, 2 };
    for (int k = 0; k < 4; k++)
        for (int stream = 0; stream < 2; stream++) {
            int a = api_of[k];
            char body[2048];
            snprintf(body, sizeof(body), "{%s,\"%s\":200,\"temperature\":0,\"stream\":%s,"
                     "\"tools\":%s,\"tool_choice\":%s}",
                     a == 1 ? "\"input\":\"Hi\"" : "\"messages\":[{\"role\":\"user\","
                     "\"content\":\"Hi\"}]", a == 1 ? "max_output_tokens" : "max_tokens",
                     stream ? "true" : "false",
                     a == 1 ? tools_responses : a == 2 ? tools_anthropic : tools, choices[k]);
            http_resp h = post(paths[a], body);
            CHECKF(h.status == 200 && h.body && strstr(h.body, "get_weather") &&
                   strstr(h.body, call_mark[a]) && no_xml(h.body), "forced %d%s: %d %s", k,
                   stream ? " streamed" : "", h.status, h.body ? h.body : "");
            if (!stream && a == 0) {          /* the arguments follow the schema */
                cJSON *j = h.body ? cJSON_Parse(h.body) : NULL;
                const char *args = cJSON_GetStringValue(
                    at(j, "choices.0.message.tool_calls.0.function.arguments"));
                cJSON *x = args ? cJSON_Parse(args) : NULL;
                const char *city = cJSON_GetStringValue(at(x, "city"));
                CHECKF(city && (!strcmp(city, "Paris") || !strcmp(city, "Oslo")) &&
                       cJSON_IsNumber(at(x, "days")), "forced %d: arguments %s", k,
                       args ? args : "(none)");
                cJSON_Delete(x);
                cJSON_Delete(j);
            }
            http_resp_free(&h);
        }
}

/* A tool without parameters (OpenAI allows it; agents send a "get_time"):
 * Qwen3-Coder's template reads tool.parameters.properties, which fails
 * unless the request is given the empty schema. Served in every dialect,
 * whole and streamed, a call to it has arguments {}; tool_choice naming it
 * forces exactly that call. */
static void test_no_parameters(void)
{
    static const char *const tl[] = {
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
        SCHEMA "}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\","
        "\"description\":\"The time\"}}]",
        "[{\"type\":\"function\",\"name\":\"get_weather\",\"parameters\":" SCHEMA "},"
        "{\"type\":\"function\",\"name\":\"get_time\",\"parameters\":null}]",
        "[{\"name\":\"get_weather\",\"input_schema\":" SCHEMA "},{\"name\":\"get_time\"}]",
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
        SCHEMA "}},{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]",
    };
    static const char *const empty_args[] = { "\"arguments\":\"{}\"", "\"arguments\":\"{}\"",
                                              "\"input\":{}", "\"arguments\":{}" };
    for (int a = 0; a < 4; a++)
        for (int stream = 0; stream < 2; stream++) {
            char body[4096];
            snprintf(body, sizeof(body), "{%s,\"%s\":100,%s\"stream\":%s,\"grammar\":"
                     "\"root ::= \\\"%s<tool_call>\\\\n<function=get_time>\\\\n</function>"
                     "\\\\n</tool_call>\\\"\",\"tools\":%s}",
                     a == 1 ? "\"input\":\"Time?\"" : "\"messages\":[{\"role\":\"user\","
                     "\"content\":\"Time?\"}]", a == 1 ? "max_output_tokens" : "max_tokens",
                     a == 3 ? "\"model\":\"q\",\"options\":{\"temperature\":0}," :
                     "\"temperature\":0,", stream ? "true" : "false", THOUGHT(think), tl[a]);
            http_resp h = post(paths[a], body);
            CHECKF(h.status == 200 && h.body && strstr(h.body, "get_time") &&
                   strstr(h.body, call_mark[a]) && no_xml(h.body) &&
                   (stream || strstr(h.body, empty_args[a])),
                   "no parameters, %s%s: %d %s", apis[a], stream ? " streamed" : "", h.status,
                   h.body ? h.body : "");
            http_resp_free(&h);
        }
    char body[2048];
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
             "\"max_tokens\":100,\"temperature\":0,\"tools\":%s,\"tool_choice\":{\"type\":"
             "\"function\",\"function\":{\"name\":\"get_time\"}}}", tl[0]);
    http_resp h = post("/v1/chat/completions", body);
    CHECKF(h.status == 200 && h.body && strstr(h.body, "\"name\":\"get_time\",\"arguments\":"
           "\"{}\"") && strstr(h.body, call_mark[0]), "forced get_time: %d %s", h.status,
           h.body ? h.body : "");
    http_resp_free(&h);
}

/* The tool loop: turn 1's call sent back with the tool's result renders as
 * the model wrote it (the template iterates the arguments as a mapping),
 * and every token before the result is reused. */
static void test_tool_turn(void)
{
    char reply[1024];
    snprintf(reply, sizeof(reply), "%s%s", THOUGHT(think), CALL_G);
    char *b = forced(0, reply, think ? "\"user\":\"qwen35-tools\"" : "\"user\":\"qwen-tools\"");
    http_resp h = post("/v1/chat/completions", b);
    free(b);
    cJSON *j = h.body ? cJSON_Parse(h.body) : NULL;
    char *args = cJSON_PrintUnformatted(at(j, "choices.0.message.tool_calls.0.function.arguments"));
    cJSON_Delete(j);
    http_resp_free(&h);
    CHECK(args != NULL);
    char t2[4096];
    snprintf(t2, sizeof(t2), "{\"messages\":[{\"role\":\"user\",\"content\":\"What is the "
             "weather in Paris?\"},{\"role\":\"assistant\",\"content\":null,%s\"tool_calls\":"
             "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
             "\"arguments\":%s}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":"
             "\"sunny\"}],\"max_tokens\":4,\"temperature\":0,\"user\":\"%s\","
             "\"tools\":%s}", think ? "\"reasoning_content\":\"Hmm.\"," : "",
             args ? args : "\"\"", think ? "qwen35-tools" : "qwen-tools", tools);
    free(args);
    h = post("/apply-template", t2);
    /* each template's rendering (Qwen3.5: the thinking kept after the last
     * user message, the result without a newline before <|im_end|>) */
    static const char call[] =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>";
    char want[1024];
    snprintf(want, sizeof(want), "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
             "<|im_start|>assistant\n%s%suser\n<tool_response>\nsunny\n</tool_response>%s"
             "<|im_end|>\n<|im_start|>assistant\n%s", think ? "<think>\nHmm.\n</think>\n\n" : "",
             call, think ? "" : "\n", think ? "<think>\n" : "");
    j = h.body ? cJSON_Parse(h.body) : NULL;
    const char *prompt = cJSON_GetStringValue(at(j, "prompt"));
    CHECKF(prompt && strstr(prompt, want), "turn 2 renders as %s", prompt ? prompt : h.body);
    cJSON_Delete(j);
    http_resp_free(&h);
    /* from the end of the call on: <|im_end|>, the result, the prompt */
    static const char *const tail[] = {
        "<|im_end|>\\n<|im_start|>user\\n<tool_response>\\nsunny\\n"
        "</tool_response>\\n<|im_end|>\\n<|im_start|>assistant\\n",
        "<|im_end|>\\n<|im_start|>user\\n<tool_response>\\nsunny\\n"
        "</tool_response><|im_end|>\\n<|im_start|>assistant\\n<think>\\n" };
    int n_new = answer_n_tokens(port, tail[think]);
    double p2 = 0, cached = 0;
    for (int tries = 0; tries < 50; tries++) {
        usleep(100 * 1000);
        h = post("/v1/chat/completions", t2);
        j = h.body ? cJSON_Parse(h.body) : NULL;
        p2 = cJSON_GetNumberValue(at(j, "usage.prompt_tokens"));
        cached = cJSON_GetNumberValue(at(j, "usage.prompt_tokens_details.cached_tokens"));
        cJSON_Delete(j);
        http_resp_free(&h);
        if (cached >= p2 - n_new)
            break;
    }
    printf("%s tool turn: %g prompt tokens, %g cached, the result's part %d\n",
           think ? "qwen3.5" : "qwen3-coder", p2, cached, n_new);
    CHECKF(n_new > 4 && cached >= p2 - n_new, "tool turn: %g of %g cached, want all but the %d "
           "of the result", cached, p2, n_new);
}

int main(void)
{
    const char *bin = getenv("KVC_BIN");
    if (!bin || !*bin)
        return TEST_SKIP;
    kvc_gen_params gp;
    kvc_gen_preset("tiny", &gp);
    char path[64], err[256], tmpl[1024];
    snprintf(path, sizeof(path), "/tmp/kvc_qwenxml_%d.gguf", (int)getpid());
    CHECK(kvc_gen_write(&gp, path, err, sizeof(err)) == KVC_OK);
    for (int k = 0; k < 2; k++) {
        think = k == 1;
        snprintf(tmpl, sizeof(tmpl), "%s/tests/templates/%s", KVC_SOURCE_DIR,
                 think ? "qwen3.5.jinja" : "qwen3-coder.jinja");
        const char *args[] = { "-m", path, "--chat-template-file", tmpl, "--parallel", "1",
                               "--cache-disk", "0", NULL };
        http_server s = { 0 };
        CHECK(http_server_start(&s, bin, args, 60));
        port = s.port;
        if (port > 0) {
            test_dialects();
            test_forced();
            test_no_parameters();
            test_tool_turn();
        }
        http_server_stop(&s);
    }
    unlink(path);
    return test_done("test_qwen_xml_http");
}
