/* server_stream.c - one choice of a streamed response (server.h): its engine
 * events turned into SSE chunks.
 *
 * The text that came is kept whole: with tools, what may begin a tool call
 * is held back until the reply ends (content only if no call came). With
 * logprobs, a TEXT event ends where a token ends and carries the logprobs of
 * the tokens it shows (engine: kvc_event); a chunk goes out only up to the
 * end of such an event, so its logprobs are exactly those of its text. At
 * DONE, whose list has every token, the finish chunk carries what no text
 * chunk did: the concatenation of a stream's lists is the whole response's. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "tool_calls.h"

void srv_stream_choice_init(srv_stream_choice *c, srv_chunk_head head, const kvc_model *model,
                            bool tools, int tool_format)
{
    memset(c, 0, sizeof(*c));
    c->head = head;
    c->model = model;
    c->tools = tools;
    c->tool_format = tool_format;
}

void srv_stream_choice_free(srv_stream_choice *c)
{
    if (!c)
        return;
    free(c->text);
    free(c->lp);
    free(c->lp_at);
    memset(c, 0, sizeof(*c));
}

bool srv_sse_put(char **out, size_t *len, size_t *cap, char *sse)
{
    bool oom = !sse;
    if (sse)
        kvc_text_append(out, len, cap, &oom, sse, strlen(sse));
    free(sse);
    return !oom;
}

/* The logprobs object of lp[from, to), counting text offsets on; NULL when
 * there are none to send. */
static cJSON *logprobs_of(srv_stream_choice *c, const kvc_token_logprob *lp, size_t from,
                          size_t to)
{
    if (!c->model || to <= from)
        return NULL;
    return srv_logprobs_json(c->head.kind, lp + from, (int32_t)(to - from), c->model,
                             &c->text_offset);
}

/* Keep a TEXT event's text and logprobs. false when out of memory. */
static bool keep(srv_stream_choice *c, const kvc_event *ev)
{
    bool oom = false;
    kvc_text_append(&c->text, &c->len, &c->cap, &oom, ev->text ? ev->text : "", ev->len);
    for (int32_t i = 0; !oom && c->model && i < ev->n_logprobs; i++) {
        oom = !kvc_grow((void **)&c->lp, &c->cap_lp, c->n_lp, sizeof(*c->lp)) ||
              !kvc_grow((void **)&c->lp_at, &c->cap_at, c->n_lp, sizeof(*c->lp_at));
        if (!oom) {
            c->lp[c->n_lp] = ev->logprobs[i];
            c->lp_at[c->n_lp++] = c->len;
        }
    }
    return !oom;
}

/* Send the text that may go: not what may begin a tool call, and with
 * logprobs only up to the end of a piece whose tokens came with it. */
static bool send_ready(srv_stream_choice *c, char **out, size_t *len, size_t *cap)
{
    size_t upto = c->len, k = c->lp_sent;
    if (c->tools)
        upto -= kvc_tool_calls_holdback(c->tool_format, c->text, c->len);
    if (c->model) {
        while (k < c->n_lp && c->lp_at[k] <= upto)
            k++;
        upto = k > c->lp_sent ? c->lp_at[k - 1] : c->sent;
    }
    if (upto <= c->sent)
        return true;
    cJSON *lp = logprobs_of(c, c->lp, c->lp_sent, k);
    char *sse = srv_sse_text(&c->head, c->text + c->sent, upto - c->sent, lp);
    c->sent = upto;
    c->lp_sent = k;
    return srv_sse_put(out, len, cap, sse);
}

/* The reply ended: its tool calls, or the text held back; then the finish
 * chunk with the logprobs no text chunk carried. */
static bool send_end(srv_stream_choice *c, const kvc_event *done, char **out, size_t *len,
                     size_t *cap)
{
    bool ok = true;
    if (c->tools && done->tool_calls) {
        ok = srv_sse_put(out, len, cap, srv_sse_tool_calls(&c->head, done->tool_calls));
    } else if (c->len > c->sent) {
        cJSON *lp = logprobs_of(c, c->lp, c->lp_sent, c->n_lp);
        ok = srv_sse_put(out, len, cap, srv_sse_text(&c->head, c->text + c->sent,
                                                     c->len - c->sent, lp));
        c->sent = c->len;
        c->lp_sent = c->n_lp;
    }
    size_t n = done->n_logprobs > 0 ? (size_t)done->n_logprobs : 0;
    cJSON *lp = logprobs_of(c, done->logprobs, c->lp_sent, n);
    c->lp_sent = KVC_MAX(c->lp_sent, n);
    char *finish = srv_sse_finish(&c->head, done->stats.finish_reason, lp);
    return srv_sse_put(out, len, cap, finish) && ok;
}

bool srv_stream_choice_event(srv_stream_choice *c, const kvc_event *ev, char **out,
                             size_t *len, size_t *cap)
{
    if (ev->type == KVC_EVENT_TEXT)
        return keep(c, ev) && send_ready(c, out, len, cap);
    c->done = true;
    c->stats = ev->stats;
    return send_end(c, ev, out, len, cap);
}
