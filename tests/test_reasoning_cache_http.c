/* test_reasoning_cache_http.c - a thinking template's conversation reuses
 * the previous turn whole, however the client sends the reasoning back.
 *
 * The server splits a reply's <think> block into reasoning_content; the
 * client sends the turn back with the content alone (most chat clients) or
 * with the reasoning too (agents: reasoning items, thinking blocks), and the
 * template drops the reasoning of past turns (before the last user query) or
 * keeps it (Qwen3 keeps the turns of a tool loop). The cache holds the raw
 * reply; the background step must render it as it will come back, so that
 * every later turn computes only its new message and markup (at most SLACK
 * tokens more). Run on Qwen3's own template (tests/templates/qwen3.jinja;
 * the reply opens the block itself) and on a variant whose generation
 * prompt opens it (Qwen3.5, DeepSeek-R1), with replies forced by a grammar
 * to reason and then answer, to be cut by max_tokens inside the reasoning,
 * or to reason and call a tool. Every warm reply equals a fresh process's.
 *
 * Catches: canonicalizing the raw reply (a tool loop computed 144 tokens
 * per turn for 34 new; a reply cut inside its reasoning re-rendered as
 * content), and a user message after a reply with tool calls where a tool
 * message comes (the template drops the reasoning there and keeps it before
 * a tool message).
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include "test.h"

#include "http_client.h"

#include <cjson/cJSON.h>

#define N_TURNS 6
#define SLACK   4

static const char *bin;

enum mode { DROP, KEEP, CUT, TOOLS };
static const char *const MODE[] = { "reasoning dropped", "reasoning sent back",
                                    "cut inside the reasoning", "tool loop, reasoning sent back" };

static const char *const USER[] = {
    "Hello! Tell me a story about a small dog.", "Why is the sky blue? Answer in two lines.",
    "What did you say before? Repeat it.",       "Write a list: one two three",
    "Once upon a time there was a girl named Lily.", "The quick brown fox jumps over the lazy dog.",
};

static const char TOOLS_JSON[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}}]";

/* The grammar of a reply: reasoning, then words or a tool call; `open`: the
 * generation prompt opened the block already. */
static char *grammar(bool open, bool call)
{
    static char g[1024];
    snprintf(g, sizeof(g), "root ::= %s[a-z]{2,8} ( \" \" [a-z]{2,8} ){6,12} \"\\n</think>\\n\\n\" %s",
             open ? "" : "\"<think>\\n\" ",
             call ? "\"<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": "
                    "{\\\"city\\\": \\\"\" [a-z]{3,8} \"\\\"}}\\n</tool_call>\""
                  : "[a-z]{2,8} ( \" \" [a-z]{2,8} ){4,10}");
    return g;
}

static cJSON *post_json(int port, const char *path, cJSON *body)
{
    char *text = cJSON_PrintUnformatted(body);
    http_resp r = http_request(port, "POST", path, text, 60);
    free(text);
    cJSON *j = r.status == 200 && r.body ? cJSON_Parse(r.body) : NULL;
    if (!j)
        fprintf(stderr, "%s: HTTP %d: %s\n", path, r.status, r.body ? r.body : "(no answer)");
    http_resp_free(&r);
    return j;
}

/* The tokens of the rendered prompt of body's messages (and tools). */
static cJSON *prompt_tokens(int port, cJSON *msgs, bool tools)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(b, "messages", msgs);
    if (tools)
        cJSON_AddItemToObject(b, "tools", cJSON_Parse(TOOLS_JSON));
    cJSON *a = post_json(port, "/apply-template", b);
    cJSON_Delete(b);
    const char *prompt = cJSON_GetStringValue(cJSON_GetObjectItem(a, "prompt"));
    b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "content", prompt ? prompt : "");
    cJSON_AddBoolToObject(b, "parse_special", true);
    cJSON *t = post_json(port, "/tokenize", b);
    cJSON_Delete(b);
    cJSON_Delete(a);
    cJSON *toks = cJSON_DetachItemFromObject(t, "tokens");
    cJSON_Delete(t);
    return toks;
}

static int token_at(cJSON *toks, int i)
{
    cJSON *x = cJSON_GetArrayItem(toks, i);
    return cJSON_IsNumber(x) ? x->valueint : (int)cJSON_GetNumberValue(cJSON_GetObjectItem(x, "id"));
}

/* The tokens a perfect cache computes for msgs: those from where a request
 * whose last message says something else parts from it. */
