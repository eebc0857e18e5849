/* server_chat.c - the OpenAI chat completions and completions dialects
 * (server.h): their response, chunk, usage and error JSON, and their ops
 * tables. The two differ in a few names (chat's message and delta, the
 * completions' text) and in the first chunk (chat's role), which the tables
 * say once. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "common.h"
#include "reasoning.h"
#include "server.h"


srv_reply srv_reply_whole(const kvc_event *done, bool tool_calls)
{
    srv_reply rp = { .done = done };
    if (tool_calls && done->tool_calls) {
        rp.tool_calls = done->tool_calls;
        rp.content = done->content ? done->content : "";
    } else {
        rp.content = done->text ? done->text : "";
    }
    rp.n_content = strlen(rp.content);
    return rp;
}

srv_reply srv_reply_make(const kvc_event *done, bool tool_calls, const char *const *stop,
                         int n_stop, const kvc_model *model)
{
    srv_reply rp = srv_reply_whole(done, tool_calls);
    const char *f = done->stats.finish_reason;
    if (!model || n_stop <= 0 || done->n_logprobs <= 0 || (f && strcmp(f, "stop")))
        return rp;
    char *all = NULL;
    size_t len = 0, cap = 0, reply = done->text ? strlen(done->text) : 0;
    bool oom = false;
    for (int32_t i = 0; i < done->n_logprobs && len < reply + 4096; i++) {
        char buf[256];
        int k = kvc_model_token_to_piece(model, done->logprobs[i].token, true, buf, sizeof(buf));
        kvc_text_append(&all, &len, &cap, &oom, buf, k > 0 && k < (int)sizeof(buf) ? (size_t)k : 0);
    }
    for (int i = 0; all && len > reply && i < n_stop && !rp.stop_sequence; i++)
        if (!strncmp(all + reply, stop[i], strlen(stop[i])))
            rp.stop_sequence = stop[i];
    free(all);
    return rp;
}

void srv_reply_only_calls(srv_reply *rp)
{
    if (rp->tool_calls) {
        rp->content = "";
        rp->n_content = 0;
    }
}

void srv_reply_think(srv_reply *rp, int mode)
{
    kvc_think_span sp = kvc_think_find(rp->content, rp->n_content, mode, true);
    if (sp.state != KVC_THINK_OPEN && sp.state != KVC_THINK_CLOSED && mode != KVC_THINK_HARMONY)
        return;
    if (sp.r_end > sp.r_begin || (mode != KVC_THINK_HARMONY && sp.state != KVC_THINK_NONE)) {
        rp->reasoning = rp->content + sp.r_begin;   /* harmony: an analysis came */
        rp->n_reasoning = sp.r_end - sp.r_begin;
    }
    rp->content += sp.c_begin;                  /* harmony: up to the final message's end */
    rp->n_content = sp.c_end > sp.c_begin ? sp.c_end - sp.c_begin : 0;
}

/* ================================================================ pieces */

char *srv_error_json(const srv_error *e) { return srv_json_print(srv_error_object(e)); }
static char *sse_error(const srv_error *e) { return srv_sse_data(srv_error_object(e)); }

static void add_usage(cJSON *o, const kvc_chat_stats *st)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", st->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", st->output_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)st->prompt_tokens + st->output_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", st->cached_tokens);
    cJSON_AddNumberToObject(d, "cached_disk_tokens", st->cached_disk_tokens);  /* ours */
}

/* llama-server's timings object: prompt_n is what was computed, cache_n what
 * was reused. Every dialect adds it (a field clients ignore). */
void srv_add_timings(void *cjson, const kvc_chat_stats *st)
{
    cJSON *t = cJSON_AddObjectToObject(cjson, "timings");
    cJSON_AddNumberToObject(t, "prompt_n", st->computed_tokens);
    cJSON_AddNumberToObject(t, "cache_n", st->cached_tokens);
    cJSON_AddNumberToObject(t, "cache_disk_n", st->cached_disk_tokens);
    cJSON_AddNumberToObject(t, "prompt_ms", st->prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_second", st->prompt_tps);
    cJSON_AddNumberToObject(t, "predicted_n", st->output_tokens);
    cJSON_AddNumberToObject(t, "predicted_ms", st->decode_ms);
    cJSON_AddNumberToObject(t, "predicted_per_second", st->decode_tps);
    cJSON_AddNumberToObject(t, "ttft_ms", st->ttft_ms);
    if (st->grammar_masks > 0) {           /* constrained decoding's cost */
        cJSON_AddNumberToObject(t, "grammar_masks", st->grammar_masks);
        cJSON_AddNumberToObject(t, "grammar_mask_ms", st->grammar_mask_ms);
        cJSON_AddNumberToObject(t, "grammar_mask_ms_per_token", st->grammar_mask_ms / st->grammar_masks);
    }
}

static const char *finish_name(const char *f)
{
    return f && *f ? f : "stop";
}

static bool is_chat(const srv_dialect *d) { return d == &srv_dialect_chat; }

/* The envelope every response and chunk shares. */
static cJSON *envelope(const srv_reply_id *id, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)id->created);
    cJSON_AddStringToObject(o, "model", id->model ? id->model : "");
    cJSON_AddStringToObject(o, "system_fingerprint", "kvchat");
    return o;
}

