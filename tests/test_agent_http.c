/* test_agent_http.c - the agent API of `kvchat serve` over HTTP (issue 13):
 * nothing silently ignored (unknown fields, bad response_format, schema
 * features, logit_bias, tool_choice: 400s naming them), logit_bias steering
 * greedy decoding, logprobs equal to `kvchat eval`'s for the same tokens,
 * completions with token ids and lists of prompts, content parts joined with
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
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"foo\":1}",
              "foo", "unknown field");
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
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
              "\"top_logprobs\":3}", "top_logprobs", "logprobs");
    check_400(port, chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2,"
              "\"stream\":true}", "n", "stream");
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
    cJSON_Delete(j);
    http_resp_free(&r);
    http_resp_free(&m0);
    http_resp_free(&m1);
}

static void test_cors_alias_tokenize(int port)
{
    http_resp r = http_request_ex(port, "OPTIONS", "/v1/chat/completions",
                                  "Origin: http://ok.example\r\n"
                                  "Access-Control-Request-Method: POST\r\n", NULL, 10);
    CHECKF(r.status == 204, "preflight: %d", r.status);
    CHECK(r.raw && strstr(r.raw, "Access-Control-Allow-Origin: http://ok.example"));
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
        test_cors_alias_tokenize(s.port);
    }
    http_server_stop(&s);
    unlink(model_path);
    unlink(vocab_path);
    return test_done("test_agent_http");
}
