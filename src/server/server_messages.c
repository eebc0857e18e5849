/* server_messages.c - the Anthropic Messages dialect (POST /v1/messages and
 * /v1/messages/count_tokens), as Claude Code and the @anthropic-ai/sdk
 * client call it.
 *
 * A request is translated into the chat completions request it means
 * (system -> a system message; content blocks: text -> content, thinking ->
 * reasoning_content, tool_use -> tool_calls, tool_result -> tool messages;
 * tools' input_schema -> parameters; tool_choice auto/any/tool/none;
 * stop_sequences -> stop; thinking -> enable_thinking; metadata.user_id ->
 * user, the session key) and parsed by the chat parser, so a conversation
 * renders to the same tokens through any API and shares its cache.
 *
 * The answer is a message with content blocks (thinking, text, tool_use),
 * stop_reason (end_turn, max_tokens, stop_sequence, tool_use) and usage
 * (input_tokens not cached, cache_read_input_tokens, output_tokens); a
 * stream sends message_start, ping, content_block_start/delta/stop
 * (text_delta, thinking_delta, input_json_delta), message_delta and
 * message_stop. Errors are in Anthropic's shape. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "common.h"
#include "server.h"
#include "tool_calls.h"

#define BAD(e, param, ...) srv_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static bool is_type(const cJSON *block, const char *type)
{
    const cJSON *t = srv_json_get(block, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

/* ============================================================== request */

/* Text blocks as chat content: one block's text as a string (as a chat
 * client sends it), several as text parts (joined by the chat parser).
 * NULL (with *e) when a block is not text. */
static cJSON *oom(srv_error *e)
{
    srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return NULL;
}

/* c (a string or an array of text blocks) as a chat message's content: a
 * string, or an array of {"type": "text", "text"} parts. NULL with e set
 * (400 naming param, or 500 when memory ran out) otherwise. */
static cJSON *text_blocks(const cJSON *c, const char *param, srv_error *e)
{
    if (cJSON_IsString(c)) {
        cJSON *s = cJSON_CreateString(c->valuestring);
        return s ? s : oom(e);
    }
    if (!cJSON_IsArray(c)) {
        BAD(e, param, "%s must be a string or an array of text blocks", param);
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    if (!parts)
        return oom(e);
    const cJSON *b;
    int j = 0;
    cJSON_ArrayForEach(b, c) {
        const cJSON *t = srv_json_get(b, "text");
        if (!is_type(b, "text") || !cJSON_IsString(t)) {
            cJSON_Delete(parts);
            BAD(e, param, "%s[%d] must be a text block {\"type\": \"text\", \"text\": ...}",
                param, j);
            return NULL;
        }
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "text");
        cJSON_AddStringToObject(x, "text", t->valuestring);
        cJSON_AddItemToArray(parts, x);
        j++;
    }
    if (j == 1) {
        cJSON *s = cJSON_CreateString(cJSON_GetObjectItem(parts->child, "text")->valuestring);
        cJSON_Delete(parts);
        return s ? s : oom(e);
    }
    return parts;
}

static cJSON *add_message(cJSON *msgs, const char *role, cJSON *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    if (content)
        cJSON_AddItemToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
    return m;
}

/* A user turn's blocks: tool_result blocks become tool messages (first, as
 * Anthropic's order has them), the text blocks one user message. */
static int user_turn(cJSON *msgs, const cJSON *c, const char *param, srv_error *e)
{
    if (cJSON_IsString(c)) {
        add_message(msgs, "user", cJSON_CreateString(c->valuestring));
        return 0;
    }
    cJSON *texts = cJSON_CreateArray();
    const cJSON *b;
    int j = 0;
    cJSON_ArrayForEach(b, c) {
        char p[64];
        snprintf(p, sizeof(p), "%s[%d]", param, j++);
        if (is_type(b, "tool_result")) {
            const cJSON *id = srv_json_get(b, "tool_use_id"), *rc = srv_json_get(b, "content");
            cJSON *content = rc ? text_blocks(rc, p, e) : cJSON_CreateString("");
            if (!cJSON_IsString(id) || !content) {
                cJSON_Delete(content);
                cJSON_Delete(texts);
                return content ? BAD(e, p, "%s.tool_use_id must be a string", p) : e->http_status;
            }
            cJSON *m = add_message(msgs, "tool", content);
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
        } else if (is_type(b, "text")) {
            cJSON_AddItemToArray(texts, cJSON_Duplicate(b, true));
        } else {
            const cJSON *t = srv_json_get(b, "type");
            cJSON_Delete(texts);
            return BAD(e, p, "%s.type '%.40s' is not supported in a user turn (text, "
                       "tool_result; kvchat's models read text only)", p,
                       cJSON_IsString(t) ? t->valuestring : "");
        }
    }
    int rc = 0;
    if (cJSON_GetArraySize(texts) > 0) {
        cJSON *content = text_blocks(texts, param, e);
        if (content)
            add_message(msgs, "user", content);
        else
            rc = e->http_status;
    }
    cJSON_Delete(texts);
    return rc;
}

