/* test_exact_http.c - over HTTP, a warm server answers exactly as a fresh
 * server process does, and later turns compute only the new message.
 *
 * One warm `kvchat serve` per model holds three conversations of six turns,
 * interleaved (one keyed by prompt_cache_key, one by user, one unkeyed), half
 * the replies streamed. The reference for every reply is a server process
 * started fresh for that one request. Greedy and seeded sampling at
 * temperature 1; random-weight BPE and SPM models made here (one a mixture
 * of experts) and the two real TinyStories models of ../shared when present. Checked: every warm reply
 * equals the fresh process's; every body and every streamed chunk is valid
 * UTF-8 and valid JSON; a cold request (cache_prompt false) on the warm server
 * gives the same reply; once the background step has finished, turns 2+
 * compute at most SLACK tokens beyond the new message and its markup.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include "test.h"

#include "chat_template.h"
#include "http_client.h"
#include "model.h"
#include "prompt.h"
#include "session.h"
#include "unicode.h"

#include <cjson/cJSON.h>

#define N_CONV  3
#define N_TURNS 6
#define SLACK   8

static const char *bin;

static const char *const USER[] = {
    "Hello! Tell me a story about a small dog.",
    "Why is the sky blue?\nAnswer in two lines.",
    "Café, naïve, 日本語, emoji 🙂 — and a tab\there.",
    "What did you say before? Repeat it.",
    "Write a list:\n- one\n- two\n- three",
    "  leading and trailing spaces  ",
    "Once upon a time there was a girl named Lily.",
    "Numbers: 3.14159, 2718, -42, 1e10.",
    "The quick brown fox jumps over the lazy dog.",
};

typedef struct reply {
    char *content;          /* malloc'd; NULL when the request failed */
    int   prompt_tokens, cached_tokens;
    bool  body_ok;          /* valid UTF-8 and JSON throughout */
} reply;

/* The reply of a non-streamed answer. */
static reply parse_plain(const http_resp *r)
{
    reply out = { 0 };
    out.body_ok = r->body && kvc_utf8_valid(r->body, r->body_len);
    cJSON *j = r->body ? cJSON_Parse(r->body) : NULL;
    out.body_ok = out.body_ok && j;
    cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
                                     "message");
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content"));
    out.content = c ? strdup(c) : NULL;
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    out.prompt_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens"));
    out.cached_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(
        cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"));
    cJSON_Delete(j);
    return out;
}

/* The reply of a stream: every data chunk parsed, the deltas joined. */
static reply parse_stream(const http_resp *r)
{
    reply out = { 0 };
    out.body_ok = r->body && kvc_utf8_valid(r->body, r->body_len);
    size_t cap = 256, len = 0;
    out.content = calloc(1, cap);
    bool done = false;
    for (char *p = r->body; p && *p && out.content;) {
        char *end = strstr(p, "\n\n");
        if (end)
            *end = 0;
        if (strncmp(p, "data: ", 6) == 0) {
            if (strcmp(p + 6, "[DONE]") == 0)
                done = true;
            else {
                cJSON *j = cJSON_Parse(p + 6);
                out.body_ok = out.body_ok && j;
                cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"),
                                                                  0), "delta");
                const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(d, "content"));
                size_t n = c ? strlen(c) : 0;
                if (len + n + 1 > cap) {
                    while (len + n + 1 > cap)
                        cap *= 2;
                    out.content = realloc(out.content, cap);
                }
                if (n && out.content) {
                    memcpy(out.content + len, c, n + 1);
                    len += n;
                }
                cJSON *u = cJSON_GetObjectItem(j, "usage");
                if (cJSON_IsObject(u)) {
                    out.prompt_tokens = (int)cJSON_GetNumberValue(
                        cJSON_GetObjectItem(u, "prompt_tokens"));
                    out.cached_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(
                        cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"));
                }
                cJSON_Delete(j);
            }
        }
        p = end ? end + 2 : NULL;
    }
    out.body_ok = out.body_ok && done;
    return out;
}

static reply chat(int port, cJSON *body, bool stream)
{
    cJSON_ReplaceItemInObject(body, "stream", cJSON_CreateBool(stream));
    char *text = cJSON_PrintUnformatted(body);
    http_resp r = http_request(port, "POST", "/v1/chat/completions", text, 60);
    free(text);
    reply out = { 0 };
    if (r.status == 200)
        out = stream ? parse_stream(&r) : parse_plain(&r);
    else
        fprintf(stderr, "HTTP %d: %s\n", r.status, r.body ? r.body : "(no answer)");
    http_resp_free(&r);
    return out;
}

/* Tokens of the conversation in body (its messages; gen: the generation
 * prompt) as a cold run has them. */
/* The template the servers run: NULL = the model's, else Jinja source
 * (given to them with --chat-template-file tmpl_file). */
static const char *tmpl_src;
static char tmpl_file[4200];

