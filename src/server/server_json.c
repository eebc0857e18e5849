/* server_json.c - request bodies to kvc_request_params, and the JSON helpers
 * every dialect's answers use.
 *
 * srv_request_parse checks the body (srv_json_parse), the fields against the
 * dialect's policy (server_fields.c), then hands it to the dialect's parser;
 * the chat and completions parsers here (with server_agent.c's fields) are
 * the ones the other dialects translate into. Every field used is validated
 * against OpenAI's ranges and named in the error.
 * Strings are borrowed from the cJSON tree the request keeps, except joined
 * content parts, which are made here. Nesting is bounded by cJSON itself
 * (CJSON_NESTING_LIMIT, 1000), so hostile bodies cannot exhaust the stack. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "chat_template.h"
#include "common.h"
#include "sampler.h"
#include "server.h"
#include "unicode.h"

#define MAX_KEY_LEN     512   /* user, prompt_cache_key, model */
#define MAX_STOP_LEN    1024  /* bytes per stop string */
#define MAX_ROLE_LEN    32

/* ================================================================ errors */

int srv_error_set(srv_error *e, int http_status, const char *type, const char *param,
                  const char *code, const char *fmt, ...)
{
    e->http_status = http_status;
    snprintf(e->type, sizeof(e->type), "%s", type);
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return http_status;
}

int srv_error_from_status(srv_error *e, int status, const char *message)
{
    const char *m = message && *message ? message : kvc_strerror(status);
    switch (status) {
    case KVC_ERR_INVALID_ARG:
        return srv_error_set(e, 400, "invalid_request_error", NULL, NULL, "%s", m);
    case KVC_ERR_CONTEXT_LENGTH:
        return srv_error_set(e, 400, "invalid_request_error", "messages",
                             "context_length_exceeded", "%s", m);
    case KVC_ERR_BUSY:
        return srv_error_set(e, 503, "server_error", NULL, "server_busy",
                             "the server is busy (request queue full); try again later: %s", m);
    case KVC_ERR_KV_FULL:   /* the engine says so only of a request larger than its
                             * whole pool (others wait for room): a retry cannot help */
        return srv_error_set(e, 400, "invalid_request_error", "messages",
                             "context_length_exceeded",
                             "the request can never fit in the KV cache: %s", m);
    default:
        return srv_error_set(e, 500, "server_error", NULL, NULL, "%s", m);
    }
}

/* 400 invalid_request_error naming `param`. */
static int bad(srv_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(srv_error *e, const char *param, const char *fmt, ...)
{
    char msg[sizeof(e->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return srv_error_set(e, 400, "invalid_request_error", param, NULL, "%s", msg);
}

/* ========================================================== field access */

const cJSON *srv_json_get(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

void srv_json_copy_as(cJSON *to_obj, const cJSON *from_obj, const char *from, const char *to)
{
    const cJSON *v = srv_json_get(from_obj, from);
    if (v)
        cJSON_AddItemToObject(to_obj, to, cJSON_Duplicate(v, true));
}

void srv_json_add_function(cJSON *tools, const cJSON *t, const char *params)
{
    cJSON *x = cJSON_CreateObject(), *f;
    cJSON_AddStringToObject(x, "type", "function");
    f = cJSON_AddObjectToObject(x, "function");
    srv_json_copy_as(f, t, "name", "name");
    srv_json_copy_as(f, t, "description", "description");
    srv_json_copy_as(f, t, params, "parameters");
    cJSON_AddItemToArray(tools, x);
}

/* A number in [lo, hi] into *out (left alone when absent). 0 or 400. */
static int num_field(const cJSON *o, const char *name, double lo, double hi, float *out,
                     srv_error *e)
{
    const cJSON *v = srv_json_get(o, name);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return bad(e, name, "%s must be a number between %g and %g", name, lo, hi);
    *out = (float)v->valuedouble;
    return 0;
}

/* An integer in [lo, hi] into *out (left alone when absent; *present says). */
static int int_field(const cJSON *o, const char *name, double lo, double hi, int64_t *out,
                     bool *present, srv_error *e)
{
    const cJSON *v = srv_json_get(o, name);
    if (present)
        *present = v != NULL;
    if (!v)
        return 0;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d) || d < lo || d > hi)
        return bad(e, name, "%s must be an integer between %.0f and %.0f", name, lo, hi);
    *out = (int64_t)d;
    return 0;
}

/* seed: OpenAI's is any 64-bit integer; negative ones wrap (-1 = all ones =
 * KVC_SEED_RANDOM, as llama.cpp's -1). Left alone when absent. */
static int seed_field(const cJSON *o, uint64_t *out, bool *present, srv_error *e)
{
    const cJSON *v = srv_json_get(o, "seed");
    *present = v != NULL;
    if (!v)
        return 0;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d) || d < -9223372036854775808.0 ||
        d >= 18446744073709551616.0)
        return bad(e, "seed", "seed must be a 64-bit integer");
    *out = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    return 0;
}

