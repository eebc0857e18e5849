/* server_agent.c - the agent API's request fields and response parts
 * (server.h): structured output and forced tool calls as grammars, tool
 * calls in replies, logprobs, logit_bias, n and prompt lists, /tokenize and
 * /detokenize. */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "model.h"
#include "sampler.h"
#include "server.h"
#include "tool_calls.h"

#define BAD(e, param, ...) srv_error_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM(e) srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory")
#define MAX_BIAS 1024

static int32_t vocab_size(const kvc_model *m)
{
    kvc_model_info info;
    kvc_model_get_info(m, &info);
    return info.n_vocab;
}

/* ----------------------------------------------------------------- grammar */

/* response_format: text, json_object, json_schema {schema, strict, name}. */
static int parse_response_format(srv_request *r, const cJSON *root, srv_error *e)
{
    const cJSON *rf = srv_json_get(root, "response_format"), *type;
    if (!rf)
        return 0;
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type = srv_json_get(rf, "type")))
        return BAD(e, "response_format", "response_format must be an object with a \"type\"");
    const char *t = type->valuestring;
    if (!strcmp(t, "text"))
        return 0;
    const char *schema = NULL;
    char *owned = NULL;
    if (!strcmp(t, "json_object")) {
        schema = "{\"type\":\"object\",\"additionalProperties\":true}";
    } else if (!strcmp(t, "json_schema")) {
        const cJSON *js = srv_json_get(rf, "json_schema"), *sc, *strict;
        if (!cJSON_IsObject(js))
            return BAD(e, "response_format.json_schema",
                       "response_format.json_schema must be an object with a \"schema\"");
        if ((strict = srv_json_get(js, "strict")) && !cJSON_IsBool(strict))
            return BAD(e, "response_format.json_schema.strict",
                       "response_format.json_schema.strict must be a boolean");
        sc = srv_json_get(js, "schema");
        if (sc && !cJSON_IsObject(sc))
            return BAD(e, "response_format.json_schema.schema",
                       "response_format.json_schema.schema must be an object");
        schema = owned = sc ? cJSON_PrintUnformatted(sc) : strdup("{\"type\":\"object\","
                                                                  "\"additionalProperties\":true}");
        if (!owned)
            return OOM(e);
    } else {
        return BAD(e, "response_format.type", "response_format.type '%.40s' is not supported "
                   "(text, json_object, json_schema)", t);
    }
    kvc_err ke = { 0 };
    int rc = kvc_schema_to_gbnf(schema, strlen(schema), NULL, &r->grammar, &ke);
    free(owned);
    if (rc == KVC_ERR_NOMEM)
        return OOM(e);
    if (rc)
        return BAD(e, "response_format.json_schema.schema", "response_format: %s", ke.msg);
    return 0;
}

/* The grammar fields of llama.cpp and vLLM: grammar (GBNF text, our
 * dialect of it: grammar.h), json_schema (llama.cpp) and guided_json (vLLM)
 * (a schema, as response_format's). At most one of them and
 * response_format; *from names the one given. */
static int parse_grammar_fields(srv_request *r, const cJSON *root, const char **from,
                                srv_error *e)
{
    static const char *const names[] = { "grammar", "json_schema", "guided_json" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const cJSON *v = srv_json_get(root, names[i]);
        if (!v)
            continue;
        if (r->grammar)
            return BAD(e, names[i], "%s cannot be combined with %s: give one", names[i], *from);
        *from = names[i];
        if (i == 0) {
            if (!cJSON_IsString(v))
                return BAD(e, "grammar", "grammar must be a string (GBNF)");
            if (!(r->grammar = strdup(v->valuestring)))
                return OOM(e);
            continue;
        }
        char *schema = cJSON_IsString(v) ? strdup(v->valuestring)
                     : cJSON_IsObject(v) ? cJSON_PrintUnformatted(v) : NULL;
        if (!schema && !cJSON_IsString(v) && !cJSON_IsObject(v))
            return BAD(e, names[i], "%s must be a JSON schema (an object)", names[i]);
        if (!schema)
            return OOM(e);
        kvc_err ke = { 0 };
        int rc = kvc_schema_to_gbnf(schema, strlen(schema), NULL, &r->grammar, &ke);
        free(schema);
        if (rc == KVC_ERR_NOMEM)
            return OOM(e);
        if (rc)
            return BAD(e, names[i], "%s: %s", names[i], ke.msg);
    }
    return 0;
}

