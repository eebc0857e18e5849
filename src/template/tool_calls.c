/* tool_calls.c - tool-call formats: detection, parsing, forcing grammars
 * (tool_calls.h). */
#include "tool_calls.h"
#include "grammar.h"
#include "unicode.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_PARALLEL 8

static const char *const names[] = { "hermes", "llama3-json", "mistral", "harmony",
                                      "qwen3-coder-xml" };

const char *kvc_tool_format_name(int f)
{
    return f >= 0 && f <= KVC_TOOLS_QWEN_XML ? names[f] : "hermes";
}

int kvc_tool_format_from_name(const char *name)
{
    for (int i = 0; i <= KVC_TOOLS_QWEN_XML; i++)
        if (!strcmp(name, names[i]))
            return i;
    return -1;
}

int kvc_tool_format_detect(const kvc_chat_template *t)
{
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"probe_fn\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}]";
    kvc_chat_message m[3] = {
        { .role = "user", .content = "q" },
        { .role = "assistant", .content = "",
          .tool_calls_json = "[{\"id\":\"call_probe0000\",\"type\":\"function\",\"function\":"
                             "{\"name\":\"probe_fn\",\"arguments\":\"{\\\"a\\\":1}\"}}]" },
        { .role = "tool", .content = "1", .tool_call_id = "call_probe0000", .name = "probe_fn" },
    };
    kvc_rendered r = { 0 };
    kvc_err err = { 0 };
    int f = KVC_TOOLS_HERMES;
    if (kvc_chat_template_apply(t, m, 3, tools, NULL, true, &r, &err) == KVC_OK && r.text) {
        const char *call = strstr(r.text, "probe_fn\"");
        const char *last = NULL;
        for (const char *p = r.text; (p = strstr(p, "probe_fn")); p++)
            last = p;                          /* the call comes after the tool list */
        if (strstr(r.text, "to=functions.probe_fn"))
            f = KVC_TOOLS_HARMONY;
        else if (strstr(r.text, "<function=probe_fn>"))
            f = KVC_TOOLS_QWEN_XML;
        else if (strstr(r.text, "[TOOL_CALLS]"))
            f = KVC_TOOLS_MISTRAL;
        else if (strstr(r.text, "<tool_call>"))
            f = KVC_TOOLS_HERMES;
        else if (call && last && strstr(last, "\"parameters\""))
            f = KVC_TOOLS_LLAMA3;
    }
    kvc_rendered_free(&r);
    return f;
}

/* ---------------------------------------------------------------- parsing */

void kvc_tool_call_add(cJSON *calls, const char *id, const char *name, const char *args)
{
    cJSON *c = cJSON_CreateObject(), *f;
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    cJSON_AddItemToArray(calls, c);
}

/* Append the tool call of call object o (its name and its args_key member,
 * kvc_tool_call_add); false when o is not a call. */
static bool add_call(cJSON *arr, const cJSON *o, const char *args_key, uint64_t seed)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, args_key);
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(o, args_key[0] == 'a' ? "parameters" : "arguments");
    if (!cJSON_IsObject(o) || !cJSON_IsString(name))
        return false;
    char id[48];
    uint64_t h = seed * 0x9E3779B97F4A7C15ull + (uint64_t)cJSON_GetArraySize(arr) + 1;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    snprintf(id, sizeof(id), "call_%016llx%08x", (unsigned long long)h,
             (unsigned)(seed ^ (seed >> 32)));
    char *a = args ? cJSON_PrintUnformatted(args) : strdup("{}");
    if (args && cJSON_IsString(args)) {      /* arguments already given as text */
        free(a);
        a = strdup(args->valuestring);
    }
    kvc_tool_call_add(arr, id, name->valuestring, a ? a : "{}");
    free(a);
    return true;
}

/* A JSON value at text[0, len) (after spaces): parsed, *used the bytes it took. */
static cJSON *json_at(const char *text, size_t len, size_t *used)
{
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", text[i]))
        i++;
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(text + i, len - i, &end, false);
    *used = v && end ? (size_t)(end - text) : 0;
    return v;
}

static void trim(const char **s, size_t *n)
{
    while (*n && strchr(" \t\r\n", **s))
        (*s)++, (*n)--;
    while (*n && strchr(" \t\r\n", (*s)[*n - 1]))
        (*n)--;
}

static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n, bool *oom)
{
    kvc_text_append(buf, len, cap, oom, s, n);
}

/* Hermes: <tool_call>JSON</tool_call> blocks, content around them. */
static void parse_hermes(const char *r, size_t len, cJSON *arr, uint64_t seed, char **content,
                         size_t *clen, size_t *ccap, bool *oom)
{
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    size_t at = 0;
    while (at < len) {
        const char *o = memmem(r + at, len - at, open, sizeof(open) - 1);
        size_t upto = o ? (size_t)(o - r) : len;
        append(content, clen, ccap, r + at, upto - at, oom);
        if (!o)
            break;
        size_t body = upto + sizeof(open) - 1, used = 0;
        cJSON *v = json_at(r + body, len - body, &used);
        bool ok = v && add_call(arr, v, "arguments", seed);
        cJSON_Delete(v);
        const char *c = memmem(r + body, len - body, close, sizeof(close) - 1);
        if (!ok) {                          /* not a call: keep it as text */
            size_t to = c ? (size_t)(c - r) + sizeof(close) - 1 : len;
            append(content, clen, ccap, r + upto, to - upto, oom);
            at = to;
            continue;
        }
        at = c ? (size_t)(c - r) + sizeof(close) - 1 : body + used;
    }
}