static int bool_field(const cJSON *o, const char *name, bool *out, srv_error *e)
{
    const cJSON *v = srv_json_get(o, name);
    if (!v)
        return 0;
    if (!cJSON_IsBool(v))
        return bad(e, name, "%s must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A string of at most max_len bytes; *out NULL when absent. */
static int str_field(const cJSON *o, const char *name, size_t max_len, const char **out,
                     srv_error *e)
{
    const cJSON *v = srv_json_get(o, name);
    *out = NULL;
    if (!v)
        return 0;
    if (!cJSON_IsString(v))
        return bad(e, name, "%s must be a string", name);
    if (strlen(v->valuestring) > max_len)
        return bad(e, name, "%s is longer than %zu bytes", name, max_len);
    *out = v->valuestring;
    return 0;
}

/* ============================================================== messages */

static bool role_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MAX_ROLE_LEN)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* Keep a string made here; false when out of memory (s is then freed). */
static bool own(srv_request *r, char *s)
{
    char **o = realloc(r->owned, (r->n_owned + 1) * sizeof(*o));
    if (!o) {
        free(s);
        return false;
    }
    r->owned = o;
    r->owned[r->n_owned++] = s;
    return true;
}

/* Content given as an array of parts: [{type: "text", text}], joined with
 * "\n" (as vLLM and llama.cpp join them). */
static int parse_parts(srv_request *r, const cJSON *parts, int i, const char **out, srv_error *e)
{
    char param[64];
    size_t total = 0;
    int j = 0;
    const cJSON *p;
    snprintf(param, sizeof(param), "messages[%d].content", i);
    cJSON_ArrayForEach(p, parts) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type))
            return bad(e, param, "messages[%d].content[%d] must be an object with a \"type\"", i, j);
        if (strcmp(type->valuestring, "text") != 0)
            return bad(e, param, "messages[%d].content[%d].type '%.40s' is not supported "
                       "(only \"text\")", i, j, type->valuestring);
        if (!cJSON_IsString(text))
            return bad(e, param, "messages[%d].content[%d].text must be a string", i, j);
        total += strlen(text->valuestring) + 1;
        j++;
    }
    char *s = malloc(total + 1), *w = s;
    if (!s || !own(r, s))
        return srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON_ArrayForEach(p, parts) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(t);
        if (w > s)
            *w++ = '\n';
        memcpy(w, t, n);
        w += n;
    }
    *w = 0;
    *out = s;
    return 0;
}

/* An optional string field of messages[i] into *out (NULL when absent). */
static int opt_string(const cJSON *m, const char *name, int i, const char **out, srv_error *e)
{
    const cJSON *v = srv_json_get(m, name);
    *out = NULL;
    if (!v)
        return 0;
    if (!cJSON_IsString(v)) {
        char param[64];
        snprintf(param, sizeof(param), "messages[%d].%s", i, name);
        return bad(e, param, "messages[%d].%s must be a string", i, name);
    }
    *out = v->valuestring;
    return 0;
}

