/* test_agent_http.c - the agent API of `kvchat serve` over HTTP (issue 13):
 * nothing silently dropped (answer-changing fields, bad response_format, schema
 * features, logit_bias, tool_choice: 400s naming them), logit_bias steering
 * greedy decoding, logprobs equal to `kvchat eval`'s for the same tokens,
 * completions with token ids and lists of prompts, streams with logprobs in
 * every chunk and with several choices, content parts joined with
 * "\n", CORS preflight and headers, --alias, /tokenize and /detokenize, and
 * `kvchat tokenize` on a vocab-only GGUF.
 *
 * Needs $KVC_BIN (set by CTest); skips without it. */
#include <cjson/cJSON.h>
#include <math.h>

#include "http_client.h"
#include "kvchat.h"
#include "test.h"

static const char *bin;
static char model_path[64], vocab_path[64];

/* POST body to path; the answer (caller frees). */
static http_resp post(int port, const char *path, const char *body)
{
    return http_request(port, "POST", path, body, 60);
}

/* The answer is a 400 whose error.param is `param` and whose message has `word`. */
static void check_400(int port, const char *path, const char *body, const char *param,
                      const char *word)
{
    http_resp r = post(port, path, body);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    cJSON *e = cJSON_GetObjectItem(j, "error");
    const char *p = cJSON_GetStringValue(cJSON_GetObjectItem(e, "param"));
    const char *m = cJSON_GetStringValue(cJSON_GetObjectItem(e, "message"));
    CHECKF(r.status == 400, "%s: status %d (%s)", body, r.status, r.body ? r.body : "");
    CHECKF(p && !strcmp(p, param), "%s: param %s, wanted %s", body, p ? p : "null", param);
    CHECKF(m && strstr(m, word), "%s: message '%s' lacks '%s'", body, m ? m : "", word);
    cJSON_Delete(j);
    http_resp_free(&r);
}

static void test_rejects(int port)
{
    const char *chat = "/v1/chat/completions";
    /* a field that would change the answer and cannot be honoured (unknown
     * ones are hints now: test_dialects_http's field policy) */
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"ignore_eos\":true}", "ignore_eos", "change the answer");
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"response_format\":{\"type\":\"sound\"}}", "response_format.type", "sound");
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
              "{\"type\":\"array\",\"uniqueItems\":true}}}}",
              "response_format.json_schema.schema", "uniqueItems");
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"logit_bias\":\"bad\"}", "logit_bias", "logit_bias");
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"logit_bias\":{\"99999999\":1}}", "logit_bias", "token id");
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"logit_bias\":{\"5\":150}}", "logit_bias", "-100 and 100");
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"tool_choice\":\"required\"}", "tool_choice", "requires tools");
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":"
              "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":"
              "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", "tool_choice", "'g'");
    /* a GBNF grammar with forced calls would go unused; response_format
     * shapes a later turn's text (the Agents SDK sends both): taken */
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":"
              "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":"
              "\"required\",\"grammar\":\"root ::= [a-z]*\"}", "tool_choice", "grammar");
    http_resp rf = post(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                        "\"tool_choice\":\"required\",\"max_tokens\":60,\"response_format\":"
                        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":"
                        "{\"type\":\"object\"}}}}");
    CHECKF(rf.status == 200 && rf.body && strstr(rf.body, "\"tool_calls\":[{") &&
           strstr(rf.body, "\"name\":\"f\""), "response_format with a forced call: %d %s",
           rf.status, rf.body ? rf.body : "");
    http_resp_free(&rf);
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"top_logprobs\":3}", "top_logprobs", "logprobs");
    check_400(port, "/v1/completions", "{\"prompt\":[1,2,99999999]}", "prompt", "token ids");
    check_400(port, "/v1/completions", "{\"prompt\":\"x\",\"echo\":true}", "echo", "echo");
    /* text is fine */
    http_resp r = post(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                       "\"max_tokens\":2,\"response_format\":{\"type\":\"text\"},\"store\":false}");
    CHECKF(r.status == 200, "response_format text: %d", r.status);
    http_resp_free(&r);
}

/* The text of token id (via /detokenize). */
static char *piece_of(int port, int id)
{
    char body[64];
    snprintf(body, sizeof(body), "{\"tokens\":[%d]}", id);
    http_resp r = post(port, "/detokenize", body);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(j, "content"));
    char *s = strdup(c ? c : "");
    cJSON_Delete(j);
    http_resp_free(&r);
    return s;
}