static int ideal_new_tokens(int port, cJSON *msgs, bool tools)
{
    cJSON *alt = cJSON_Duplicate(msgs, true);
    cJSON *last = cJSON_GetArrayItem(alt, cJSON_GetArraySize(alt) - 1);
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(last, "content"));
    char buf[512];
    snprintf(buf, sizeof(buf), "zzqx %s", c ? c : "");
    cJSON_ReplaceItemInObject(last, "content", cJSON_CreateString(buf));
    cJSON *a = prompt_tokens(port, msgs, tools), *b = prompt_tokens(port, alt, tools);
    int n = cJSON_GetArraySize(a), k = 0;
    while (k < n && k < cJSON_GetArraySize(b) && token_at(a, k) == token_at(b, k))
        k++;
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(alt);
    return n - k;
}

/* What a reply says, for comparing two processes: reasoning, content and the
 * calls' names and arguments (their ids are random). malloc'd. */
static char *reply_text(const cJSON *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "r", cJSON_Duplicate(cJSON_GetObjectItem(msg, "reasoning_content"), 1));
    cJSON_AddItemToObject(o, "c", cJSON_Duplicate(cJSON_GetObjectItem(msg, "content"), 1));
    cJSON *calls = cJSON_AddArrayToObject(o, "f");
    const cJSON *tc;
    cJSON_ArrayForEach(tc, cJSON_GetObjectItem(msg, "tool_calls"))
        cJSON_AddItemToArray(calls, cJSON_Duplicate(cJSON_GetObjectItem(tc, "function"), 1));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

typedef struct totals {
    int turns, within, replies, equal;
    long computed, ideal;
} totals;