/* JSON text of v, kept with the request. */
static int own_json(srv_request *r, const cJSON *v, const char **out, srv_error *e)
{
    char *s = cJSON_PrintUnformatted(v);
    if (!s || !own(r, s))
        return srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    *out = s;
    return 0;
}

/* name, tool_call_id, tool_calls, reasoning_content: passed to the chat template */
static int parse_message_extras(srv_request *r, const cJSON *m, int i, srv_error *e)
{
    kvc_chat_message *msg = &r->msgs[i];
    int rc;
    if ((rc = opt_string(m, "name", i, &msg->name, e)) ||
        (rc = opt_string(m, "tool_call_id", i, &msg->tool_call_id, e)) ||
        (rc = opt_string(m, "reasoning_content", i, &msg->reasoning_content, e)))
        return rc;
    const cJSON *tc = srv_json_get(m, "tool_calls");
    if (!tc)
        return 0;
    char param[64];
    snprintf(param, sizeof(param), "messages[%d].tool_calls", i);
    if (!cJSON_IsArray(tc))
        return bad(e, param, "messages[%d].tool_calls must be an array", i);
    const cJSON *c;
    int j = 0;
    cJSON_ArrayForEach(c, tc) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(f) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")))
            return bad(e, param, "messages[%d].tool_calls[%d] must be an object with a "
                       "\"function\" object that has a \"name\"", i, j);
        j++;
    }
    return own_json(r, tc, &msg->tool_calls_json, e);
}

static int parse_message(srv_request *r, const cJSON *m, int i, srv_error *e)
{
    int rc = cJSON_IsObject(m) ? parse_message_extras(r, m, i, e) : 0;
    if (rc)
        return rc;
    char param[64];
    snprintf(param, sizeof(param), "messages[%d]", i);
    if (!cJSON_IsObject(m))
        return bad(e, param, "messages[%d] must be an object with \"role\" and \"content\"", i);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    snprintf(param, sizeof(param), "messages[%d].role", i);
    if (!cJSON_IsString(role))
        return bad(e, param, "messages[%d].role must be a string", i);
    if (!role_ok(role->valuestring))
        return bad(e, param, "messages[%d].role '%.40s' is not a valid role", i, role->valuestring);
    const char *rs = role->valuestring;
    r->msgs[i].role = !strcmp(rs, "developer") ? "system" : rs;

    const cJSON *c = srv_json_get(m, "content");
    snprintf(param, sizeof(param), "messages[%d].content", i);
    if (!c) {
        if (strcmp(rs, "assistant") != 0)
            return bad(e, param, "messages[%d].content is required", i);
        r->msgs[i].content = "";
        return 0;
    }
    if (cJSON_IsString(c)) {
        r->msgs[i].content = c->valuestring;
        return 0;
    }
    if (cJSON_IsArray(c))
        return parse_parts(r, c, i, &r->msgs[i].content, e);
    return bad(e, param, "messages[%d].content must be a string or an array of content parts", i);
}

/* reasoning_format (none: the reply as it is; auto, deepseek: its thinking
 * split out, as llama-server does), and chat_template_kwargs, with the
 * thinking switches of the APIs added where
 * the request's kwargs do not set them: reasoning_effort ("none" turns the
 * template's enable_thinking off, any other effort on; the effort itself is
 * passed as reasoning_effort, gpt-oss's variable) and enable_thinking given
 * at the top level (as some clients send it). */