/* tools: [{"type": "function", "function": {"name", "parameters"?}}] */
static int check_tools(const cJSON *tools, srv_error *e)
{
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = srv_json_get(t, "type"), *fn = srv_json_get(t, "function"), *name,
                    *params;
        char param[48];
        snprintf(param, sizeof(param), "tools[%d]", i);
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return BAD(e, param, "tools[%d] must be {\"type\": \"function\", \"function\": "
                       "{...}} (only function tools are supported)", i);
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name = srv_json_get(fn, "name")) ||
            !*name->valuestring)
            return BAD(e, param, "tools[%d].function must be an object with a \"name\"", i);
        if ((params = srv_json_get(fn, "parameters")) && !cJSON_IsObject(params))
            return BAD(e, param, "tools[%d].function.parameters must be an object", i);
        i++;
    }
    return 0;
}

/* tools, tool_choice, parallel_tool_calls: a forcing grammar when required. */
static int parse_tools(srv_request *r, const cJSON *root, const srv_limits *lim, srv_error *e)
{
    const cJSON *tools = srv_json_get(root, "tools"), *tc = srv_json_get(root, "tool_choice");
    const cJSON *par = srv_json_get(root, "parallel_tool_calls");
    int rc;
    if (par && !cJSON_IsBool(par))
        return BAD(e, "parallel_tool_calls", "parallel_tool_calls must be a boolean");
    if (tools && (rc = check_tools(tools, e)))
        return rc;
    bool have = tools && cJSON_GetArraySize(tools) > 0, force = false;
    const char *only = NULL;
    if (tc && cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        if (!strcmp(s, "required"))
            force = true;
        else if (strcmp(s, "auto") && strcmp(s, "none"))
            return BAD(e, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" "
                       "or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!strcmp(s, "none"))
            have = false;                      /* tools are shown, calls are not parsed */
    } else if (tc) {
        const cJSON *fn = srv_json_get(tc, "function"), *name = srv_json_get(fn, "name"),
                    *type = srv_json_get(tc, "type");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
            !cJSON_IsString(name))
            return BAD(e, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" "
                       "or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        force = true;
        only = name->valuestring;
    }
    if (force && !have)
        return BAD(e, "tool_choice", "tool_choice requires tools");
    r->params.chat.parse_tool_calls = have;
    r->params.chat.single_tool_call = par && cJSON_IsFalse(par);
    r->forced_calls = force;
    r->params.chat.forced_tool_calls = force;
    if (!force)
        return 0;
    /* a reply that is only calls has no text for response_format to shape:
     * it shapes the answer of a later turn (OpenAI takes both, and the
     * Agents SDK sends both: outputType and a required tool). A grammar
     * given as such would go unused: refused */
    static const char *const gbnf[] = { "grammar", "json_schema", "guided_json" };
    for (size_t i = 0; r->grammar && i < sizeof(gbnf) / sizeof(gbnf[0]); i++)
        if (srv_json_get(root, gbnf[i]))
            return BAD(e, "tool_choice", "%s and a forced tool_choice cannot be combined",
                       gbnf[i]);
    free(r->grammar);
    r->grammar = NULL;
    kvc_err ke = { 0 };
    rc = kvc_tool_calls_grammar(lim->tool_format, r->params.chat.tools_json, only,
                                !par || cJSON_IsTrue(par), &r->grammar, &ke);
    if (rc == KVC_ERR_NOMEM)
        return OOM(e);
    return rc ? BAD(e, only ? "tool_choice" : "tools", "%s", ke.msg) : 0;
}

/* ---------------------------------------------------------------- sampling */

static int parse_bias(srv_request *r, const cJSON *root, const srv_limits *lim, srv_error *e)
{
    const cJSON *lb = srv_json_get(root, "logit_bias"), *v;
    if (!lb)
        return 0;
    int n = cJSON_GetArraySize(lb);
    if (!cJSON_IsObject(lb) || n > MAX_BIAS)
        return BAD(e, "logit_bias", "logit_bias must be an object of at most %d token ids "
                   "(as strings) to numbers", MAX_BIAS);
    if (n == 0)
        return 0;
    int32_t n_vocab = lim->model ? vocab_size(lim->model) : INT32_MAX;
    r->bias = malloc((size_t)n * sizeof(*r->bias));
    if (!r->bias)
        return OOM(e);
    int i = 0;
    cJSON_ArrayForEach(v, lb) {
        char *end;
        long id = strtol(v->string, &end, 10);
        if (!*v->string || *end || id < 0 || id >= n_vocab)
            return BAD(e, "logit_bias", "logit_bias: '%.40s' is not a token id (0 to %d)",
                       v->string, n_vocab - 1);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > 100)
            return BAD(e, "logit_bias", "logit_bias[%ld] must be a number between -100 and 100",
                       id);
        r->bias[i++] = (kvc_logit_bias){ (int32_t)id, (float)v->valuedouble };
    }
    r->params.chat.logit_bias = r->bias;
    r->params.chat.n_logit_bias = i;
    return 0;
}