/* A list of calls: JSON objects separated by ";" / "," / spaces, or one
 * array of them. Returns whether the whole text was calls. */
static bool parse_list(const char *r, size_t len, const char *args_key, cJSON *arr, uint64_t seed)
{
    size_t at = 0;
    while (at < len) {
        while (at < len && strchr(" \t\r\n;,", r[at]))
            at++;
        if (at == len)
            break;
        size_t used = 0;
        cJSON *v = json_at(r + at, len - at, &used);
        bool ok = v != NULL;
        if (cJSON_IsArray(v)) {
            const cJSON *x;
            cJSON_ArrayForEach(x, v) ok = ok && add_call(arr, x, args_key, seed);
        } else {
            ok = ok && add_call(arr, v, args_key, seed);
        }
        cJSON_Delete(v);
        if (!ok)
            return false;
        at += used;
    }
    return cJSON_GetArraySize(arr) > 0;
}

/* Mistral's newer form: [TOOL_CALLS]name[ARGS]{...} repeated. */
static bool parse_mistral_args(const char *r, size_t len, cJSON *arr, uint64_t seed)
{
    static const char tc[] = "[TOOL_CALLS]", ar[] = "[ARGS]";
    size_t at = 0;
    while (at < len) {
        if (len - at < sizeof(tc) - 1 || memcmp(r + at, tc, sizeof(tc) - 1))
            return false;
        at += sizeof(tc) - 1;
        const char *a = memmem(r + at, len - at, ar, sizeof(ar) - 1);
        if (!a)
            return false;
        size_t nl = (size_t)(a - (r + at)), used = 0, body = (size_t)(a - r) + sizeof(ar) - 1;
        cJSON *args = json_at(r + body, len - body, &used);
        cJSON *o = cJSON_CreateObject();
        char *name = strndup(r + at, nl);
        cJSON_AddStringToObject(o, "name", name ? name : "");
        free(name);
        if (args)
            cJSON_AddItemToObject(o, "arguments", args);
        bool ok = args && add_call(arr, o, "arguments", seed);
        cJSON_Delete(o);
        if (!ok)
            return false;
        at = body + used;
        while (at < len && strchr(" \t\r\n", r[at]))
            at++;
    }
    return true;
}

/* Where the last tag in r[from, upto) begins; upto when none. */
static size_t last_before(const char *r, size_t upto, const char *tag, size_t from)
{
    size_t n = strlen(tag), found = upto;
    for (size_t i = from; i + n <= upto; i++)
        if (!memcmp(r + i, tag, n))
            found = i;
    return found;
}

/* Harmony: every message addressed "to=functions.NAME", its arguments the
 * text after its <|message|> up to <|call|> (or the next message); the
 * text before the first call's message is content. */
static void parse_harmony(const char *r, size_t len, cJSON *arr, uint64_t seed, char **content,
                          size_t *clen, size_t *ccap, bool *oom)
{
    static const char to[] = "to=functions.", msg[] = "<|message|>";
    size_t at = 0, first = len;
    const char *t;
    while (at < len && (t = memmem(r + at, len - at, to, sizeof(to) - 1))) {
        size_t name = (size_t)(t - r) + sizeof(to) - 1, ne = name;
        while (ne < len && !strchr(" \t\r\n<", r[ne]))
            ne++;
        const char *m = memmem(r + ne, len - ne, msg, sizeof(msg) - 1);
        if (!m || ne == name)
            break;
        size_t a = (size_t)(m - r) + sizeof(msg) - 1, ae = len;
        static const char *const ends[] = { "<|call|>", "<|end|>", "<|start|>" };
        for (size_t k = 0; k < 3; k++) {
            const char *e = memmem(r + a, len - a, ends[k], strlen(ends[k]));
            if (e && (size_t)(e - r) < ae)
                ae = (size_t)(e - r);
        }
        size_t used = 0;
        cJSON *args = json_at(r + a, ae - a, &used);
        if (args) {
            cJSON *o = cJSON_CreateObject();
            char *nm = strndup(r + name, ne - name);
            *oom = *oom || !nm;
            cJSON_AddStringToObject(o, "name", nm ? nm : "");
            free(nm);
            cJSON_AddItemToObject(o, "arguments", args);
            if (add_call(arr, o, "arguments", seed) && first == len) {
                /* the call's message begins at its <|start|>, else its <|channel|> */
                size_t to_at = (size_t)(t - r), end = last_before(r, to_at, "<|end|>", 0);
                end = end == to_at ? 0 : end;
                size_t st = last_before(r, to_at, "<|start|>", end), ch = last_before(r, to_at,
                                                                                 "<|channel|>", end);
                first = st < to_at ? st : ch < to_at ? ch : to_at;
            }
            cJSON_Delete(o);
        }
        at = ae;
    }
    append(content, clen, ccap, r, first, oom);
}

