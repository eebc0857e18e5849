/* chat_template_apply.c - the chat template object: the model's Jinja
 * template (or a built-in format), and the variables a request gives it, as
 * transformers passes them. See chat_template.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat_template.h"
#include "jinja.h"

struct kvc_chat_template {
    jinja_template *jinja;        /* NULL: a built-in format */
    jinja_template *jinja_tools;  /* tokenizer.chat_template.tool_use, or NULL */
    int   builtin;                /* enum kvc_chat_tmpl when jinja is NULL */
    int   family;                 /* the built-in format the Jinja source is recognised as */
    char *bos, *eos;
    bool  strip_bos;
    bool  thinking;               /* a harmony template (gpt-oss): it reads an assistant's
                                     reasoning as message.thinking */
    char  describe[192];
};

void kvc_rendered_free(kvc_rendered *r)
{
    if (!r)
        return;
    free(r->text);
    free(r->content);
    memset(r, 0, sizeof(*r));
}

void kvc_chat_template_free(kvc_chat_template *t)
{
    if (!t)
        return;
    jinja_template_free(t->jinja);
    jinja_template_free(t->jinja_tools);
    free(t->bos);
    free(t->eos);
    free(t);
}

static int compile(const char *src, const char *what, jinja_template **out, kvc_err *err)
{
    int rc = jinja_compile(src, strlen(src), out, err);
    if (rc)
        kvc_err_prefix(err, "%s", what);
    return rc;
}

int kvc_chat_template_new(const kvc_chat_template_params *p, kvc_chat_template **out,
                          kvc_err *err)
{
    *out = NULL;
    kvc_chat_template *t = calloc(1, sizeof(*t));
    if (!t)
        return kvc_fail(err, KVC_ERR_NOMEM, "chat template: out of memory");
    t->bos = strdup(p->bos_text ? p->bos_text : "");
    t->eos = strdup(p->eos_text ? p->eos_text : "");
    t->strip_bos = p->strip_bos;
    t->builtin = t->family = KVC_TMPL_UNKNOWN;
    int rc = KVC_OK;
    if (!t->bos || !t->eos) {
        rc = kvc_fail(err, KVC_ERR_NOMEM, "chat template: out of memory");
    } else if (p->name) {
        t->builtin = kvc_chat_template_from_name(p->name);
        if (t->builtin == KVC_TMPL_UNKNOWN)
            rc = kvc_fail(err, KVC_ERR_INVALID_ARG, "unknown chat template '%.64s' (a built-in "
                          "format name; use a file for Jinja source)", p->name);
        snprintf(t->describe, sizeof(t->describe), "built-in %s (chosen by name)", p->name);
    } else if (p->jinja && *p->jinja) {
        rc = compile(p->jinja, "chat template", &t->jinja, err);
        if (!rc && p->jinja_tool_use && *p->jinja_tool_use)
            rc = compile(p->jinja_tool_use, "chat template tool_use", &t->jinja_tools, err);
        t->family = kvc_chat_template_detect(p->jinja);
        t->thinking = strstr(p->jinja, "<|channel|>") != NULL;
        snprintf(t->describe, sizeof(t->describe), "%s Jinja chat template%s%s%s",
                 p->origin ? p->origin : "the model's", t->jinja_tools ? " (and its tool_use variant)" : "",
                 t->family != KVC_TMPL_UNKNOWN ? ", family " : "",
                 t->family != KVC_TMPL_UNKNOWN ? kvc_chat_template_name(t->family) : "");
    } else {
        t->builtin = KVC_TMPL_CHATML;
        snprintf(t->describe, sizeof(t->describe), "built-in chatml (the model has no chat template)");
    }
    if (rc) {
        kvc_chat_template_free(t);
        return rc;
    }
    *out = t;
    return KVC_OK;
}

const char *kvc_chat_template_describe(const kvc_chat_template *t) { return t->describe; }

const char *const *kvc_chat_template_stop_list(const kvc_chat_template *t)
{
    return kvc_chat_template_stops(t->jinja ? t->family : t->builtin);
}

const char *kvc_chat_template_sep(const kvc_chat_template *t)
{
    return kvc_chat_template_reply_sep(t->jinja ? t->family : t->builtin);
}

/* ---------------------------------------------------------------- variables as JSON */

