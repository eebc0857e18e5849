/* server_stream.c - a streamed response (server.h): its choices' engine
 * events turned into SSE chunks, and the reader the HTTP layer sends them
 * from.
 *
 * One choice: the text that came is kept whole: with tools, what may begin a
 * tool call is held back until the reply ends (content only if no call
 * came). With logprobs, a TEXT event ends where a token ends and carries the
 * logprobs of the tokens it shows (engine: kvc_event); a chunk goes out only
 * up to the end of such an event, so its logprobs are exactly those of its
 * text. At DONE, whose list has every token, the finish chunk carries what no
 * text chunk did: the concatenation of a stream's lists is the whole
 * response's.
 *
 * The stream: its reader blocks on the engine, which is fine in a
 * connection's own thread; with several choices it takes their events in
 * turns (a short wait on one, then all are looked at again), so their chunks
 * interleave. Every wait is a slice, after which it checks whether the
 * client hung up and whether the server is stopping. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "reasoning.h"
#include "server.h"
#include "tool_calls.h"

/* ================================================================ choice */

void srv_stream_choice_init(srv_stream_choice *c, srv_chunk_head head, const kvc_model *model,
                            bool tools, int tool_format)
{
    memset(c, 0, sizeof(*c));
    c->em.head = head;
    c->em.open = -1;
    c->model = model;
    c->tools = tools;
    c->tool_format = tool_format;
}

void srv_stream_choice_free(srv_stream_choice *c)
{
    if (!c)
        return;
    free(c->text);
    free(c->em.acc.p);
    free(c->lp);
    free(c->lp_at);
    memset(c, 0, sizeof(*c));
}

/* The logprobs object of lp[from, to), counting text offsets on; NULL when
 * there are none to send. */
