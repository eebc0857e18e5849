/* server_ollama.c - Ollama's API as a dialect (server.h): POST /api/chat and
 * POST /api/generate, as the `ollama` clients (JavaScript, Python) and the
 * UIs and editors built on them call it; and the routes that tell of the
 * model: GET /api/tags, POST /api/show, GET /api/ps, GET /api/version.
 *
 * A request is translated into the chat completions request it means (or,
 * for generate with raw, the completions request) and parsed by that parser,
 * so a conversation renders to the same tokens through any API and reaches
 * the same sessions and cache:
 *   messages (role, content, thinking, tool_calls with arguments as objects,
 *   tool messages with tool_name) -> chat messages (reasoning_content,
 *   tool_calls with arguments as JSON text and ids, tool_call_id);
 *   generate's system + prompt -> a system and a user message; raw -> the
 *   prompt as it is (completions);
 *   options: temperature, top_k, top_p, min_p, seed, stop, repeat_penalty,
 *   repeat_last_n, presence_penalty, frequency_penalty, num_predict (-1, -2
 *   and 0: no limit), num_ctx (a 400 when larger than the context served);
 *   options that only tune the runtime (num_gpu, num_thread, use_mmap, ...)
 *   are accepted and named as ignored; options that would change the answer
 *   and cannot be honoured (mirostat, typical_p, tfs_z, rope scaling, unless
 *   at the value that changes nothing) are 400s naming them; others Ollama
 *   does not know either are ignored and logged, as Ollama does;
 *   format "json" or a JSON schema -> constrained decoding; think (true,
 *   false, "low", "medium", "high") -> the template's thinking switch;
 *   logprobs and top_logprobs as chat's (each answer object then carries
 *   logprobs [{token, logprob, bytes, top_logprobs}] of its tokens);
 *   keep_alive: accepted and ignored (the model stays loaded), logged;
 *   the extensions every route honours (prompt_cache_key, cache_salt, user,
 *   ...) pass through as they are.
 * Refused with a 400 naming the field: images (kvchat's models read text),
 * generate's suffix (fill-in-the-middle), template (a Go template: kvchat
 * renders the model's Jinja template) and context (the token list of an
 * earlier answer: send the conversation to /api/chat instead, whose cache
 * makes resending it cost nothing).
 *
 * The answer: {model, created_at, message {role, content, thinking?,
 * tool_calls?} | response, done, done_reason, total_duration,
 * load_duration, prompt_eval_count, prompt_eval_duration, eval_count,
 * eval_duration} (durations in nanoseconds; prompt_eval_count is the whole
 * prompt, as Ollama counts it), plus llama-server's timings object, whose
 * cache_n tells how much of the prompt came from the cache. Streamed (the
 * default) as NDJSON: one such object a line, done false until the last.
 * Errors are {"error": "message"}. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "server.h"
#include "tool_calls.h"

#define BAD(e, param, ...) srv_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* The version of Ollama's API this dialect follows, told by /api/version:
 * clients compare it to decide what they may send (tools, think). */
#define OLLAMA_API_VERSION "0.12.0"

/* Whether v is absent or empty: null, "", [], {}. */
static bool empty(const cJSON *v)
{
    return !v || (cJSON_IsString(v) && !*v->valuestring) ||
           ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child);
}

/* ============================================================== fields */

#define USED(n)          { n, SRV_FIELD_USED, NULL }
#define IGNORED(n)       { n, SRV_FIELD_IGNORED, NULL }
#define REFUSED(n, noop) { n, SRV_FIELD_REFUSED, noop }

const srv_field srv_fields_ollama_chat[] = {
    USED("model"), USED("messages"), USED("tools"), USED("format"), USED("options"),
    USED("stream"), USED("think"), USED("logprobs"), USED("top_logprobs"), IGNORED("keep_alive"),
    { NULL, 0, NULL },
};