static void test_logit_bias(int port)
{
    /* +100 on one ordinary token makes greedy decoding repeat it */
    const int id = 300;
    char body[256];
    snprintf(body, sizeof(body), "{\"prompt\":[10,11,12],\"max_tokens\":4,\"temperature\":0,"
             "\"logit_bias\":{\"%d\":100}}", id);
    http_resp r = post(port, "/v1/completions", body);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text"));
    char *p = piece_of(port, id), want[256] = "";
    for (int i = 0; i < 4; i++)
        strncat(want, p, sizeof(want) - strlen(want) - 1);
    CHECKF(text && !strcmp(text, want), "logit_bias: '%s', wanted '%s'", text ? text : "", want);
    free(p);
    cJSON_Delete(j);
    http_resp_free(&r);
}

/* `kvchat eval` at the last of tokens[0, n): the argmax and log p of every
 * token (log-softmax of the full logits). false when it failed. */
static bool eval_last(const int *tokens, int n, int n_vocab, int *argmax, double *lp)
{
    char cmd[8192];
    int k = snprintf(cmd, sizeof(cmd), "'%s' eval -m %s --top %d --from %d --json --tokens ", bin,
                     model_path, n_vocab, n - 1);
    for (int i = 0; i < n; i++)
        k += snprintf(cmd + k, sizeof(cmd) - (size_t)k, "%s%d", i ? "," : "", tokens[i]);
    FILE *f = popen(cmd, "r");
    size_t cap = 1 << 20, len = 0;
    char *out = malloc(cap);
    for (size_t got; f && out && (got = fread(out + len, 1, cap - len - 1, f)) > 0;) {
        len += got;
        if (len + 1 >= cap)
            out = realloc(out, cap *= 2);
    }
    if (f)
        pclose(f);
    if (!out)
        return false;
    out[len] = 0;
    cJSON *j = cJSON_Parse(out);
    free(out);
    cJSON *last = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "logits"), 0);
    cJSON *top = cJSON_GetObjectItem(last, "top"), *e;
    double mx = -INFINITY, sum = 0;
    cJSON_ArrayForEach(e, top)
        mx = fmax(mx, cJSON_GetArrayItem(e, 1)->valuedouble);
    for (int i = 0; i < n_vocab; i++)
        lp[i] = -INFINITY;
    cJSON_ArrayForEach(e, top)
        sum += exp(cJSON_GetArrayItem(e, 1)->valuedouble - mx);
    cJSON_ArrayForEach(e, top)
        lp[(int)cJSON_GetArrayItem(e, 0)->valuedouble] =
            cJSON_GetArrayItem(e, 1)->valuedouble - mx - log(sum);
    *argmax = top ? (int)cJSON_GetArrayItem(cJSON_GetArrayItem(top, 0), 0)->valuedouble : -1;
    bool ok = cJSON_GetArraySize(top) == n_vocab;
    cJSON_Delete(j);
    return ok;
}

static int desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_logprobs(int port, int n_vocab)
{
    int toks[16] = { 20, 21, 22, 23, 24, 25, 26, 27 }, n = 8;
    http_resp r = post(port, "/v1/completions", "{\"prompt\":[20,21,22,23,24,25,26,27],"
                       "\"max_tokens\":4,\"temperature\":0,\"logprobs\":3}");
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
                                    "logprobs");
    cJSON *tl = cJSON_GetObjectItem(lp, "token_logprobs"), *top = cJSON_GetObjectItem(lp, "top_logprobs");
    CHECKF(cJSON_GetArraySize(tl) == 4, "logprobs: %s", r.body ? r.body : "");
    double *ref = malloc((size_t)n_vocab * sizeof(double)), worst = 0;
    for (int k = 0; k < cJSON_GetArraySize(tl) && ref; k++) {
        int g;
        CHECK(eval_last(toks, n, n_vocab, &g, ref));
        double got = cJSON_GetArrayItem(tl, k)->valuedouble;
        worst = fmax(worst, fabs(got - ref[g]));
        CHECKF(fabs(got - ref[g]) < 1e-3, "token %d: server %f, eval %f", k, got, ref[g]);
        /* the 3 best: the same values */
        double s[3], e[3];
        int m = 0;
        cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetArrayItem(top, k)) if (m < 3) s[m++] = x->valuedouble;
        qsort(ref, (size_t)n_vocab, sizeof(double), desc);
        memcpy(e, ref, sizeof(e));
        for (int i = 0; i < m; i++)
            CHECKF(fabs(s[i] - e[i]) < 1e-3, "top %d of token %d: %f vs %f", i, k, s[i], e[i]);
        toks[n++] = g;                       /* greedy: the argmax is what came out */
    }
    printf("logprobs vs kvchat eval: largest difference %.2e over 4 tokens\n", worst);
    free(ref);
    cJSON_Delete(j);
    http_resp_free(&r);
}