/* chat: logprobs (bool), top_logprobs (0-20); completions: logprobs (0-20). */
static int parse_logprobs(srv_request *r, const cJSON *root, bool completion, srv_error *e)
{
    const cJSON *lp = srv_json_get(root, "logprobs"), *top = srv_json_get(root, "top_logprobs");
    r->logprobs = -1;
    if (!completion) {
        if (lp && !cJSON_IsBool(lp))
            return BAD(e, "logprobs", "logprobs must be a boolean");
        bool on = lp && cJSON_IsTrue(lp);
        if (top && (!cJSON_IsNumber(top) || top->valuedouble != floor(top->valuedouble) ||
                    top->valuedouble < 0 || top->valuedouble > KVC_MAX_TOP_LOGPROBS))
            return BAD(e, "top_logprobs", "top_logprobs must be an integer between 0 and %d",
                       KVC_MAX_TOP_LOGPROBS);
        if (top && !on)
            return BAD(e, "top_logprobs", "top_logprobs needs logprobs: true");
        r->logprobs = on ? (top ? (int)top->valuedouble : 0) : -1;
    } else if (lp) {
        if (!cJSON_IsNumber(lp) || lp->valuedouble != floor(lp->valuedouble) ||
            lp->valuedouble < 0 || lp->valuedouble > KVC_MAX_TOP_LOGPROBS)
            return BAD(e, "logprobs", "logprobs must be an integer between 0 and %d",
                       KVC_MAX_TOP_LOGPROBS);
        r->logprobs = (int)lp->valuedouble;
    }
    r->params.chat.logprobs = r->logprobs;
    return 0;
}

/* ----------------------------------------------------------------- prompts */

/* An array of token ids into a new array; 0 or 400. */
static int token_list(srv_request *r, const cJSON *a, int i, const srv_limits *lim, srv_error *e)
{
    int n = cJSON_GetArraySize(a), k = 0;
    int32_t n_vocab = lim->model ? vocab_size(lim->model) : INT32_MAX;
    if (n < 1)
        return BAD(e, "prompt", "prompt[%d] is an empty list of tokens", i);
    int32_t *t = r->prompt_toks[i] = malloc((size_t)n * sizeof(int32_t));
    if (!t)
        return OOM(e);
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= n_vocab)
            return BAD(e, "prompt", "prompt token ids must be integers from 0 to %d", n_vocab - 1);
        t[k++] = (int32_t)v->valuedouble;
    }
    r->n_prompt_toks[i] = n;
    return 0;
}