const srv_field srv_fields_ollama_generate[] = {
    USED("model"), USED("prompt"), USED("system"), USED("raw"), USED("format"),
    USED("options"), USED("stream"), USED("think"), USED("images"), USED("suffix"),
    USED("template"), USED("context"), USED("logprobs"), USED("top_logprobs"),
    IGNORED("keep_alive"),
    { NULL, 0, NULL },
};

/* ============================================================= options */

/* Options that are sampling fields of the chat request, by the same name. */
static const char *const same_options[] = {
    "temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty",
    "repeat_last_n", "presence_penalty", "frequency_penalty",
};

/* Options of the runtime (memory, threads, GPUs): they change no answer. */
static const char *const runtime_options[] = {
    "num_keep", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
    "vocab_only", "use_mmap", "use_mlock", "num_thread", "numa", "embedding_only",
    "penalize_newline", "mirostat_tau", "mirostat_eta", "num_gqa",
};

/* Options that change the answer and that kvchat cannot do, with the value
 * that changes nothing. */
static const struct { const char *name; double noop; } refused_options[] = {
    { "mirostat", 0 }, { "typical_p", 1 }, { "tfs_z", 1 }, { "rope_frequency_base", 0 },
    { "rope_frequency_scale", 0 },
};

static bool in(const char *const *list, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], name))
            return true;
    return false;
}

/* Check `options`: refused ones are a 400 naming them; runtime and unknown
 * ones are noted as ignored (and logged); num_ctx larger than the context is
 * a 400. 0 or the HTTP status. */
static int check_options(srv_request *r, const cJSON *root, const srv_limits *lim, srv_error *e)
{
    const cJSON *opts = srv_json_get(root, "options"), *v;
    if (!opts)
        return 0;
    if (!cJSON_IsObject(opts))
        return BAD(e, "options", "options must be an object");
    cJSON_ArrayForEach(v, opts) {
        char name[80];
        snprintf(name, sizeof(name), "options.%.60s", v->string);
        if (in(same_options, KVC_ARRAY_LEN(same_options), v->string) ||
            !strcmp(v->string, "num_predict") || cJSON_IsNull(v))
            continue;
        if (!strcmp(v->string, "num_ctx")) {
            if (!cJSON_IsNumber(v) || v->valuedouble < 1)
                return BAD(e, name, "options.num_ctx must be a positive integer");
            if (lim->n_ctx > 0 && v->valuedouble > lim->n_ctx)
                return BAD(e, name, "options.num_ctx %.0f is larger than the context kvchat "
                           "serves: %d tokens per conversation (set at start with -c)",
                           v->valuedouble, lim->n_ctx);
            continue;
        }
        bool refused = false;
        for (size_t i = 0; i < KVC_ARRAY_LEN(refused_options); i++)
            if (!strcmp(v->string, refused_options[i].name)) {
                if (!cJSON_IsNumber(v) || v->valuedouble != refused_options[i].noop)
                    return BAD(e, name, "%s is not supported: kvchat cannot do what it asks, "
                               "which would change the answer (only %g is accepted)", name,
                               refused_options[i].noop);
                refused = true;
            }
        if (refused)
            continue;
        /* the runtime's, and those Ollama does not know either (it warns and
         * goes on): accepted, told; with --strict-fields the unknown ones are 400s */
        if (lim->strict_fields && !in(runtime_options, KVC_ARRAY_LEN(runtime_options), v->string))
            return BAD(e, name, "unknown option '%s' (--strict-fields)", name);
        srv_note_ignored(r, name);
        if (lim->log_ignored)
            lim->log_ignored(name, lim->log_user);
    }
    return 0;
}

/* The options that are the chat request's fields, into chat. */
static int map_options(cJSON *chat, const cJSON *root, srv_error *e)
{
    const cJSON *opts = srv_json_get(root, "options"), *np = srv_json_get(opts, "num_predict");
    for (size_t i = 0; i < KVC_ARRAY_LEN(same_options); i++)
        srv_json_copy_as(chat, opts, same_options[i], same_options[i]);
    if (np && !cJSON_IsNumber(np))
        return BAD(e, "options.num_predict", "options.num_predict must be an integer");
    if (np && np->valuedouble > 0)               /* -1, -2, 0: no limit (the context's) */
        cJSON_AddNumberToObject(chat, "max_tokens", np->valuedouble);
    return 0;
}