/* An assistant turn's blocks: text -> content, thinking -> reasoning_content,
 * tool_use -> tool_calls (input as the arguments' JSON text). */
static int assistant_turn(cJSON *msgs, const cJSON *c, const char *param, srv_error *e)
{
    if (cJSON_IsString(c)) {
        add_message(msgs, "assistant", cJSON_CreateString(c->valuestring));
        return 0;
    }
    cJSON *texts = cJSON_CreateArray(), *calls = cJSON_CreateArray();
    const char *thinking = NULL;
    const cJSON *b;
    int j = 0, rc = 0;
    cJSON_ArrayForEach(b, c) {
        char p[64];
        snprintf(p, sizeof(p), "%s[%d]", param, j++);
        if (is_type(b, "text")) {
            cJSON_AddItemToArray(texts, cJSON_Duplicate(b, true));
        } else if (is_type(b, "thinking")) {
            const cJSON *t = srv_json_get(b, "thinking");
            thinking = cJSON_IsString(t) ? t->valuestring : thinking;
        } else if (is_type(b, "redacted_thinking")) {
            continue;                       /* another model's: nothing to show ours */
        } else if (is_type(b, "tool_use")) {
            const cJSON *id = srv_json_get(b, "id"), *name = srv_json_get(b, "name"),
                        *in = srv_json_get(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name)) {
                rc = BAD(e, p, "%s: a tool_use needs string id and name", p);
                break;
            }
            char *args = in ? cJSON_PrintUnformatted(in) : strdup("{}");
            kvc_tool_call_add(calls, id->valuestring, name->valuestring, args ? args : "{}");
            free(args);
        } else {
            const cJSON *t = srv_json_get(b, "type");
            rc = BAD(e, p, "%s.type '%.40s' is not supported in an assistant turn (text, "
                     "thinking, tool_use)", p, cJSON_IsString(t) ? t->valuestring : "");
            break;
        }
    }
    cJSON *content = NULL;
    if (!rc && cJSON_GetArraySize(texts) > 0 && !(content = text_blocks(texts, param, e)))
        rc = e->http_status;
    if (!rc) {
        bool any_calls = cJSON_GetArraySize(calls) > 0;
        cJSON *m = add_message(msgs, "assistant",
                               content ? content : any_calls ? cJSON_CreateNull()
                                                             : cJSON_CreateString(""));
        if (thinking)
            cJSON_AddStringToObject(m, "reasoning_content", thinking);
        if (any_calls) {
            cJSON_AddItemToObject(m, "tool_calls", calls);
            calls = NULL;
        }
    }
    cJSON_Delete(texts);
    cJSON_Delete(calls);
    return rc;
}

static int translate_messages(cJSON *chat, const cJSON *root, srv_error *e)
{
    const cJSON *sys = srv_json_get(root, "system"), *ms = srv_json_get(root, "messages"), *m;
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    if (sys) {
        cJSON *content = text_blocks(sys, "system", e);
        if (!content)
            return e->http_status;
        add_message(msgs, "system", content);
    }
    if (!cJSON_IsArray(ms))
        return BAD(e, "messages", "messages must be an array of {\"role\", \"content\"}");
    int i = 0, rc;
    cJSON_ArrayForEach(m, ms) {
        char p[48];
        snprintf(p, sizeof(p), "messages[%d].content", i);
        const cJSON *role = srv_json_get(m, "role"), *c = srv_json_get(m, "content");
        if (!cJSON_IsString(role) || !c || !(cJSON_IsString(c) || cJSON_IsArray(c)))
            return BAD(e, p, "messages[%d] must have a role and a content (a string or an "
                       "array of content blocks)", i);
        if (!strcmp(role->valuestring, "user"))
            rc = user_turn(msgs, c, p, e);
        else if (!strcmp(role->valuestring, "assistant"))
            rc = assistant_turn(msgs, c, p, e);
        else
            return BAD(e, p, "messages[%d].role must be \"user\" or \"assistant\"", i);
        if (rc)
            return rc;
        i++;
    }
    return 0;
}

