/* server_responses.c - the OpenAI Responses dialect (POST /v1/responses),
 * stateless as llama-server and Ollama serve it.
 *
 * A request is translated into the chat completions request it means
 * (instructions -> a system message, input items -> messages, function
 * tools -> chat tools, text.format -> response_format, reasoning.effort ->
 * reasoning_effort, max_output_tokens -> max_tokens) and parsed by the chat
 * parser: one internal request, so a conversation sent through either API
 * renders to the same tokens and shares its cache. Nothing is stored:
 * previous_response_id is refused with a message saying to send the history.
 *
 * The answer is a response object whose output lists a reasoning item, a
 * message item and function_call items; a stream sends the named events the
 * OpenAI SDKs, the Agents SDK and Codex consume (response.created,
 * response.output_item.added, response.output_text.delta, ...,
 * response.completed), each with its sequence_number. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "common.h"
#include "server.h"
#include "tool_calls.h"

#define BAD(e, param, ...) srv_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* ============================================================== request */

/* Translation state: the chat messages made so far, and reasoning waiting
 * for the assistant message it belongs to. */
typedef struct xlate {
    cJSON      *msgs;
    const char *reasoning;   /* a reasoning item's text, for the next assistant turn */
    bool        last_open;   /* the last message is an assistant turn that may take calls */
} xlate;

/* The text of a content part list ([{type: input_text | output_text | text
 * | refusal, text}]) as chat parts, or the string itself. NULL with *e set. */
static cJSON *content_of(const cJSON *c, const char *param, srv_error *e)
{
    if (cJSON_IsString(c))
        return cJSON_CreateString(c->valuestring);
    if (!cJSON_IsArray(c)) {
        BAD(e, param, "%s must be a string or an array of content parts", param);
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    const cJSON *p;
    int j = 0;
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = srv_json_get(p, "type"), *text = srv_json_get(p, "text");
        if (!text && cJSON_IsString(srv_json_get(p, "refusal")))
            text = srv_json_get(p, "refusal");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") &&
            strcmp(t, "refusal")) {
            cJSON_Delete(parts);
            BAD(e, param, "%s[%d].type '%.40s' is not supported (input_text, output_text; "
                "kvchat's models read text only)", param, j, t);
            return NULL;
        }
        if (!cJSON_IsString(text)) {
            cJSON_Delete(parts);
            BAD(e, param, "%s[%d].text must be a string", param, j);
            return NULL;
        }
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "text");
        cJSON_AddStringToObject(x, "text", text->valuestring);
        cJSON_AddItemToArray(parts, x);
        j++;
    }
    if (j == 1) {               /* one part: the same message as its plain string */
        cJSON *s = cJSON_CreateString(parts->child->child->next->valuestring);
        cJSON_Delete(parts);
        return s;
    }
    return parts;
}

/* A new message {role, content?} appended to x->msgs. */
static cJSON *add_message(xlate *x, const char *role, cJSON *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    if (content)
        cJSON_AddItemToObject(m, "content", content);
    if (!strcmp(role, "assistant") && x->reasoning) {
        cJSON_AddStringToObject(m, "reasoning_content", x->reasoning);
        x->reasoning = NULL;
    }
    cJSON_AddItemToArray(x->msgs, m);
    x->last_open = !strcmp(role, "assistant");
    return m;
}

/* A message item {type?: "message", role, content}. */
static int message_item(xlate *x, const cJSON *it, const char *param, srv_error *e)
{
    const cJSON *role = srv_json_get(it, "role"), *c = srv_json_get(it, "content");
    char p[64];
    if (!cJSON_IsString(role))
        return BAD(e, param, "%s.role must be a string", param);
    snprintf(p, sizeof(p), "%s.content", param);
    cJSON *content = c ? content_of(c, p, e) : cJSON_CreateString("");
    if (!content)
        return e->http_status;
    add_message(x, role->valuestring, content);
    return 0;
}

/* A function_call item: a tool call of the assistant turn before it (or of
 * a new one). */
static int call_item(xlate *x, const cJSON *it, const char *param, srv_error *e)
{
    const cJSON *name = srv_json_get(it, "name"), *args = srv_json_get(it, "arguments"),
                *id = srv_json_get(it, "call_id");
    if (!cJSON_IsString(name) || !cJSON_IsString(args) || !cJSON_IsString(id))
        return BAD(e, param, "%s: a function_call needs string call_id, name and arguments",
                   param);
    cJSON *m = x->last_open ? cJSON_GetArrayItem(x->msgs, cJSON_GetArraySize(x->msgs) - 1)
                            : add_message(x, "assistant", NULL);
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!calls)
        calls = cJSON_AddArrayToObject(m, "tool_calls");
    kvc_tool_call_add(calls, id->valuestring, name->valuestring, args->valuestring);
    return 0;
}

