/* test_harmony_http.c - gpt-oss's harmony format with a gpt-oss vocabulary
 * (issue 28 item 4, issue 31 item 4), end to end through `kvchat serve`.
 *
 * In o200k_harmony the markup (<|channel|> <|message|> <|start|> <|end|>
 * <|constrain|>) is made of control tokens, and only <|return|> and
 * <|call|> end a reply. The model here is a random-weight gpt-oss whose
 * vocabulary carries those seven tokens with o200k_harmony's texts and types
 * (EOS <|return|>) and whose chat template is gpt-oss's own
 * (tests/templates/gpt-oss.jinja, as the GGUFs ship it). Replies are forced:
 * a grammar spells the harmony text, and a logit bias makes the model take
 * each markup token where the grammar allows it (and <|return|> or <|call|>
 * at the end), so the reply's tokens are those a real gpt-oss writes.
 *
 * What is checked: the tokenizer's harmony rules; the analysis channel as
 * reasoning and the final one as content in every dialect, whole and
 * streamed, with no markup in either; a commentary message to=functions.NAME
 * as a tool call; that <|end|> does not end a reply; and that the next turn
 * (whose template drops the analysis) reuses the whole previous turn.
 *
 * `test_harmony_http make OUT.gguf` only writes the model (for a look by
 * hand). Needs $KVC_BIN (set by CTest) for the server part. */
#include <cjson/cJSON.h>

#include "common.h"
#include "gguf.h"
#include "model_gen.h"
#include "reasoning.h"
#include "tokenizer.h"

#include "answer_http.h"
#include "gguf_edit.h"
#include "http_client.h"
#include "json_at.h"
#include "kvchat.h"
#include "test.h"

/* The markup tokens, by their o200k_harmony texts, put on the first fillers. */
static const char *const harmony_tokens[] = { "<|return|>", "<|constrain|>", "<|channel|>",
                                              "<|start|>", "<|end|>", "<|message|>", "<|call|>" };
enum { H_RETURN, H_CONSTRAIN, H_CHANNEL, H_START, H_END, H_MESSAGE, H_CALL, N_HARMONY };
static int32_t hid[N_HARMONY];               /* their ids in the model */

/* The gpt-oss chat template (malloc'd) or NULL. */
static char *read_template(void)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/tests/templates/gpt-oss.jinja", KVC_SOURCE_DIR);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *s = malloc(1 << 16);
    size_t n = s ? fread(s, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (s)
        s[n] = 0;
    return s;
}

/* Write a gpt-oss model with the harmony tokens and template to path: the
 * tiny-gpt-oss preset's, its vocabulary padded, the first fillers renamed. */
static bool make_harmony_model(const char *path)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.base", path);
    kvc_gen_params p;
    kvc_gen_preset("tiny-gpt-oss", &p);
    p.n_vocab = 0;
    p.n_threads = 1;
    kvc_err err = { 0 };
    int32_t natural = kvc_gen_vocab_size(p.vocab);
    p.n_vocab = natural + 16;
    CHECKF(kvc_gen_model(&p, tmp, &err) == KVC_OK, "%s", err.msg);
    gguf_file *f = NULL;
    CHECKF(gguf_open(tmp, &f, &err) == KVC_OK, "%s", err.msg);
    char *tmpl = read_template();
    CHECK(tmpl != NULL);
    gguf_writer *w = gguf_writer_new();
    /* every key as generated but these, rewritten when the file has them */
    static const char *const own[] = { "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                       "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                       "tokenizer.chat_template", NULL };
    bool ok = f && tmpl && w && test_gguf_copy_keys_except(f, w, own);
    for (int o = 0; ok && own[o]; o++) {
        const gguf_kv *kv = gguf_find_kv(f, own[o]);
        const char *key = own[o];
        if (!kv) {
            continue;
        } else if (o == 0) {
            uint64_t n = kv->v.arr.n;
            char **v = calloc(n, sizeof(char *));
            for (uint64_t k = 0; v && k < n; k++)
                v[k] = k >= (uint64_t)natural && k < (uint64_t)natural + N_HARMONY
                     ? strdup(harmony_tokens[k - natural])
                     : strndup(kv->v.arr.strs[k].s, kv->v.arr.strs[k].len);
            ok = v && gguf_writer_set_arr_str(w, key, (const char *const *)v, n) == KVC_OK;
            for (uint64_t k = 0; v && k < n; k++)
                free(v[k]);
            free(v);
        } else if (o == 1) {
            int32_t *t = malloc(kv->v.arr.n * sizeof(int32_t));
            ok = t != NULL;
            for (uint64_t k = 0; ok && k < kv->v.arr.n; k++)
                t[k] = k >= (uint64_t)natural && k < (uint64_t)natural + N_HARMONY
                     ? KVC_TOKEN_CONTROL : (int32_t)gguf_arr_i64(kv, k);
            ok = ok && gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, t, kv->v.arr.n) == KVC_OK;
            free(t);
        } else if (o <= 3) {
            ok = gguf_writer_set_u32(w, key, (uint32_t)natural + H_RETURN) == KVC_OK;
        } else {
            ok = gguf_writer_set_str(w, key, tmpl) == KVC_OK;
        }
    }
    for (int64_t i = 0; ok && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.s);
        ok = gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->size) == KVC_OK;
    }
    ok = ok && gguf_writer_write(w, path, &err) == KVC_OK;
    CHECKF(ok, "harmony model: %s", err.msg);
    gguf_writer_free(w);
    gguf_close(f);
    free(tmpl);
    unlink(tmp);
    for (int i = 0; i < N_HARMONY; i++)
        hid[i] = natural + i;
    return ok;
}