/* prompt: a string, a list of strings, a list of token ids, a list of such lists. */
static int parse_prompts(srv_request *r, const cJSON *root, const srv_limits *lim, srv_error *e)
{
    const cJSON *p = srv_json_get(root, "prompt");
    if (!p)
        return BAD(e, "prompt", "prompt is required");
    bool ids = cJSON_IsArray(p) && cJSON_IsNumber(p->child);
    int n = cJSON_IsString(p) || ids ? 1 : cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
    if (n < 1 || n > SRV_MAX_CHOICES)
        return BAD(e, "prompt", "prompt must be a string, a list of token ids, or a list of 1 "
                   "to %d of those", SRV_MAX_CHOICES);
    r->n_prompts = n;
    r->prompts = calloc((size_t)n, sizeof(*r->prompts));
    r->prompt_toks = calloc((size_t)n, sizeof(*r->prompt_toks));
    r->n_prompt_toks = calloc((size_t)n, sizeof(*r->n_prompt_toks));
    if (!r->prompts || !r->prompt_toks || !r->n_prompt_toks)
        return OOM(e);
    if (cJSON_IsString(p) || ids) {
        r->prompts[0] = ids ? NULL : p->valuestring;
        return ids ? token_list(r, p, 0, lim, e) : 0;
    }
    int i = 0, rc;
    const cJSON *v;
    cJSON_ArrayForEach(v, p) {
        if (cJSON_IsString(v))
            r->prompts[i] = v->valuestring;
        else if (!cJSON_IsArray(v))
            return BAD(e, "prompt", "prompt[%d] must be a string or a list of token ids", i);
        else if ((rc = token_list(r, v, i, lim, e)))
            return rc;
        i++;
    }
    return 0;
}

/* ---------------------------------------------------------------- admission */

struct srv_vocab {
    pthread_mutex_t  mu;
    const kvc_model *model;
    kvc_gvocab      *v;              /* NULL until first use */
};

srv_vocab *srv_vocab_new(const kvc_model *model)
{
    srv_vocab *sv = calloc(1, sizeof(*sv));
    if (!sv)
        return NULL;
    pthread_mutex_init(&sv->mu, NULL);
    sv->model = model;
    return sv;
}

void srv_vocab_free(srv_vocab *sv)
{
    if (!sv)
        return;
    kvc_gvocab_free(sv->v);
    pthread_mutex_destroy(&sv->mu);
    free(sv);
}

const kvc_gvocab *srv_vocab_get(srv_vocab *sv, kvc_err *err)
{
    pthread_mutex_lock(&sv->mu);
    if (!sv->v && sv->model)
        kvc_gvocab_new(sv->model->tok, &sv->v, err);
    const kvc_gvocab *v = sv->v;
    pthread_mutex_unlock(&sv->mu);
    if (!v && !sv->model)
        kvc_fail(err, KVC_ERR_INVALID_ARG, "no model");
    return v;
}

/* Steps after the start whose masks admission computes. */
enum { ADMIT_STEPS = 8 };

/* The request's grammar compiles and, with a vocabulary to check against,
 * its first masks stay within the matcher's cost limits (grammar.h): a
 * grammar too ambiguous to serve is a 400 here, on the worker thread,
 * instead of stalling the engine. */
static int admit_grammar(srv_request *r, const char *param, const srv_limits *lim, srv_error *e)
{
    kvc_grammar *g = NULL;
    kvc_err ke = { 0 };
    int rc = kvc_grammar_parse(r->grammar, strlen(r->grammar), &g, &ke);
    if (rc)
        return rc == KVC_ERR_NOMEM ? OOM(e) : BAD(e, param, "%s", ke.msg);
    /* no trie (no model, or none can be built): the engine's own limits still hold */
    const kvc_gvocab *v = lim->vocab ? srv_vocab_get(lim->vocab, &ke) : NULL;
    if (lim->vocab && !v && ke.code == KVC_ERR_NOMEM)
        rc = KVC_ERR_NOMEM;
    else if (v)
        rc = kvc_grammar_check_cost(g, v, ADMIT_STEPS, 0, &ke);
    kvc_grammar_free(g);
    if (rc == KVC_ERR_NOMEM)
        return OOM(e);
    if (rc)
        return BAD(e, param, "%s", ke.msg);
    r->params.chat.grammar = r->grammar;
    return 0;
}