/* Qwen3-Coder / Qwen3.5 XML calls:
 *     <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
 *     </function>\n</tool_call>
 * A value is typed by its parameter's schema the way vLLM's qwen3_coder
 * parser does: "null" (any case) is null; a parameter the schema does not
 * declare (or an unknown function) keeps the raw text; string types keep
 * it; integer / number types become numbers when they parse as such;
 * boolean ones are true when the text is "true" (any case); other types
 * (object, array) are JSON when the text parses, else the raw text. */
enum { XK_STRING, XK_INT, XK_NUM, XK_BOOL, XK_JSON };

static const char XTC[] = "<tool_call>", XTCE[] = "</tool_call>", XFN[] = "<function=",
                  XFNE[] = "</function>", XPA[] = "<parameter=", XPAE[] = "</parameter>";
#define SL(s) (sizeof(s) - 1)

static bool has_prefix_ci(const char *s, const char *p)
{
    return !strncasecmp(s, p, strlen(p));
}

/* The schema of parameter schema prop with its $refs followed (into params,
 * the function's parameters document, by grammar.h's resolver); prop itself
 * when it has no $ref, or one that does not resolve or loops. */
static const cJSON *xml_schema(const cJSON *params, const cJSON *prop)
{
    for (int hops = 0; hops < 16; hops++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(prop, "$ref");
        const cJSON *to = cJSON_IsString(ref) ? kvc_schema_resolve(params, ref->valuestring)
                                              : NULL;
        if (!to)
            return prop;
        prop = to;
    }
    return prop;
}

/* The kind of value a parameter schema asks for (XK_STRING without a type;
 * of a type list, "string" when it is among them, else the first not null).
 * prop: with its $refs followed (xml_schema). */
static int xml_kind(const cJSON *prop)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(prop, "type"), *x;
    const char *s = cJSON_IsString(t) ? t->valuestring : NULL;
    if (cJSON_IsArray(t)) {
        cJSON_ArrayForEach(x, t) {
            if (!cJSON_IsString(x))
                continue;
            if (!strcmp(x->valuestring, "string"))
                return XK_STRING;
            if (!s && strcmp(x->valuestring, "null"))
                s = x->valuestring;
        }
    }
    if (!s)
        return XK_STRING;
    static const char *const strs[] = { "string", "str", "text", "varchar", "char", "enum" };
    for (size_t i = 0; i < sizeof(strs) / sizeof(*strs); i++)
        if (!strcasecmp(s, strs[i]))
            return XK_STRING;
    static const char *const ints[] = { "int", "uint", "long", "short", "unsigned" };
    for (size_t i = 0; i < sizeof(ints) / sizeof(*ints); i++)
        if (has_prefix_ci(s, ints[i]))
            return XK_INT;
    if (has_prefix_ci(s, "num") || has_prefix_ci(s, "float"))
        return XK_NUM;
    if (!strcasecmp(s, "boolean") || !strcasecmp(s, "bool") || !strcasecmp(s, "binary"))
        return XK_BOOL;
    return XK_JSON;
}

/* The value text v[0, n) of a parameter whose schema is prop (its $refs
 * followed; NULL: not declared) as a JSON value (xml_kind's rules). NULL
 * when out of memory. */
static cJSON *xml_value(const char *v, size_t n, const cJSON *prop)
{
    const char *t = v;
    size_t tn = n;
    trim(&t, &tn);
    if (tn == 4 && !strncasecmp(t, "null", 4))
        return cJSON_CreateNull();
    char *s = strndup(v, n), *ts = strndup(t, tn), *end = NULL;
    cJSON *out = NULL;
    int kind = prop ? xml_kind(prop) : XK_STRING;
    if (!s || !ts) {
        free(s);
        free(ts);
        return NULL;
    }
    if (kind == XK_INT && tn) {               /* digits kept exactly (no 2^53 limit) */
        size_t i = ts[0] == '-' || ts[0] == '+';
        if (i < tn && strspn(ts + i, "0123456789") == tn - i)
            out = cJSON_CreateRaw(ts[0] == '+' ? ts + 1 : ts);
    } else if (kind == XK_NUM && tn) {
        double d = strtod(ts, &end);
        if (end == ts + tn && isfinite(d))
            out = cJSON_CreateNumber(d);
    } else if (kind == XK_BOOL) {
        out = cJSON_CreateBool(!strcasecmp(ts, "true"));
    } else if (kind == XK_JSON) {
        out = cJSON_ParseWithLength(ts, strlen(ts));     /* a NUL in the reply ends it */
    }
    if (!out)
        out = cJSON_CreateString(s);
    free(s);
    free(ts);
    return out;
}

/* The "parameters" schema of function `name` in tools (NULL when the
 * function or its parameters are unknown). */
static const cJSON *xml_params(const cJSON *tools, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name))
            return cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    }
    return NULL;
}

static size_t skip_ws(const char *r, size_t at, size_t len)
{
    while (at < len && strchr(" \t\r\n", r[at]))
        at++;
    return at;
}

static bool starts(const char *r, size_t at, size_t len, const char *tag, size_t tl)
{
    return len - at >= tl && !memcmp(r + at, tag, tl);
}