/* ============================================================ tokenizer */

/* o200k_harmony's rules: <|return|> and <|call|> end a reply, <|end|> does
 * not; the five markup tokens are written into a reply's text but are never
 * read from caller text. */
static void test_vocab(const char *path)
{
    gguf_file *f = NULL;
    kvc_err err = { 0 };
    kvc_tokenizer *t = NULL;
    CHECKF(gguf_open(path, &f, &err) == KVC_OK && kvc_tokenizer_load(f, &t, &err) == KVC_OK,
           "%s", err.msg);
    gguf_close(f);
    if (!t)
        return;
    CHECK(kvc_tokenizer_is_eog(t, hid[H_RETURN]) && kvc_tokenizer_is_eog(t, hid[H_CALL]));
    CHECK(!kvc_tokenizer_is_eog(t, hid[H_END]));
    for (int i = H_CONSTRAIN; i <= H_MESSAGE; i++) {
        char buf[32];
        int n = kvc_token_to_piece(t, hid[i], false, buf, sizeof(buf));
        CHECKF(kvc_tokenizer_is_markup(t, hid[i]) && n == (int)strlen(harmony_tokens[i]) &&
               !memcmp(buf, harmony_tokens[i], (size_t)n), "%s: not kept as markup",
               harmony_tokens[i]);
        CHECK(kvc_tokenizer_token_type(t, hid[i]) == KVC_TOKEN_CONTROL);
        int32_t ids[16];
        CHECK(kvc_tokenize(t, harmony_tokens[i], strlen(harmony_tokens[i]), false, false, ids, 16) > 1);
    }
    CHECK(!kvc_tokenizer_is_markup(t, hid[H_RETURN]) && !kvc_tokenizer_is_markup(t, hid[H_CALL]));
    int32_t im_end = kvc_tokenizer_find(t, "<|im_end|>");
    CHECK(im_end >= 0 && !kvc_tokenizer_is_markup(t, im_end) && kvc_tokenizer_is_eog(t, im_end));
    kvc_tokenizer_free(t);
}

/* ================================================================ parser */

/* Harmony's split as a gpt-oss reply's text shows it: no markup in the
 * content, a recipient in the role header is a call, not content. */