/* ================================================================ whole */

/* Chat's choice object of reply rp: its message (reasoning_content, content,
 * tool_calls), logprobs and finish_reason. */
static cJSON *chat_choice(int index, const srv_reply *rp, const kvc_model *model, bool logprobs)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    cJSON *m = cJSON_AddObjectToObject(c, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *calls = rp->tool_calls ? cJSON_Parse(rp->tool_calls) : NULL;
    if (calls && !rp->n_content)
        cJSON_AddNullToObject(m, "content");
    else
        cJSON_AddItemToObject(m, "content", srv_json_string_n(rp->content, rp->n_content));
    if (rp->reasoning)
        cJSON_AddItemToObject(m, "reasoning_content", srv_json_string_n(rp->reasoning, rp->n_reasoning));
    if (calls)
        cJSON_AddItemToObject(m, "tool_calls", calls);
    size_t offset = 0;
    const kvc_event *done = rp->done;
    if (logprobs && model)
        cJSON_AddItemToObject(c, "logprobs", srv_logprobs_chat_json(done->logprobs,
                                                                    done->n_logprobs, model,
                                                                    &offset));
    else
        cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish_name(done->stats.finish_reason));
    return c;
}

/* The completions' choice object: text, logprobs, finish_reason. */
static cJSON *completion_choice(int index, const srv_reply *rp, const kvc_model *model,
                                bool logprobs)
{
    cJSON *c = cJSON_CreateObject();
    const kvc_event *done = rp->done;
    cJSON_AddNumberToObject(c, "index", index);
    cJSON_AddStringToObject(c, "text", done->text ? done->text : "");
    size_t offset = 0;
    if (logprobs && model)
        cJSON_AddItemToObject(c, "logprobs", srv_logprobs_completion_json(
                                                 done->logprobs, done->n_logprobs, model, &offset));
    else
        cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish_name(done->stats.finish_reason));
    return c;
}

static cJSON *choices_response(const srv_reply_id *id, const char *object, const srv_reply *rp,
                               int n, int per_prompt, const kvc_model *model, bool logprobs,
                               cJSON *(*choice)(int, const srv_reply *, const kvc_model *, bool))
{
    cJSON *o = envelope(id, object);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    kvc_chat_stats st[SRV_MAX_CHOICES];
    for (int i = 0; i < n && i < SRV_MAX_CHOICES; i++) {
        cJSON_AddItemToArray(ch, choice(i, &rp[i], model, logprobs));
        st[i] = rp[i].done->stats;
    }
    kvc_chat_stats sum = srv_stats_sum(st, KVC_MIN(n, SRV_MAX_CHOICES), per_prompt);
    add_usage(o, &sum);
    srv_add_timings(o, &sum);
    return o;
}

static char *chat_response(const srv_reply_id *id, const srv_request *rq, const srv_reply *rp,
                           int n, int per_prompt, const kvc_model *model, bool logprobs)
{
    return srv_json_print(choices_response(id, "chat.completion", rp, n, per_prompt, model,
                                           logprobs, chat_choice));
}

static char *completion_response(const srv_reply_id *id, const srv_request *rq,
                                 const srv_reply *rp, int n, int per_prompt,
                                 const kvc_model *model, bool logprobs)
{
    return srv_json_print(choices_response(id, "text_completion", rp, n, per_prompt, model,
                                           logprobs, completion_choice));
}

/* ================================================================ chunks */

/* A chunk of the choice h names, with its logprobs (taken; NULL = null);
 * *choice gets its delta (chat) or the choice itself (completion, for its
 * text), to be filled by the caller. */
