/* dialects_http.h - what the HTTP tests of the API dialects
 * (test_dialects_http, test_dialects_reasoning_http) share: POSTs carrying
 * each API's key header, JSON answers read by path, server-sent events split
 * into (event, data) pairs, a prompt rendered through /apply-template, the
 * get_weather tool, and the setup (the tiny model). Header-only, for tests; after http_client.h and
 * json_at.h. */
#ifndef KVC_TEST_DIALECTS_HTTP_H
#define KVC_TEST_DIALECTS_HTTP_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http_client.h"
#include "json_at.h"
#include "kvchat.h"
#include "test.h"

#define KEY "dialects-key"

/* A dialects test's setup: $KVC_BIN in *bin (false when it is not set: the
 * test skips), and the tiny generated model written to
 * /tmp/kvc_<stem>_<pid>.gguf, its path in model (for the caller to unlink). */
static inline bool dialects_setup(const char **bin, char *model, size_t cap, const char *stem)
{
    *bin = getenv("KVC_BIN");
    if (!*bin || !**bin)
        return false;
    kvc_gen_params gp;
    kvc_gen_preset("tiny", &gp);
    snprintf(model, cap, "/tmp/kvc_%s_%d.gguf", stem, (int)getpid());
    char err[256];
    CHECKF(kvc_gen_write(&gp, model, err, sizeof(err)) == KVC_OK, "tiny model: %s", err);
    return true;
}

/* POST with the API key as each API's clients send it: Anthropic's in
 * x-api-key (with anthropic-version), OpenAI's as a bearer token. */
static inline http_resp post(int port, const char *path, const char *body)
{
    bool anthropic = strstr(path, "messages") || strstr(path, "api=messages");
    return http_request_ex(port, "POST", path,
                           anthropic ? "x-api-key: " KEY "\r\nanthropic-version: 2023-06-01\r\n"
                                     : "Authorization: Bearer " KEY "\r\n", body, 60);
}

/* The JSON body of a POST (NULL when not JSON); *status its status. */
static inline cJSON *post_json(int port, const char *path, const char *body, int *status)
{
    http_resp r = post(port, path, body);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    *status = r.status;
    if (!j || r.status != 200)
        fprintf(stderr, "%s %s -> %d %s\n", path, body, r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return j;
}

static inline const char *str_at(const cJSON *o, const char *path)
{
    return cJSON_GetStringValue(at(o, path));
}

static inline double num_at(const cJSON *o, const char *path)
{
    const cJSON *v = at(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* The 400 of body at path names param (error.param, or Anthropic's message). */
static inline void check_400(int port, const char *path, const char *body, const char *word)
{
    http_resp r = post(port, path, body);
    CHECKF(r.status == 400, "%s: status %d (%s)", body, r.status, r.body ? r.body : "");
    CHECKF(r.body && strstr(r.body, word), "%s: answer '%s' lacks '%s'", body,
           r.body ? r.body : "", word);
    http_resp_free(&r);
}

/* ============================================================ SSE events */

typedef struct sse {
    int    n;
    char  *name[512];      /* the event: line (NULL = none) */
    cJSON *data[512];      /* the data: JSON (NULL = not JSON) */
} sse;

static inline void sse_parse(sse *s, const char *body)
{
    memset(s, 0, sizeof(*s));
    const char *p = body;
    while (p && *p && s->n < 512) {
        const char *end = strstr(p, "\n\n");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *ev = strndup(p, len), *save = NULL;
        for (char *line = strtok_r(ev, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            if (!strncmp(line, "event: ", 7))
                s->name[s->n] = strdup(line + 7);
            else if (!strncmp(line, "data: ", 6))
                s->data[s->n] = cJSON_Parse(line + 6);
        }
        free(ev);
        if (s->name[s->n] || s->data[s->n])
            s->n++;
        p = end ? end + 2 : NULL;
    }
}

static inline void sse_free(sse *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->name[i]);
        cJSON_Delete(s->data[i]);
    }
}

/* The index of the first event named `name` from `from`, -1 when none. */
static inline int sse_find(const sse *s, const char *name, int from)
{
    for (int i = from; i < s->n; i++)
        if (s->name[i] && !strcmp(s->name[i], name))
            return i;
    return -1;
}

/* Check that the events named order[0, n) come in that order (others may
 * come between them). */
static inline void sse_check_order(const sse *s, const char *const *order, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        int f = sse_find(s, order[i], k);
        CHECKF(f >= k, "event %s missing or out of order", order[i]);
        k = f >= 0 ? f : k;
    }
}

/* ============================================================ prompts */

/* The prompt body renders to through `api`'s /apply-template. malloc'd. */
static inline char *rendered(int port, const char *api, const char *body)
{
    char path[64];
    int st;
    snprintf(path, sizeof(path), "/apply-template?api=%s", api);
    cJSON *j = post_json(port, path, body, &st);
    char *p = str_at(j, "prompt") ? strdup(str_at(j, "prompt")) : NULL;
    cJSON_Delete(j);
    return p;
}

/* The get_weather tool as chat completions declares it. */
static const char tools_chat[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather "
    "of a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
    "\"string\"}},\"required\":[\"city\"]}}}]";

#endif
