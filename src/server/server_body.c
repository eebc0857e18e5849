/* server_body.c - a request body to a cJSON tree, every string in it checked
 * (server.h, srv_json_parse): the one entry all dialects parse bodies with.
 *
 * cJSON keeps strings NUL-terminated and does not check UTF-8: a \u0000 would
 * silently cut a string (two prompt_cache_keys differing after it shared a
 * session) and invalid UTF-8 would reach the tokenizer and the template. Both
 * are a 400 naming the field instead. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "server.h"
#include "unicode.h"

/* 400 invalid_request_error naming param. */
#define BAD(e, param, ...) srv_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* The body with each \u0000 escape inside a JSON string rewritten as the two
 * bytes C0 80 (an overlong NUL, invalid UTF-8), so that check_strings finds
 * and names the string instead of cJSON ending it there; malloc'd, length in
 * *out_len. NULL when the body has no such escape (or memory ran out: the
 * body is then parsed as it is and a NUL truncates, as before). */
static char *nul_escapes_marked(const char *body, size_t len, size_t *out_len)
{
    bool any = false;
    for (size_t i = 0; i + 6 <= len && !any; i++)
        any = body[i] == '\\' && body[i + 1] == 'u' && !memcmp(body + i + 2, "0000", 4);
    char *out = any ? malloc(len + 1) : NULL;
    if (!out)
        return NULL;
    size_t w = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_string && c == '\\' && i + 6 <= len && body[i + 1] == 'u' &&
            !memcmp(body + i + 2, "0000", 4)) {
            out[w++] = (char)0xC0;
            out[w++] = (char)0x80;
            i += 5;
            continue;
        }
        out[w++] = c;
        if (in_string && c == '\\' && i + 1 < len)
            out[w++] = body[++i];            /* an escape: \" does not end the string */
        else if (c == '"')
            in_string = !in_string;
    }
    out[w] = 0;
    *out_len = w;
    return out;
}

/* Where t first stops being valid UTF-8 (*nul: at a marked NUL); false when
 * it is valid throughout. */
static bool utf8_flaw(const char *t, size_t *at, bool *nul)
{
    size_t n = strlen(t), i = 0;
    for (int r; i < n; i += (size_t)r)
        if ((r = kvc_utf8_decode(t + i, n - i, NULL)) <= 0) {
            *at = i;
            *nul = (unsigned char)t[i] == 0xC0 && i + 1 < n && (unsigned char)t[i + 1] == 0x80;
            return true;
        }
    return false;
}

/* 400 naming the first string under v (path: v's, plen bytes of cap used)
 * that is not valid UTF-8 or holds a NUL: a value (named by its path) or a
 * member's name (named by its object's path). Strings reach the tokenizer,
 * the template and session keys as C strings. */
static int check_strings(const cJSON *v, char *path, size_t cap, size_t plen, srv_error *e)
{
    size_t at;
    bool nul;
    const char *where = plen ? path : "the request body";
    if (cJSON_IsString(v) && utf8_flaw(v->valuestring, &at, &nul))
        return BAD(e, plen ? path : NULL, "%s has %s at byte %zu%s", where,
                   nul ? "a NUL character (\\u0000)" : "invalid UTF-8", at,
                   nul ? ", which is not allowed" : "");
    int i = 0, rc;
    const cJSON *c;
    cJSON_ArrayForEach(c, v) {
        if (c->string && utf8_flaw(c->string, &at, &nul))
            return BAD(e, plen ? path : NULL,
                       "a member name in %s has %s at byte %zu%s", where,
                       nul ? "a NUL character (\\u0000)" : "invalid UTF-8", at,
                       nul ? ", which is not allowed" : "");
        size_t n = cJSON_IsArray(v) ? (size_t)snprintf(path + plen, cap - plen, "[%d]", i++)
                 : (size_t)snprintf(path + plen, cap - plen, plen ? ".%s" : "%s",
                                    c->string ? c->string : "");
        if ((rc = check_strings(c, path, cap, KVC_MIN(plen + n, cap - 1), e)))
            return rc;
        path[plen] = 0;
    }
    return 0;
}

void *srv_json_parse(const char *body, size_t len, srv_error *e)
{
    size_t mlen = 0;
    char *marked = nul_escapes_marked(body, len, &mlen);
    const char *b = marked ? marked : body, *end = NULL;
    size_t n = marked ? mlen : len;
    cJSON *root = cJSON_ParseWithLengthOpts(b, n, &end, false);
    size_t at = end && end >= b ? (size_t)(end - b) : 0;
    if (!root) {
        BAD(e, NULL, "the request body is not valid JSON (error near byte %zu)", at);
    } else {
        /* Only whitespace may follow the value (a NUL byte ends cJSON's view). */
        for (const char *p = end; p && p < b + n; p++)
            if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
                BAD(e, NULL, "the request body is not valid JSON (trailing data at byte %zu)",
                    (size_t)(p - b));
                cJSON_Delete(root);
                root = NULL;
                break;
            }
    }
    char path[256] = "";
    if (root && check_strings(root, path, sizeof(path), 0, e)) {
        cJSON_Delete(root);
        root = NULL;
    }
    free(marked);
    return root;
}