static void test_find(void)
{
    static const char *const cases[][3] = {   /* reply, reasoning, content */
        { "<|channel|>analysis<|message|>abc<|end|><|start|>assistant<|channel|>final<|message|>"
          "hello<|end|><|start|>assistant<|channel|>final<|message|>again", "abc", "hello" },
        { "<|channel|>final<|message|>hi<|return|>", "", "hi" },
        { "plain<|end|><|end|>", "", "plain" },
        { "<|end|>x", "", "" },
        { " to=functions.f<|channel|>commentary json<|message|>{}", "", "" },
        { "<|channel|>analysis<|message|>r<|end|><|start|>assistant to=functions.f<|channel|>"
          "commentary json<|message|>{}", "r", "" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *t = cases[i][0];
        kvc_think_span sp = kvc_think_find(t, strlen(t), KVC_THINK_HARMONY, true);
        size_t rl = sp.r_end - sp.r_begin, cl = sp.c_end - sp.c_begin;
        CHECKF(sp.c_end >= sp.c_begin && rl == strlen(cases[i][1]) &&
               !memcmp(t + sp.r_begin, cases[i][1], rl) && cl == strlen(cases[i][2]) &&
               !memcmp(t + sp.c_begin, cases[i][2], cl), "'%s': reasoning '%.*s' content '%.*s'",
               t, (int)rl, t + sp.r_begin, (int)cl, t + sp.c_begin);
    }
    /* while streaming: " t" may be a recipient, "hi<|en" a message's end */
    kvc_think_span sp = kvc_think_find(" t", 2, KVC_THINK_HARMONY, false);
    CHECK(sp.state == KVC_THINK_UNDECIDED);
    sp = kvc_think_find("<|channel|>final<|message|>hi<|en", 33, KVC_THINK_HARMONY, false);
    CHECK(sp.state == KVC_THINK_CLOSED && sp.c_end == 29);
}

/* ================================================================ server */

static int port;

static http_resp post(const char *path, const char *body)
{
    return http_request_ex(port, "POST", path, NULL, body, 60);
}

/* A forced reply's body for `api`: the grammar spells reply, the logit
 * bias makes every harmony token win where the grammar allows it. extra:
 * more fields ("" for none). malloc'd. */
static char *forced(const char *api, const char *reply, const char *extra)
{
    cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
    char g[512];
    snprintf(g, sizeof(g), "root ::= \"%s\"", reply);
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", "What is the weather in Paris?");
    if (!strcmp(api, "responses")) {
        cJSON_AddStringToObject(o, "input", "What is the weather in Paris?");
        cJSON_AddNumberToObject(o, "max_output_tokens", 80);
        cJSON_Delete(m);
    } else {
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "messages"), m);
        cJSON_AddNumberToObject(o, "max_tokens", 80);
    }
    if (!strcmp(api, "ollama")) {
        cJSON_AddStringToObject(o, "model", "gpt-oss");
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "options"), "temperature", 0);
    } else {
        cJSON_AddNumberToObject(o, "temperature", 0);
    }
    cJSON_AddStringToObject(o, "grammar", g);
    cJSON *b = cJSON_AddObjectToObject(o, "logit_bias");
    for (int i = 0; i < N_HARMONY; i++) {
        char id[16];
        snprintf(id, sizeof(id), "%d", hid[i]);
        cJSON_AddNumberToObject(b, id, 100);
    }
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t n = strlen(t);
    char *out = malloc(n + strlen(extra) + 4);
    t[n - 1] = 0;
    sprintf(out, "%s%s%s}", t, *extra ? "," : "", extra);
    free(t);
    return out;
}

static const char *const apis[] = { "chat", "responses", "messages", "ollama" };
static const char *const paths[] = { "/v1/chat/completions", "/v1/responses", "/v1/messages",
                                     "/api/chat" };

/* analysis -> reasoning, final -> content, in every dialect, whole and
 * streamed; no markup anywhere in the answer. */
static void test_channels(void)
{
    static const char reply[] = "<|channel|>analysis<|message|>abc<|end|><|start|>assistant"
                                "<|channel|>final<|message|>hello";
    for (int a = 0; a < 4; a++)
        for (int stream = 0; stream < 2; stream++) {
            char *b = forced(apis[a], reply, stream ? "\"stream\":true" : "\"stream\":false");
            http_resp h = post(paths[a], b);
            char r[512], c[512];
            answer_parts(h.body, r, c, sizeof(r));
            CHECKF(h.status == 200 && !strcmp(r, "abc") && !strcmp(c, "hello"),
                   "%s%s: %d reasoning '%s' content '%s'", apis[a], stream ? " streamed" : "",
                   h.status, r, c);
            CHECKF(h.body && !strstr(h.body, "<|"), "%s%s: markup in %s", apis[a],
                   stream ? " streamed" : "", h.body ? h.body : "");
            http_resp_free(&h);
            free(b);
        }
    /* the markup came as the vocabulary's tokens, one each (six of them), and
     * <|return|> ended the reply (the grammar allowed only an end there) */
    char *b = forced("chat", reply, "\"logprobs\":true");
    http_resp h = post("/v1/chat/completions", b);
    cJSON *j = h.body ? cJSON_Parse(h.body) : NULL;
    int n_markup = 0, n_tok = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, at(j, "choices.0.logprobs.content")) {
        const char *tk = cJSON_GetStringValue(at(it, "token"));
        n_tok++;
        for (int i = 0; tk && i < N_HARMONY; i++)
            n_markup += !strcmp(tk, harmony_tokens[i]);
    }
    CHECKF(n_markup == 6 && n_tok > 6, "forced reply: %d markup tokens of %d (want 6)", n_markup,
           n_tok);
    const char *fin = cJSON_GetStringValue(at(j, "choices.0.finish_reason"));
    CHECKF(fin && !strcmp(fin, "stop"), "finish %s", fin ? fin : "(none)");
    cJSON_Delete(j);
    http_resp_free(&h);
    free(b);
}