/* A function_call_output item: a tool message. */
static int output_item(xlate *x, const cJSON *it, const char *param, srv_error *e)
{
    const cJSON *id = srv_json_get(it, "call_id"), *out = srv_json_get(it, "output");
    char p[64];
    if (!cJSON_IsString(id))
        return BAD(e, param, "%s.call_id must be a string", param);
    snprintf(p, sizeof(p), "%s.output", param);
    cJSON *content = out ? content_of(out, p, e) : cJSON_CreateString("");
    if (!content)
        return e->http_status;
    cJSON *m = add_message(x, "tool", content);
    cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
    return 0;
}

/* A reasoning item: its text (content's reasoning_text, else the summary)
 * goes with the next assistant turn. */
static int reasoning_item(xlate *x, const cJSON *it)
{
    const cJSON *parts = srv_json_get(it, "content"), *p;
    if (!cJSON_IsArray(parts) || !cJSON_GetArraySize(parts))
        parts = srv_json_get(it, "summary");
    cJSON_ArrayForEach(p, parts) {
        const cJSON *t = srv_json_get(p, "text");
        if (cJSON_IsString(t))
            x->reasoning = t->valuestring;   /* the last part: models write one */
    }
    return 0;
}

/* input: a string (one user message) or a list of items. */
static int translate_input(xlate *x, const cJSON *input, srv_error *e)
{
    if (cJSON_IsString(input)) {
        add_message(x, "user", cJSON_CreateString(input->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(input))
        return BAD(e, "input", "input must be a string or an array of items");
    const cJSON *it;
    int i = 0, rc = 0;
    cJSON_ArrayForEach(it, input) {
        char param[48];
        snprintf(param, sizeof(param), "input[%d]", i++);
        const cJSON *type = srv_json_get(it, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : type ? "" : "message";
        if (!cJSON_IsObject(it))
            return BAD(e, param, "%s must be an object", param);
        if (!strcmp(t, "message"))
            rc = message_item(x, it, param, e);
        else if (!strcmp(t, "function_call"))
            rc = call_item(x, it, param, e);
        else if (!strcmp(t, "function_call_output"))
            rc = output_item(x, it, param, e);
        else if (!strcmp(t, "reasoning"))
            rc = reasoning_item(x, it);
        else
            return BAD(e, param, "%s.type '%.40s' is not supported (message, function_call, "
                       "function_call_output, reasoning)", param, t);
        if (rc)
            return rc;
    }
    return 0;
}

/* tools in chat's shape: function tools, and those of a namespace (Codex
 * groups tools so). Built-in tools (web_search, file_search, local_shell,
 * custom, mcp, ...) are left out and named in r->ignored: kvchat runs none,
 * so the model is not shown them; refusing them would make Codex, which
 * always sends web_search, unusable. */
static int translate_tools(srv_request *r, cJSON *chat, const cJSON *tools, srv_error *e)
{
    if (!cJSON_IsArray(tools))
        return BAD(e, "tools", "tools must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    const cJSON *t, *inner;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = srv_json_get(t, "type");
        const char *ty = cJSON_IsString(type) ? type->valuestring : "";
        char note[64];
        i++;
        if (!strcmp(ty, "function")) {
            srv_json_add_function(out, t, "parameters");
        } else if (!strcmp(ty, "namespace") && cJSON_IsArray(srv_json_get(t, "tools"))) {
            cJSON_ArrayForEach(inner, srv_json_get(t, "tools"))
                if (cJSON_IsString(srv_json_get(inner, "type")) &&
                    !strcmp(srv_json_get(inner, "type")->valuestring, "function"))
                    srv_json_add_function(out, inner, "parameters");
        } else {
            snprintf(note, sizeof(note), "tools[%d] (%.40s)", i - 1, ty);
            srv_note_ignored(r, note);
        }
    }
    if (cJSON_GetArraySize(out) == 0)
        cJSON_DeleteItemFromObject(chat, "tools");
    return 0;
}

/* tool_choice: "auto" | "none" | "required" | {type: "function", name}. */
static int translate_tool_choice(cJSON *chat, const cJSON *tc, srv_error *e)
{
    if (cJSON_IsString(tc)) {
        cJSON_AddStringToObject(chat, "tool_choice", tc->valuestring);
        return 0;
    }
    const cJSON *type = srv_json_get(tc, "type"), *name = srv_json_get(tc, "name");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
        return BAD(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or "
                   "{\"type\": \"function\", \"name\": ...}");
    cJSON *x = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON_AddStringToObject(x, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(x, "function"), "name", name->valuestring);
    return 0;
}

/* text: {format: {type: text | json_object | json_schema, name?, schema?,
 * strict?}, verbosity?}. */
static int translate_text(cJSON *chat, const cJSON *text, srv_error *e)
{
    const cJSON *f = srv_json_get(text, "format"), *type;
    if (!cJSON_IsObject(text))
        return BAD(e, "text", "text must be an object");
    if (!f)
        return 0;
    if (!cJSON_IsObject(f) || !cJSON_IsString(type = srv_json_get(f, "type")))
        return BAD(e, "text.format", "text.format must be an object with a \"type\"");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    cJSON_AddStringToObject(rf, "type", type->valuestring);
    if (!strcmp(type->valuestring, "json_schema")) {
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        srv_json_copy_as(js, f, "name", "name");
        srv_json_copy_as(js, f, "schema", "schema");
        srv_json_copy_as(js, f, "strict", "strict");
    }
    return 0;
}

/* The Responses request as a chat request (the fields were checked:
 * srv_fields_responses). */
static int translate(srv_request *r, cJSON *chat, const cJSON *root, srv_error *e)
{
    static const char *const same[] = {
        "model", "temperature", "top_p", "stream", "parallel_tool_calls", "stop",
        "presence_penalty", "frequency_penalty", "logit_bias",
    };
    const cJSON *v;
    int rc;
    if ((v = srv_json_get(root, "previous_response_id")) ||
        (v = srv_json_get(root, "conversation")))
        return BAD(e, v->string, "%s is not supported: kvchat stores no responses (as "
                   "llama-server and Ollama); send the whole conversation in input", v->string);
    if ((v = srv_json_get(root, "background")) && cJSON_IsTrue(v))
        return BAD(e, "background", "background is not supported (only false)");
    for (size_t i = 0; i < KVC_ARRAY_LEN(same); i++)
        srv_json_copy_as(chat, root, same[i], same[i]);
    cJSON_ArrayForEach(v, root)        /* the extensions every route honours */
        if (srv_field_use(NULL, v->string) == SRV_FIELD_USED && !cJSON_IsNull(v))
            cJSON_AddItemToObject(chat, v->string, cJSON_Duplicate(v, true));
    srv_json_copy_as(chat, root, "max_output_tokens", "max_tokens");
    xlate x = { .msgs = cJSON_AddArrayToObject(chat, "messages") };
    const cJSON *ins = srv_json_get(root, "instructions"), *input = srv_json_get(root, "input");
    if (ins && !cJSON_IsString(ins))
        return BAD(e, "instructions", "instructions must be a string");
    if (ins)
        add_message(&x, "system", cJSON_CreateString(ins->valuestring));
    if (!input)
        return BAD(e, "input", "input is required");
    if ((rc = translate_input(&x, input, e)))
        return rc;
    if ((v = srv_json_get(root, "tools")) && (rc = translate_tools(r, chat, v, e)))
        return rc;
    if ((v = srv_json_get(root, "tool_choice")) && (rc = translate_tool_choice(chat, v, e)))
        return rc;
    if ((v = srv_json_get(root, "text")) && (rc = translate_text(chat, v, e)))
        return rc;
    const cJSON *rs = srv_json_get(root, "reasoning");
    if (rs && !cJSON_IsObject(rs))
        return BAD(e, "reasoning", "reasoning must be an object");
    if ((v = srv_json_get(rs, "effort")))
        cJSON_AddItemToObject(chat, "reasoning_effort", cJSON_Duplicate(v, true));
    return 0;
}

static int responses_parse(srv_request *r, void *root_json, const srv_limits *lim, srv_error *e)
{
    return srv_parse_translated(r, root_json, translate, lim, e);
}

/* ============================================================== answer */

/* The id of the output item at index i of response id: its kind's prefix
 * and the response's hex digits. */
static void item_id(char *buf, size_t cap, const char *prefix, const srv_reply_id *id, int i)
{
    const char *hex = strchr(id->id, '_');
    snprintf(buf, cap, "%s_%s%d", prefix, hex ? hex + 1 : id->id, i);
}


static cJSON *reasoning_object(const char *iid, const char *text, size_t n)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", iid);
    cJSON_AddStringToObject(it, "type", "reasoning");
    cJSON_AddArrayToObject(it, "summary");
    cJSON *c = cJSON_AddArrayToObject(it, "content"), *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "reasoning_text");
    cJSON_AddItemToObject(p, "text", srv_json_string_n(text, n));
    cJSON_AddItemToArray(c, p);
    return it;
}

static cJSON *text_part(const char *text, size_t n)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddItemToObject(p, "text", srv_json_string_n(text, n));
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

static cJSON *message_object(const char *iid, const char *status, const char *text, size_t n,
                             bool with_part)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", iid);
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *c = cJSON_AddArrayToObject(it, "content");
    if (with_part)
        cJSON_AddItemToArray(c, text_part(text, n));
    return it;
}