/* tools: [{name, description?, input_schema}] (custom tools) as chat's.
 * Server tools (web_search_..., bash_..., text_editor_..., code_execution_...)
 * are left out and named in r->ignored: kvchat runs none of them. */
static int translate_tools(srv_request *r, cJSON *chat, const cJSON *tools, srv_error *e)
{
    if (!cJSON_IsArray(tools))
        return BAD(e, "tools", "tools must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = srv_json_get(t, "type");
        char note[64];
        i++;
        if (type && !is_type(t, "custom")) {
            snprintf(note, sizeof(note), "tools[%d] (%.40s)", i - 1,
                     cJSON_IsString(type) ? type->valuestring : "?");
            srv_note_ignored(r, note);
            continue;
        }
        srv_json_add_function(out, t, "input_schema");
    }
    if (cJSON_GetArraySize(out) == 0)
        cJSON_DeleteItemFromObject(chat, "tools");
    return 0;
}

/* tool_choice {type: auto | any | tool (name) | none, disable_parallel_tool_use?} */
static int translate_tool_choice(cJSON *chat, const cJSON *tc, srv_error *e)
{
    const cJSON *name = srv_json_get(tc, "name"),
                *dp = srv_json_get(tc, "disable_parallel_tool_use");
    if (is_type(tc, "auto") || is_type(tc, "none")) {
        cJSON_AddStringToObject(chat, "tool_choice", srv_json_get(tc, "type")->valuestring);
    } else if (is_type(tc, "any")) {
        cJSON_AddStringToObject(chat, "tool_choice", "required");
    } else if (is_type(tc, "tool") && cJSON_IsString(name)) {
        cJSON *x = cJSON_AddObjectToObject(chat, "tool_choice");
        cJSON_AddStringToObject(x, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(x, "function"), "name", name->valuestring);
    } else {
        return BAD(e, "tool_choice", "tool_choice must be {\"type\": \"auto\" | \"any\" | "
                   "\"none\"} or {\"type\": \"tool\", \"name\": ...}");
    }
    if (cJSON_IsTrue(dp))
        cJSON_AddFalseToObject(chat, "parallel_tool_calls");
    return 0;
}

/* The Messages request as a chat request (the fields were checked:
 * srv_fields_messages). */
static int translate(srv_request *r, cJSON *chat, const cJSON *root, srv_error *e)
{
    const cJSON *v;
    int rc;
    static const char *const same[] = {
        "model", "max_tokens", "temperature", "top_p", "stream", "presence_penalty",
        "frequency_penalty",
    };
    if ((v = srv_json_get(root, "temperature")) && cJSON_IsNumber(v) && v->valuedouble > 1)
        return BAD(e, "temperature", "temperature must be a number between 0 and 1");
    for (size_t i = 0; i < KVC_ARRAY_LEN(same); i++)
        srv_json_copy_as(chat, root, same[i], same[i]);
    cJSON_ArrayForEach(v, root)        /* the extensions every route honours */
        if (srv_field_use(NULL, v->string) == SRV_FIELD_USED && !cJSON_IsNull(v) &&
            strcmp(v->string, "user"))
            cJSON_AddItemToObject(chat, v->string, cJSON_Duplicate(v, true));
    srv_json_copy_as(chat, root, "stop_sequences", "stop");
    if ((rc = translate_messages(chat, root, e)))
        return rc;
    if ((v = srv_json_get(root, "tools")) && (rc = translate_tools(r, chat, v, e)))
        return rc;
    if ((v = srv_json_get(root, "tool_choice")) && (rc = translate_tool_choice(chat, v, e)))
        return rc;
    const cJSON *th = srv_json_get(root, "thinking"), *md = srv_json_get(root, "metadata");
    if (th && !(is_type(th, "enabled") || is_type(th, "disabled") || is_type(th, "adaptive")))
        return BAD(e, "thinking", "thinking must be {\"type\": \"enabled\" | \"disabled\" | "
                   "\"adaptive\"}");
    if (th)
        cJSON_AddBoolToObject(chat, "enable_thinking", !is_type(th, "disabled"));
    if (md && !cJSON_IsObject(md))
        return BAD(e, "metadata", "metadata must be an object");
    if (cJSON_IsString(srv_json_get(md, "user_id")) && !srv_json_get(root, "prompt_cache_key"))
        srv_json_copy_as(chat, md, "user_id", "user");
    return 0;
}