/* format ("json" or a JSON schema) -> response_format; think -> the
 * thinking switch; stream (true when absent); model (required). */
static int map_common(cJSON *chat, const cJSON *root, srv_error *e)
{
    const cJSON *model = srv_json_get(root, "model"), *fmt = srv_json_get(root, "format"),
                *think = srv_json_get(root, "think"), *stream = srv_json_get(root, "stream");
    if (!cJSON_IsString(model) || !*model->valuestring)
        return BAD(e, "model", "model is required");
    cJSON_AddStringToObject(chat, "model", model->valuestring);
    const cJSON *v;
    cJSON_ArrayForEach(v, root)        /* the extensions every route honours (cache_salt, ...) */
        if (srv_field_use(NULL, v->string) == SRV_FIELD_USED && !cJSON_IsNull(v))
            cJSON_AddItemToObject(chat, v->string, cJSON_Duplicate(v, true));
    srv_json_copy_as(chat, root, "logprobs", "logprobs");          /* chat's, checked there */
    srv_json_copy_as(chat, root, "top_logprobs", "top_logprobs");
    if (stream && !cJSON_IsBool(stream))
        return BAD(e, "stream", "stream must be a boolean");
    cJSON_AddBoolToObject(chat, "stream", !stream || cJSON_IsTrue(stream));
    if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "json")) {
        cJSON_AddStringToObject(cJSON_AddObjectToObject(chat, "response_format"), "type",
                                "json_object");
    } else if (cJSON_IsObject(fmt)) {
        cJSON *rf = cJSON_AddObjectToObject(chat, "response_format"), *js;
        cJSON_AddStringToObject(rf, "type", "json_schema");
        js = cJSON_AddObjectToObject(rf, "json_schema");
        cJSON_AddStringToObject(js, "name", "format");
        cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(fmt, true));
    } else if (!empty(fmt)) {
        return BAD(e, "format", "format must be \"json\" or a JSON schema object");
    }
    if (cJSON_IsBool(think)) {
        cJSON_AddBoolToObject(chat, "enable_thinking", cJSON_IsTrue(think));
    } else if (cJSON_IsString(think) && (!strcmp(think->valuestring, "low") ||
                                         !strcmp(think->valuestring, "medium") ||
                                         !strcmp(think->valuestring, "high"))) {
        cJSON_AddStringToObject(chat, "reasoning_effort", think->valuestring);
    } else if (think) {
        return BAD(e, "think", "think must be a boolean or \"low\", \"medium\", \"high\"");
    }
    return 0;
}

/* ============================================================ messages */

/* An assistant message's tool_calls [{function: {name, arguments: {...}}}]
 * as chat's [{id, type, function: {name, arguments: "JSON text"}}], the ids
 * call_<i>_<k>. NULL with *e when malformed. */
static cJSON *tool_calls(const cJSON *calls, int i, srv_error *e)
{
    char p[64];
    snprintf(p, sizeof(p), "messages[%d].tool_calls", i);
    if (!cJSON_IsArray(calls)) {
        BAD(e, p, "%s must be an array", p);
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *f = srv_json_get(c, "function"), *name = srv_json_get(f, "name"),
                    *args = srv_json_get(f, "arguments");
        if (!cJSON_IsString(name)) {
            cJSON_Delete(out);
            BAD(e, p, "%s[%d] must be {\"function\": {\"name\", \"arguments\"}}", p, k);
            return NULL;
        }
        char id[48], *text = cJSON_IsString(args) ? strdup(args->valuestring)
                           : args ? cJSON_PrintUnformatted(args) : strdup("{}");
        snprintf(id, sizeof(id), "call_%d_%d", i, k++);
        kvc_tool_call_add(out, id, name->valuestring, text ? text : "{}");
        free(text);
    }
    return out;
}

/* The id of the pending call a tool message answers: the first call not
 * answered yet of the name (tool_name), else the first not answered. */