static cJSON *logprobs_of(srv_stream_choice *c, const kvc_token_logprob *lp, size_t from,
                          size_t to)
{
    if (!c->model || to <= from)
        return NULL;
    return c->em.head.dialect->logprobs(lp + from, (int32_t)(to - from), c->model,
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
/* With reasoning split: send the reasoning that may go (final: the reply is
 * whole), and fix where the content starts once it has. false when no
 * content may go yet, or memory ran out (*ok). */
static bool send_reasoning(srv_stream_choice *c, bool final, srv_buf *out, bool *ok)
{
    kvc_think_span sp = kvc_think_find(c->text, c->len, c->think_open, final);
    size_t from = KVC_MAX(c->r_sent, sp.r_begin);
    if (sp.r_end > from) {
        *ok = c->em.head.dialect->sse_text(&c->em, SRV_REASONING, c->text + from,
                                           sp.r_end - from, NULL, out) && *ok;
        c->r_sent = sp.r_end;
    }
    if (sp.state != KVC_THINK_NONE && sp.state != KVC_THINK_CLOSED)
        return false;
    if (!c->content_begun)
        c->sent = KVC_MAX(c->sent, sp.c_begin);
    c->c_end = sp.c_end;
    return true;
}

static bool send_ready(srv_stream_choice *c, srv_buf *out)
{
    bool ok = true;
    if (c->think && !send_reasoning(c, false, out, &ok))
        return ok;
    size_t upto = c->len, k = c->lp_sent;
    if (c->tools)
        upto -= kvc_tool_calls_holdback(c->tool_format, c->text, c->len);
    if (c->think)                              /* harmony: the final message's end */
        upto = KVC_MIN(upto, c->c_end);
    if (c->model) {
        while (k < c->n_lp && c->lp_at[k] <= upto)
            k++;
        upto = k > c->lp_sent ? c->lp_at[k - 1] : c->sent;
    }
    if (upto <= c->sent)
        return ok;
    cJSON *lp = logprobs_of(c, c->lp, c->lp_sent, k);
    size_t from = c->sent;
    c->sent = upto;
    c->lp_sent = k;
    c->content_begun = true;
    return c->em.head.dialect->sse_text(&c->em, SRV_CONTENT, c->text + from, upto - from, lp,
                                        out) && ok;
}

/* The reply ended: the text held back (unless tool calls came instead),
 * then its end (tool calls, finish) with the logprobs no text carried. */
static bool send_end(srv_stream_choice *c, const kvc_event *done, srv_buf *out)
{
    const srv_dialect *d = c->em.head.dialect;
    srv_reply rp = srv_reply_make(done, c->tools, c->stop, c->n_stop, c->vocab);
    bool ok = true;
    if (c->forced_calls)
        srv_reply_only_calls(&rp);
    size_t end = c->len;
    if (c->think) {
        srv_reply_think(&rp, c->think_open);
        c->c_end = c->len;
        send_reasoning(c, true, out, &ok);
        end = KVC_MIN(c->c_end, c->len);        /* harmony: the final message's end */
        if (!c->content_begun && !rp.n_content)
            c->sent = c->len;                  /* nothing but reasoning */
    }
    if (!rp.tool_calls && end > c->sent) {
        cJSON *lp = logprobs_of(c, c->lp, c->lp_sent, c->n_lp);
        ok = d->sse_text(&c->em, SRV_CONTENT, c->text + c->sent, end - c->sent, lp, out);
        c->sent = c->len;
        c->lp_sent = c->n_lp;
    }
    size_t n = done->n_logprobs > 0 ? (size_t)done->n_logprobs : 0;
    cJSON *lp = logprobs_of(c, done->logprobs, c->lp_sent, n);
    c->lp_sent = KVC_MAX(c->lp_sent, n);
    return d->sse_finish(&c->em, &rp, lp, out) && ok;
}

bool srv_stream_choice_event(srv_stream_choice *c, const kvc_event *ev, srv_buf *out)
{
    if (ev->type == KVC_EVENT_TEXT)
        return keep(c, ev) && send_ready(c, out);
    c->done = true;
    c->stats = ev->stats;
    return send_end(c, ev, out);
}

/* ================================================================ stream */

#define ANY_SLICE_MS 5            /* several choices: the wait on one before looking at all again */
#define STREAM_BATCH (16 << 10)   /* SSE bytes gathered from ready events per read */

struct srv_stream {
    srv_metrics       *metrics;       /* borrowed */
    const atomic_bool *stopping;      /* borrowed: the server's; set = end the waits */
    int                fd;            /* the client's socket, polled for a hang-up */
    const srv_dialect *dialect;
    bool               include_usage;
    bool               finished;      /* the end or an error formatted: nothing more to
                                       * wait for */
    srv_reply_id       id;
    char              *model;         /* id.model's storage */
    char              *stop[SRV_MAX_STOP];   /* the request's stop strings (copies) */
    srv_buf            buf;           /* the SSE text; sent up to pos */
    size_t             pos;
    int                n, per_prompt; /* choices, of which per_prompt for each prompt */
    int                open;          /* choices without their DONE yet */
    int                next;          /* the choice to look at first: they take turns */
    srv_error          err;           /* the error a choice failed with; http_status 0 = none */
    kvc_request       *req[SRV_MAX_CHOICES];
    srv_stream_choice  choice[SRV_MAX_CHOICES];
};

/* Append a formatted SSE string (taken). false when out of memory. */
static bool stream_put(srv_stream *st, char *s)
{
    return srv_buf_put(&st->buf, s);
}

int srv_stream_next(srv_stream *st, kvc_event *ev, bool wait)
{
    for (;;) {
        int first = -1;
        for (int k = 0; k < st->n; k++) {
            int i = (st->next + k) % st->n;
            if (st->choice[i].done)
                continue;
            if (kvc_request_next(st->req[i], ev, 0)) {
                st->next = (i + 1) % st->n;
                return i;
            }
            if (first < 0)
                first = i;
        }
        if (!wait || first < 0)
            return -1;
        if (kvc_request_next(st->req[first], ev, st->n > 1 ? ANY_SLICE_MS : SRV_TICK_MS)) {
            st->next = (first + 1) % st->n;
            return first;
        }
        if (atomic_load(st->stopping) || srv_peer_gone(st->fd))
            return -1;
    }
}

/* Format event ev of choice i; after the last choice's DONE, the usage chunk
 * (include_usage) and [DONE]. false when out of memory. */
static bool stream_event(srv_stream *st, int i, const kvc_event *ev)
{
    if (ev->type == KVC_EVENT_ERROR) {
        srv_error_from_status(&st->err, ev->status, ev->message);
        srv_metrics_failed(st->metrics);
        st->finished = true;
        if (st->dialect->sse_fail)
            return st->dialect->sse_fail(&st->choice[i].em, &st->err, &st->buf);
        return stream_put(st, st->dialect->sse_error(&st->err));
    }
    if (ev->type == KVC_EVENT_DONE) {
        srv_metrics_done(st->metrics, &ev->stats);
        st->open--;
    }
    if (!srv_stream_choice_event(&st->choice[i], ev, &st->buf))
        return false;
    if (st->open > 0)
        return true;
    st->finished = true;
    kvc_chat_stats stats[SRV_MAX_CHOICES];
    for (int k = 0; k < st->n; k++)
        stats[k] = st->choice[k].stats;
    return st->dialect->sse_end(&st->id, st->include_usage, stats, st->n, st->per_prompt,
                                &st->buf);
}

ssize_t srv_stream_read(srv_stream *st, char *out, size_t max)
{
    while (st->pos == st->buf.len) {
        if (st->finished)
            return SRV_STREAM_END;
        st->pos = st->buf.len = 0;
        kvc_event ev;
        int i = srv_stream_next(st, &ev, true);
        if (i < 0)
            return SRV_STREAM_ERROR;
        bool ok = stream_event(st, i, &ev);
        kvc_event_clear(&ev);
        while (ok && !st->finished && st->buf.len < STREAM_BATCH &&
               (i = srv_stream_next(st, &ev, false)) >= 0) {
            ok = stream_event(st, i, &ev);
            kvc_event_clear(&ev);
        }
        if (!ok)
            return SRV_STREAM_ERROR;
    }
    size_t n = st->buf.len - st->pos < max ? st->buf.len - st->pos : max;
    memcpy(out, st->buf.p + st->pos, n);
    st->pos += n;
    return (ssize_t)n;
}

void srv_stream_free(srv_stream *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->n; i++) {
        kvc_request_free(st->req[i]);
        srv_stream_choice_free(&st->choice[i]);
    }
    free(st->model);
    for (int i = 0; i < SRV_MAX_STOP; i++)
        free(st->stop[i]);
    free(st->buf.p);
    free(st);
}

srv_stream *srv_stream_new(const srv_request *rq, const srv_reply_id *id, const srv_limits *lim,
                           srv_metrics *metrics, const atomic_bool *stopping, int fd)
{
    srv_stream *st = calloc(1, sizeof(*st));
    char *model = strdup(id->model);
    if (!st || !model) {
        free(st);
        free(model);
        return NULL;
    }
    *st = (srv_stream){ .metrics = metrics, .stopping = stopping, .fd = fd, .dialect = rq->dialect,
                        .include_usage = rq->include_usage, .id = *id, .model = model,
                        .n = rq->n * rq->n_prompts, .per_prompt = rq->n };
    st->id.model = model;
    st->open = st->n;
    int n_stop = rq->params.chat.n_stop;
    for (int i = 0; i < n_stop; i++)
        if (!(st->stop[i] = strdup(rq->params.chat.stop[i]))) {
            srv_stream_free(st);
            return NULL;
        }
    for (int i = 0; i < st->n; i++) {
        srv_stream_choice *c = &st->choice[i];
        srv_stream_choice_init(c, (srv_chunk_head){ rq->dialect, &st->id, i, rq->include_usage },
                               rq->logprobs >= 0 ? lim->model : NULL,
                               rq->params.chat.parse_tool_calls, lim->tool_format);
        c->stop = (const char *const *)st->stop;
        c->n_stop = n_stop;
        c->vocab = lim->model;
        c->forced_calls = rq->forced_calls;
        c->think = rq->think;
        c->think_open = rq->think_open;
    }
    return st;
}

kvc_request **srv_stream_requests(srv_stream *st, int *n)
{
    *n = st->n;
    return st->req;
}

bool srv_stream_begin(srv_stream *st, int i, const kvc_event *first)
{
    bool ok = true;
    for (int k = 0; ok && k < st->n; k++) {
        st->choice[k].em.prompt = first->stats;
        ok = st->dialect->sse_begin(&st->choice[k].em, &st->buf);
    }
    return ok && stream_event(st, i, first);
}

bool srv_stream_result(const srv_stream *st, kvc_chat_stats *sum, srv_error *e)
{
    kvc_chat_stats stats[SRV_MAX_CHOICES];
    int n = 0;
    for (int k = 0; k < st->n; k++)       /* the finished ones, in order */
        if (st->choice[k].done)
            stats[n++] = st->choice[k].stats;
    *e = st->err;
    if (n)
        *sum = srv_stats_sum(stats, n, n == st->n ? st->per_prompt : 1);
    return n > 0;
}