/* The earliest of the tags in r[at, len); len when none. */
static size_t first_of(const char *r, size_t at, size_t len, const char *const *tags, size_t n)
{
    size_t best = len;
    for (size_t i = 0; i < n; i++) {
        const char *p = memmem(r + at, len - at, tags[i], strlen(tags[i]));
        if (p && (size_t)(p - r) < best)
            best = (size_t)(p - r);
    }
    return best;
}

/* One call's body from r[at] (just after "<function="): its parameters
 * into a call object added to arr; returns where the call ends, or 0 when
 * this is not a call (no name or no ">" closing it). */
static size_t xml_call(const char *r, size_t at, size_t len, bool wrapped, const cJSON *tools,
                       cJSON *arr, uint64_t seed, bool *oom)
{
    size_t ne = at;
    while (ne < len && r[ne] != '>' && r[ne] != '\n')
        ne++;
    if (ne == len || r[ne] != '>' || ne == at)
        return 0;
    char *name = strndup(r + at, ne - at);
    cJSON *o = cJSON_CreateObject(), *args = cJSON_CreateObject();
    if (!name || !o || !args) {
        *oom = true;
        free(name);
        cJSON_Delete(o);
        cJSON_Delete(args);
        return len;
    }
    const cJSON *params = xml_params(tools, name);
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    size_t p = ne + 1;
    for (;;) {
        p = skip_ws(r, p, len);
        if (!starts(r, p, len, XPA, SL(XPA)))
            break;
        size_t pn = p + SL(XPA), pe = pn;
        while (pe < len && r[pe] != '>' && r[pe] != '\n')
            pe++;
        if (pe == len || r[pe] != '>')
            break;
        size_t v = pe + 1, ve;
        const char *close = memmem(r + v, len - v, XPAE, SL(XPAE));
        static const char *const stops[] = { "<parameter=", "</function>", "</tool_call>" };
        ve = close ? (size_t)(close - r) : first_of(r, v, len, stops, 3);
        p = close ? ve + SL(XPAE) : ve;
        size_t vs = v;
        if (vs < ve && r[vs] == '\n')
            vs++;
        if (ve > vs && r[ve - 1] == '\n')
            ve--;
        char *pname = strndup(r + pn, pe - pn);
        const cJSON *prop = pname ? cJSON_GetObjectItemCaseSensitive(props, pname) : NULL;
        cJSON *val = pname ? xml_value(r + vs, ve - vs, prop ? xml_schema(params, prop) : NULL)
                           : NULL;
        if (!val) {
            *oom = true;
            free(pname);
            break;
        }
        if (cJSON_GetObjectItemCaseSensitive(args, pname))   /* a repeated name: the last wins */
            cJSON_ReplaceItemInObjectCaseSensitive(args, pname, val);
        else
            cJSON_AddItemToObject(args, pname, val);
        free(pname);
    }
    size_t q = skip_ws(r, p, len);
    if (starts(r, q, len, XFNE, SL(XFNE))) {
        p = q + SL(XFNE);
        q = skip_ws(r, p, len);
        if (wrapped && starts(r, q, len, XTCE, SL(XTCE)))
            p = q + SL(XTCE);
    }
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddItemToObject(o, "arguments", args);
    add_call(arr, o, "arguments", seed);
    cJSON_Delete(o);
    free(name);
    return p;
}

/* Calls are <tool_call> blocks holding a <function=...> (or a bare
 * <function=...> block, which vLLM accepts too); the text around them is
 * content. A <tool_call> without a function in it stays text. */
static void parse_xml(const char *r, size_t len, const cJSON *tools, cJSON *arr, uint64_t seed,
                      char **content, size_t *clen, size_t *ccap, bool *oom)
{
    size_t at = 0;
    while (at < len && !*oom) {
        static const char *const opens[] = { XTC, XFN };
        size_t s = first_of(r, at, len, opens, 2);
        append(content, clen, ccap, r + at, s - at, oom);
        if (s == len)
            break;
        bool wrapped = starts(r, s, len, XTC, SL(XTC));
        size_t f = wrapped ? skip_ws(r, s + SL(XTC), len) : s, end = 0;
        if (starts(r, f, len, XFN, SL(XFN)))
            end = xml_call(r, f + SL(XFN), len, wrapped, tools, arr, seed, oom);
        if (!end) {                           /* not a call: its opening tag is text */
            size_t tl = wrapped ? SL(XTC) : SL(XFN);
            append(content, clen, ccap, r + s, tl, oom);
            end = s + tl;
        }
        at = end;
    }
}