static const char *answered_call(cJSON *pending, const char *name)
{
    cJSON *c, *pick = NULL;
    cJSON_ArrayForEach(c, pending) {
        const char *n = cJSON_GetStringValue(srv_json_get(srv_json_get(c, "function"), "name"));
        if (!pick || (name && n && !strcmp(n, name) &&
                      strcmp(cJSON_GetStringValue(
                                 srv_json_get(srv_json_get(pick, "function"), "name")), name))) {
            pick = c;
            if (!name || (n && !strcmp(n, name)))
                break;
        }
    }
    if (!pick)
        return NULL;
    static _Thread_local char id[48];
    snprintf(id, sizeof(id), "%s", cJSON_GetStringValue(srv_json_get(pick, "id")));
    cJSON_Delete(cJSON_DetachItemViaPointer(pending, pick));
    return id;
}

static int translate_messages(cJSON *chat, const cJSON *ms, srv_error *e)
{
    if (!cJSON_IsArray(ms))
        return BAD(e, "messages", "messages must be an array of {\"role\", \"content\"}");
    cJSON *out = cJSON_AddArrayToObject(chat, "messages"), *pending = cJSON_CreateArray();
    const cJSON *m;
    int i = 0, rc = 0;
    cJSON_ArrayForEach(m, ms) {
        char p[48];
        snprintf(p, sizeof(p), "messages[%d]", i);
        const cJSON *role = srv_json_get(m, "role"), *content = srv_json_get(m, "content"), *calls;
        if (!cJSON_IsObject(m) || !cJSON_IsString(role) || (content && !cJSON_IsString(content))) {
            rc = BAD(e, p, "%s must have a string role and a string content", p);
            break;
        }
        if (!empty(srv_json_get(m, "images"))) {
            char q[64];
            snprintf(q, sizeof(q), "%s.images", p);
            rc = BAD(e, q, "%s is not supported: kvchat's models read text only", q);
            break;
        }
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "role", role->valuestring);
        cJSON_AddStringToObject(x, "content", content ? content->valuestring : "");
        srv_json_copy_as(x, m, "thinking", "reasoning_content");
        if ((calls = srv_json_get(m, "tool_calls"))) {
            cJSON *tc = tool_calls(calls, i, e);
            if (!tc) {
                cJSON_Delete(x);
                rc = 400;
                break;
            }
            cJSON_Delete(pending);
            pending = cJSON_Duplicate(tc, true);
            cJSON_AddItemToObject(x, "tool_calls", tc);
        }
        if (!strcmp(role->valuestring, "tool")) {
            const cJSON *name = srv_json_get(m, "tool_name");
            const char *id = answered_call(pending, cJSON_GetStringValue(name));
            if (id)
                cJSON_AddStringToObject(x, "tool_call_id", id);
            if (cJSON_IsString(name))
                cJSON_AddStringToObject(x, "name", name->valuestring);
        }
        cJSON_AddItemToArray(out, x);
        i++;
    }
    cJSON_Delete(pending);
    return rc;
}

/* ============================================================== parse */

static int chat_translate(srv_request *r, cJSON *chat, const cJSON *root, srv_error *e)
{
    int rc;
    if ((rc = map_common(chat, root, e)) || (rc = map_options(chat, root, e)) ||
        (rc = translate_messages(chat, srv_json_get(root, "messages"), e)))
        return rc;
    srv_json_copy_as(chat, root, "tools", "tools");
    return 0;
}