static void test_prompts_and_parts(int port)
{
    http_resp r = post(port, "/v1/completions", "{\"prompt\":[\"ab\",[1,2,3]],\"max_tokens\":2}");
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    CHECKF(r.status == 200 && cJSON_GetArraySize(ch) == 2, "prompt list: %s", r.body ? r.body : "");
    CHECK_EQ_INT(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 1), "index")->valueint, 1);
    cJSON_Delete(j);
    http_resp_free(&r);
    r = post(port, "/apply-template", "{\"messages\":[{\"role\":\"user\",\"content\":["
             "{\"type\":\"text\",\"text\":\"What is\"},{\"type\":\"text\",\"text\":\"the best\"}]}]}");
    CHECKF(r.body && strstr(r.body, "What is\\nthe best"), "parts: %s", r.body ? r.body : "");
    http_resp_free(&r);
}

static char *streamed_body(const char *body);

static double usage_num(const cJSON *j, const char *detail)
{
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    return cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"),
                                                    detail));
}

/* n = 3: the prompt computed once (the others find it in the prefix tree;
 * each recomputes at most its last partial block). */
static void test_n(int port)
{
    char body[4096];
    int k = snprintf(body, sizeof(body), "{\"prompt\":\"");
    for (int i = 0; i < 40; i++)
        k += snprintf(body + k, sizeof(body) - (size_t)k, "line %d of a long prompt. ", i);
    snprintf(body + k, sizeof(body) - (size_t)k, "\",\"n\":3,\"max_tokens\":3,\"seed\":7}");
    http_resp m0 = http_request(port, "GET", "/metrics", NULL, 10);
    http_resp r = post(port, "/v1/completions", body);
    http_resp m1 = http_request(port, "GET", "/metrics", NULL, 10);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    int prompt = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"),
                                                               "prompt_tokens"));
    double done = http_prom(m1.body ? m1.body : "", "kvchat_computed_tokens_total") -
                  http_prom(m0.body ? m0.body : "", "kvchat_computed_tokens_total");
    CHECKF(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")) == 3, "n=3: %s", r.body);
    /* usage counts a completion's prompt once per prompt given */
    CHECKF(prompt > 100 && done >= prompt && done < prompt + 2 * 16,
           "n=3: prompt %d, computed %.0f", prompt, done);
    printf("n=3: prompt %d tokens, computed %.0f\n", prompt, done);
    /* its cached part once too: nothing of this new prompt was cached when it
     * came (the choices after the first find it, which is not the prompt's
     * cached part; summed they gave 2x the prompt) */
    int cached = (int)usage_num(j, "cached_tokens");
    CHECKF(cached == 0, "n=3, a new prompt: cached_tokens %d of %d", cached, prompt);
    cJSON_Delete(j);
    http_resp_free(&r);
    /* the same again, whole and streamed: all but the last block cached, once */
    r = post(port, "/v1/completions", body);
    j = r.body ? cJSON_Parse(r.body) : NULL;
    cached = (int)usage_num(j, "cached_tokens");
    CHECKF(cached >= prompt - 16 && cached < prompt, "n=3 again: cached %d of %d", cached, prompt);
    CHECKF(usage_num(j, "cached_disk_tokens") == 0, "no disk tier, yet disk tokens: %s", r.body);
    cJSON_Delete(j);
    http_resp_free(&r);
    char *sb = streamed_body(body);
    r = post(port, "/v1/completions", sb);
    const char *u = r.body ? strstr(r.body, "\"usage\":{") : NULL;
    j = u ? cJSON_Parse(u + 8) : NULL;       /* the usage object, up to its end */
    int scached = (int)cJSON_GetNumberValue(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "prompt_tokens_details"), "cached_tokens"));
    CHECKF(scached >= prompt - 16 && scached < prompt, "n=3 streamed: cached %d of %d", scached,
           prompt);
    printf("n=3: cached_tokens %d new, %d again, %d streamed (prompt %d)\n", 0, cached, scached,
           prompt);
    free(sb);
    cJSON_Delete(j);
    http_resp_free(&r);
    http_resp_free(&m0);
    http_resp_free(&m1);
}

