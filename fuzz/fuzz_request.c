/* fuzz_request.c - libFuzzer target for the server's request parser and
 * validator (src/server_json.c) and the JSON it writes back.
 *
 * Input: byte 0 picks the endpoint (modulo 6: chat, completions, responses,
 * messages, Ollama's chat, Ollama's generate); the rest is
 * the request body, placed in an allocation of exactly its size (no NUL after
 * it), so any read past the end is an ASan report.
 *
 * Checked on every input:
 *   - a rejected body gets status 400 (500 only for out of memory), a non-empty
 *     message, and error JSON that parses back with the same message;
 *   - an accepted body gives params within OpenAI's ranges (temperature in
 *     [0, 2], top_p in [0, 1], n_stop <= 16, max_tokens >= 0, messages within
 *     the limit, every string readable), and the response and stream chunks
 *     built from its text parse back as JSON holding that text;
 *   - everything written is valid UTF-8, whatever bytes the strings held (a
 *     text that is valid UTF-8 comes back unchanged). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "unicode.h"

#define MAX_MESSAGES 64

static volatile size_t sink;

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_request: %s\n", what);
    abort();
}

static bool valid_utf8(const char *s)
{
    for (size_t n = strlen(s), i = 0; i < n;) {
        int r = kvc_utf8_decode(s + i, n - i, NULL);
        if (r <= 0)
            return false;
        i += (size_t)r;
    }
    return true;
}

/* out must be valid UTF-8 and valid JSON; when `path` names a string member
 * chain and `want` is valid UTF-8, its value must equal `want`. */
static void check_json(char *out, const char *a, const char *b, const char *want)
{
    if (!out)
        fail("out of memory building JSON");
    if (!valid_utf8(out))
        fail("produced JSON is not valid UTF-8");
    const char *j = !strncmp(out, "data: ", 6) ? out + 6 : out;
    cJSON *o = cJSON_Parse(j);
    if (!o)
        fail("produced JSON does not parse");
    if (a && valid_utf8(want)) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
        if (cJSON_IsArray(v))
            v = cJSON_GetArrayItem(v, 0);
        if (b)
            for (const char *p = b; v && *p; p += strlen(p) + 1)
                v = cJSON_GetObjectItemCaseSensitive(v, p);
        if (!cJSON_IsString(v) || strcmp(v->valuestring, want) != 0)
            fail("produced JSON lost the text");
    }
    cJSON_Delete(o);
    free(out);
}

static void check_params(const srv_request *r)
{
    const kvc_request_params *p = &r->params;
    const kvc_sampler_params *s = &p->chat.sampling;
    if (!(s->temperature >= 0 && s->temperature <= 2) || !(s->top_p >= 0 && s->top_p <= 1) ||
        !(s->min_p >= 0 && s->min_p <= 1) || fabsf(s->presence_penalty) > 2 ||
        fabsf(s->frequency_penalty) > 2 || !(s->repeat_penalty > 0) || s->top_k < 0)
        fail("sampling parameter out of range");
    if (p->chat.n_stop < 0 || p->chat.n_stop > SRV_MAX_STOP || p->chat.max_tokens < 0)
        fail("stop or max_tokens out of range");
    for (int i = 0; i < p->chat.n_stop; i++)
        if (!p->chat.stop[i][0])
            fail("empty stop string");
        else
            sink += strlen(p->chat.stop[i]);
    if (r->load_only) {                       /* Ollama's load: nothing to run */
        if (r->dialect != &srv_dialect_ollama_chat && r->dialect != &srv_dialect_ollama_generate)
            fail("a load-only request of another API");
    } else if (r->dialect != &srv_dialect_completions && !(p->prompt &&
               r->dialect == &srv_dialect_ollama_generate)) {   /* raw: a completion */
        if (!p->messages || p->n_messages < 1 || p->n_messages > MAX_MESSAGES || p->prompt)
            fail("bad message list");
        for (size_t i = 0; i < p->n_messages; i++)
            sink += strlen(p->messages[i].role) + strlen(p->messages[i].content);
    } else if (!p->prompt == !p->prompt_tokens || p->messages) {
        fail("a completion needs a text or a token-id prompt");   /* one of them */
    } else if (p->prompt_tokens) {
        if (p->n_prompt_tokens < 1)
            fail("an empty token-id prompt");
        for (int64_t i = 0; i < p->n_prompt_tokens; i++)
            if (p->prompt_tokens[i] < 0)
                fail("a negative token id");
    }
    if (p->session_key)
        sink += strlen(p->session_key);
    if (r->model)
        sink += strlen(r->model);
}