/* <|end|> ends a message, not the reply: a model that writes it on and on
 * runs to max_tokens, and none of it is shown. */
static void test_end_not_stop(void)
{
    char body[256];
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
             "\"max_tokens\":6,\"temperature\":0,\"logit_bias\":{\"%d\":100}}", hid[H_END]);
    http_resp h = post("/v1/chat/completions", body);
    cJSON *j = h.body ? cJSON_Parse(h.body) : NULL;
    const char *fin = cJSON_GetStringValue(at(j, "choices.0.finish_reason"));
    const char *c = cJSON_GetStringValue(at(j, "choices.0.message.content"));
    CHECKF(fin && !strcmp(fin, "length") && cJSON_GetNumberValue(at(j, "usage.completion_tokens")) == 6
           && c && !*c, "<|end|> x 6: %s", h.body ? h.body : "");
    cJSON_Delete(j);
    http_resp_free(&h);
}

static const char tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}}]";
static const char tools_anthropic[] =
    "[{\"name\":\"get_weather\",\"description\":\"Weather\",\"input_schema\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]";
static const char tools_responses[] =
    "[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]";

/* A commentary message to=functions.NAME, ended by <|call|>: a tool call
 * with its JSON arguments, the analysis as reasoning, in every dialect. */
static void test_tool_call(void)
{
    /* the recipient in the channel's header, and in the role's (after the
     * analysis, or as the reply's first words) */
    static const char *const calls[] = {
        "<|channel|>analysis<|message|>abc<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\\\"city\\\": \\\"Paris\\\"}",
        "<|channel|>analysis<|message|>abc<|end|><|start|>assistant to=functions.get_weather"
        "<|channel|>commentary json<|message|>{\\\"city\\\": \\\"Paris\\\"}",
        " to=functions.get_weather<|channel|>commentary json<|message|>{\\\"city\\\": "
        "\\\"Paris\\\"}",
    };
    for (int k = 0; k < 3; k++)
    for (int a = 0; a < 4; a++)
        for (int stream = 0; stream < 2; stream++) {
            const char *call = calls[k];
            char extra[1024];
            snprintf(extra, sizeof(extra), "\"stream\":%s,\"tools\":%s", stream ? "true" : "false",
                     a == 1 ? tools_responses : a == 2 ? tools_anthropic : tools);
            char *b = forced(apis[a], call, extra);
            http_resp h = post(paths[a], b);
            char r[512], c[512];
            answer_parts(h.body, r, c, sizeof(r));
            const char *done = a == 0 ? "\"finish_reason\":\"tool_calls\""
                             : a == 1 ? "\"type\":\"function_call\""
                             : a == 2 ? "\"stop_reason\":\"tool_use\"" : "\"tool_calls\"";
            CHECKF(h.status == 200 && h.body && strstr(h.body, "get_weather") &&
                   strstr(h.body, "Paris") && strstr(h.body, done) &&
                   !strcmp(r, k < 2 ? "abc" : "") && !*c &&
                   !strstr(h.body, "<|") && !strstr(h.body, "commentary"),
                   "%s call %d%s: %d reasoning '%s' content '%s': %s", apis[a], k,
                   stream ? " streamed" : "", h.status, r, c, h.body ? h.body : "");
            http_resp_free(&h);
            free(b);
        }
}

/* A final message, then a call: the stream holds back the call's text and
 * cuts the content at the final message's end, never past what it has. */