int kvc_tool_calls_parse(int format, const char *reply, size_t len, const char *tools_json,
                         uint64_t id_seed, int max_calls, char **calls_json, char **content)
{
    *calls_json = *content = NULL;
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return KVC_ERR_NOMEM;
    char *text = NULL;
    size_t tl = 0, tc = 0;
    bool oom = false;
    const char *r = reply;
    size_t n = len;
    trim(&r, &n);
    if (format == KVC_TOOLS_HERMES) {
        parse_hermes(r, n, arr, id_seed, &text, &tl, &tc, &oom);
    } else if (format == KVC_TOOLS_QWEN_XML) {
        cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
        parse_xml(r, n, tools, arr, id_seed, &text, &tl, &tc, &oom);
        cJSON_Delete(tools);
    } else if (format == KVC_TOOLS_HARMONY) {
        parse_harmony(r, n, arr, id_seed, &text, &tl, &tc, &oom);
    } else if (format == KVC_TOOLS_LLAMA3) {
        static const char tag[] = "<|python_tag|>";
        if (n >= sizeof(tag) - 1 && !memcmp(r, tag, sizeof(tag) - 1))
            r += sizeof(tag) - 1, n -= sizeof(tag) - 1;
        cJSON *tmp = cJSON_CreateArray();
        if (tmp && n && r[0] == '{' && parse_list(r, n, "parameters", tmp, id_seed)) {
            cJSON_Delete(arr);
            arr = tmp;
        } else {
            cJSON_Delete(tmp);
        }
    } else {
        const char *m = memmem(r, n, "[TOOL_CALLS]", 12);
        size_t pre = m ? (size_t)(m - r) : n;
        cJSON *tmp = cJSON_CreateArray();
        bool ok = m && tmp && (n - pre > 12 && (m[12] == '[' || m[12] == '{' || m[12] == ' ')
                                   ? parse_list(m + 12, n - pre - 12, "arguments", tmp, id_seed)
                                   : parse_mistral_args(m, n - pre, tmp, id_seed));
        if (ok) {
            cJSON_Delete(arr);
            arr = tmp;
            append(&text, &tl, &tc, r, pre, &oom);
        } else {
            cJSON_Delete(tmp);
        }
    }
    int rc = KVC_OK;
    while (max_calls > 0 && cJSON_GetArraySize(arr) > max_calls)
        cJSON_DeleteItemFromArray(arr, cJSON_GetArraySize(arr) - 1);
    if (cJSON_GetArraySize(arr) > 0 && !oom) {
        *calls_json = cJSON_PrintUnformatted(arr);
        const char *c = text ? text : "";
        size_t cl = tl;
        trim(&c, &cl);
        *content = strndup(c, cl);
        if (!*calls_json || !*content) {
            free(*calls_json);
            free(*content);
            *calls_json = *content = NULL;
            rc = KVC_ERR_NOMEM;
        }
    } else if (oom) {
        rc = KVC_ERR_NOMEM;
    }
    free(text);
    cJSON_Delete(arr);
    return rc;
}

/* ---------------------------------------------------------------- streaming */

/* Bytes at the end of text[0, len) that are, or may begin, mark: len when
 * mark is in it, else the longest end of text that begins mark. */
static size_t mark_holdback(const char *text, size_t len, const char *mark)
{
    size_t ml = strlen(mark);
    if (memmem(text, len, mark, ml))
        return len;
    for (size_t k = KVC_MIN(ml - 1, len); k > 0; k--)
        if (!memcmp(text + len - k, mark, k))
            return k;
    return 0;
}

size_t kvc_tool_calls_holdback(int format, const char *text, size_t len)
{
    if (format == KVC_TOOLS_QWEN_XML) {       /* <tool_call>, or a bare <function= */
        size_t a = mark_holdback(text, len, XTC), b = mark_holdback(text, len, XFN);
        size_t k = a > b ? a : b;
        /* and the spaces before: the content before a call ends trimmed
         * (the templates write "\n\n" between them) */
        while (k < len && strchr(" \t\r\n", text[len - k - 1]))
            k++;
        return k;
    }
    const char *mark = format == KVC_TOOLS_HARMONY ? "to=functions."
                     : format == KVC_TOOLS_MISTRAL ? "[TOOL_CALLS]"
                     : format == KVC_TOOLS_LLAMA3 ? "<|python_tag|>" : "<tool_call>";
    if (format == KVC_TOOLS_LLAMA3) {          /* a reply that starts as JSON may be a call */
        size_t i = 0;
        while (i < len && strchr(" \t\r\n", text[i]))
            i++;
        if (i == len || text[i] == '{')
            return len;
    }
    return mark_holdback(text, len, mark);
}

/* ---------------------------------------------------------------- forcing */

/* Rules "call-i" for function i: {"name": its name, key: its parameters}. */
/* Rebase the local $refs of schema node n ("#", "#/$defs/x", ...), written
 * against the parameters' own root, onto `base` ("#/properties/arguments"),
 * where call_rules embeds the parameters. Values (const, enum, default,
 * examples) are data, not schemas: left as they are. False when out of memory. */
static bool rebase_refs(cJSON *n, const char *base)
{
    for (cJSON *k = n ? n->child : NULL; k; k = k->next) {
        if (k->string && (!strcmp(k->string, "const") || !strcmp(k->string, "enum") ||
                          !strcmp(k->string, "default") || !strcmp(k->string, "examples")))
            continue;
        if (k->string && !strcmp(k->string, "$ref") && cJSON_IsString(k) &&
            k->valuestring[0] == '#') {
            size_t len = strlen(base) + strlen(k->valuestring);
            char *ref = malloc(len);
            if (!ref)
                return false;
            snprintf(ref, len, "%s%s", base, k->valuestring + 1);
            bool ok = cJSON_SetValuestring(k, ref) != NULL;
            free(ref);
            if (!ok)
                return false;
        } else if ((cJSON_IsObject(k) || cJSON_IsArray(k)) && !rebase_refs(k, base)) {
            return false;
        }
    }
    return true;
}

