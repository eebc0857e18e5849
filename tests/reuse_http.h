/* reuse_http.h - what the HTTP reuse scenarios (test_swa_reuse,
 * test_recurrent_reuse) share: greedy completions of token ids against a
 * running `kvchat serve`, /tokenize, deterministic token streams, the
 * common prefix of two of them, and the five-turn conversation both run.
 * Header-only, for tests; after test.h and http_client.h. */
#ifndef KVC_TEST_REUSE_HTTP_H
#define KVC_TEST_REUSE_HTTP_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "http_client.h"
#include "test.h"

#define N_GEN  12      /* tokens each completion generates */

typedef struct reply {
    char *text;
    int   prompt_tokens, cached_tokens;
} reply;

/* POST body to path (/v1/completions or /v1/chat/completions): the first
 * choice's text (malloc'd; NULL when there is none) and the usage figures. */
static reply post_reply(int port, const char *path, const char *body)
{
    http_resp r = http_request(port, "POST", path, body, 120);
    reply out = { 0 };
    cJSON *root = r.status == 200 && r.body ? cJSON_Parse(r.body) : NULL;
    if (!root)
        fprintf(stderr, "HTTP %d: %s\n", r.status, r.body ? r.body : "(no answer)");
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    const cJSON *t = cJSON_GetObjectItem(c0, "text"), *u = cJSON_GetObjectItem(root, "usage");
    if (!t)
        t = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content");
    if (cJSON_IsString(t))
        out.text = strdup(t->valuestring);
    out.prompt_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens"));
    out.cached_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(
        cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"));
    cJSON_Delete(root);
    http_resp_free(&r);
    return out;
}

/* POST /v1/completions of the token ids, greedy, N_GEN tokens, in session
 * `key` (NULL: none), cached or not (cache_prompt false: a cold run). */
static reply complete_ex(int port, const int32_t *toks, int n, const char *key, bool cache)
{
    cJSON *body = cJSON_CreateObject(), *p = cJSON_AddArrayToObject(body, "prompt");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(p, cJSON_CreateNumber(toks[i]));
    cJSON_AddNumberToObject(body, "max_tokens", N_GEN);
    cJSON_AddNumberToObject(body, "temperature", 0);
    if (key)
        cJSON_AddStringToObject(body, "prompt_cache_key", key);
    if (!cache)
        cJSON_AddBoolToObject(body, "cache_prompt", false);
    char *text = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    reply out = post_reply(port, "/v1/completions", text);
    free(text);
    return out;
}

/* The same, in no session, cached. */
static reply complete(int port, const int32_t *toks, int n)
{
    return complete_ex(port, toks, n, NULL, true);
}

/* The token ids of text by POST /tokenize, special tokens added and parsed
 * or neither; n_out of them (malloc'd; 0 of them when the server failed). */
static int32_t *tokenize_ex(int port, const char *text, bool special, int *n_out)
{
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "content", text);
    cJSON_AddBoolToObject(body, "add_special", special);
    cJSON_AddBoolToObject(body, "parse_special", special);
    char *s = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    http_resp r = http_request(port, "POST", "/tokenize", s, 30);
    free(s);
    cJSON *root = r.status == 200 && r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *a = cJSON_GetObjectItem(root, "tokens");
    int n = cJSON_GetArraySize(a);
    int32_t *out = malloc((size_t)(n + 1) * sizeof(int32_t));
    for (int i = 0; out && i < n; i++)
        out[i] = (int32_t)cJSON_GetNumberValue(cJSON_GetArrayItem(a, i));
    *n_out = out ? n : 0;
    cJSON_Delete(root);
    http_resp_free(&r);
    return out;
}

/* The token ids of text (no special tokens added or parsed); n_out of them. */
static int32_t *tokenize(int port, const char *text, int *n_out)
{
    return tokenize_ex(port, text, false, n_out);
}