int srv_agent_parse(srv_request *r, const void *root_json, const srv_limits *lim, bool completion,
                    srv_error *e)
{
    const cJSON *root = root_json, *nv = srv_json_get(root, "n");
    int rc;
    r->n = 1;
    r->n_prompts = 1;
    if (nv && (!cJSON_IsNumber(nv) || nv->valuedouble != floor(nv->valuedouble) ||
               nv->valuedouble < 1 || nv->valuedouble > SRV_MAX_CHOICES))
        return BAD(e, "n", "n must be an integer between 1 and %d", SRV_MAX_CHOICES);
    if (nv)
        r->n = (int)nv->valuedouble;
    if ((rc = parse_logprobs(r, root, completion, e)) ||
        (rc = parse_bias(r, root, lim, e)))
        return rc;
    const char *from = "response_format";
    if (!completion) {
        if ((rc = parse_response_format(r, root, e)) ||
            (rc = parse_grammar_fields(r, root, &from, e)) || (rc = parse_tools(r, root, lim, e)))
            return rc;
    } else if ((rc = parse_prompts(r, root, lim, e)) ||
               (rc = parse_grammar_fields(r, root, &from, e))) {
        return rc;
    }
    if (r->n * r->n_prompts > SRV_MAX_CHOICES)
        return BAD(e, "n", "n times the prompts is %d; at most %d choices", r->n * r->n_prompts,
                   SRV_MAX_CHOICES);
    if (r->grammar && (rc = admit_grammar(r, from, lim, e)))   /* sets params.chat.grammar */
        return rc;
    if (completion) {
        r->params.prompt = r->prompts[0];
        r->params.prompt_tokens = r->prompt_toks[0];
        r->params.n_prompt_tokens = r->n_prompt_toks[0];
    }
    return 0;
}

void srv_agent_free(srv_request *r)
{
    for (int i = 0; r->prompt_toks && i < r->n_prompts; i++)
        free(r->prompt_toks[i]);
    free(r->prompt_toks);
    free(r->n_prompt_toks);
    free(r->prompts);
    free(r->grammar);
    free(r->bias);
}

/* ---------------------------------------------------------------- responses */

/* The text of token id (control tokens rendered), NUL-terminated in buf
 * (cap >= 8); its length. */
static int piece(const kvc_model *m, int32_t id, char *buf, int cap)
{
    int k = kvc_model_token_to_piece(m, id, true, buf, cap - 1);
    if (k < 0 || k > cap - 1)
        k = 0;
    buf[k] = 0;
    return k;
}

static cJSON *token_entry(const kvc_model *m, int32_t id, float lp, bool bytes)
{
    char buf[256];
    int k = piece(m, id, buf, sizeof(buf));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", buf);
    cJSON_AddNumberToObject(o, "logprob", isfinite(lp) ? lp : -9999.0);
    if (bytes) {
        cJSON *b = cJSON_AddArrayToObject(o, "bytes");
        for (int i = 0; i < k; i++)
            cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[i]));
    }
    return o;
}

void *srv_logprobs_chat_json(const kvc_token_logprob *lp, int32_t n, const kvc_model *model,
                             size_t *text_offset)
{
    cJSON *o = cJSON_CreateObject();
    {
        cJSON *c = cJSON_AddArrayToObject(o, "content");
        for (int32_t i = 0; i < n; i++) {
            const kvc_token_logprob *t = &lp[i];
            cJSON *x = token_entry(model, t->token, t->logprob, true);
            cJSON *top = cJSON_AddArrayToObject(x, "top_logprobs");
            for (int32_t j = 0; j < t->n_top; j++)
                cJSON_AddItemToArray(top, token_entry(model, t->top_token[j], t->top_logprob[j],
                                                      true));
            cJSON_AddItemToArray(c, x);
        }
        cJSON_AddArrayToObject(o, "refusal");
    }
    return o;
}

