/* answer_http.h - reading an answer of any API dialect in the HTTP tests:
 * its reasoning and content, whole or streamed, and how many tokens
 * /tokenize makes of a text. Header-only, for tests. */
#ifndef KVC_TEST_ANSWER_HTTP_H
#define KVC_TEST_ANSWER_HTTP_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_client.h"
#include "json_at.h"

/* Append s to buf (cap bytes); nothing when buf or s is NULL. */
static inline void answer_add(char *buf, size_t cap, const char *s)
{
    if (buf && s)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s", s);
}

/* The reasoning (into r, cap bytes; NULL: not wanted) and content (into c)
 * of an answer, whole or streamed (SSE data lines or Ollama's NDJSON), by
 * each dialect's fields: chat completions, Responses, Anthropic Messages,
 * Ollama. */
static inline void answer_parts(const char *body, char *r, char *c, size_t cap)
{
    if (r)
        r[0] = 0;
    c[0] = 0;
    for (const char *p = body; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 6 && !strncmp(p, "data: ", 6))
            p += 6, n -= 6;
        char *line = strndup(p, n);
        cJSON *j = line ? cJSON_Parse(line) : NULL;
        free(line);
        const char *type = cJSON_GetStringValue(at(j, "type")),
                   *object = cJSON_GetStringValue(at(j, "object"));
        /* chat, whole and streamed */
        answer_add(r, cap, cJSON_GetStringValue(at(j, "choices.0.message.reasoning_content")));
        answer_add(c, cap, cJSON_GetStringValue(at(j, "choices.0.message.content")));
        answer_add(r, cap, cJSON_GetStringValue(at(j, "choices.0.delta.reasoning_content")));
        answer_add(c, cap, cJSON_GetStringValue(at(j, "choices.0.delta.content")));
        /* Ollama, whole and streamed */
        answer_add(r, cap, cJSON_GetStringValue(at(j, "message.thinking")));
        answer_add(c, cap, cJSON_GetStringValue(at(j, "message.content")));
        if (object && !strcmp(object, "response")) {         /* Responses, whole */
            const cJSON *it;
            cJSON_ArrayForEach(it, at(j, "output")) {
                const char *k = cJSON_GetStringValue(at(it, "type"));
                answer_add(k && !strcmp(k, "reasoning") ? r : c, cap,
                           cJSON_GetStringValue(at(it, "content.0.text")));
            }
        } else if (type && !strcmp(type, "message")) {       /* Messages, whole */
            const cJSON *it;
            cJSON_ArrayForEach(it, at(j, "content")) {
                answer_add(r, cap, cJSON_GetStringValue(at(it, "thinking")));
                answer_add(c, cap, cJSON_GetStringValue(at(it, "text")));
            }
        } else if (type && !strcmp(type, "response.reasoning_text.delta")) {
            answer_add(r, cap, cJSON_GetStringValue(at(j, "delta")));
        } else if (type && !strcmp(type, "response.output_text.delta")) {
            answer_add(c, cap, cJSON_GetStringValue(at(j, "delta")));
        } else if (type && !strcmp(type, "content_block_delta")) {
            answer_add(r, cap, cJSON_GetStringValue(at(j, "delta.thinking")));
            answer_add(c, cap, cJSON_GetStringValue(at(j, "delta.text")));
        }
        cJSON_Delete(j);
        p = e ? e + 1 : NULL;
    }
}

/* How many tokens the server on port makes of text (JSON-escaped) with
 * /tokenize, special tokens parsed; 0 when it fails. */
static inline int answer_n_tokens(int port, const char *text)
{
    char body[1024];
    snprintf(body, sizeof(body), "{\"content\":\"%s\",\"parse_special\":true}", text);
    http_resp tk = http_request_ex(port, "POST", "/tokenize", NULL, body, 60);
    cJSON *tj = tk.body ? cJSON_Parse(tk.body) : NULL;
    int n = cJSON_GetArraySize(at(tj, "tokens"));
    cJSON_Delete(tj);
    http_resp_free(&tk);
    return n;
}

#endif