/* Appends n ids of stream `salt` (fixed, away from the vocabulary's ends). */
static int fill(int32_t *t, int at, int n, uint32_t salt, int n_vocab)
{
    const uint32_t span = (uint32_t)n_vocab - 300;
    for (int i = 0; i < n; i++)
        t[at + i] = (int32_t)(259 + (2654435761u * (uint32_t)(i + 1) + 40503u * salt) % span);
    return at + n;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

/* One model's run of the five-turn conversation. */
typedef struct reuse_case {
    const char        *bin;          /* the kvchat binary */
    const char        *path;         /* the model; the fresh references run it alone */
    const char *const *warm_args;    /* the warm server's arguments (NULL-terminated) */
    const char        *name;         /* the model, in messages */
    int                n_vocab;
    int                n_t1, n_long; /* T1's length; the new tokens of T2 */
    int                t5_slack;     /* T5 may reuse this many fewer tokens than it shares
                                      * (recurrent memory goes back to a snapshot) */
    bool               may_hit_all;  /* cached_tokens may equal the prompt's length */
} reuse_case;

/* The five turns against one warm server: T1 n_t1 ids; T2 = T1 + T1's reply
 * + n_long ids; T3 = T2 + T2's reply + 20; T4 = T1 + 60 other ids (diverges
 * right after T1); T5 = T1's first n_t1 - 20 + 60 other ids. Each turn
 * checks that prompt_tokens is what was sent, that cached_tokens is at
 * least the longest prefix shared with an earlier prompt (less t5_slack on
 * T5) and below the prompt's length (or equal, with may_hit_all), and that
 * the reply equals that of a fresh process with no disk tier. */
static inline void reuse_five_turns(const reuse_case *c)
{
    const char *const fresh_args[] = { "-m", c->path, "-t", "1", "--cache-disk", "0", NULL };
    const char *name = c->name;
    const int n_t1 = c->n_t1;
    http_server warm;
    CHECKF(http_server_start(&warm, c->bin, c->warm_args, 30), "%s: warm server", name);
    if (!warm.pid)
        return;
    enum { CAP = 2048 };
    static int32_t turn[5][CAP];
    int len[5] = { 0 };
    reply rep[5] = { { 0 } };
    for (int k = 0; k < 5; k++) {
        int32_t *t = turn[k];
        int n = 0, n_r = 0;
        int32_t *r = NULL;
        switch (k) {
        case 0: n = fill(t, 0, n_t1, 1, c->n_vocab); break;
        case 1: case 2:
            memcpy(t, turn[k - 1], (size_t)len[k - 1] * sizeof(int32_t));
            n = len[k - 1];
            r = rep[k - 1].text ? tokenize(warm.port, rep[k - 1].text, &n_r) : NULL;
            if (r && n + n_r < CAP / 2)
                memcpy(t + n, r, (size_t)n_r * sizeof(int32_t)), n += n_r;
            free(r);
            n = fill(t, n, k == 1 ? c->n_long : 20, 10 + (uint32_t)k, c->n_vocab);
            break;
        case 3:
            memcpy(t, turn[0], (size_t)n_t1 * sizeof(int32_t));
            n = fill(t, n_t1, 60, 30, c->n_vocab);
            break;
        case 4:
            memcpy(t, turn[0], (size_t)(n_t1 - 20) * sizeof(int32_t));
            n = fill(t, n_t1 - 20, 60, 40, c->n_vocab);
            break;
        }
        len[k] = n;
        int shared = 0;
        for (int j = 0; j < k; j++) {
            int p = common_prefix(t, n, turn[j], len[j]);
            shared = p > shared ? p : shared;
        }
        int want = k == 4 ? shared - c->t5_slack : shared;
        rep[k] = complete(warm.port, t, n);
        http_server fresh;
        reply f = { 0 };
        if (http_server_start(&fresh, c->bin, fresh_args, 30)) {
            f = complete(fresh.port, t, n);
            http_server_stop(&fresh);
        }
        printf("  %s T%d: %d prompt tokens, %d shared with earlier prompts, %d cached\n", name, k + 1,
               n, shared, rep[k].cached_tokens);
        CHECKF(rep[k].prompt_tokens == n, "%s T%d: prompt_tokens %d, sent %d", name, k + 1,
               rep[k].prompt_tokens, n);
        CHECKF(rep[k].cached_tokens >= want &&
               (rep[k].cached_tokens < n || (c->may_hit_all && rep[k].cached_tokens == n)),
               "%s T%d: %d tokens cached, %d shared with earlier prompts (want %d)", name, k + 1,
               rep[k].cached_tokens, shared, want);
        CHECKF(rep[k].text && f.text && strcmp(rep[k].text, f.text) == 0,
               "%s T%d: warm \"%s\" != fresh process \"%s\"", name, k + 1,
               rep[k].text ? rep[k].text : "(null)", f.text ? f.text : "(null)");
        free(f.text);
    }
    for (int k = 0; k < 5; k++)
        free(rep[k].text);
    http_server_stop(&warm);
}

#endif