static int call_rules(const cJSON *fn, int i, const char *key, char **out, kvc_err *err)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *sch = cJSON_CreateObject();
    cJSON_AddStringToObject(sch, "type", "object");
    cJSON *props = cJSON_AddObjectToObject(sch, "properties");
    cJSON *nm = cJSON_AddObjectToObject(props, "name");
    cJSON_AddStringToObject(nm, "const", name->valuestring);
    cJSON *pv = params && cJSON_IsObject(params) ? cJSON_Duplicate(params, true)
                                                  : cJSON_Parse("{\"type\":\"object\"}");
    cJSON_AddItemToObject(props, key, pv);
    char base[48];
    snprintf(base, sizeof(base), "#/properties/%s", key);
    if (!rebase_refs(pv, base)) {
        cJSON_Delete(sch);
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    }
    cJSON *req = cJSON_AddArrayToObject(sch, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(key));
    cJSON_AddFalseToObject(sch, "additionalProperties");
    char *text = cJSON_PrintUnformatted(sch);
    cJSON_Delete(sch);
    if (!text)
        return kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    char root[32], prefix[32];
    snprintf(root, sizeof(root), "call-%d", i);
    snprintf(prefix, sizeof(prefix), "f%d-", i);
    kvc_schema_opts o = { .root = root, .prefix = prefix };
    int rc = kvc_schema_to_gbnf(text, strlen(text), &o, out, err);
    free(text);
    if (rc) {
        char msg[sizeof(err->msg)];
        memcpy(msg, err->msg, sizeof(msg));
        return kvc_fail(err, rc, "tools: function '%.80s': %.400s", name->valuestring, msg);
    }
    return KVC_OK;
}

/* Harmony's rules for function fn (the i-th): "args-i", its parameters as
 * JSON, and in *alt the call's message with them:
 *   "<|channel|>commentary to=functions.f <|constrain|>json<|message|>" args-i
 * The markup is spelled as text: a gpt-oss vocabulary has it as whole
 * tokens in the grammar's trie (kvc_tokenizer_is_markup). */
static int harmony_rules(const cJSON *fn, int i, char **out, char *alt, size_t cap, kvc_err *err)
{
    const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (!*name || strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
                      != strlen(name))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "tools: function name '%.80s' cannot be "
                        "addressed in harmony (letters, digits, _ - . only)", name);
    char *text = params && cJSON_IsObject(params) ? cJSON_PrintUnformatted(params)
                                                  : strdup("{\"type\":\"object\"}");
    char root[32], prefix[32];
    snprintf(root, sizeof(root), "args-%d", i);
    snprintf(prefix, sizeof(prefix), "f%d-", i);
    kvc_schema_opts o = { .root = root, .prefix = prefix };
    int rc = text ? kvc_schema_to_gbnf(text, strlen(text), &o, out, err)
                  : kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    free(text);
    if (rc) {
        char msg[sizeof(err->msg)];
        memcpy(msg, err->msg, sizeof(msg));
        return kvc_fail(err, rc, "tools: function '%.80s': %.400s", name, msg);
    }
    snprintf(alt, cap, "\"<|channel|>commentary to=functions.%.120s <|constrain|>json<|message|>\" %s",
             name, root);
    return KVC_OK;
}

/* Append the C string s to a kvc_text_append builder. */
static void put(char **b, size_t *l, size_t *c, bool *oom, const char *s)
{
    kvc_text_append(b, l, c, oom, s, strlen(s));
}

/* s as a GBNF literal ("..." with \ " and control bytes escaped) appended
 * to the builder. */