static cJSON *chunk(const srv_chunk_head *h, const char *finish, cJSON *logprobs, cJSON **choice)
{
    bool chat = is_chat(h->dialect);
    cJSON *o = envelope(h->id, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", h->index);
    *choice = chat ? cJSON_AddObjectToObject(c, "delta") : c;
    if (logprobs)
        cJSON_AddItemToObject(c, "logprobs", logprobs);
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (h->include_usage)
        cJSON_AddNullToObject(o, "usage");
    return o;
}

/* Chat's first chunk of a choice: delta {role, content ""}. */
static bool chat_begin(srv_emit *h, srv_buf *out)
{
    cJSON *d;
    cJSON *o = chunk(&h->head, NULL, NULL, &d);
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddStringToObject(d, "content", "");
    return srv_buf_put(out, srv_sse_data(o));
}

static bool completion_begin(srv_emit *h, srv_buf *out) { return true; }

/* A chunk of text in `field` of the delta (chat) or choice. */
static char *text_chunk(const srv_chunk_head *h, const char *field, const char *text, size_t len,
                        void *logprobs)
{
    cJSON *s = srv_json_string_n(text, len);
    if (!s) {
        cJSON_Delete(logprobs);
        return NULL;
    }
    cJSON *d;
    cJSON *o = chunk(h, NULL, logprobs, &d);
    cJSON_AddItemToObject(d, field, s);
    return srv_sse_data(o);
}

char *srv_sse_text(const srv_chunk_head *h, const char *text, size_t len, void *logprobs)
{
    return text_chunk(h, is_chat(h->dialect) ? "content" : "text", text, len, logprobs);
}

static bool sse_text(srv_emit *h, int channel, const char *text, size_t len, void *logprobs,
                     srv_buf *out)
{
    if (channel == SRV_REASONING)
        return srv_buf_put(out, text_chunk(&h->head, "reasoning_content", text, len, logprobs));
    return srv_buf_put(out, srv_sse_text(&h->head, text, len, logprobs));
}

/* The tool calls, one delta per call (as OpenAI streams them). */
static bool sse_tool_calls(const srv_chunk_head *h, const char *calls_json, srv_buf *out)
{
    cJSON *calls = cJSON_Parse(calls_json), *c;
    bool ok = calls != NULL;
    int i = 0;
    cJSON_ArrayForEach(c, calls) {
        cJSON *d;
        cJSON *o = chunk(h, NULL, NULL, &d);
        cJSON *x = cJSON_Duplicate(c, true);
        cJSON_AddNumberToObject(x, "index", i++);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), x);
        ok = srv_buf_put(out, srv_sse_data(o)) && ok;
    }
    cJSON_Delete(calls);
    return ok;
}

char *srv_sse_finish(const srv_chunk_head *h, const char *finish_reason, void *logprobs)
{
    cJSON *d;
    cJSON *o = chunk(h, finish_name(finish_reason), logprobs, &d);
    if (!is_chat(h->dialect))
        cJSON_AddStringToObject(d, "text", "");
    return srv_sse_data(o);
}

static bool sse_finish(srv_emit *h, const srv_reply *rp, void *logprobs, srv_buf *out)
{
    bool ok = !rp->tool_calls || sse_tool_calls(&h->head, rp->tool_calls, out);
    char *f = srv_sse_finish(&h->head, rp->done->stats.finish_reason, logprobs);
    return srv_buf_put(out, f) && ok;
}

/* choices [] with the usage and timings (include_usage), then [DONE]. */
static bool sse_end(const srv_reply_id *id, bool include_usage, const kvc_chat_stats *stats,
                    int n, int per_prompt, srv_buf *out, const char *object)
{
    if (include_usage) {
        cJSON *o = envelope(id, object);
        cJSON_AddArrayToObject(o, "choices");
        kvc_chat_stats sum = srv_stats_sum(stats, n, per_prompt);
        add_usage(o, &sum);
        srv_add_timings(o, &sum);
        if (!srv_buf_put(out, srv_sse_data(o)))
            return false;
    }
    return srv_buf_put(out, strdup("data: [DONE]\n\n"));
}

static bool chat_end(const srv_reply_id *id, bool include_usage, const kvc_chat_stats *stats,
                     int n, int per_prompt, srv_buf *out)
{
    return sse_end(id, include_usage, stats, n, per_prompt, out, "chat.completion.chunk");
}

static bool completion_end(const srv_reply_id *id, bool include_usage,
                           const kvc_chat_stats *stats, int n, int per_prompt, srv_buf *out)
{
    return sse_end(id, include_usage, stats, n, per_prompt, out, "text_completion");
}

/* ================================================================ tables */

const srv_dialect srv_dialect_chat = {
    .name = "chat.completions",
    .id_prefix = "chatcmpl-",
    .fields = srv_fields_chat,
    .parse = srv_parse_chat,
    .response = chat_response,
    .error = srv_error_json,
    .logprobs = srv_logprobs_chat_json,
    .sse_begin = chat_begin,
    .sse_text = sse_text,
    .sse_finish = sse_finish,
    .sse_end = chat_end,
    .sse_error = sse_error,
};

const srv_dialect srv_dialect_completions = {
    .name = "completions",
    .id_prefix = "cmpl-",
    .fields = srv_fields_completions,
    .parse = srv_parse_completion,
    .response = completion_response,
    .error = srv_error_json,
    .logprobs = srv_logprobs_completion_json,
    .sse_begin = completion_begin,
    .sse_text = sse_text,
    .sse_finish = sse_finish,
    .sse_end = completion_end,
    .sse_error = sse_error,
};