typedef struct jbuf {
    char  *p;
    size_t n, cap;
    bool   oom;
} jbuf;

static void jb_put(jbuf *b, const char *s, size_t n)
{
    kvc_text_append(&b->p, &b->n, &b->cap, &b->oom, s, n);
}

static void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

static void jb_string(jbuf *b, const char *s)
{
    jb_puts(b, "\"");
    for (const char *q = s; *q; q++) {
        unsigned char c = (unsigned char)*q;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\'; esc[1] = (char)c; esc[2] = 0;
            jb_puts(b, esc);
        } else if (c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            jb_puts(b, esc);
        } else {
            const char *r = q;
            while (r[1] && (unsigned char)r[1] >= 0x20 && r[1] != '"' && r[1] != '\\')
                r++;
            jb_put(b, q, (size_t)(r - q + 1));
            q = r;
        }
    }
    jb_puts(b, "\"");
}

static void jb_field(jbuf *b, const char *key, const char *val)
{
    if (!val)
        return;
    jb_puts(b, ", ");
    jb_string(b, key);
    jb_puts(b, ": ");
    jb_string(b, val);
}

/* A tool call's arguments given as a JSON string become the value it
 * encodes (written as its own text, so 1.0 stays a float); anything else is
 * copied. */
static int put_tool_calls(jbuf *b, const char *json, size_t i, kvc_err *err)
{
    cJSON *arr = cJSON_Parse(json);
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(arr);
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "messages[%zu].tool_calls: not a JSON array", i);
    }
    jb_puts(b, "[");
    const cJSON *call;
    int k = 0;
    cJSON_ArrayForEach(call, arr) {
        if (k++) jb_puts(b, ", ");
        if (!cJSON_IsObject(call)) {
            cJSON_Delete(arr);
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "messages[%zu].tool_calls[%d]: not an object",
                            i, k - 1);
        }
        jb_puts(b, "{");
        const cJSON *f;
        int m = 0;
        cJSON_ArrayForEach(f, call) {
            if (m++) jb_puts(b, ", ");
            jb_string(b, f->string);
            jb_puts(b, ": ");
            if (!strcmp(f->string, "function") && cJSON_IsObject(f)) {
                jb_puts(b, "{");
                const cJSON *g;
                int q = 0;
                cJSON_ArrayForEach(g, f) {
                    if (q++) jb_puts(b, ", ");
                    jb_string(b, g->string);
                    jb_puts(b, ": ");
                    cJSON *parsed = NULL;
                    if (!strcmp(g->string, "arguments") && cJSON_IsString(g) &&
                        (parsed = cJSON_Parse(g->valuestring)) != NULL) {
                        jb_puts(b, g->valuestring);
                    } else {
                        char *s = cJSON_PrintUnformatted(g);
                        if (s) jb_puts(b, s); else b->oom = true;
                        free(s);
                    }
                    cJSON_Delete(parsed);
                }
                jb_puts(b, "}");
            } else {
                char *s = cJSON_PrintUnformatted(f);
                if (s) jb_puts(b, s); else b->oom = true;
                free(s);
            }
        }
        jb_puts(b, "}");
    }
    jb_puts(b, "]");
    cJSON_Delete(arr);
    return KVC_OK;
}

/* The members of a JSON object, without its braces ("" for {}). */
static int object_members(const char *json, const char **p, size_t *n, const char *what, kvc_err *err)
{
    cJSON *o = cJSON_Parse(json);
    bool ok = cJSON_IsObject(o);
    cJSON_Delete(o);
    if (!ok)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "%s: not a JSON object", what);
    const char *a = strchr(json, '{'), *z = strrchr(json, '}');
    *p = a + 1;
    *n = (size_t)(z - a - 1);
    return KVC_OK;
}

