/* reuse_http.h - what the HTTP reuse scenarios (test_swa_reuse,
 * test_recurrent_reuse) share: greedy completions of token ids against a
 * running `kvchat serve`, /tokenize, deterministic token streams, and the
 * common prefix of two of them. Header-only, for tests; after
 * http_client.h. */
#ifndef KVC_TEST_REUSE_HTTP_H
#define KVC_TEST_REUSE_HTTP_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "http_client.h"

#define N_GEN  12      /* tokens each completion generates */

typedef struct reply {
    char *text;
    int   prompt_tokens, cached_tokens;
} reply;

/* POST /v1/completions of the token ids, greedy, N_GEN tokens. */
static reply complete(int port, const int32_t *toks, int n)
{
    cJSON *body = cJSON_CreateObject(), *p = cJSON_AddArrayToObject(body, "prompt");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(p, cJSON_CreateNumber(toks[i]));
    cJSON_AddNumberToObject(body, "max_tokens", N_GEN);
    cJSON_AddNumberToObject(body, "temperature", 0);
    char *text = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    http_resp r = http_request(port, "POST", "/v1/completions", text, 120);
    free(text);
    reply out = { 0 };
    cJSON *root = r.status == 200 && r.body ? cJSON_Parse(r.body) : NULL;
    if (!root)
        fprintf(stderr, "HTTP %d: %s\n", r.status, r.body ? r.body : "(no answer)");
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    const cJSON *t = cJSON_GetObjectItem(c0, "text"), *u = cJSON_GetObjectItem(root, "usage");
    if (cJSON_IsString(t))
        out.text = strdup(t->valuestring);
    out.prompt_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(u, "prompt_tokens"));
    out.cached_tokens = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(
        cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"));
    cJSON_Delete(root);
    http_resp_free(&r);
    return out;
}

/* The token ids of text (no special tokens added or parsed); n_out of them. */
static int32_t *tokenize(int port, const char *text, int *n_out)
{
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "content", text);
    cJSON_AddBoolToObject(body, "add_special", false);
    cJSON_AddBoolToObject(body, "parse_special", false);
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

#endif