static int generate_translate(srv_request *r, cJSON *chat, const cJSON *root, srv_error *e)
{
    static const char *const refused[][2] = {
        { "images", "kvchat's models read text only" },
        { "suffix", "kvchat does not fill in the middle" },
        { "template", "kvchat renders the model's own (Jinja) chat template; a custom one "
                      "is given at start with --chat-template-file" },
        { "context", "send the whole conversation to /api/chat instead: kvchat's cache "
                     "reuses what it computed, so resending costs nothing" },
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(refused); i++)
        if (!empty(srv_json_get(root, refused[i][0])))
            return BAD(e, refused[i][0], "%s is not supported: %s", refused[i][0], refused[i][1]);
    const cJSON *prompt = srv_json_get(root, "prompt"), *system = srv_json_get(root, "system"),
                *raw = srv_json_get(root, "raw");
    if (prompt && !cJSON_IsString(prompt))
        return BAD(e, "prompt", "prompt must be a string");
    if (system && !cJSON_IsString(system))
        return BAD(e, "system", "system must be a string");
    if (raw && !cJSON_IsBool(raw))
        return BAD(e, "raw", "raw must be a boolean");
    int rc;
    if ((rc = map_common(chat, root, e)) || (rc = map_options(chat, root, e)))
        return rc;
    if (cJSON_IsTrue(raw)) {
        if (!empty(system))
            return BAD(e, "system", "system has no place in a raw prompt (raw: true sends the "
                       "prompt as it is): write it into the prompt");
        cJSON_AddStringToObject(chat, "prompt", prompt->valuestring);
        return 0;
    }
    cJSON *ms = cJSON_AddArrayToObject(chat, "messages"), *m;
    if (!empty(system)) {
        cJSON_AddItemToArray(ms, m = cJSON_CreateObject());
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system->valuestring);
    }
    cJSON_AddItemToArray(ms, m = cJSON_CreateObject());
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", prompt->valuestring);
    return 0;
}

/* Nothing to generate (an empty prompt, no messages): Ollama's way to load a
 * model. The request keeps only its model name. */
static int load_only(srv_request *r, const cJSON *root, srv_error *e)
{
    const cJSON *model = srv_json_get(root, "model");
    if (!cJSON_IsString(model) || !*model->valuestring)
        return BAD(e, "model", "model is required");
    r->model = model->valuestring;
    r->load_only = true;
    r->n = r->n_prompts = 1;
    return 0;
}

static int ollama_chat_parse(srv_request *r, void *root_json, const srv_limits *lim, srv_error *e)
{
    const cJSON *root = root_json;
    int rc = check_options(r, root, lim, e);
    if (rc)
        return rc;
    const cJSON *ms = srv_json_get(root, "messages");
    if (!ms || (cJSON_IsArray(ms) && !ms->child))
        return load_only(r, root, e);
    return srv_parse_translated(r, root_json, chat_translate, lim, e);
}

static int ollama_generate_parse(srv_request *r, void *root_json, const srv_limits *lim,
                                 srv_error *e)
{
    const cJSON *root = root_json, *prompt = srv_json_get(root, "prompt");
    int rc = check_options(r, root, lim, e);
    if (rc)
        return rc;
    if (empty(prompt) && empty(srv_json_get(root, "images")))
        return load_only(r, root, e);
    cJSON *req = cJSON_CreateObject();
    if (!req)
        return srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    if ((rc = generate_translate(r, req, root, e))) {
        cJSON_Delete(req);
        return rc;
    }
    cJSON_Delete(r->json);                       /* what the request borrows is in req */
    r->json = req;
    return cJSON_HasObjectItem(req, "messages") ? srv_parse_chat(r, req, lim, e)
                                                : srv_parse_completion(r, req, lim, e);
}

/* ============================================================= answer */

/* RFC 3339 with nanoseconds, UTC, as Ollama writes created_at. */
static void created_at(char *buf, size_t size)
{
    struct timespec t;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &t);
    gmtime_r(&t.tv_sec, &tm);
    size_t n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, size - n, ".%09ldZ", t.tv_nsec);
}

static bool is_generate(const srv_dialect *d)
{
    return d == &srv_dialect_ollama_generate;
}

/* {model, created_at} every object of an answer begins with. */
static cJSON *head(const srv_reply_id *id)
{
    char at[48];
    created_at(at, sizeof(at));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", id->model ? id->model : "");
    cJSON_AddStringToObject(o, "created_at", at);
    return o;
}

/* chat's tool_calls JSON text as Ollama's [{function: {name, arguments}}],
 * the arguments an object. */