static kvc_tokbuf tokens_of(const kvc_model *m, cJSON *msgs, int n, bool gen)
{
    kvc_chat_message cm[2 * N_TURNS + 2];
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_GetArrayItem(msgs, i);
        cm[i] = (kvc_chat_message){ .role = cJSON_GetStringValue(cJSON_GetObjectItem(x, "role")),
                                    .content = cJSON_GetStringValue(
                                        cJSON_GetObjectItem(x, "content")) };
    }
    kvc_chat_template_params tp = { .jinja = tmpl_src ? tmpl_src : m->chat_template };
    kvc_chat_template *t = NULL;
    kvc_rendered r = { 0 };
    kvc_err e = { 0 };
    kvc_tokbuf b = { 0 };
    if (kvc_chat_template_new(&tp, &t, &e) == KVC_OK &&
        kvc_chat_template_apply(t, cm, (size_t)n, NULL, NULL, gen, &r, &e) == KVC_OK)
        kvc_prompt_tokenize(m, r.text, r.len, &b, &e);
    kvc_rendered_free(&r);
    kvc_chat_template_free(t);
    return b;
}

static int64_t new_tokens(const kvc_model *m, cJSON *msgs)
{
    int n = cJSON_GetArraySize(msgs);
    kvc_tokbuf now = tokens_of(m, msgs, n, true), before = tokens_of(m, msgs, n - 1, false);
    int64_t r = now.n - kvc_tokens_common(now.v, now.n, before.v, before.n);
    kvc_tokbuf_free(&now);
    kvc_tokbuf_free(&before);
    return r;
}

typedef struct totals {
    int replies, equal, bodies_ok, cold_equal, colds, slack_ok, turns2;
    int64_t computed, ideal;
} totals;