/* The texts of a completion's choices (malloc'd, n of them). */
static void choice_texts(int port, const char *body, char **out, int n)
{
    http_resp r = post(port, "/v1/completions", body);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    CHECKF(r.status == 200 && cJSON_GetArraySize(ch) == n, "%s: %s", body, r.body ? r.body : "");
    for (int i = 0; i < n; i++) {
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, i), "text"));
        out[i] = strdup(t ? t : "(none)");
    }
    cJSON_Delete(j);
    http_resp_free(&r);
}

/* A fixed seed makes every choice deterministic, whatever the seed: choice k
 * samples with seed + k modulo 2^64 - 1, never the all-ones "random" (-2 + 1
 * was -1, so choice 1 of seed -2 was random). */
static void test_seed_choices(int port)
{
    const char *b2 = "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":1.5,"
                     "\"seed\":-2,\"n\":2}";
    const char *b0 = "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":1.5,"
                     "\"seed\":0}";
    char *a[2], *b[2], *z[1];
    choice_texts(port, b2, a, 2);
    choice_texts(port, b2, b, 2);
    choice_texts(port, b0, z, 1);
    CHECKF(!strcmp(a[0], b[0]) && !strcmp(a[1], b[1]), "seed -2, n 2: '%s' '%s', then '%s' '%s'",
           a[0], a[1], b[0], b[1]);
    CHECKF(!strcmp(a[1], z[0]), "choice 1 of seed -2 is '%s', seed 0 gives '%s'", a[1], z[0]);
    printf("seed -2, n 2: choice 1 '%s' twice, = seed 0's\n", a[1]);
    free(a[0]), free(a[1]), free(b[0]), free(b[1]), free(z[0]);
    /* an empty prompt on a vocabulary without BOS: nothing to continue from */
    http_resp r = post(port, "/v1/completions", "{\"prompt\":\"\",\"max_tokens\":2}");
    CHECKF(r.status == 400 && r.body && strstr(r.body, "BOS"), "empty prompt: %d %s", r.status,
           r.body ? r.body : "");
    http_resp_free(&r);
}

/* ------------------------------------------------------------- streaming */

#define MAX_CHOICES 16

/* A stream read back: per choice, the text, the logprobs of every chunk
 * joined (chat: the "content" entries; completions: the four lists), the
 * finish chunks; the usage chunks; and the order of the text chunks' choices. */
typedef struct streamed {
    char  *text[MAX_CHOICES];
    cJSON *lp[MAX_CHOICES];
    int    n_finish[MAX_CHOICES];
    int    n_usage, prompt_tokens, completion_tokens;
    int    order[512], n_order;
    bool   done_last;
} streamed;

static void streamed_free(streamed *s)
{
    for (int i = 0; i < MAX_CHOICES; i++) {
        free(s->text[i]);
        cJSON_Delete(s->lp[i]);
    }
}

static void append(char **dst, const char *s, size_t n)
{
    size_t k = *dst ? strlen(*dst) : 0;
    *dst = realloc(*dst, k + n + 1);
    memcpy(*dst + k, s, n);
    (*dst)[k + n] = 0;
}

/* The text the tokens of a chunk's logprobs stand for (chat: their bytes;
 * completions: their token strings). */
static char *logprobs_text(bool chat, const cJSON *lp)
{
    char *t = calloc(1, 1);
    const cJSON *x, *b;
    if (!chat) {
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(lp, "tokens"))
            append(&t, x->valuestring, strlen(x->valuestring));
        return t;
    }
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(lp, "content"))
        cJSON_ArrayForEach(b, cJSON_GetObjectItem(x, "bytes")) {
            char c = (char)b->valueint;
            append(&t, &c, 1);
        }
    return t;
}

/* Join a chunk's logprobs onto what the choice has. */
static void join_logprobs(bool chat, cJSON **acc, const cJSON *lp)
{
    if (!*acc)
        *acc = chat ? cJSON_CreateArray() : cJSON_CreateObject();
    const char *lists[] = { "tokens", "token_logprobs", "top_logprobs", "text_offset" };
    const cJSON *x;
    if (chat) {
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(lp, "content"))
            cJSON_AddItemToArray(*acc, cJSON_Duplicate(x, true));
        return;
    }
    for (int k = 0; k < 4; k++) {
        cJSON *to = cJSON_GetObjectItem(*acc, lists[k]);
        if (!to)
            to = cJSON_AddArrayToObject(*acc, lists[k]);
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(lp, lists[k]))
            cJSON_AddItemToArray(to, cJSON_Duplicate(x, true));
    }
}