static cJSON *ollama_calls(const char *openai_calls)
{
    cJSON *in = cJSON_Parse(openai_calls), *out = cJSON_CreateArray(), *c;
    cJSON_ArrayForEach(c, in) {
        const cJSON *f = srv_json_get(c, "function"), *args = srv_json_get(f, "arguments");
        cJSON *x = cJSON_CreateObject(), *fx = cJSON_AddObjectToObject(x, "function");
        srv_json_copy_as(fx, f, "name", "name");
        cJSON *a = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        cJSON_AddItemToObject(fx, "arguments", a ? a : cJSON_CreateObject());
        cJSON_AddItemToArray(out, x);
    }
    cJSON_Delete(in);
    return out;
}

/* The text of an answer object: chat's message {role, content, thinking?,
 * tool_calls?}, generate's response and thinking. */
static void add_text(cJSON *o, bool generate, const char *content, size_t n_content,
                     const char *thinking, size_t n_thinking, const char *calls)
{
    cJSON *m = generate ? o : cJSON_AddObjectToObject(o, "message");
    if (!generate)
        cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddItemToObject(m, generate ? "response" : "content",
                          srv_json_string_n(content ? content : "", content ? n_content : 0));
    if (thinking)
        cJSON_AddItemToObject(m, "thinking", srv_json_string_n(thinking, n_thinking));
    if (calls && !generate)
        cJSON_AddItemToObject(m, "tool_calls", ollama_calls(calls));
}

/* done, done_reason and the figures: durations in nanoseconds. */
static void add_done(cJSON *o, const kvc_chat_stats *st)
{
    const char *f = st->finish_reason;
    cJSON_AddBoolToObject(o, "done", true);
    cJSON_AddStringToObject(o, "done_reason", f && !strcmp(f, "length") ? "length" : "stop");
    cJSON_AddNumberToObject(o, "total_duration", (double)(int64_t)(st->total_ms * 1e6));
    cJSON_AddNumberToObject(o, "load_duration", 0);
    cJSON_AddNumberToObject(o, "prompt_eval_count", st->prompt_tokens);
    cJSON_AddNumberToObject(o, "prompt_eval_duration", (double)(int64_t)(st->prompt_ms * 1e6));
    cJSON_AddNumberToObject(o, "eval_count", st->output_tokens);
    cJSON_AddNumberToObject(o, "eval_duration", (double)(int64_t)(st->decode_ms * 1e6));
    srv_add_timings(o, st);
}

/* Ollama's logprobs [{token, logprob, bytes, top_logprobs}]: the entries of
 * chat's {"content": [...]} (lp, taken), added to o. */
static void add_logprobs(cJSON *o, cJSON *lp)
{
    cJSON *c = lp ? cJSON_DetachItemFromObjectCaseSensitive(lp, "content") : NULL;
    if (c)
        cJSON_AddItemToObject(o, "logprobs", c);
    cJSON_Delete(lp);
}

static char *ollama_response(const srv_reply_id *id, const srv_request *rq, const srv_reply *rp,
                             int n, int per_prompt, const kvc_model *model, bool logprobs)
{
    cJSON *o = head(id);
    add_text(o, is_generate(rq->dialect), rp->content, rp->n_content, rp->reasoning,
             rp->n_reasoning, rp->tool_calls);
    size_t off = 0;
    if (logprobs && model)
        add_logprobs(o, srv_logprobs_chat_json(rp->done->logprobs, rp->done->n_logprobs, model,
                                               &off));
    add_done(o, &rp->done->stats);
    return srv_json_print(o);
}

static char *ollama_error(const srv_error *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", e->message);
    return srv_json_print(o);
}

/* ============================================================= stream */

/* One NDJSON line of o (printed and freed). */
static bool line(cJSON *o, srv_buf *out)
{
    char *s = srv_json_print(o);
    bool ok = srv_buf_put(out, s);
    return srv_buf_put(out, strdup("\n")) && ok;
}

static char *ollama_sse_error(const srv_error *e)
{
    char *s = ollama_error(e), *l = s ? malloc(strlen(s) + 2) : NULL;
    if (l)
        sprintf(l, "%s\n", s);
    free(s);
    return l;
}