static void add_message(cJSON *msgs, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

static void run(const kvc_model *m, const char *path, const char *name, bool sampled, totals *t)
{
    const char *const args[] = { "-m", path, "-t", "1", tmpl_src ? "--chat-template-file" : NULL,
                                 tmpl_file, NULL };
    /* the reference shares nothing with the warm server, its disk tier included */
    const char *const fresh_args[] = { "-m", path, "-t", "1", "--cache-disk", "0",
                                       tmpl_src ? "--chat-template-file" : NULL, tmpl_file, NULL };
    http_server warm;
    CHECKF(http_server_start(&warm, bin, args, 30), "%s: warm server", name);
    if (!warm.pid)
        return;
    cJSON *body[N_CONV];
    for (int i = 0; i < N_CONV; i++) {
        body[i] = cJSON_CreateObject();
        cJSON *msgs = cJSON_AddArrayToObject(body[i], "messages");
        if (i == 1)
            add_message(msgs, "system", "You are a helpful assistant.");
        cJSON_AddNumberToObject(body[i], "temperature", sampled ? 1.0 : 0.0);
        cJSON_AddBoolToObject(body[i], "stream", false);
        cJSON *so = cJSON_AddObjectToObject(body[i], "stream_options");
        cJSON_AddBoolToObject(so, "include_usage", true);
        if (i == 0)
            cJSON_AddStringToObject(body[i], "prompt_cache_key", "conversation-0");
        else if (i == 1)
            cJSON_AddStringToObject(body[i], "user", "user-1");
    }
    for (int turn = 0; turn < N_TURNS; turn++)
        for (int i = 0; i < N_CONV; i++) {
            cJSON *msgs = cJSON_GetObjectItem(body[i], "messages");
            add_message(msgs, "user", USER[(size_t)(i * 4 + turn) % KVC_ARRAY_LEN(USER)]);
            cJSON_DeleteItemFromObject(body[i], "max_tokens");
            cJSON_AddNumberToObject(body[i], "max_tokens", 10 + 5 * ((i + turn) % 3));
            cJSON_DeleteItemFromObject(body[i], "seed");
            cJSON_AddNumberToObject(body[i], "seed", 100 * i + turn + 1);
            reply w = chat(warm.port, body[i], (i + turn) % 2 == 1);
            t->replies++;
            t->bodies_ok += w.body_ok;
            CHECKF(w.content && w.body_ok, "%s conv %d turn %d: warm body not valid", name, i,
                   turn);
            CHECKF(http_wait_background(warm.port), "%s: background work never finished", name);
            if (turn > 0) {
                int64_t ideal = new_tokens(m, msgs);
                int computed = w.prompt_tokens - w.cached_tokens;
                t->turns2++;
                t->computed += computed;
                t->ideal += ideal;
                t->slack_ok += computed <= ideal + SLACK;
                CHECKF(computed <= ideal + SLACK, "%s conv %d turn %d: computed %d tokens, the new "
                       "message and its markup are %lld", name, i, turn, computed,
                       (long long)ideal);
            }
            http_server fresh;
            reply f = { 0 };
            if (http_server_start(&fresh, bin, fresh_args, 30)) {
                f = chat(fresh.port, body[i], false);
                http_server_stop(&fresh);
            }
            bool eq = w.content && f.content && strcmp(w.content, f.content) == 0;
            t->equal += eq;
            CHECKF(eq, "%s %s conv %d turn %d: warm \"%s\" != fresh process \"%s\"", name,
                   sampled ? "seeded" : "greedy", i, turn, w.content ? w.content : "(null)",
                   f.content ? f.content : "(null)");
            if (turn == 2) {                 /* a cold request on the warm server */
                cJSON_AddBoolToObject(body[i], "cache_prompt", false);
                reply c = chat(warm.port, body[i], false);
                cJSON_DeleteItemFromObject(body[i], "cache_prompt");
                t->colds++;
                bool ceq = c.content && f.content && strcmp(c.content, f.content) == 0;
                t->cold_equal += ceq;
                CHECKF(ceq && c.cached_tokens == 0, "%s conv %d: cache_prompt false gave \"%s\" "
                       "(cached %d)", name, i, c.content ? c.content : "(null)", c.cached_tokens);
                free(c.content);
            }
            add_message(msgs, "assistant", w.content ? w.content : "");
            free(w.content);
            free(f.content);
        }
    for (int i = 0; i < N_CONV; i++)
        cJSON_Delete(body[i]);
    http_server_stop(&warm);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        printf("test_exact_http: skipped ($KVC_BIN not set)\n");
        return TEST_SKIP;
    }
    char dir[] = "/tmp/kvc_exact_http_XXXXXX", path[4200];
    if (!mkdtemp(dir))
        return 1;
    struct { const char *name, *preset, *file; } models[] = {
        { "random qwen2 (BPE)", "tiny", NULL },
        { "random llama (SPM)", "tiny-llama", NULL },
        { "random qwen3moe (SPM, 8 experts, top-2)", "tiny-qwen3moe", NULL },
        { "TinyStories-656K", NULL, "TinyStories-656K-Q8_0.gguf" },
        { "stories260K", NULL, "stories260K.gguf" },
    };
    const char *shared = test_shared_dir();
    totals t = { 0 };
    for (size_t k = 0; k < KVC_ARRAY_LEN(models); k++) {
        char err[512];
        if (models[k].preset) {
            kvc_gen_params g;
            kvc_gen_preset(models[k].preset, &g);
            snprintf(path, sizeof(path), "%s/%s.gguf", dir, models[k].preset);
            CHECKF(kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK, "%s", err);
        } else if (shared) {
            snprintf(path, sizeof(path), "%s/models/%s", shared, models[k].file);
        } else {
            printf("  %s: skipped (no ../shared)\n", models[k].name);
            continue;
        }
        kvc_model *m = NULL;
        CHECKF(kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK, "%s", err);
        if (!m)
            continue;
        totals before = t;
        run(m, path, models[k].name, false, &t);
        run(m, path, models[k].name, true, &t);
        printf("  %s: %d/%d replies equal a fresh process's; turns 2+ computed %lld tokens, new "
               "messages and markup %lld\n", models[k].name, t.equal - before.equal,
               t.replies - before.replies, (long long)(t.computed - before.computed),
               (long long)(t.ideal - before.ideal));
        kvc_model_free(m);
        if (models[k].preset)
            unlink(path);
    }
    /* a template that drops the reasoning block from history (test_exact.c) */
    static const char think[] =
        "{%- for message in messages %}{%- if message.role == 'assistant' %}"
        "{%- set content = message.content %}{%- if '</think>' in content %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
        "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}{%- else %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";
    snprintf(tmpl_file, sizeof(tmpl_file), "%s/think.jinja", dir);
    snprintf(path, sizeof(path), "%s/think.gguf", dir);
    FILE *fp = fopen(tmpl_file, "w");
    kvc_gen_params g;
    char err[512];
    kvc_gen_preset("tiny", &g);
    kvc_model *m = NULL;
    if (fp && fputs(think, fp) >= 0 && fclose(fp) == 0 &&
        kvc_gen_write(&g, path, err, sizeof(err)) == KVC_OK &&
        kvc_model_load(path, NULL, &m, err, sizeof(err)) == KVC_OK) {
        totals before = t;
        tmpl_src = think;
        run(m, path, "reasoning dropped", false, &t);
        tmpl_src = NULL;
        printf("  reasoning dropped from history: %d/%d replies equal a fresh process's; turns 2+ "
               "computed %lld tokens, new messages and markup %lld\n", t.equal - before.equal,
               t.replies - before.replies, (long long)(t.computed - before.computed),
               (long long)(t.ideal - before.ideal));
    } else
        CHECKF(0, "the reasoning template's model: %s", err);
    kvc_model_free(m);
    unlink(path);
    unlink(tmpl_file);
    rmdir(dir);
    printf("  all: %d/%d equal; %d/%d bodies valid; cache_prompt false %d/%d equal; %d/%d later "
           "turns within %d tokens of the ideal\n", t.equal, t.replies, t.bodies_ok, t.replies,
           t.cold_equal, t.colds, t.slack_ok, t.turns2, SLACK);
    return test_done("test_exact_http");
}
