/* tool_calls_xml.c - the XML tool calls of Qwen3-Coder(-Next), Qwen3.5 and
 * Qwen3.6 (format "qwen3-coder-xml", tool_calls.h): parsing a reply with
 * values typed by the parameters' schema, the stream hold-back, and the
 * grammar that forces a call. A row of the format table
 * (tool_calls_internal.h). */
#include "tool_calls_internal.h"
#include "grammar.h"
#include "unicode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---------------------------------------------------------------- parsing */

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
    tc_trim(&t, &tn);
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
    tc_add_call(arr, o, "arguments", seed);
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
        kvc_text_append(content, clen, ccap, oom, r + at, s - at);
        if (s == len)
            break;
        bool wrapped = starts(r, s, len, XTC, SL(XTC));
        size_t f = wrapped ? skip_ws(r, s + SL(XTC), len) : s, end = 0;
        if (starts(r, f, len, XFN, SL(XFN)))
            end = xml_call(r, f + SL(XFN), len, wrapped, tools, arr, seed, oom);
        if (!end) {                           /* not a call: its opening tag is text */
            size_t tl = wrapped ? SL(XTC) : SL(XFN);
            kvc_text_append(content, clen, ccap, oom, r + s, tl);
            end = s + tl;
        }
        at = end;
    }
}

/* ---------------------------------------------------------------- streaming */

/* <tool_call>, or a bare <function=, and the spaces before: the content
 * before a call ends trimmed (the templates write "\n\n" between them). */
static size_t holdback_xml(const char *text, size_t len)
{
    size_t a = tc_mark_holdback(text, len, XTC), b = tc_mark_holdback(text, len, XFN);
    size_t k = a > b ? a : b;
    while (k < len && strchr(" \t\r\n", text[len - k - 1]))
        k++;
    return k;
}

/* ---------------------------------------------------------------- forcing */

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

static int rules_xml(const cJSON *fn, int i, char **out, char *alt, size_t cap, kvc_err *err)
{
    snprintf(alt, cap, "call-%d", i);
    return xml_rules(fn, i, out, err);
}

const tc_format tc_qwen_xml = {
    .name = "qwen3-coder-xml",
    .parse = parse_xml,
    .typed = true,
    .holdback = holdback_xml,
    .rules = rules_xml,
    .root_one = "root ::= tc\n"
                "tc ::= \"<tool_call>\\n\" calls \"\\n</tool_call>\"\n",
    .root_parallel = "root ::= tc ( \"\\n\" tc ){0,7}\n"
                     "tc ::= \"<tool_call>\\n\" calls \"\\n</tool_call>\"\n",
    .shared_rules = xml_text_rule,
};