static bool o_begin(srv_emit *h, srv_buf *out)
{
    return true;
}

static bool o_text(srv_emit *h, int ch, const char *text, size_t len, void *logprobs, srv_buf *out)
{
    cJSON *o = head(h->head.id);
    bool thinking = ch == SRV_REASONING;
    add_text(o, is_generate(h->head.dialect), thinking ? NULL : text, len,
             thinking ? text : NULL, len, NULL);
    add_logprobs(o, logprobs);
    cJSON_AddBoolToObject(o, "done", false);
    return line(o, out);
}

static bool o_finish(srv_emit *h, const srv_reply *rp, void *logprobs, srv_buf *out)
{
    bool generate = is_generate(h->head.dialect), ok = true;
    if (rp->tool_calls && !generate) {      /* the calls in their own line, as Ollama */
        cJSON *o = head(h->head.id);
        add_text(o, false, NULL, 0, NULL, 0, rp->tool_calls);
        cJSON_AddBoolToObject(o, "done", false);
        ok = line(o, out);
    }
    cJSON *o = head(h->head.id);
    add_text(o, generate, NULL, 0, NULL, 0, NULL);
    add_logprobs(o, logprobs);            /* the tokens no text showed (a stop string's) */
    add_done(o, &rp->done->stats);
    return line(o, out) && ok;
}

static bool o_end(const srv_reply_id *id, bool include_usage, const kvc_chat_stats *stats, int n,
                  int per_prompt, srv_buf *out)
{
    return true;      /* the done line was the end */
}

const srv_dialect srv_dialect_ollama_chat = {
    .name = "ollama.chat",
    .id_prefix = "ollama-",
    .fields = srv_fields_ollama_chat,
    .stream_type = "application/x-ndjson",
    .parse = ollama_chat_parse,
    .response = ollama_response,
    .error = ollama_error,
    .logprobs = srv_logprobs_chat_json,
    .sse_begin = o_begin,
    .sse_text = o_text,
    .sse_finish = o_finish,
    .sse_end = o_end,
    .sse_error = ollama_sse_error,
};

const srv_dialect srv_dialect_ollama_generate = {
    .name = "ollama.generate",
    .id_prefix = "ollama-",
    .fields = srv_fields_ollama_generate,
    .stream_type = "application/x-ndjson",
    .parse = ollama_generate_parse,
    .response = ollama_response,
    .error = ollama_error,
    .logprobs = srv_logprobs_chat_json,
    .sse_begin = o_begin,
    .sse_text = o_text,
    .sse_finish = o_finish,
    .sse_end = o_end,
    .sse_error = ollama_sse_error,
};

char *srv_ollama_load_json(const srv_dialect *d, const char *model)
{
    srv_reply_id id = { .model = model };
    cJSON *o = head(&id);
    add_text(o, is_generate(d), NULL, 0, NULL, 0, NULL);
    cJSON_AddBoolToObject(o, "done", true);
    cJSON_AddStringToObject(o, "done_reason", "load");
    return srv_json_print(o);
}

/* ========================================================== the model */

/* Ollama lists models as name:tag; a name without a tag is name:latest. */
static void tagged(const char *name, char *buf, size_t size)
{
    snprintf(buf, size, strchr(name, ':') ? "%s" : "%s:latest", name);
}

static cJSON *details(const srv_model_desc *d)
{
    char size[32];
    srv_param_size(d->info.n_params, size, sizeof(size));
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "parent_model", "");
    cJSON_AddStringToObject(x, "format", "gguf");
    cJSON_AddStringToObject(x, "family", d->info.arch);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(x, "families"), cJSON_CreateString(d->info.arch));
    cJSON_AddStringToObject(x, "parameter_size", size);
    cJSON_AddStringToObject(x, "quantization_level", d->weight_type);
    return x;
}

/* RFC 3339 of t (seconds), UTC. */
static void rfc3339(time_t t, char *buf, size_t size)
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