static void test_final_then_call(void)
{
    char extra[1024];
    for (int stream = 0; stream < 2; stream++) {
        snprintf(extra, sizeof(extra), "\"stream\":%s,\"tools\":%s", stream ? "true" : "false",
                 tools);
        char *b = forced("chat", "<|channel|>final<|message|>hi<|end|><|start|>assistant to="
                         "functions.get_weather<|channel|>commentary json<|message|>{\\\"city\\\": "
                         "\\\"Paris\\\"}", extra);
        http_resp h = post("/v1/chat/completions", b);
        char r[512], c[512];
        answer_parts(h.body, r, c, sizeof(r));
        CHECKF(h.status == 200 && h.body && strstr(h.body, "get_weather") && !strstr(h.body, "<|") &&
               (!strcmp(c, "hi") || !*c) && !*r, "final then call%s: %d content '%s': %s",
               stream ? " streamed" : "", h.status, c, h.body ? h.body : "");
        http_resp_free(&h);
        free(b);
    }
}

/* A call sent back with its reasoning and a content too (a preamble, or a
 * client's habit): gpt-oss's template refuses content beside thinking in a
 * call's message; the content is dropped, as llama-server does. */
static void test_call_with_content(void)
{
    char body[1024];
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
             "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"reasoning_content\":\"R1\","
             "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
             "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":"
             "\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}],\"tools\":%s}", tools);
    http_resp h = post("/apply-template", body);
    CHECKF(h.status == 200 && h.body && strstr(h.body, "<|channel|>analysis<|message|>R1<|end|>") &&
           !strstr(h.body, "Let me look"), "call with content and reasoning: %d %s", h.status,
           h.body ? h.body : "");
    http_resp_free(&h);
}

/* tool_choice "required" (and a named function): the grammar forces one
 * commentary message to a function; its arguments follow the schema, and
 * <|call|> ends it. (No bias on the markup here: inside a JSON string the
 * grammar allows its text too, and a biased random model would write it.) */
static void test_forced_call(void)
{
    for (int k = 0; k < 2; k++)
        for (int stream = 0; stream < 2; stream++) {
            char body[2048];
            snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                     "\"max_tokens\":60,\"temperature\":0,\"stream\":%s,\"tools\":%s,"
                     "\"tool_choice\":%s,\"logit_bias\":{\"%d\":100}}", stream ? "true" : "false",
                     tools, k ? "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}"
                              : "\"required\"", hid[H_CALL]);
            http_resp h = post("/v1/chat/completions", body);
            CHECKF(h.status == 200 && h.body && strstr(h.body, "\"name\":\"get_weather\"") &&
                   strstr(h.body, "\\\"city\\\"") && strstr(h.body, "\"finish_reason\":\"tool_calls\"")
                   && !strstr(h.body, "<|"), "forced call %d%s: %d %s", k, stream ? " streamed" : "",
                   h.status, h.body ? h.body : "");
            http_resp_free(&h);
        }
}

/* Post the chat request body until all but its last n_new prompt tokens are
 * cached (the background turn that canonicalizes the previous reply runs
 * when the server is idle), 50 tries 100 ms apart; the last answer's
 * prompt_tokens and cached_tokens in *prompt and *cached. */
static void post_until_cached(const char *body, int n_new, double *prompt, double *cached)
{
    *prompt = *cached = 0;
    for (int tries = 0; tries < 50; tries++) {
        usleep(100 * 1000);
        http_resp h = post("/v1/chat/completions", body);
        cJSON *j = h.body ? cJSON_Parse(h.body) : NULL;
        *prompt = cJSON_GetNumberValue(at(j, "usage.prompt_tokens"));
        *cached = cJSON_GetNumberValue(at(j, "usage.prompt_tokens_details.cached_tokens"));
        cJSON_Delete(j);
        http_resp_free(&h);
        if (*cached >= *prompt - n_new)
            break;
    }
}

/* The next turn: the template drops the analysis of a past final answer, so
 * the reply's own tokens part from it right after the generation prompt;
 * the background turn computes the canonical ones, and every token before
 * the new user message is reused. */