static int parse_thinking(srv_request *r, const cJSON *root, const cJSON *kw, srv_error *e)
{
    static const char *const efforts[] = { "none", "minimal", "low", "medium", "high", "xhigh" };
    const cJSON *eff = srv_json_get(root, "reasoning_effort"),
                *on = srv_json_get(root, "enable_thinking");
    if (eff) {
        size_t i = 0;
        while (cJSON_IsString(eff) && i < KVC_ARRAY_LEN(efforts) && strcmp(eff->valuestring, efforts[i]))
            i++;
        if (!cJSON_IsString(eff) || i == KVC_ARRAY_LEN(efforts))
            return bad(e, "reasoning_effort", "reasoning_effort must be one of none, minimal, "
                       "low, medium, high, xhigh");
    }
    if (on && !cJSON_IsBool(on))
        return bad(e, "enable_thinking", "enable_thinking must be a boolean");
    const cJSON *rf = srv_json_get(root, "reasoning_format");
    const char *f = cJSON_IsString(rf) ? rf->valuestring : rf ? "?" : "auto";
    if (strcmp(f, "none") && strcmp(f, "auto") && strcmp(f, "deepseek") &&
        strcmp(f, "deepseek-legacy"))
        return bad(e, "reasoning_format", "reasoning_format must be none, auto, deepseek or "
                   "deepseek-legacy");
    r->think = strcmp(f, "none") != 0;      /* the template's tags decide: srv_parse_chat */
    if (!eff && !on)
        return kw ? own_json(r, kw, &r->params.chat.template_kwargs_json, e) : 0;
    cJSON *all = kw ? cJSON_Duplicate(kw, true) : cJSON_CreateObject();
    if (all && !cJSON_HasObjectItem(all, "enable_thinking"))
        cJSON_AddBoolToObject(all, "enable_thinking",
                              on ? cJSON_IsTrue(on) : strcmp(eff->valuestring, "none") != 0);
    if (all && eff && !cJSON_HasObjectItem(all, "reasoning_effort"))
        cJSON_AddStringToObject(all, "reasoning_effort", eff->valuestring);
    int rc = all ? own_json(r, all, &r->params.chat.template_kwargs_json, e)
                 : srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON_Delete(all);
    return rc;
}

static int parse_messages(srv_request *r, const cJSON *root, int max, srv_error *e)
{
    const cJSON *ms = srv_json_get(root, "messages");
    if (!ms)
        return bad(e, "messages", "messages is required");
    if (!cJSON_IsArray(ms))
        return bad(e, "messages", "messages must be an array");
    int n = cJSON_GetArraySize(ms);
    if (n < 1)
        return bad(e, "messages", "messages must contain at least one message");
    if (n > max)
        return bad(e, "messages", "messages has %d entries; at most %d are allowed", n, max);
    r->msgs = calloc((size_t)n, sizeof(*r->msgs));
    if (!r->msgs)
        return srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0, rc;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms)
        if ((rc = parse_message(r, m, i++, e)) != 0)
            return rc;
    r->params.messages = r->msgs;
    r->params.n_messages = (size_t)n;
    /* tools and chat_template_kwargs go to the chat template */
    const cJSON *tools = srv_json_get(root, "tools"),
                *kw = srv_json_get(root, "chat_template_kwargs");
    if (tools && !cJSON_IsArray(tools))
        return bad(e, "tools", "tools must be an array");
    if (kw && !cJSON_IsObject(kw))
        return bad(e, "chat_template_kwargs", "chat_template_kwargs must be an object");
    if (tools && cJSON_GetArraySize(tools) > 0 && (rc = own_json(r, tools, &r->params.chat.tools_json, e)))
        return rc;
    return parse_thinking(r, root, kw, e);
}

/* ============================================================ parameters */