static cJSON *call_object(const char *iid, const char *status, const cJSON *call,
                          const char *args)
{
    const cJSON *f = srv_json_get(call, "function");
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", iid);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", status);
    srv_json_copy_as(it, f, "arguments", "arguments");
    if (args)
        cJSON_ReplaceItemInObject(it, "arguments", cJSON_CreateString(args));
    srv_json_copy_as(it, call, "id", "call_id");
    srv_json_copy_as(it, f, "name", "name");
    return it;
}

/* The output items of rp, in order: reasoning, message, function calls. */
static cJSON *output_items(const srv_reply_id *id, const srv_reply *rp)
{
    cJSON *out = cJSON_CreateArray();
    char iid[64];
    int k = 0;
    if (rp->reasoning) {
        item_id(iid, sizeof(iid), "rs", id, k++);
        cJSON_AddItemToArray(out, reasoning_object(iid, rp->reasoning, rp->n_reasoning));
    }
    if (rp->n_content || !rp->tool_calls) {
        item_id(iid, sizeof(iid), "msg", id, k++);
        cJSON_AddItemToArray(out, message_object(iid, "completed", rp->content, rp->n_content,
                                                 true));
    }
    cJSON *calls = rp->tool_calls ? cJSON_Parse(rp->tool_calls) : NULL, *c;
    cJSON_ArrayForEach(c, calls) {
        item_id(iid, sizeof(iid), "fc", id, k++);
        cJSON_AddItemToArray(out, call_object(iid, "completed", c, NULL));
    }
    cJSON_Delete(calls);
    return out;
}