void *srv_logprobs_completion_json(const kvc_token_logprob *lp, int32_t n,
                                   const kvc_model *model, size_t *text_offset)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int32_t i = 0; i < n; i++) {
        const kvc_token_logprob *t = &lp[i];
        char buf[256];
        int k = piece(model, t->token, buf, sizeof(buf));
        cJSON_AddItemToArray(toks, cJSON_CreateString(buf));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t->logprob));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*text_offset));
        *text_offset += (size_t)k;
        cJSON *top = cJSON_CreateObject();
        for (int32_t j = 0; j < t->n_top; j++) {
            piece(model, t->top_token[j], buf, sizeof(buf));
            if (!cJSON_GetObjectItemCaseSensitive(top, buf))
                cJSON_AddNumberToObject(top, buf, t->top_logprob[j]);
        }
        cJSON_AddItemToArray(tops, top);
    }
    return o;
}

/* ---------------------------------------------------------------- tokenize */

static cJSON *parse_body(const char *body, size_t len, srv_error *e)
{
    cJSON *root = srv_json_parse(body, len, e);
    if (!root)
        return NULL;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        BAD(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

char *srv_tokenize(const kvc_model *model, const char *body, size_t len, srv_error *e)
{
    cJSON *root = parse_body(body, len, e);
    if (!root)
        return NULL;
    const cJSON *c = srv_json_get(root, "content"), *as = srv_json_get(root, "add_special"),
                *wp = srv_json_get(root, "with_pieces");
    const cJSON *ps = srv_json_get(root, "parse_special");
    char *out = NULL;
    if (!cJSON_IsString(c))
        BAD(e, "content", "content must be a string");
    else if ((as && !cJSON_IsBool(as)) || (wp && !cJSON_IsBool(wp)) || (ps && !cJSON_IsBool(ps)))
        BAD(e, NULL, "add_special, parse_special and with_pieces must be booleans");
    else {
        size_t n = strlen(c->valuestring);
        int64_t cap = (int64_t)n + 8;
        int32_t *t = malloc((size_t)cap * sizeof(int32_t));
        int64_t k = t ? kvc_model_tokenize(model, c->valuestring, n, cJSON_IsTrue(as),
                                           !ps || cJSON_IsTrue(ps), t, cap) : -1;
        if (k < 0 || k > cap) {
            srv_error_set(e, 500, "server_error", NULL, NULL, "tokenization failed");
        } else {
            cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
            for (int64_t i = 0; i < k; i++) {
                if (!cJSON_IsTrue(wp)) {
                    cJSON_AddItemToArray(a, cJSON_CreateNumber(t[i]));
                    continue;
                }
                char buf[256];
                piece(model, t[i], buf, sizeof(buf));
                cJSON *x = cJSON_CreateObject();
                cJSON_AddNumberToObject(x, "id", t[i]);
                cJSON_AddStringToObject(x, "piece", buf);
                cJSON_AddItemToArray(a, x);
            }
            out = cJSON_PrintUnformatted(o);
            cJSON_Delete(o);
        }
        free(t);
    }
    cJSON_Delete(root);
    return out;
}

char *srv_detokenize(const kvc_model *model, const char *body, size_t len, srv_error *e)
{
    cJSON *root = parse_body(body, len, e);
    if (!root)
        return NULL;
    const cJSON *t = srv_json_get(root, "tokens"), *v;
    int32_t n_vocab = vocab_size(model);
    char *text = NULL, *out = NULL;
    size_t tl = 0, tc = 0;
    bool oom = false, ok = cJSON_IsArray(t);
    cJSON_ArrayForEach(v, t) {
        ok = ok && cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
             v->valuedouble >= 0 && v->valuedouble < n_vocab;
        if (!ok)
            break;
        char buf[256];
        int k = piece(model, (int32_t)v->valuedouble, buf, sizeof(buf));
        kvc_text_append(&text, &tl, &tc, &oom, buf, (size_t)k);
    }
    if (!ok) {
        BAD(e, "tokens", "tokens must be a list of token ids from 0 to %d", n_vocab - 1);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "content", text ? text : "");
        out = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    }
    free(text);
    cJSON_Delete(root);
    return out;
}