static int parse_stop(srv_request *r, const cJSON *root, srv_error *e)
{
    const cJSON *s = srv_json_get(root, "stop"), *v;
    int n = 0;
    if (!s)
        return 0;
    if (cJSON_IsString(s)) {
        if (strlen(s->valuestring) > MAX_STOP_LEN)
            return bad(e, "stop", "stop is longer than %d bytes", MAX_STOP_LEN);
        if (*s->valuestring)
            r->stop[n++] = s->valuestring;
    } else if (cJSON_IsArray(s) && cJSON_GetArraySize(s) <= SRV_MAX_STOP) {
        cJSON_ArrayForEach(v, s) {
            if (!cJSON_IsString(v))
                return bad(e, "stop", "stop must be a string or an array of strings");
            if (strlen(v->valuestring) > MAX_STOP_LEN)
                return bad(e, "stop", "stop strings must be at most %d bytes", MAX_STOP_LEN);
            if (*v->valuestring)   /* an empty stop string would stop at once: ignored */
                r->stop[n++] = v->valuestring;
        }
    } else {
        return bad(e, "stop", "stop must be a string or an array of at most %d strings",
                   SRV_MAX_STOP);
    }
    r->params.chat.stop = r->stop;
    r->params.chat.n_stop = n;
    return 0;
}

static int parse_sampling(kvc_sampler_params *s, const cJSON *root, const srv_limits *lim,
                          srv_error *e)
{
    int64_t v = 0;
    bool has_seed = false;
    int rc;
    if ((rc = num_field(root, "temperature", 0, 2, &s->temperature, e)) ||
        (rc = num_field(root, "top_p", 0, 1, &s->top_p, e)) ||
        (rc = num_field(root, "min_p", 0, 1, &s->min_p, e)) ||
        (rc = num_field(root, "presence_penalty", -2, 2, &s->presence_penalty, e)) ||
        (rc = num_field(root, "frequency_penalty", -2, 2, &s->frequency_penalty, e)) ||
        (rc = num_field(root, "repetition_penalty", 1e-3, 100, &s->repeat_penalty, e)) ||
        (rc = num_field(root, "repeat_penalty", 1e-3, 100, &s->repeat_penalty, e)))
        return rc;
    v = s->top_k;
    if ((rc = int_field(root, "top_k", 0, INT32_MAX, &v, NULL, e)))
        return rc;
    s->top_k = (int32_t)v;
    v = s->repeat_last_n;
    if ((rc = int_field(root, "repeat_last_n", -1, INT32_MAX, &v, NULL, e)))
        return rc;
    s->repeat_last_n = (int32_t)v;
    if ((rc = seed_field(root, &s->seed, &has_seed, e)))
        return rc;
    if (!has_seed && !lim->fixed_seed)
        s->seed = KVC_SEED_RANDOM;
    return 0;
}

/* n_predict (llama.cpp's), max_tokens, max_completion_tokens (the newer name
 * wins); -1 is no limit; n is server_agent.c's. */
static int parse_lengths(srv_request *r, const cJSON *root, srv_error *e)
{
    static const char *const names[] = { "n_predict", "max_tokens", "max_completion_tokens" };
    int64_t v = 0;
    int rc;
    for (size_t i = 0; i < KVC_ARRAY_LEN(names); i++) {
        const cJSON *f = srv_json_get(root, names[i]);
        if (cJSON_IsNumber(f) && f->valuedouble == -1)   /* llama.cpp's "no limit" */
            v = 0;
        else if ((rc = int_field(root, names[i], 1, INT32_MAX, &v, NULL, e)))
            return bad(e, names[i], "%s must be an integer between 1 and %d, or -1 (no limit)",
                       names[i], INT32_MAX);
    }
    r->params.chat.max_tokens = (int32_t)v;
    return 0;
}

static int parse_stream(srv_request *r, const cJSON *root, srv_error *e)
{
    int rc = bool_field(root, "stream", &r->stream, e);
    if (rc)
        return rc;
    const cJSON *so = srv_json_get(root, "stream_options");
    if (!so)
        return 0;
    if (!cJSON_IsObject(so))
        return bad(e, "stream_options", "stream_options must be an object");
    if (bool_field(so, "include_usage", &r->include_usage, e))
        return bad(e, "stream_options.include_usage", "stream_options.include_usage must be a boolean");
    return 0;
}