/* Read an SSE body. Every text chunk must carry logprobs whose tokens are
 * its text when `exact` (with a stop string, the last may show part of one). */
static void read_stream(char *body, bool chat, bool logprobs, bool exact, streamed *s)
{
    memset(s, 0, sizeof(*s));
    char *save = NULL;
    for (char *ev = strtok_r(body, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
        s->done_last = !strcmp(ev, "data: [DONE]");
        cJSON *c = s->done_last ? NULL : cJSON_Parse(ev + 6);
        cJSON *ch = cJSON_GetObjectItem(c, "choices"), *x;
        if (c && cJSON_GetArraySize(ch) == 0 && cJSON_IsObject(cJSON_GetObjectItem(c, "usage"))) {
            cJSON *u = cJSON_GetObjectItem(c, "usage");
            s->n_usage++;
            s->prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
            s->completion_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
        }
        cJSON_ArrayForEach(x, ch) {
            int i = cJSON_GetObjectItem(x, "index")->valueint;
            CHECKF(i >= 0 && i < MAX_CHOICES && cJSON_GetArraySize(ch) == 1, "chunk %.200s", ev);
            if (i < 0 || i >= MAX_CHOICES)
                continue;
            cJSON *d = chat ? cJSON_GetObjectItem(x, "delta") : x;
            const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(d, chat ? "content" : "text"));
            cJSON *lp = cJSON_GetObjectItem(x, "logprobs");
            if (!s->text[i])
                s->text[i] = calloc(1, 1);
            if (t && *t) {
                append(&s->text[i], t, strlen(t));
                if (s->n_order < 512)
                    s->order[s->n_order++] = i;
                char *lt = logprobs ? logprobs_text(chat, lp) : NULL;
                CHECKF(!logprobs || (exact ? !strcmp(lt, t) : !strncmp(lt, t, strlen(t))),
                       "chunk text '%s', its tokens '%s'", t, lt ? lt : "");
                CHECKF(logprobs || cJSON_IsNull(lp), "logprobs not asked for: %.200s", ev);
                free(lt);
            }
            if (logprobs && cJSON_IsObject(lp))
                join_logprobs(chat, &s->lp[i], lp);
            if (cJSON_IsString(cJSON_GetObjectItem(x, "finish_reason")))
                s->n_finish[i]++;
        }
        cJSON_Delete(c);
    }
}

/* The whole response's choice i: its text and its logprobs list. */
static const char *whole_text(cJSON *j, bool chat, int i)
{
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), i);
    return cJSON_GetStringValue(chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"),
                                                           "content")
                                     : cJSON_GetObjectItem(c, "text"));
}

static cJSON *whole_logprobs(cJSON *j, bool chat, int i)
{
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), i);
    cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
    return chat ? cJSON_GetObjectItem(lp, "content") : lp;
}