int kvc_chat_kwargs_merge(const char *defaults, const char *request, char **out, kvc_err *err)
{
    *out = NULL;
    const char *pa = NULL, *pb = NULL;
    size_t na = 0, nb = 0;
    int rc;
    if (defaults && (rc = object_members(defaults, &pa, &na, "chat template kwargs", err)))
        return rc;
    if (request && (rc = object_members(request, &pb, &nb, "chat_template_kwargs", err)))
        return rc;
    if (!defaults && !request)
        return KVC_OK;
    jbuf b = { 0 };
    jb_puts(&b, "{");
    jb_put(&b, pa ? pa : "", na);
    bool a_any = false, b_any = false;
    for (size_t i = 0; i < na; i++) a_any |= !strchr(" \t\r\n", pa[i]);
    for (size_t i = 0; i < nb; i++) b_any |= !strchr(" \t\r\n", pb[i]);
    if (a_any && b_any)
        jb_puts(&b, ", ");   /* a key in both: the later (the request's) is the value read */
    jb_put(&b, pb ? pb : "", nb);
    jb_puts(&b, "}");
    if (b.oom) {
        free(b.p);
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    }
    *out = b.p;
    return KVC_OK;
}

/* The function of tool t: its "function" member, or t itself when it is a
 * bare function ({"name": ...}, which templates accept too); NULL else. */
static cJSON *tool_function(cJSON *t)
{
    cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (cJSON_IsObject(f))
        return f;
    return cJSON_IsObject(t) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(t, "name")) ? t
                                                                                         : NULL;
}

/* tools as the templates read them: a function without "parameters" (or
 * with null) gets the empty schema {"type": "object", "properties": {}},
 * which OpenAI says omitting them means. Templates read
 * tool.parameters.properties (Qwen3-Coder's errors on it under Python's
 * jinja2 too) or print the schema (tojson). *out: the tools' JSON text,
 * malloc'd, or NULL when nothing was missing (use tools_json as it is). */
static int fill_parameters(const char *tools_json, char **out, kvc_err *err)
{
    *out = NULL;
    cJSON *tools = cJSON_Parse(tools_json), *t;
    if (!cJSON_IsArray(tools)) {
        cJSON_Delete(tools);
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "tools: not a JSON array");
    }
    bool changed = false, oom = false;
    cJSON_ArrayForEach(t, tools) {
        cJSON *f = tool_function(t), *p = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (!f || (p && !cJSON_IsNull(p)))
            continue;
        cJSON *e = cJSON_CreateObject();
        oom |= !e || !cJSON_AddStringToObject(e, "type", "object") ||
               !cJSON_AddObjectToObject(e, "properties");
        if (oom || !(p ? cJSON_ReplaceItemInObjectCaseSensitive(f, "parameters", e)
                       : cJSON_AddItemToObject(f, "parameters", e))) {
            cJSON_Delete(e);
            oom = true;
            break;
        }
        changed = true;
    }
    if (changed && !oom)
        oom = !(*out = cJSON_PrintUnformatted(tools));
    cJSON_Delete(tools);
    return oom ? kvc_fail(err, KVC_ERR_NOMEM, "chat template: out of memory") : KVC_OK;
}

/* thinking: reasoning_content is also given as "thinking" (harmony templates
 * read that, as llama-server gives it); a message with calls and reasoning
 * then goes without its content, which gpt-oss's template refuses beside
 * thinking ("Cannot pass both content and thinking"), as llama-server
 * drops it. */
static int build_data(const kvc_chat_message *msgs, size_t n, const char *tools_json,
                      const char *kwargs_json, bool thinking, jbuf *b, kvc_err *err)
{
    jb_puts(b, "{");
    if (kwargs_json) {   /* first, so messages and tools win a clash */
        const char *p = NULL;
        size_t len = 0;
        int rc = object_members(kwargs_json, &p, &len, "chat_template_kwargs", err);
        if (rc)
            return rc;
        jb_put(b, p, len);
        for (size_t i = 0; i < len; i++)
            if (p[i] != ' ' && p[i] != '\t' && p[i] != '\n' && p[i] != '\r') {
                jb_puts(b, ", ");
                break;
            }
    }
    jb_puts(b, "\"messages\": [");
    for (size_t i = 0; i < n; i++) {
        const kvc_chat_message *m = &msgs[i];
        if (!m->role || !*m->role)
            return kvc_fail(err, KVC_ERR_INVALID_ARG, "chat message %zu: empty role", i);
        jb_puts(b, i ? ", {\"role\": " : "{\"role\": ");
        jb_string(b, m->role);
        bool drop = thinking && m->reasoning_content && *m->reasoning_content && m->tool_calls_json;
        jb_field(b, "content", m->content && !drop ? m->content : "");
        jb_field(b, "name", m->name);
        jb_field(b, "tool_call_id", m->tool_call_id);
        jb_field(b, "reasoning_content", m->reasoning_content);
        if (thinking)
            jb_field(b, "thinking", m->reasoning_content);
        if (m->tool_calls_json) {
            jb_puts(b, ", \"tool_calls\": ");
            int rc = put_tool_calls(b, m->tool_calls_json, i, err);
            if (rc)
                return rc;
        }
        jb_puts(b, "}");
    }
    jb_puts(b, "]");
    if (tools_json) {
        char *filled = NULL;
        int rc = fill_parameters(tools_json, &filled, err);
        if (rc)
            return rc;
        jb_puts(b, ", \"tools\": ");
        jb_puts(b, filled ? filled : tools_json);
        free(filled);
    }
    jb_puts(b, "}");
    return b->oom ? kvc_fail(err, KVC_ERR_NOMEM, "chat template: out of memory") : KVC_OK;
}