static int messages_parse(srv_request *r, void *root_json, const srv_limits *lim, srv_error *e)
{
    int rc = srv_parse_translated(r, root_json, translate, lim, e);
    if (rc)
        return rc;
    /* which stop sequence ended a reply is told by its tokens (srv_reply_make) */
    if (r->params.chat.n_stop > 0 && r->params.chat.logprobs < 0)
        r->params.chat.logprobs = 0;
    return 0;
}

/* ============================================================== answer */

static const char *stop_reason(const srv_reply *rp)
{
    const char *f = rp->done->stats.finish_reason;
    if (rp->tool_calls)
        return "tool_use";
    if (f && !strcmp(f, "length"))
        return "max_tokens";
    return rp->stop_sequence ? "stop_sequence" : "end_turn";
}

/* Anthropic's usage: input_tokens are those not read from the cache (as
 * llama-server counts them; nothing is "created" apart: every prompt token
 * computed is cached without cache_control). */
static cJSON *usage_object(const kvc_chat_stats *st)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", st->prompt_tokens - st->cached_tokens);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", st->cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", st->output_tokens);
    return u;
}

/* A tool_use block of a chat tool call (input: its arguments parsed). */
static cJSON *tool_use_block(const cJSON *call, bool with_input)
{
    const cJSON *f = srv_json_get(call, "function"), *args = srv_json_get(f, "arguments");
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "tool_use");
    srv_json_copy_as(b, call, "id", "id");
    srv_json_copy_as(b, f, "name", "name");
    cJSON *in = with_input && cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    cJSON_AddItemToObject(b, "input", in ? in : cJSON_CreateObject());
    return b;
}

static cJSON *thinking_block(const char *text, size_t n)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "thinking");
    cJSON_AddItemToObject(b, "thinking", srv_json_string_n(text, n));
    cJSON_AddStringToObject(b, "signature", "");
    return b;
}

static cJSON *text_block(const char *text, size_t n)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "text");
    cJSON_AddItemToObject(b, "text", srv_json_string_n(text, n));
    return b;
}

/* The message object: without rp the empty one message_start carries, with
 * the prompt's figures (output_tokens 0). */
static cJSON *message_object(const srv_reply_id *id, const srv_reply *rp,
                             const kvc_chat_stats *prompt)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", id->model ? id->model : "");
    cJSON *c = cJSON_AddArrayToObject(o, "content");
    if (rp && rp->reasoning)
        cJSON_AddItemToArray(c, thinking_block(rp->reasoning, rp->n_reasoning));
    if (rp && (rp->n_content || !rp->tool_calls))
        cJSON_AddItemToArray(c, text_block(rp->content, rp->n_content));
    cJSON *calls = rp && rp->tool_calls ? cJSON_Parse(rp->tool_calls) : NULL, *x;
    cJSON_ArrayForEach(x, calls)
        cJSON_AddItemToArray(c, tool_use_block(x, true));
    cJSON_Delete(calls);
    if (rp) {
        cJSON_AddStringToObject(o, "stop_reason", stop_reason(rp));
        if (rp->stop_sequence)
            cJSON_AddStringToObject(o, "stop_sequence", rp->stop_sequence);
        else
            cJSON_AddNullToObject(o, "stop_sequence");
    } else {
        cJSON_AddNullToObject(o, "stop_reason");
        cJSON_AddNullToObject(o, "stop_sequence");
    }
    cJSON_AddItemToObject(o, "usage", usage_object(rp ? &rp->done->stats : prompt));
    if (rp)
        srv_add_timings(o, &rp->done->stats);
    return o;
}

static char *messages_response(const srv_reply_id *id, const srv_request *rq, const srv_reply *rp,
                               int n, int per_prompt, const kvc_model *model, bool logprobs)
{
    return srv_json_print(message_object(id, rp, NULL));
}

/* Anthropic's error type for a status. */
static const char *error_type(const srv_error *e)
{
    switch (e->http_status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default:  return e->http_status >= 500 ? "api_error" : "invalid_request_error";
    }
}

/* {"type": "error", "error": {"type", "message"}} */
static cJSON *error_object(const srv_error *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "error");
    cJSON *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "type", error_type(e));
    cJSON_AddStringToObject(x, "message", e->message);
    return o;
}