/* `body` with "stream": true (and include_usage) added before its closing brace. */
static char *streamed_body(const char *body)
{
    size_t n = strlen(body);
    char *s = malloc(n + 80);
    snprintf(s, n + 80, "%.*s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             (int)n - 1, body);
    return s;
}

/* The same request whole and streamed: per choice the same text, and with
 * logprobs the streamed chunks' lists joined are the whole response's. */
static void check_stream_matches(int port, const char *path, const char *body, int n_choices,
                                 bool logprobs, bool exact, streamed *s)
{
    bool chat = strstr(path, "chat") != NULL;
    http_resp w = post(port, path, body);
    char *sb = streamed_body(body);
    http_resp r = post(port, path, sb);
    cJSON *j = w.body ? cJSON_Parse(w.body) : NULL;
    CHECKF(w.status == 200 && r.status == 200, "%s: %d, streamed %d (%s)", body, w.status,
           r.status, r.body ? r.body : "");
    CHECKF(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")) == n_choices, "%s", w.body);
    read_stream(r.body ? r.body : (char[]){ 0 }, chat, logprobs, exact, s);
    CHECK(s->done_last && s->n_usage == 1);
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    CHECK_EQ_INT(s->prompt_tokens, cJSON_GetObjectItem(u, "prompt_tokens")->valueint);
    CHECK_EQ_INT(s->completion_tokens, cJSON_GetObjectItem(u, "completion_tokens")->valueint);
    for (int i = 0; i < n_choices; i++) {
        const char *t = whole_text(j, chat, i);
        CHECKF(t && s->text[i] && !strcmp(t, s->text[i]), "%s choice %d: streamed '%s', whole "
               "'%s'", body, i, s->text[i] ? s->text[i] : "(none)", t ? t : "(none)");
        CHECK_EQ_INT(s->n_finish[i], 1);
        if (!logprobs)
            continue;
        cJSON *want = whole_logprobs(j, chat, i);
        CHECKF(want && s->lp[i] && cJSON_Compare(want, s->lp[i], true),
               "%s choice %d: streamed logprobs differ from the whole response's", body, i);
        int nw = chat ? cJSON_GetArraySize(want)
                      : cJSON_GetArraySize(cJSON_GetObjectItem(want, "tokens"));
        printf("streamed %s: choice %d, %d tokens' logprobs as the whole response's\n",
               chat ? "chat" : "completion", i, nw);
    }
    free(sb);
    cJSON_Delete(j);
    http_resp_free(&w);
    http_resp_free(&r);
}

/* Streamed logprobs: each chunk carries its own tokens', and together they
 * are the whole response's (seeded sampling and greedy; a stop string, whose
 * tokens the whole response lists too). */
static void test_stream_logprobs(int port)
{
    streamed s;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],"
                       "\"max_tokens\":24,\"temperature\":1,\"seed\":42,\"logprobs\":true,"
                       "\"top_logprobs\":2}";
    check_stream_matches(port, "/v1/chat/completions", chat, 1, true, true, &s);
    streamed_free(&s);
    const char *cmpl = "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,"
                       "\"logprobs\":3}";
    check_stream_matches(port, "/v1/completions", cmpl, 1, true, true, &s);
    /* a stop string from the middle of that text: its tokens are not shown */
    const char *t = s.text[0] ? s.text[0] : "";
    size_t n = strlen(t);
    char stop[8] = "", body[512];
    for (size_t k = n / 2; k + 3 <= n && !stop[0]; k++)
        if ((t[k] & 0xC0) != 0x80 && (t[k + 1] & 0xC0) != 0x80 && (t[k + 2] & 0xC0) != 0x80 &&
            t[k] != '"' && t[k] != '\\' && t[k + 1] != '"' && t[k + 1] != '\\' &&
            (unsigned char)t[k] >= ' ' && (unsigned char)t[k + 1] >= ' ')
            memcpy(stop, t + k, 2);
    streamed_free(&s);
    CHECKF(stop[0], "no stop string found in '%s'", t);
    snprintf(body, sizeof(body), "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,"
             "\"temperature\":0,\"logprobs\":3,\"stop\":\"%s\"}", stop);
    check_stream_matches(port, "/v1/completions", body, 1, true, false, &s);
    streamed_free(&s);
}

/* stream with n = 3 (chat) and with two prompts times n = 2 (completions):
 * interleaved choices, each the text the whole response gives (the same
 * seeds), a finish chunk each, one usage chunk counting them all. */
static void test_stream_n(int port)
{
    streamed s;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],"
                       "\"max_tokens\":16,\"temperature\":1,\"seed\":11,\"n\":3}";
    check_stream_matches(port, "/v1/chat/completions", chat, 3, false, true, &s);
    int last0 = -1;                       /* choice 0's last text chunk */
    for (int k = 0; k < s.n_order; k++)
        if (s.order[k] == 0)
            last0 = k;
    bool interleaved = false;             /* another choice's text before it */
    for (int k = 0; k < last0; k++)
        interleaved |= s.order[k] > 0;
    printf("stream n=3: %d text chunks, interleaved %d\n", s.n_order, interleaved);
    CHECKF(interleaved, "the choices' chunks are not interleaved");
    streamed_free(&s);
    const char *cmpl = "{\"prompt\":[\"Once upon a time\",[1,2,3]],\"max_tokens\":8,"
                       "\"temperature\":1,\"seed\":5,\"n\":2,\"logprobs\":1}";
    check_stream_matches(port, "/v1/completions", cmpl, 4, true, true, &s);
    streamed_free(&s);
}