static void add_usage(cJSON *o, const kvc_chat_stats *st)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", st->prompt_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens",
                            st->cached_tokens);
    cJSON_AddNumberToObject(u, "output_tokens", st->output_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"),
                            "reasoning_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", (double)st->prompt_tokens + st->output_tokens);
}

/* The Responses error object {"code", "message"} of e: its code, else
 * "server_error" for a 5xx and "invalid_prompt" for the rest (the codes
 * OpenAI gives a failed response). */
static cJSON *error_object(const srv_error *e)
{
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "code", e->code[0] ? e->code
                                       : e->http_status >= 500 ? "server_error" : "invalid_prompt");
    cJSON_AddStringToObject(x, "message", e->message);
    return x;
}

/* The response object: status "in_progress" without rp (output []), else
 * "completed" or "incomplete" (max_output_tokens reached) with rp's output
 * and usage; "failed" with error e (rp NULL). */
static cJSON *response_object(const srv_reply_id *id, const srv_reply *rp, const srv_error *e)
{
    cJSON *o = cJSON_CreateObject();
    const char *f = rp ? rp->done->stats.finish_reason : NULL;
    bool cut = f && !strcmp(f, "length");
    cJSON_AddStringToObject(o, "id", id->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)id->created);
    cJSON_AddStringToObject(o, "status", e ? "failed" : !rp ? "in_progress"
                                       : cut ? "incomplete" : "completed");
    if (e)
        cJSON_AddItemToObject(o, "error", error_object(e));
    else
        cJSON_AddNullToObject(o, "error");
    if (cut)
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason",
                                "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    cJSON_AddStringToObject(o, "model", id->model ? id->model : "");
    cJSON_AddItemToObject(o, "output", rp ? output_items(id, rp) : cJSON_CreateArray());
    cJSON_AddBoolToObject(o, "parallel_tool_calls", true);
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON_AddBoolToObject(o, "store", false);
    if (rp) {
        add_usage(o, &rp->done->stats);
        srv_add_timings(o, &rp->done->stats);
    } else {
        cJSON_AddNullToObject(o, "usage");
    }
    return o;
}