static void gbnf_lit(char **b, size_t *l, size_t *c, bool *oom, const char *s)
{
    kvc_text_append(b, l, c, oom, "\"", 1);
    for (; *s; s++) {
        char e[8];
        if (*s == '"' || *s == '\\')
            snprintf(e, sizeof(e), "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            snprintf(e, sizeof(e), "\\x%02X", (unsigned char)*s);
        else
            e[0] = *s, e[1] = 0;
        kvc_text_append(b, l, c, oom, e, strlen(e));
    }
    kvc_text_append(b, l, c, oom, "\"", 1);
}

/* "xml-text": a string parameter's value, any text without "</parameter>"
 * (where the parser ends a value). Split at each "<": the pieces after one
 * must not begin "/parameter>", so each is empty, a proper prefix of it, or
 * leaves it at some byte:
 *   xml-text ::= [^<]* ( "<" ( "" | [^/<] [^<]* | "/" ( "" | [^p<] [^<]* | "p" ( ... ) ) ) )* */
static void xml_text_rule(char **b, size_t *l, size_t *c, bool *oom)
{
    static const char tail[] = "/parameter>";
    char part[64];
    put(b, l, c, oom, "xml-text ::= [^<]* ( \"<\" ");
    for (size_t k = 0; k < SL(tail); k++) {
        snprintf(part, sizeof(part), "( \"\" | [^%c<] [^<]*%s", tail[k],
                 k + 1 < SL(tail) ? " | \"" : " ");
        kvc_text_append(b, l, c, oom, part, strlen(part));
        if (k + 1 < SL(tail)) {
            snprintf(part, sizeof(part), "%c\" ", tail[k]);
            kvc_text_append(b, l, c, oom, part, strlen(part));
        }
    }
    for (size_t k = 0; k < SL(tail); k++)
        put(b, l, c, oom, ") ");
    put(b, l, c, oom, ")*\n");
}

/* A name that can stand in "<function=NAME>" / "<parameter=NAME>" (and in
 * a grammar literal: valid UTF-8). */
static bool xml_name_ok(const char *s)
{
    return *s && !strpbrk(s, "<>\n\r") && kvc_utf8_valid(s, strlen(s));
}

/* The XML format's rules for function fn (the i-th): "call-i", the
 * <function=...> block whose parameters follow the schema, in its order:
 * required ones always, optional ones may be left out; string values as
 * xml-text (a string enum as its literals), others as JSON per their
 * schema (rules "fI-pJ"); a parameter's $refs are followed (into the
 * function's parameters, as the parser types values). */
static int xml_rules(const cJSON *fn, int i, char **out, kvc_err *err)
{
    const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required"), *p;
    const cJSON *plist = cJSON_IsObject(props) ? props : NULL;
    const cJSON *rlist = cJSON_IsArray(req) ? req : NULL;
    if (!xml_name_ok(name))
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "tools: function name '%.80s' cannot be "
                        "written as <function=NAME> (UTF-8 without <, >, line breaks)", name);
    char *b = NULL, *rules = NULL, head[64];
    size_t l = 0, c = 0, rl = 0, rc_ = 0;
    bool oom = false;
    int rc = KVC_OK, j = 0;
    snprintf(head, sizeof(head), "call-%d ::= ", i);
    kvc_text_append(&b, &l, &c, &oom, head, strlen(head));
    char *open = NULL, *doc = plist ? cJSON_PrintUnformatted(params) : NULL;
    size_t ol = 0, oc = 0;
    oom |= plist && !doc;
    put(&open, &ol, &oc, &oom, "<function=");
    kvc_text_append(&open, &ol, &oc, &oom, name, strlen(name));
    put(&open, &ol, &oc, &oom, ">\n");
    gbnf_lit(&b, &l, &c, &oom, open ? open : "");
    free(open);
    cJSON_ArrayForEach(p, plist) {
        j++;
        if (!xml_name_ok(p->string)) {
            rc = kvc_fail(err, KVC_ERR_INVALID_ARG, "tools: function '%.80s': parameter name "
                          "'%.80s' cannot be written as <parameter=NAME>", name, p->string);
            break;
        }
        bool required = false;
        const cJSON *r;
        cJSON_ArrayForEach(r, rlist)
            required = required || (cJSON_IsString(r) && !strcmp(r->valuestring, p->string));
        char *pl = NULL;
        size_t pll = 0, plc = 0;
        put(&pl, &pll, &plc, &oom, "<parameter=");
        kvc_text_append(&pl, &pll, &plc, &oom, p->string, strlen(p->string));
        put(&pl, &pll, &plc, &oom, ">\n");
        put(&b, &l, &c, &oom, " ( ");
        gbnf_lit(&b, &l, &c, &oom, pl ? pl : "");
        free(pl);
        const cJSON *ps = xml_schema(params, p);
        const cJSON *en = cJSON_GetObjectItemCaseSensitive(ps, "enum"), *e;
        bool str_enum = cJSON_IsArray(en) && cJSON_GetArraySize(en) > 0;
        const cJSON *elist = str_enum ? en : NULL;
        cJSON_ArrayForEach(e, elist)
            str_enum = str_enum && cJSON_IsString(e) && !strstr(e->valuestring, "</parameter>") &&
                       kvc_utf8_valid(e->valuestring, strlen(e->valuestring));
        if (xml_kind(ps) == XK_STRING && str_enum) {
            put(&b, &l, &c, &oom, " (");
            int k = 0;
            cJSON_ArrayForEach(e, en) {
                kvc_text_append(&b, &l, &c, &oom, k ? " | " : " ", k ? 3 : 1);
                k++;
                gbnf_lit(&b, &l, &c, &oom, e->valuestring);
            }
            put(&b, &l, &c, &oom, " )");
        } else if (xml_kind(ps) == XK_STRING) {
            put(&b, &l, &c, &oom, " xml-text");
        } else {
            /* the property within the parameters, so that its $refs resolve */
            char root[48], prefix[48], *at = NULL, *pr = NULL;
            size_t atl = 0, atc = 0;
            put(&at, &atl, &atc, &oom, "#/properties/");
            for (const char *q = p->string; *q; q++)
                kvc_text_append(&at, &atl, &atc, &oom, *q == '~' ? "~0" : *q == '/' ? "~1" : q,
                                *q == '~' || *q == '/' ? 2 : 1);
            snprintf(root, sizeof(root), "f%d-p%d", i, j);
            snprintf(prefix, sizeof(prefix), "f%d-p%d-", i, j);
            kvc_schema_opts o = { .root = root, .prefix = prefix, .at = at };
            rc = doc && at && !oom ? kvc_schema_to_gbnf(doc, strlen(doc), &o, &pr, err)
                               : kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
            free(at);
            if (rc) {
                char msg[sizeof(err->msg)];
                memcpy(msg, err->msg, sizeof(msg));
                rc = kvc_fail(err, rc, "tools: function '%.80s': parameter '%.80s': %.380s",
                              name, p->string, msg);
                break;
            }
            kvc_text_append(&rules, &rl, &rc_, &oom, pr, strlen(pr));
            put(&rules, &rl, &rc_, &oom, "\n");
            free(pr);
            put(&b, &l, &c, &oom, " ");
            kvc_text_append(&b, &l, &c, &oom, root, strlen(root));
        }
        put(&b, &l, &c, &oom, " \"\\n</parameter>\\n\" )");
        if (!required)
            put(&b, &l, &c, &oom, "?");
    }
    put(&b, &l, &c, &oom, " \"</function>\"\n");
    kvc_text_append(&b, &l, &c, &oom, rules ? rules : "", rl);
    free(rules);
    free(doc);
    if (!rc && oom)
        rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
    if (rc)
        free(b);
    else
        *out = b;
    return rc;
}