/* ---------------------------------------------------------------- apply */

static bool has_tools(const char *tools_json)
{
    if (!tools_json)
        return false;
    cJSON *t = cJSON_Parse(tools_json);
    bool yes = cJSON_IsArray(t) && cJSON_GetArraySize(t) > 0;
    cJSON_Delete(t);
    return yes;
}

static int apply_builtin(const kvc_chat_template *t, const kvc_chat_message *msgs, size_t n,
                         bool gen, kvc_rendered *out, kvc_err *err)
{
    kvc_chat_msg *m = malloc((n ? n : 1) * sizeof(*m));
    if (!m)
        return kvc_fail(err, KVC_ERR_NOMEM, "chat render: %zu messages", n);
    for (size_t i = 0; i < n; i++)
        m[i] = (kvc_chat_msg){ msgs[i].role, msgs[i].content };
    int rc = kvc_chat_render_spans(t->builtin, m, n, gen, out, err);
    free(m);
    return rc;
}

int kvc_chat_template_apply(const kvc_chat_template *t, const kvc_chat_message *msgs, size_t n,
                            const char *tools_json, const char *kwargs_json,
                            bool add_generation_prompt, kvc_rendered *out, kvc_err *err)
{
    memset(out, 0, sizeof(*out));
    if (!msgs && n)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "chat render: %zu messages but msgs is NULL", n);
    if (!t->jinja)
        return apply_builtin(t, msgs, n, add_generation_prompt, out, err);

    jbuf data = { 0 }, trusted = { 0 };
    int rc = build_data(msgs, n, tools_json, kwargs_json, t->thinking, &data, err);
    if (!rc) {
        jb_puts(&trusted, "{\"bos_token\": ");
        jb_string(&trusted, t->bos);
        jb_puts(&trusted, ", \"eos_token\": ");
        jb_string(&trusted, t->eos);
        jb_puts(&trusted, add_generation_prompt ? ", \"add_generation_prompt\": true}"
                                                : ", \"add_generation_prompt\": false}");
        if (trusted.oom)
            rc = kvc_fail(err, KVC_ERR_NOMEM, "chat template: out of memory");
    }
    jinja_output o = { 0 };
    if (!rc) {
        const jinja_template *j = t->jinja_tools && has_tools(tools_json) ? t->jinja_tools : t->jinja;
        rc = jinja_render(j, data.p, trusted.p, NULL, &o, err);
    }
    free(data.p);
    free(trusted.p);
    if (rc)
        return rc;
    _Static_assert(sizeof(jinja_span) == sizeof(kvc_text_span), "span layouts");
    out->text = o.text;
    out->len = o.len;
    out->content = (kvc_text_span *)o.marked;
    out->n_content = o.n_marked;
    /* a leading BOS the tokenizer adds anyway (unless caller text is there) */
    size_t nb = strlen(t->bos);
    if (t->strip_bos && nb && out->len >= nb && !memcmp(out->text, t->bos, nb) &&
        !(out->n_content && out->content[0].off < nb)) {
        memmove(out->text, out->text + nb, out->len - nb + 1);
        out->len -= nb;
        for (size_t i = 0; i < out->n_content; i++)
            out->content[i].off -= nb;
    }
    return KVC_OK;
}