/* The session key of a chat request that names only its end user: `user` is
 * who is asking, not which conversation (one user may hold several at once,
 * which must not wait for each other), so the key is the user with the
 * conversation's start, its messages up to the first user message: the
 * requests of one conversation (its later turns, edits, regenerations) share
 * it. A completion has no messages to tell its conversations apart: no key
 * (the engine finds its session by prefix). */
static int user_session_key(srv_request *r, const char *user, srv_error *e)
{
    if (!r->msgs)
        return 0;
    XXH3_state_t *h = XXH3_createState();
    if (!h || XXH3_64bits_reset(h) != XXH_OK) {
        XXH3_freeState(h);
        return srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    for (size_t i = 0; i < r->params.n_messages; i++) {
        const kvc_chat_message *m = &r->msgs[i];
        XXH3_64bits_update(h, m->role, strlen(m->role) + 1);
        XXH3_64bits_update(h, m->content, strlen(m->content) + 1);
        if (!strcmp(m->role, "user"))
            break;
    }
    unsigned long long start = (unsigned long long)XXH3_64bits_digest(h);
    XXH3_freeState(h);
    size_t n = strlen(user) + 32;
    char *k = malloc(n);
    if (!k || !own(r, k))
        return srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    snprintf(k, n, "user\x1f%s\x1f%016llx", user, start);
    r->params.session_key = k;
    return 0;
}

/* model, user, prompt_cache_key (the session key), cache_prompt (extension),
 * cache_salt (vLLM's: requests with different salts share no cache). */
static int parse_identity(srv_request *r, const cJSON *root, srv_error *e)
{
    const char *user, *key;
    bool cache = true;
    int rc;
    if ((rc = str_field(root, "model", MAX_KEY_LEN, &r->model, e)) ||
        (rc = str_field(root, "user", MAX_KEY_LEN, &user, e)) ||
        (rc = str_field(root, "prompt_cache_key", MAX_KEY_LEN, &key, e)) ||
        (rc = bool_field(root, "cache_prompt", &cache, e)) ||
        (rc = str_field(root, "cache_salt", MAX_KEY_LEN, &r->cache_salt, e)))
        return rc;
    if (key && *key)
        r->params.session_key = key;
    else if (user && *user && (rc = user_session_key(r, user, e)))
        return rc;
    r->params.chat.no_cache = !cache;
    return 0;
}

/* ================================================================ parse */

/* The fields every OpenAI request shares, after the dialect's own. */
static int parse_common(srv_request *r, const cJSON *root, const srv_limits *lim, srv_error *e)
{
    int rc;
    if ((rc = parse_lengths(r, root, e)) ||
        (rc = parse_sampling(&r->params.chat.sampling, root, lim, e)) ||
        (rc = parse_stop(r, root, e)) || (rc = parse_stream(r, root, e)))
        return rc;
    return parse_identity(r, root, e);
}

int srv_parse_chat(srv_request *r, void *root_json, const srv_limits *lim, srv_error *e)
{
    const cJSON *root = root_json;
    int rc;
    if ((rc = parse_messages(r, root, lim->max_messages, e)) ||
        (rc = parse_common(r, root, lim, e)))
        return rc;
    /* harmony's channels are the reply's structure: always parsed, so that no
     * markup reaches the content (the analysis goes to the reasoning) */
    r->think = (r->think && lim->think_tags) || lim->think_harmony;
    return srv_agent_parse(r, root, lim, false, e);
}

int srv_parse_translated(srv_request *r, void *root_json, srv_translate_fn translate,
                         const srv_limits *lim, srv_error *e)
{
    cJSON *chat = cJSON_CreateObject();
    if (!chat)
        return srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    int rc = translate(r, chat, root_json, e);
    if (rc) {
        cJSON_Delete(chat);
        return rc;
    }
    cJSON_Delete(r->json);         /* what the request borrows is in the chat tree */
    r->json = chat;
    return srv_parse_chat(r, chat, lim, e);
}

int srv_parse_completion(srv_request *r, void *root_json, const srv_limits *lim, srv_error *e)
{
    const cJSON *root = root_json;
    int rc = parse_common(r, root, lim, e);
    return rc ? rc : srv_agent_parse(r, root, lim, true, e);
}

int srv_request_parse(const srv_dialect *d, const char *body, size_t len, const srv_limits *lim,
                      srv_request *out, srv_error *e)
{
    memset(out, 0, sizeof(*out));
    out->dialect = d;
    out->params.chat = kvc_chat_default_params();
    out->params.chat.sampling = lim->sampling;
    cJSON *root = srv_json_parse(body, len, e);
    if (!root)
        return e->http_status;
    out->json = root;
    int rc = !cJSON_IsObject(root) ? bad(e, NULL, "the request body must be a JSON object")
           : srv_fields_check(out, root, d->fields, lim, e);
    if (!rc)
        rc = d->parse(out, root, lim, e);
    if (rc)
        srv_request_free(out);
    return rc;
}

void srv_request_free(srv_request *r)
{
    if (!r)
        return;
    cJSON_Delete(r->json);
    srv_agent_free(r);
    for (size_t i = 0; i < r->n_owned; i++)
        free(r->owned[i]);
    free(r->owned);
    free(r->msgs);
    memset(r, 0, sizeof(*r));
}

/* ============================================================ responses */

/* A copy of s with each byte that does not start a valid UTF-8 character
 * (a stray continuation byte, an overlong form, a surrogate, a sequence cut
 * short) replaced by U+FFFD; malloc'd. NULL when s is valid (nothing to do)
 * or memory ran out (*oom set). */
static char *utf8_repaired(const char *s, bool *oom)
{
    size_t n = strlen(s), i = 0, bad = 0;
    for (int r; i < n; i += r > 0 ? (size_t)r : 1)
        bad += (r = kvc_utf8_decode(s + i, n - i, NULL)) <= 0;
    if (!bad)
        return NULL;
    char *out = malloc(n + 2 * bad + 1), *w = out;
    if (!out) {
        *oom = true;
        return NULL;
    }
    for (int r; n; s += r > 0 ? r : 1, n -= r > 0 ? (size_t)r : 1) {
        r = kvc_utf8_decode(s, n, NULL);
        memcpy(w, r > 0 ? s : KVC_UTF8_REPLACEMENT, r > 0 ? (size_t)r : 3);
        w += r > 0 ? r : 3;
    }
    *w = 0;
    return out;
}

/* Make every string (values and keys) in the tree valid UTF-8. Whatever a
 * client sent - a model name, a role, a URL - and whatever an error message
 * cut at a byte count may be echoed, and cJSON copies bytes as they are: an
 * invalid sequence would make the body invalid JSON. false when out of
 * memory. */
static bool utf8_repair_tree(cJSON *o)
{
    bool oom = false;
    for (; o && !oom; o = o->next) {
        char *v = o->valuestring && !(o->type & cJSON_IsReference)
                ? utf8_repaired(o->valuestring, &oom) : NULL;
        if (v) {
            cJSON_free(o->valuestring);
            o->valuestring = v;
        }
        char *k = o->string && !(o->type & cJSON_StringIsConst)
                ? utf8_repaired(o->string, &oom) : NULL;
        if (k) {
            cJSON_free(o->string);
            o->string = k;
        }
        if (o->child && !utf8_repair_tree(o->child))
            return false;
    }
    return !oom;
}

char *srv_json_print(void *cjson)
{
    cJSON *o = cjson;
    char *s = o && utf8_repair_tree(o) ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *srv_sse_event(const char *name, void *cjson)
{
    char *j = srv_json_print(cjson);
    if (!j)
        return NULL;
    size_t n = strlen(j), k = name ? strlen(name) + 8 : 0;
    char *s = malloc(k + n + 9);
    if (s) {
        if (name)
            snprintf(s, k + 1, "event: %s\n", name);
        memcpy(s + k, "data: ", 6);
        memcpy(s + k + 6, j, n);
        memcpy(s + k + 6 + n, "\n\n", 3);
    }
    free(j);
    return s;
}

void *srv_json_string_n(const char *s, size_t n)
{
    char *t = malloc(n + 1);
    if (!t)
        return NULL;
    memcpy(t, s, n);
    t[n] = 0;
    cJSON *o = cJSON_CreateString(t);
    free(t);
    return o;
}

char *srv_sse_data(void *cjson) { return srv_sse_event(NULL, cjson); }

void *srv_error_object(const srv_error *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "message", e->message);
    cJSON_AddStringToObject(x, "type", e->type);
    if (e->param[0])
        cJSON_AddStringToObject(x, "param", e->param);
    else
        cJSON_AddNullToObject(x, "param");
    if (e->code[0])
        cJSON_AddStringToObject(x, "code", e->code);
    else
        cJSON_AddNullToObject(x, "code");
    return o;
}

char *srv_prompt_json(const char *prompt)
{
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, "prompt", prompt)) {
        cJSON_Delete(o);
        return NULL;
    }
    return srv_json_print(o);
}