int kvc_tool_calls_grammar(int format, const char *tools_json, const char *only, bool parallel,
                           char **out, kvc_err *err)
{
    *out = NULL;
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    if (!cJSON_IsArray(tools)) {
        cJSON_Delete(tools);
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "tools must be a non-empty array");
    }
    const char *key = format == KVC_TOOLS_LLAMA3 ? "parameters" : "arguments";
    char *g = NULL, *alts = NULL;
    size_t gl = 0, gc = 0, al = 0, ac = 0;
    bool oom = false;
    int rc = KVC_OK, n = 0, i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        i++;
        if (!cJSON_IsString(name) || (only && strcmp(only, name->valuestring)))
            continue;
        char *rules = NULL, ref[256], call[224];
        if (format == KVC_TOOLS_HARMONY ? (rc = harmony_rules(fn, i, &rules, call, sizeof(call), err))
            : format == KVC_TOOLS_QWEN_XML ? (rc = xml_rules(fn, i, &rules, err))
                                           : (rc = call_rules(fn, i, key, &rules, err)))
            break;
        if (format != KVC_TOOLS_HARMONY)
            snprintf(call, sizeof(call), "call-%d", i);
        snprintf(ref, sizeof(ref), "%s%s", n ? " | " : "", call);
        kvc_text_append(&g, &gl, &gc, &oom, rules, strlen(rules));
        kvc_text_append(&g, &gl, &gc, &oom, "\n", 1);
        kvc_text_append(&alts, &al, &ac, &oom, ref, strlen(ref));
        free(rules);
        n++;
    }
    cJSON_Delete(tools);
    if (!rc && !n)
        rc = only ? kvc_fail(err, KVC_ERR_INVALID_ARG, "tool_choice names function '%.80s', "
                             "which is not in tools", only)
                  : kvc_fail(err, KVC_ERR_INVALID_ARG, "tools has no function");
    if (!rc) {
        char head[256];
        const char *rep = parallel ? "{0,7}" : "";
        const bool tagged = format == KVC_TOOLS_HERMES || format == KVC_TOOLS_QWEN_XML;
        if (tagged && !parallel)
            snprintf(head, sizeof(head), "root ::= tc\n"
                     "tc ::= \"<tool_call>\\n\" calls \"\\n</tool_call>\"\n");
        else if (tagged)
            snprintf(head, sizeof(head), "root ::= tc ( \"\\n\" tc )%s\n"
                     "tc ::= \"<tool_call>\\n\" calls \"\\n</tool_call>\"\n", rep);
        else if (format == KVC_TOOLS_HARMONY)   /* one call: <|call|> ends the reply */
            snprintf(head, sizeof(head), "root ::= calls\n");
        else if (format == KVC_TOOLS_MISTRAL)
            snprintf(head, sizeof(head), "root ::= \"[TOOL_CALLS][\" calls %s%s%s \"]\"\n",
                     parallel ? "( \", \" calls )" : "", rep, "");
        else
            snprintf(head, sizeof(head), "root ::= calls %s%s\n",
                     parallel ? "( \"; \" calls )" : "", rep);
        char *all = NULL;
        size_t ll = 0, lc = 0;
        kvc_text_append(&all, &ll, &lc, &oom, head, strlen(head));
        kvc_text_append(&all, &ll, &lc, &oom, "calls ::= ", 10);
        kvc_text_append(&all, &ll, &lc, &oom, alts, al);
        kvc_text_append(&all, &ll, &lc, &oom, "\n", 1);
        kvc_text_append(&all, &ll, &lc, &oom, g, gl);
        if (format == KVC_TOOLS_QWEN_XML)
            xml_text_rule(&all, &ll, &lc, &oom);
        if (oom)
            free(all), rc = kvc_fail(err, KVC_ERR_NOMEM, "out of memory");
        else
            *out = all;
    }
    free(g);
    free(alts);
    return rc;
}