static char *responses_response(const srv_reply_id *id, const srv_request *rq, const srv_reply *rp,
                                int n, int per_prompt, const kvc_model *model, bool logprobs)
{
    return srv_json_print(response_object(id, rp, NULL));
}

/* ============================================================== stream */

/* An event `type` (its "type" and sequence_number set here) of h. */
static bool event(srv_emit *h, const char *type, cJSON *o, srv_buf *out)
{
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", h->seq++);
    return srv_buf_put(out, srv_sse_event(type, o));
}

/* An event of the output item at index h->blocks - 1. */
static cJSON *item_event(srv_emit *h)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "output_index", h->blocks - 1);
    return o;
}

static bool resp_begin(srv_emit *h, srv_buf *out)
{
    cJSON *a = cJSON_CreateObject(), *b = cJSON_CreateObject();
    cJSON_AddItemToObject(a, "response", response_object(h->head.id, NULL, NULL));
    cJSON_AddItemToObject(b, "response", response_object(h->head.id, NULL, NULL));
    bool ok = event(h, "response.created", a, out);
    return event(h, "response.in_progress", b, out) && ok;
}

/* Close the open item (its done events, with the text it got). */
static bool close_block(srv_emit *h, srv_buf *out)
{
    char iid[64];
    const char *t = h->acc.p ? h->acc.p : "";
    bool ok = true;
    if (h->open == SRV_REASONING) {
        item_id(iid, sizeof(iid), "rs", h->head.id, h->blocks - 1);
        cJSON *d = item_event(h);
        cJSON_AddStringToObject(d, "item_id", iid);
        cJSON_AddNumberToObject(d, "content_index", 0);
        cJSON_AddStringToObject(d, "text", t);
        ok = event(h, "response.reasoning_text.done", d, out);
        cJSON *x = item_event(h);
        cJSON_AddItemToObject(x, "item", reasoning_object(iid, t, h->acc.len));
        ok = event(h, "response.output_item.done", x, out) && ok;
    } else if (h->open == SRV_CONTENT) {
        item_id(iid, sizeof(iid), "msg", h->head.id, h->blocks - 1);
        cJSON *d = item_event(h);
        cJSON_AddStringToObject(d, "item_id", iid);
        cJSON_AddNumberToObject(d, "content_index", 0);
        cJSON_AddStringToObject(d, "text", t);
        cJSON_AddArrayToObject(d, "logprobs");
        ok = event(h, "response.output_text.done", d, out);
        cJSON *p = item_event(h);
        cJSON_AddStringToObject(p, "item_id", iid);
        cJSON_AddNumberToObject(p, "content_index", 0);
        cJSON_AddItemToObject(p, "part", text_part(t, h->acc.len));
        ok = event(h, "response.content_part.done", p, out) && ok;
        cJSON *x = item_event(h);
        cJSON_AddItemToObject(x, "item", message_object(iid, "completed", t, h->acc.len, true));
        ok = event(h, "response.output_item.done", x, out) && ok;
    }
    h->open = -1;
    h->acc.len = 0;
    return ok;
}

/* Open an item for channel ch (the output_item.added event, and a message's
 * content_part.added). */
static bool open_block(srv_emit *h, int ch, srv_buf *out)
{
    char iid[64];
    bool ok = true;
    h->blocks++;
    h->open = ch;
    cJSON *x = item_event(h);
    if (ch == SRV_REASONING) {
        item_id(iid, sizeof(iid), "rs", h->head.id, h->blocks - 1);
        cJSON *it = reasoning_object(iid, "", 0);
        cJSON_ReplaceItemInObject(it, "content", cJSON_CreateArray());
        cJSON_AddItemToObject(x, "item", it);
        return event(h, "response.output_item.added", x, out);
    }
    item_id(iid, sizeof(iid), "msg", h->head.id, h->blocks - 1);
    cJSON_AddItemToObject(x, "item", message_object(iid, "in_progress", "", 0, false));
    ok = event(h, "response.output_item.added", x, out);
    cJSON *p = item_event(h);
    cJSON_AddStringToObject(p, "item_id", iid);
    cJSON_AddNumberToObject(p, "content_index", 0);
    cJSON_AddItemToObject(p, "part", text_part("", 0));
    return event(h, "response.content_part.added", p, out) && ok;
}