static void test_next_turn(void)
{
    static const char reply[] = "<|channel|>analysis<|message|>abc<|end|><|start|>assistant"
                                "<|channel|>final<|message|>hello";
    char *b = forced("chat", reply, "\"user\":\"harmony-turns\"");
    http_resp h = post("/v1/chat/completions", b);
    free(b);
    cJSON *j = h.body ? cJSON_Parse(h.body) : NULL;
    double p1 = cJSON_GetNumberValue(at(j, "usage.prompt_tokens"));
    cJSON_Delete(j);
    http_resp_free(&h);
    static const char t2[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"What is the weather "
        "in Paris?\"},{\"role\":\"assistant\",\"content\":\"hello\",\"reasoning_content\":\"abc\"},"
        "{\"role\":\"user\",\"content\":\"more\"}],\"max_tokens\":4,\"temperature\":0,"
        "\"user\":\"harmony-turns\"}";
    /* what the new message adds: its tokens after the previous turn's end */
    int n_new = answer_n_tokens(port, "<|start|>user<|message|>more<|end|><|start|>assistant");
    double p2, cached;
    post_until_cached(t2, n_new, &p2, &cached);
    printf("next turn: turn 1 %g prompt tokens; turn 2 %g, %g cached, the new message %d\n", p1, p2,
           cached, n_new);
    CHECKF(n_new > 4 && p2 > p1 && cached >= p2 - n_new, "turn 2: %g of %g cached, want all but "
           "the %d tokens of the new message", cached, p2, n_new);
}

/* The tool loop: a call (the analysis kept by the template, the recipient
 * moved to the role header, <|call|> after the arguments), then the tool's
 * result. Every token before the result's text is reused. */
static void test_tool_turn(void)
{
    char extra[1024];
    snprintf(extra, sizeof(extra), "\"user\":\"harmony-tools\",\"tools\":%s", tools);
    char *b = forced("chat", "<|channel|>analysis<|message|>abc<|end|><|start|>assistant"
                     "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                     "{\\\"city\\\": \\\"Paris\\\"}", extra);
    http_resp h = post("/v1/chat/completions", b);
    free(b);
    cJSON *j = h.body ? cJSON_Parse(h.body) : NULL;
    char *args = cJSON_PrintUnformatted(at(j, "choices.0.message.tool_calls.0.function.arguments"));
    cJSON_Delete(j);
    http_resp_free(&h);
    CHECK(args != NULL);
    char t2[2048];
    snprintf(t2, sizeof(t2), "{\"messages\":[{\"role\":\"user\",\"content\":\"What is the "
             "weather in Paris?\"},{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":"
             "\"abc\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
             "{\"name\":\"get_weather\",\"arguments\":%s}}]},{\"role\":\"tool\",\"tool_call_id\":"
             "\"c1\",\"content\":\"sunny\"}],\"max_tokens\":4,\"temperature\":0,"
             "\"user\":\"harmony-tools\",\"tools\":%s}", args ? args : "\"\"", tools);
    free(args);
    /* the result's text on: "sunny" (as tojson writes it), <|end|>, the prompt */
    int n_new = answer_n_tokens(port, "\\\"sunny\\\"<|end|><|start|>assistant");
    double p2, cached;
    post_until_cached(t2, n_new, &p2, &cached);
    printf("tool turn: %g prompt tokens, %g cached, the result's text %d\n", p2, cached, n_new);
    CHECKF(n_new > 4 && cached >= p2 - n_new, "tool turn: %g of %g cached, want all but the %d of "
           "the result", cached, p2, n_new);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "make"))
        return make_harmony_model(argv[2]) ? 0 : 1;
    char path[64];
    snprintf(path, sizeof(path), "/tmp/kvc_harmony_%d.gguf", (int)getpid());
    if (!make_harmony_model(path))
        return test_done("test_harmony_http");
    test_vocab(path);
    test_find();
    const char *bin = getenv("KVC_BIN");
    if (bin && *bin) {
        const char *args[] = { "-m", path, "--parallel", "1", "--cache-disk", "0", NULL };
        http_server s;
        CHECK(http_server_start(&s, bin, args, 60));
        port = s.port;
        if (port > 0) {
            test_channels();
            test_end_not_stop();
            test_tool_call();
            test_forced_call();
            test_call_with_content();
            test_final_then_call();
            test_next_turn();
            test_tool_turn();
        }
        http_server_stop(&s);
    } else {
        printf("test_harmony_http: server part skipped ($KVC_BIN not set)\n");
    }
    unlink(path);
    return test_done("test_harmony_http");
}