/* The usage of a response's choices, added one by one in index order
 * (per_prompt choices per prompt, consecutive). A prompt and its cached part
 * count once, as OpenAI reports n > 1: the cached part is what was cached
 * when the request came, the fewest tokens any of the prompt's choices found
 * (the others find what the first computed), with that choice's disk part.
 * Output, computed tokens and grammar work are summed over all choices. */
typedef struct {
    kvc_chat_stats sum;
    int32_t        cached, disk;   /* the current prompt's fewest cached, its disk part */
} usage_acc;

static void usage_add(usage_acc *a, const kvc_chat_stats *s, int i, int per_prompt)
{
    if (i == 0) {
        a->sum = *s;
        a->sum.cached_tokens = a->sum.cached_disk_tokens = 0;
    } else {
        a->sum.output_tokens += s->output_tokens;
        a->sum.computed_tokens += s->computed_tokens;
        a->sum.grammar_masks += s->grammar_masks;
        a->sum.grammar_mask_ms += s->grammar_mask_ms;
    }
    bool first = i == 0 || per_prompt <= 0 || i % per_prompt == 0;
    if (first) {
        a->sum.cached_tokens += a->cached;     /* the previous prompt's */
        a->sum.cached_disk_tokens += a->disk;
        if (i > 0)
            a->sum.prompt_tokens += s->prompt_tokens;
    }
    if (first || s->cached_tokens < a->cached) {
        a->cached = s->cached_tokens;
        a->disk = s->cached_disk_tokens;
    }
}

static const kvc_chat_stats *usage_sum(usage_acc *a)
{
    a->sum.cached_tokens += a->cached;
    a->sum.cached_disk_tokens += a->disk;
    a->cached = a->disk = 0;
    return &a->sum;
}

kvc_chat_stats srv_stats_sum(const kvc_chat_stats *stats, int n, int per_prompt)
{
    usage_acc a = { 0 };
    for (int i = 0; i < n; i++)
        usage_add(&a, &stats[i], i, per_prompt);
    return *usage_sum(&a);
}

bool srv_buf_put(srv_buf *b, char *s)
{
    b->oom |= !s;
    if (s && !b->oom)
        kvc_text_append(&b->p, &b->len, &b->cap, &b->oom, s, strlen(s));
    free(s);
    return !b->oom;
}

static cJSON *model_object(const char *model, time_t created)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "kvchat");
    return m;
}

char *srv_models_json(const char *model, time_t created, bool one)
{
    if (one)
        return srv_json_print(model_object(model, created));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(d, model_object(model, created));
    return srv_json_print(o);
}
