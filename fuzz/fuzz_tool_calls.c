/* fuzz_tool_calls.c - libFuzzer target for the tool-call formats
 * (template/tool_calls.h): parsing a model's reply, the stream hold-back
 * and the forcing grammars.
 *
 * Input: a format byte, a max_calls byte, then the request's tools JSON and
 * the reply, split at the first NUL (no NUL: all reply, no tools).
 *
 * Properties checked (abort on violation):
 *   - parsing never fails but for memory; calls come with content, both or
 *     neither; the calls are a JSON array of at most max_calls calls (when
 *     set), each with a name and arguments that are JSON text (an object in
 *     the XML format); the content is no longer than the reply;
 *   - the hold-back of every prefix is at most its length;
 *   - a grammar made from tools that are valid UTF-8 (the server refuses a
 *     body that is not) parses: names and enums escaped. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "tool_calls.h"
#include "unicode.h"

#define FORMATS 5

static void check_calls(int format, const char *calls, const char *content, size_t len,
                        int max_calls)
{
    if (!calls != !content)
        abort();
    if (!calls)
        return;
    cJSON *a = cJSON_Parse(calls), *c;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0 ||
        (max_calls > 0 && cJSON_GetArraySize(a) > max_calls) || strlen(content) > len)
        abort();
    cJSON_ArrayForEach(c, a) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const char *args = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name")) || !args)
            abort();
        cJSON *x = cJSON_Parse(args);
        /* other formats pass arguments given as a string through as they are */
        if (format == KVC_TOOLS_QWEN_XML && !cJSON_IsObject(x))
            abort();
        cJSON_Delete(x);
    }
    cJSON_Delete(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 1 << 16)
        return 0;
    int format = data[0] % FORMATS, max_calls = data[1] % 3;
    const char *body = (const char *)data + 2;
    size_t n = size - 2;
    const char *nul = memchr(body, 0, n);
    char *tools = nul ? strndup(body, (size_t)(nul - body)) : NULL;
    const char *reply = nul ? nul + 1 : body;
    size_t len = nul ? n - (size_t)(nul - body) - 1 : n;
    char *calls = NULL, *content = NULL;
    if (kvc_tool_calls_parse(format, reply, len, tools, 7, max_calls, &calls, &content) != KVC_OK)
        abort();
    check_calls(format, calls, content, len, max_calls);
    free(calls);
    free(content);
    for (size_t k = 0; k <= len; k += 1 + len / 16)
        if (kvc_tool_calls_holdback(format, reply, k) > k)
            abort();
    char *g = NULL;
    kvc_err err = { 0 };
    if (tools && kvc_utf8_valid(tools, strlen(tools)) && kvc_tool_calls_grammar(format, tools, NULL, data[1] & 4, &g, &err) == KVC_OK) {
        kvc_grammar *gr = NULL;
        if (kvc_grammar_parse(g, strlen(g), &gr, &err) != KVC_OK) {
            fprintf(stderr, "grammar does not parse: %s\n%s\n", err.msg, g);
            abort();
        }
        kvc_grammar_free(gr);
    }
    free(g);
    free(tools);
    return 0;
}