static void test_cors_alias_tokenize(int port)
{
    http_resp r = http_request_ex(port, "OPTIONS", "/v1/chat/completions",
                                  "Origin: http://ok.example\r\n"
                                  "Access-Control-Request-Method: POST\r\n", NULL, 10);
    CHECKF(r.status == 204, "preflight: %d", r.status);
    CHECK(r.raw && strstr(r.raw, "Access-Control-Allow-Origin: http://ok.example"));
    CHECK(r.raw && strstr(r.raw, "Access-Control-Expose-Headers: X-Kvchat-Ignored-Fields"));
    http_resp_free(&r);
    r = http_request_ex(port, "GET", "/v1/models", "Origin: http://bad.example\r\n", NULL, 10);
    CHECK(r.status == 200 && r.raw && !strstr(r.raw, "Access-Control-Allow-Origin"));
    CHECKF(r.body && strstr(r.body, "\"id\":\"my-alias\""), "alias: %s", r.body ? r.body : "");
    http_resp_free(&r);
    r = post(port, "/tokenize", "{\"content\":\"hello world\"}");
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    cJSON *t = cJSON_GetObjectItem(j, "tokens");
    CHECKF(cJSON_GetArraySize(t) > 0, "tokenize: %s", r.body ? r.body : "");
    char *ids = cJSON_PrintUnformatted(t), body[4200];
    snprintf(body, sizeof(body), "{\"tokens\":%s}", ids ? ids : "[]");
    http_resp_free(&r);
    r = post(port, "/detokenize", body);
    CHECKF(r.body && strstr(r.body, "\"content\":\"hello world\""), "detokenize: %s",
           r.body ? r.body : "");
    http_resp_free(&r);
    /* `kvchat tokenize --ids` on the vocab-only file: the same ids */
    char cmd[512], line[4200] = "";
    snprintf(cmd, sizeof(cmd), "'%s' tokenize -m %s --ids --no-bos 'hello world'", bin, vocab_path);
    FILE *f = popen(cmd, "r");
    if (f && !fgets(line, sizeof(line), f))
        line[0] = 0;
    int st = f ? pclose(f) : -1;
    cJSON *vl = cJSON_Parse(line);
    char *c = vl ? cJSON_PrintUnformatted(vl) : NULL;
    cJSON_Delete(vl);
    CHECKF(st == 0 && c && ids && !strcmp(c, ids), "vocab-only tokenize: '%s' vs %s", line,
           ids ? ids : "");
    free(c);
    free(ids);
    cJSON_Delete(j);
}

int main(void)
{
    bin = getenv("KVC_BIN");
    if (!bin || !*bin)
        return TEST_SKIP;
    kvc_gen_params gp;
    kvc_gen_preset("tiny", &gp);
    snprintf(model_path, sizeof(model_path), "/tmp/kvc_agent_%d.gguf", (int)getpid());
    snprintf(vocab_path, sizeof(vocab_path), "/tmp/kvc_agent_vocab_%d.gguf", (int)getpid());
    char err[256];
    CHECK(kvc_gen_write(&gp, model_path, err, sizeof(err)) == KVC_OK);
    gp.vocab_only = true;
    gp.arch = "llama";                       /* any architecture: only the vocabulary is read */
    CHECK(kvc_gen_write(&gp, vocab_path, err, sizeof(err)) == KVC_OK);
    kvc_model *m = NULL;
    kvc_model_info info = { 0 };
    if (kvc_model_load(model_path, NULL, &m, err, sizeof(err)) == KVC_OK)
        kvc_model_get_info(m, &info);
    kvc_model_free(m);
    const char *args[] = { "-m", model_path, "--alias", "my-alias", "--cors-origins",
                           "http://ok.example,http://also.example", "--parallel", "2",
                           "--cache-disk", "0", NULL };   /* no disk tier: what is computed
                                                             does not depend on earlier runs */
    http_server s;
    CHECK(info.n_vocab > 0 && http_server_start(&s, bin, args, 60));
    if (s.port > 0) {
        test_rejects(s.port);
        test_logit_bias(s.port);
        test_logprobs(s.port, info.n_vocab);
        test_prompts_and_parts(s.port);
        test_n(s.port);
        test_seed_choices(s.port);
        test_stream_logprobs(s.port);
        test_stream_n(s.port);
        test_cors_alias_tokenize(s.port);
    }
    http_server_stop(&s);
    unlink(model_path);
    unlink(vocab_path);
    return test_done("test_agent_http");
}