static void run(const char *tmpl_path, bool open, enum mode mode, totals *t, const char *model)
{
    const char *const args[] = { "-m", model, "-t", "1", "--cache-disk", "0",
                                 "--chat-template-file", tmpl_path, NULL };
    http_server warm;
    CHECKF(http_server_start(&warm, bin, args, 30), "warm server");
    if (!warm.pid)
        return;
    cJSON *msgs = cJSON_CreateArray();
    cJSON *sys = cJSON_CreateObject();
    cJSON_AddStringToObject(sys, "role", "system");
    cJSON_AddStringToObject(sys, "content", "You are a helpful assistant.");
    cJSON_AddItemToArray(msgs, sys);
    long computed = 0, ideal = 0;
    for (int turn = 0; turn < N_TURNS; turn++) {
        bool call = mode == TOOLS && turn % 2 == 0;
        if (!(mode == TOOLS && turn % 2 == 1)) {     /* a tool loop answers with the result */
            cJSON *u = cJSON_CreateObject();
            cJSON_AddStringToObject(u, "role", "user");
            cJSON_AddStringToObject(u, "content", USER[turn]);
            cJSON_AddItemToArray(msgs, u);
        }
        cJSON *body = cJSON_CreateObject();
        cJSON_AddItemReferenceToObject(body, "messages", msgs);
        cJSON_AddNumberToObject(body, "max_tokens", mode == CUT ? 15 : 120);
        cJSON_AddNumberToObject(body, "temperature", 0);
        cJSON_AddStringToObject(body, "grammar", grammar(open, call));
        cJSON_AddStringToObject(body, "prompt_cache_key", "conversation");
        if (mode == TOOLS)
            cJSON_AddItemToObject(body, "tools", cJSON_Parse(TOOLS_JSON));
        cJSON *w = post_json(warm.port, "/v1/chat/completions", body);
        CHECKF(http_wait_background(warm.port), "background work never finished");
        cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(w, "choices"), 0),
                                         "message");
        const char *reasoning = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "reasoning_content"));
        CHECKF(reasoning && *reasoning, "%s %s turn %d: no reasoning split", tmpl_path,
               MODE[mode], turn);
        CHECKF(!call || cJSON_GetArraySize(cJSON_GetObjectItem(msg, "tool_calls")) == 1,
               "%s turn %d: no tool call", MODE[mode], turn);
        if (turn > 0) {
            int c = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(w, "timings"),
                                                                  "prompt_n"));
            int i = ideal_new_tokens(warm.port, msgs, mode == TOOLS);
            computed += c;
            ideal += i;
            t->turns++;
            t->within += c <= i + SLACK;
            CHECKF(c <= i + SLACK, "%s, %s, turn %d: computed %d tokens, the new message and "
                   "its markup are %d", open ? "prompt opens <think>" : "Qwen3", MODE[mode], turn,
                   c, i);
        }
        http_server fresh;
        cJSON *f = NULL;
        const char *const fresh_args[] = { "-m", model, "-t", "1", "--cache-disk", "0",
                                           "--chat-template-file", tmpl_path, NULL };
        if (http_server_start(&fresh, bin, fresh_args, 30)) {
            f = post_json(fresh.port, "/v1/chat/completions", body);
            http_server_stop(&fresh);
        }
        cJSON *fmsg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(f, "choices"), 0),
                                          "message");
        char *a = msg ? reply_text(msg) : NULL, *b = fmsg ? reply_text(fmsg) : NULL;
        bool eq = a && b && !strcmp(a, b);
        t->replies++;
        t->equal += eq;
        CHECKF(eq, "%s turn %d: warm %s != fresh process %s", MODE[mode], turn, a ? a : "(none)",
               b ? b : "(none)");
        free(a);
        free(b);
        /* the turn as the client sends it back */
        cJSON *am = cJSON_CreateObject();
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content"));
        cJSON_AddStringToObject(am, "role", "assistant");
        cJSON_AddStringToObject(am, "content", content ? content : "");
        if (mode == KEEP || mode == TOOLS)
            cJSON_AddStringToObject(am, "reasoning_content", reasoning ? reasoning : "");
        cJSON *calls = cJSON_GetObjectItem(msg, "tool_calls");
        if (cJSON_GetArraySize(calls) > 0)
            cJSON_AddItemToObject(am, "tool_calls", cJSON_Duplicate(calls, true));
        cJSON_AddItemToArray(msgs, am);
        if (cJSON_GetArraySize(calls) > 0) {
            cJSON *tm = cJSON_CreateObject();
            cJSON_AddStringToObject(tm, "role", "tool");
            cJSON_AddStringToObject(tm, "tool_call_id", cJSON_GetStringValue(
                cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "id")));
            cJSON_AddStringToObject(tm, "content", "sunny, 21 degrees");
            cJSON_AddItemToArray(msgs, tm);
        }
        cJSON_Delete(w);
        cJSON_Delete(f);
        cJSON_Delete(body);
    }
    printf("  %s, %s: turns 2+ computed %ld tokens, new messages and markup %ld\n",
           open ? "prompt opens <think>" : "Qwen3", MODE[mode], computed, ideal);
    t->computed += computed;
    t->ideal += ideal;
    cJSON_Delete(msgs);
    http_server_stop(&warm);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_reasoning_cache_http: skipped ($KVC_BIN not set)\n");
        return TEST_SKIP;
    }
    char dir[] = "/tmp/kvc_reasoning_cache_XXXXXX", model[4200], qwen3[4200], open[4200];
    if (!mkdtemp(dir))
        return 1;
    char err[512];
    kvc_gen_params g;
    kvc_gen_preset("tiny", &g);
    snprintf(model, sizeof(model), "%s/tiny.gguf", dir);
    CHECKF(kvc_gen_write(&g, model, err, sizeof(err)) == KVC_OK, "%s", err);
    /* Qwen3's template, and the same with a generation prompt that opens the block */
    snprintf(qwen3, sizeof(qwen3), "%s/tests/templates/qwen3.jinja", KVC_SOURCE_DIR);
    snprintf(open, sizeof(open), "%s/open.jinja", dir);
    FILE *in = fopen(qwen3, "r"), *out = fopen(open, "w");
    CHECKF(in && out, "%s: %s", qwen3, strerror(errno));
    static char src[16384];
    size_t n = in ? fread(src, 1, sizeof(src) - 1, in) : 0;
    src[n] = 0;
    const char gen[] = "{{- '<|im_start|>assistant\\n' }}";
    char *at = strstr(src, gen);
    CHECKF(at, "the generation prompt of %s", qwen3);
    if (at && out) {
        fwrite(src, 1, (size_t)(at - src), out);
        fputs("{{- '<|im_start|>assistant\\n<think>\\n' }}", out);
        fputs(at + strlen(gen), out);
    }
    if (in)
        fclose(in);
    if (out)
        fclose(out);
    totals t = { 0 };
    for (int o = 0; o < 2; o++)
        for (int m = DROP; m <= TOOLS; m++)
            run(o ? open : qwen3, o == 1, (enum mode)m, &t, model);
    printf("  all: %d/%d replies equal a fresh process's; %d/%d later turns within %d tokens of "
           "the ideal; computed %ld, new messages and markup %ld\n", t.equal, t.replies, t.within,
           t.turns, SLACK, t.computed, t.ideal);
    unlink(open);
    unlink(model);
    rmdir(dir);
    return test_done("test_reasoning_cache_http");
}