/* Build what the server would send for a reply whose text is `text`: the
 * whole answer, and a stream's events (every dialect's); for chat and
 * completions the text must be found where those APIs put it. */
static void check_output(const srv_request *r, const char *text)
{
    srv_reply_id id = { .id = "chatcmpl-fuzz", .created = 1, .model = r->model ? r->model : "m" };
    kvc_event done = { .type = KVC_EVENT_DONE, .text = (char *)text, .len = strlen(text) };
    done.stats.finish_reason = "stop";
    bool chat = r->dialect == &srv_dialect_chat;
    srv_reply rp = srv_reply_whole(&done, false);
    srv_reply split = rp;
    srv_reply_think(&split, (unsigned char)text[0] % 3);  /* reasoning: any kvc_think_mode */
    if (r->dialect != &srv_dialect_chat && r->dialect != &srv_dialect_completions) {
        check_json(r->dialect->response(&id, r, &split, 1, 1, NULL, false), NULL, NULL, NULL);
        srv_emit em = { .head = { r->dialect, &id, 0, false }, .open = -1 };
        srv_buf b = { 0 };
        r->dialect->sse_begin(&em, &b);
        r->dialect->sse_text(&em, SRV_REASONING, text, strlen(text), NULL, &b);
        r->dialect->sse_text(&em, SRV_CONTENT, text, strlen(text), NULL, &b);
        r->dialect->sse_finish(&em, &split, NULL, &b);
        /* SSE: events end with a blank line; an event's "data: " line starts
         * it or follows its "event: " line (a "data: " inside a JSON string
         * is not one) */
        for (char *p = b.p, *end; !r->dialect->stream_type && p && *p; p = end + 2) {
            if (!(end = strstr(p, "\n\n")))
                fail("an SSE event without its blank line");
            char *d = !strncmp(p, "data: ", 6) ? p : strstr(p, "\ndata: ");
            if (!d || d > end)
                fail("an SSE event without data");
            d += *d == '\n' ? 7 : 6;
            cJSON *j = cJSON_ParseWithLength(d, (size_t)(end - d));
            if (!j)
                fail("a stream event is not JSON");
            cJSON_Delete(j);
        }
        for (char *p = b.p, *end; r->dialect->stream_type && p && *p; p = end + 1) {
            if (!(end = strchr(p, '\n')))    /* NDJSON: every line ends */
                fail("an NDJSON line without its newline");
            cJSON *j = cJSON_ParseWithLength(p, (size_t)(end - p));
            if (!j || !valid_utf8(p))
                fail("an NDJSON line is not JSON");
            cJSON_Delete(j);
        }
        free(b.p);
        free(em.acc.p);
        return;
    }
    check_json(r->dialect->response(&id, r, &rp, 1, 1, NULL, false), "choices",
               chat ? "message\0content\0" : "text\0", text);
    srv_chunk_head h = { r->dialect, &id, 0, r->include_usage };
    check_json(srv_sse_text(&h, text, strlen(text), NULL), "choices",
               chat ? "delta\0content\0" : "text\0", text);
    check_json(srv_sse_finish(&h, "length", NULL), NULL, NULL, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const srv_dialect *const dialects[] = { &srv_dialect_chat, &srv_dialect_completions,
                                                   &srv_dialect_responses, &srv_dialect_messages,
                                                   &srv_dialect_ollama_chat,
                                                   &srv_dialect_ollama_generate };
    const srv_dialect *kind = dialects[data[0] % 6];
    size_t n = size - 1;
    char *body = malloc(n ? n : 1);
    if (!body)
        return 0;
    memcpy(body, data + 1, n);
    srv_limits lim = { .max_messages = MAX_MESSAGES, .sampling = kvc_sampler_default_params() };
    srv_request r;
    /* as an earlier request might have left it: a status, no message (a
     * path that returns e->http_status without setting e fails below) */
    srv_error e = { .http_status = 400 };
    int rc = srv_request_parse(kind, body, n, &lim, &r, &e);
    if (rc != 0) {
        if ((rc != 400 && rc != 500) || rc != e.http_status || !e.message[0] || !e.type[0])
            fail("rejection without a 400 and a message");
        check_json(srv_error_json(&e), "error", "message\0", e.message);
    } else {
        check_params(&r);
        const char *text = r.load_only ? NULL : r.params.messages
                         ? r.params.messages[r.params.n_messages - 1].content : r.params.prompt;
        if (text)
            check_output(&r, text);
    }
    srv_request_free(&r);
    free(body);
    return 0;
}