static bool resp_text(srv_emit *h, int ch, const char *text, size_t len, void *logprobs,
                      srv_buf *out)
{
    cJSON_Delete(logprobs);
    bool ok = true;
    if (h->open != ch) {
        ok = close_block(h, out);
        ok = open_block(h, ch, out) && ok;
    }
    kvc_text_append(&h->acc.p, &h->acc.len, &h->acc.cap, &h->acc.oom, text, len);
    char iid[64];
    item_id(iid, sizeof(iid), ch == SRV_REASONING ? "rs" : "msg", h->head.id, h->blocks - 1);
    cJSON *d = item_event(h);
    cJSON_AddStringToObject(d, "item_id", iid);
    cJSON_AddNumberToObject(d, "content_index", 0);
    cJSON_AddItemToObject(d, "delta", srv_json_string_n(text, len));
    if (ch == SRV_CONTENT)
        cJSON_AddArrayToObject(d, "logprobs");
    return event(h, ch == SRV_REASONING ? "response.reasoning_text.delta"
                                        : "response.output_text.delta", d, out) && ok && !h->acc.oom;
}

/* A function call item: added, its arguments (one delta), done. */
static bool send_call(srv_emit *h, const cJSON *call, srv_buf *out)
{
    char iid[64];
    const cJSON *args = srv_json_get(srv_json_get(call, "function"), "arguments");
    const char *a = cJSON_IsString(args) ? args->valuestring : "";
    h->blocks++;
    item_id(iid, sizeof(iid), "fc", h->head.id, h->blocks - 1);
    cJSON *x = item_event(h);
    cJSON_AddItemToObject(x, "item", call_object(iid, "in_progress", call, ""));
    bool ok = event(h, "response.output_item.added", x, out);
    cJSON *d = item_event(h);
    cJSON_AddStringToObject(d, "item_id", iid);
    cJSON_AddStringToObject(d, "delta", a);
    ok = event(h, "response.function_call_arguments.delta", d, out) && ok;
    d = item_event(h);
    cJSON_AddStringToObject(d, "item_id", iid);
    cJSON_AddStringToObject(d, "arguments", a);
    ok = event(h, "response.function_call_arguments.done", d, out) && ok;
    x = item_event(h);
    cJSON_AddItemToObject(x, "item", call_object(iid, "completed", call, NULL));
    return event(h, "response.output_item.done", x, out) && ok;
}

static bool resp_finish(srv_emit *h, const srv_reply *rp, void *logprobs, srv_buf *out)
{
    cJSON_Delete(logprobs);
    bool ok = close_block(h, out);
    cJSON *calls = rp->tool_calls ? cJSON_Parse(rp->tool_calls) : NULL, *c;
    cJSON_ArrayForEach(c, calls)
        ok = send_call(h, c, out) && ok;
    cJSON_Delete(calls);
    const char *f = rp->done->stats.finish_reason;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "response", response_object(h->head.id, rp, NULL));
    return event(h, f && !strcmp(f, "length") ? "response.incomplete" : "response.completed",
                 o, out) && ok;
}

static bool resp_end(const srv_reply_id *id, bool include_usage, const kvc_chat_stats *stats,
                     int n, int per_prompt, srv_buf *out)
{
    return true;      /* response.completed was the end */
}

/* {"type": "error", "code", "message", "param"}: the stream's error event. */
static char *resp_sse_error(const srv_error *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "error");
    cJSON_AddStringToObject(o, "code", e->code[0] ? e->code : e->type);
    cJSON_AddStringToObject(o, "message", e->message);
    if (e->param[0])
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    return srv_sse_event("error", o);
}

/* A failure mid-stream: the open item closed as it stands, then
 * response.failed with the error (what Codex and the Agents SDK read; the
 * generic error event alone leaves them waiting for an end). */
static bool resp_fail(srv_emit *h, const srv_error *e, srv_buf *out)
{
    bool ok = close_block(h, out);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "response", response_object(h->head.id, NULL, e));
    return event(h, "response.failed", o, out) && ok;
}

const srv_dialect srv_dialect_responses = {
    .name = "responses",
    .id_prefix = "resp_",
    .fields = srv_fields_responses,
    .parse = responses_parse,
    .response = responses_response,
    .error = srv_error_json,
    .logprobs = srv_logprobs_chat_json,
    .sse_begin = resp_begin,
    .sse_text = resp_text,
    .sse_finish = resp_finish,
    .sse_end = resp_end,
    .sse_error = resp_sse_error,
    .sse_fail = resp_fail,
};