char *srv_ollama_list_json(const srv_model_desc *d, bool running)
{
    char name[256], at[48];
    tagged(d->name, name, sizeof(name));
    cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "models"), m);
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "model", name);
    if (!running) {
        rfc3339(d->modified, at, sizeof(at));
        cJSON_AddStringToObject(m, "modified_at", at);
    }
    cJSON_AddNumberToObject(m, "size", (double)d->file_bytes);
    cJSON_AddStringToObject(m, "digest", d->digest);
    cJSON_AddItemToObject(m, "details", details(d));
    if (running) {   /* loaded for as long as the server runs: expires far away */
        cJSON_AddStringToObject(m, "expires_at", "2318-08-22T00:00:00Z");
        cJSON_AddNumberToObject(m, "size_vram", 0);
        cJSON_AddNumberToObject(m, "context_length", d->n_ctx);
    }
    return srv_json_print(o);
}

char *srv_ollama_show_json(const srv_model_desc *d, const char *body, size_t len, srv_error *e)
{
    cJSON *req = srv_json_parse(body, len, e);
    if (!req)
        return NULL;
    const cJSON *model = srv_json_get(req, "model") ? srv_json_get(req, "model")
                                                    : srv_json_get(req, "name");
    if (!cJSON_IsObject(req) || !cJSON_IsString(model)) {
        cJSON_Delete(req);
        BAD(e, "model", "model is required");
        return NULL;
    }
    cJSON_Delete(req);
    const kvc_model_info *mi = &d->info;
    char key[96], at[48];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "license", "");
    cJSON_AddStringToObject(o, "modelfile", "");
    const kvc_sampler_params *s = &d->sampling;
    char params[256];
    snprintf(params, sizeof(params), "temperature %g\ntop_k %d\ntop_p %g\nmin_p %g\n"
             "repeat_penalty %g\nnum_ctx %d", s->temperature, s->top_k, s->top_p, s->min_p,
             s->repeat_penalty, d->n_ctx);
    cJSON_AddStringToObject(o, "parameters", params);
    cJSON_AddStringToObject(o, "template", d->chat_template ? d->chat_template : "chatml");
    cJSON_AddItemToObject(o, "details", details(d));
    cJSON *info = cJSON_AddObjectToObject(o, "model_info");
    cJSON_AddStringToObject(info, "general.architecture", mi->arch);
    cJSON_AddStringToObject(info, "general.name", d->name);
    cJSON_AddNumberToObject(info, "general.parameter_count", (double)mi->n_params);
    static const char *const keys[] = { "context_length", "embedding_length", "block_count",
                                        "attention.head_count", "attention.head_count_kv",
                                        "feed_forward_length", "vocab_size" };
    const int32_t vals[] = { mi->n_ctx_train, mi->n_embd, mi->n_layer, mi->n_head,
                             mi->n_head_kv, mi->n_ff, mi->n_vocab };
    for (size_t i = 0; i < KVC_ARRAY_LEN(keys); i++) {
        snprintf(key, sizeof(key), "%s.%s", mi->arch, keys[i]);
        cJSON_AddNumberToObject(info, key, vals[i]);
    }
    cJSON *caps = cJSON_AddArrayToObject(o, "capabilities");
    cJSON_AddItemToArray(caps, cJSON_CreateString("completion"));
    if (d->chat_template && strstr(d->chat_template, "tools"))
        cJSON_AddItemToArray(caps, cJSON_CreateString("tools"));
    if (d->chat_template && (strstr(d->chat_template, "<think>") ||
                             strstr(d->chat_template, "<|channel|>")))   /* harmony */
        cJSON_AddItemToArray(caps, cJSON_CreateString("thinking"));
    rfc3339(d->modified, at, sizeof(at));
    cJSON_AddStringToObject(o, "modified_at", at);
    return srv_json_print(o);
}

char *srv_ollama_version_json(const srv_model_desc *d)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", OLLAMA_API_VERSION);
    cJSON_AddStringToObject(o, "kvchat_version", d->version);
    return srv_json_print(o);
}