static char *messages_error(const srv_error *e) { return srv_json_print(error_object(e)); }
static char *messages_sse_error(const srv_error *e)
{
    return srv_sse_event("error", error_object(e));
}

/* ============================================================== stream */

static bool event(const char *type, cJSON *o, srv_buf *out)
{
    cJSON_AddStringToObject(o, "type", type);
    return srv_buf_put(out, srv_sse_event(type, o));
}

static cJSON *indexed(int index)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", index);
    return o;
}

static bool msg_begin(srv_emit *h, srv_buf *out)
{
    cJSON *o = cJSON_CreateObject();
    kvc_chat_stats prompt = h->prompt;
    prompt.output_tokens = 0;
    cJSON_AddItemToObject(o, "message", message_object(h->head.id, NULL, &prompt));
    bool ok = event("message_start", o, out);
    return event("ping", cJSON_CreateObject(), out) && ok;
}

static bool close_block(srv_emit *h, srv_buf *out)
{
    if (h->open < 0)
        return true;
    h->open = -1;
    return event("content_block_stop", indexed(h->blocks - 1), out);
}

static bool msg_text(srv_emit *h, int ch, const char *text, size_t len, void *logprobs,
                     srv_buf *out)
{
    cJSON_Delete(logprobs);
    bool ok = true;
    if (h->open != ch) {
        ok = close_block(h, out);
        cJSON *o = indexed(h->blocks++);
        cJSON_AddItemToObject(o, "content_block", ch == SRV_REASONING ? thinking_block("", 0)
                                                                      : text_block("", 0));
        ok = event("content_block_start", o, out) && ok;
        h->open = ch;
    }
    cJSON *o = indexed(h->blocks - 1), *d = cJSON_AddObjectToObject(o, "delta");
    cJSON_AddStringToObject(d, "type", ch == SRV_REASONING ? "thinking_delta" : "text_delta");
    cJSON_AddItemToObject(d, ch == SRV_REASONING ? "thinking" : "text",
                          srv_json_string_n(text, len));
    return event("content_block_delta", o, out) && ok;
}

static bool msg_finish(srv_emit *h, const srv_reply *rp, void *logprobs, srv_buf *out)
{
    cJSON_Delete(logprobs);
    bool ok = close_block(h, out);
    cJSON *calls = rp->tool_calls ? cJSON_Parse(rp->tool_calls) : NULL, *c;
    cJSON_ArrayForEach(c, calls) {
        int i = h->blocks++;
        cJSON *o = indexed(i);
        cJSON_AddItemToObject(o, "content_block", tool_use_block(c, false));
        ok = event("content_block_start", o, out) && ok;
        const cJSON *args = srv_json_get(srv_json_get(c, "function"), "arguments");
        o = indexed(i);
        cJSON *d = cJSON_AddObjectToObject(o, "delta");
        cJSON_AddStringToObject(d, "type", "input_json_delta");
        cJSON_AddStringToObject(d, "partial_json", cJSON_IsString(args) ? args->valuestring : "{}");
        ok = event("content_block_delta", o, out) && ok;
        ok = event("content_block_stop", indexed(i), out) && ok;
    }
    cJSON_Delete(calls);
    cJSON *o = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(o, "delta");
    cJSON_AddStringToObject(d, "stop_reason", stop_reason(rp));
    if (rp->stop_sequence)
        cJSON_AddStringToObject(d, "stop_sequence", rp->stop_sequence);
    else
        cJSON_AddNullToObject(d, "stop_sequence");
    cJSON_AddItemToObject(o, "usage", usage_object(&rp->done->stats));
    ok = event("message_delta", o, out) && ok;
    return event("message_stop", cJSON_CreateObject(), out) && ok;
}

static bool msg_end(const srv_reply_id *id, bool include_usage, const kvc_chat_stats *stats,
                    int n, int per_prompt, srv_buf *out)
{
    return true;      /* message_stop was the end */
}

const srv_dialect srv_dialect_messages = {
    .name = "messages",
    .id_prefix = "msg_",
    .fields = srv_fields_messages,
    .parse = messages_parse,
    .response = messages_response,
    .error = messages_error,
    .logprobs = srv_logprobs_chat_json,
    .sse_begin = msg_begin,
    .sse_text = msg_text,
    .sse_finish = msg_finish,
    .sse_end = msg_end,
    .sse_error = messages_sse_error,
};

/* ========================================================= count_tokens */

char *srv_count_tokens_json(int64_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", (double)n);
    return srv_json_print(o);
}
