/* json_schema.c - JSON schema -> grammar text (kvc_schema_to_gbnf).
 *
 * Each schema becomes one rule; the shared JSON pieces (ws, string, number,
 * any value...) are emitted once, on first use. The output shape (property
 * order, whitespace, digit bounds) is documented in grammar.h; the text
 * buffer and the integer ranges' digit rules are in grammar_text.c. */
#include "grammar_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAX_BOUND  = 10000,           /* maxItems, maxLength, minItems, minLength */
    MAX_NEST   = 64,              /* schemas inside schemas (not through $ref) */
};
enum { NAME_CAP = 128 };          /* rule names: prefix (up to 32) + hint (23) + number */
#define INT_LIMIT 999999999999999LL   /* integers with bounds stay within 15 digits */

/* ---------------------------------------------------------------- state */

/* The shared pieces, emitted on first use. */
enum { P_WS, P_CHAR, P_STRING, P_NUMBER, P_INTEGER, P_BOOLEAN, P_NULL, P_VALUE, P_OBJECT,
       P_ARRAY, P_DATE, P_TIME, P_DATETIME, P_UUID, P_LABEL, P_HOSTNAME, P_EMAIL, P_IPV4, P_IPV6,
       P_URI, P_DURATION, P_COUNT };

typedef struct conv {
    const cJSON *root;
    const char  *prefix;
    gsbuf        out;          /* the rules */
    int          counter;      /* for unique rule names */
    bool         emitted[P_COUNT];
    char         pname[P_COUNT][NAME_CAP];  /* the pieces' rule names */
    struct { char *ref; char *name; } *refs;  /* $ref target -> its rule */
    size_t       n_refs, cap_refs;
    int          depth;
    kvc_err     *err;
    int          status;
} conv;

static int bad(conv *c, const char *path, const char *fmt, const char *arg)
{
    if (c->status == KVC_OK) {
        char what[600];
        snprintf(what, sizeof(what), fmt, arg);
        c->status = kvc_fail(c->err, KVC_ERR_INVALID_ARG, "%s at %s", what, path);
    }
    return c->status;
}

/* The name of shared piece p, emitting its rule(s) the first time. */
static const char *piece(conv *c, int p);

static void name_of(conv *c, int p, char *out, size_t cap)
{
    static const char *const names[P_COUNT] = {
        "ws", "char", "string", "number", "integer", "boolean", "null", "value", "object",
        "array", "date", "time", "date-time", "uuid", "label", "hostname", "email", "ipv4", "ipv6",
        "uri", "duration",
    };
    snprintf(out, cap, "%.32s%s", c->prefix, names[p]);
}

static const char *piece(conv *c, int p)
{
    const char *nm = c->pname[p];
    if (c->emitted[p])
        return nm;
    c->emitted[p] = true;
    gsbuf *o = &c->out;
    const char *P = c->prefix;
    switch (p) {
    case P_WS:
        gsb_printf(o, "%s ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n", nm);
        break;
    case P_CHAR:
        /* \u escapes of surrogates and of U+0000 are left out: a decoder
         * turns the first into an error and the second ends a C string */
        gsb_printf(o, "%s ::= [^" GRAM_JSON_CHAR_EXCL "] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
                      "( [1-9a-cA-Cef] %shex{3} | [dD] [0-7] %shex{2} | \"0\" ( [1-9a-fA-F] %shex{2} "
                      "| \"0\" ( [1-9a-fA-F] %shex | \"0\" [1-9a-fA-F] ) ) ) )\n%shex ::= [0-9a-fA-F]\n",
                   nm, P, P, P, P, P);
        break;
    case P_STRING:
        gsb_printf(o, "%s ::= \"\\\"\" %s* \"\\\"\"\n", nm, piece(c, P_CHAR));
        break;
    case P_NUMBER:
        gsb_printf(o, "%s ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? "
                      "( [eE] [-+]? [0-9]{1,2} )?\n", nm);
        break;
    case P_INTEGER:
        gsb_printf(o, "%s ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n", nm);
        break;
    case P_BOOLEAN:
        gsb_printf(o, "%s ::= \"true\" | \"false\"\n", nm);
        break;
    case P_NULL:
        gsb_printf(o, "%s ::= \"null\"\n", nm);
        break;
    case P_VALUE:
        gsb_printf(o, "%s ::= %s | %s | %s | %s | %s | %s\n", nm, c->pname[P_OBJECT], c->pname[P_ARRAY],
                   c->pname[P_STRING], c->pname[P_NUMBER], c->pname[P_BOOLEAN], c->pname[P_NULL]);
        for (int q = P_STRING; q <= P_ARRAY; q++)
            piece(c, q);
        break;
    case P_OBJECT: {
        const char *ws = c->pname[P_WS], *str = c->pname[P_STRING], *val = c->pname[P_VALUE];
        gsb_printf(o, "%s ::= \"{\" %s ( %s-kv ( \",\" %s %s-kv )* )? \"}\"\n"
                      "%s-kv ::= %s %s \":\" %s %s %s\n",
                   nm, ws, nm, ws, nm, nm, str, ws, ws, val, ws);
        piece(c, P_WS), piece(c, P_STRING), piece(c, P_VALUE);
        break;
    }
    case P_ARRAY: {
        const char *ws = c->pname[P_WS], *val = c->pname[P_VALUE];
        gsb_printf(o, "%s ::= \"[\" %s ( %s %s ( \",\" %s %s %s )* )? \"]\"\n",
                   nm, ws, val, ws, ws, val, ws);
        piece(c, P_WS), piece(c, P_VALUE);
        break;
    }
    case P_DATE:
        gsb_printf(o, "%s ::= ( [1-9] [0-9]{3} | \"0\" ( [1-9] [0-9]{2} | \"0\" ( [1-9] [0-9] | \"0\" [1-9] ) ) ) \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] "
                      "| [12] [0-9] | \"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] "
                      "| [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )\n", nm);
        break;
    case P_TIME:
        gsb_printf(o, "%s ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                      "( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n",
                   nm);
        break;
    case P_DATETIME: {
        const char *d = piece(c, P_DATE), *t = piece(c, P_TIME);
        gsb_printf(o, "%s ::= %s \"T\" %s\n", nm, d, t);
        break;
    }
    case P_UUID:
        gsb_printf(o, "%s ::= %shex{8} \"-\" %shex{4} \"-\" %shex{4} \"-\" %shex{4} \"-\" %shex{12}\n",
                   nm, P, P, P, P, P);
        piece(c, P_CHAR);        /* defines hex */
        break;
    case P_LABEL:            /* a hostname's label: 1-63 letters, digits, inner hyphens */
        gsb_printf(o, "%s ::= [A-Za-z0-9] ( [A-Za-z0-9-]{0,61} [A-Za-z0-9] )?\n", nm);
        break;
    case P_HOSTNAME:         /* up to 4 labels, the last led by a letter: at most 253 bytes */
        gsb_printf(o, "%s ::= ( %s \".\" ){0,3} [A-Za-z] ( [A-Za-z0-9-]{0,59} [A-Za-z0-9] )?\n",
                   nm, piece(c, P_LABEL));
        break;
    case P_EMAIL:            /* dot-atoms @ a domain with a letters-only top level (zod's too) */
        gsb_printf(o, "%s ::= [A-Za-z0-9_+-]+ ( \".\" [A-Za-z0-9_+-]+ )* \"@\" ( %s \".\" ){1,3} "
                      "[A-Za-z]{2,24}\n", nm, piece(c, P_LABEL));
        break;
    case P_IPV4:             /* dotted decimal without leading zeros */
        gsb_printf(o, "%s ::= %s-o \".\" %s-o \".\" %s-o \".\" %s-o\n"
                      "%s-o ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]\n",
                   nm, nm, nm, nm, nm, nm);
        break;
    case P_IPV6: {           /* RFC 3986's IPv6address without the embedded IPv4 form */
        const char *h = nm;
        piece(c, P_CHAR);    /* defines hex */
        gsb_printf(o, "%s ::= ( %s-h \":\" ){7} %s-h | \"::\" ( ( %s-h \":\" ){0,6} %s-h )?", nm, h, h, h, h);
        for (int k = 0; k <= 5; k++)       /* k+1 groups before "::", up to 6-k after it */
            gsb_printf(o, " | ( %s-h \":\" ){%d} %s-h \"::\" ( ( %s-h \":\" ){0,%d} %s-h )?", h, k, h, h,
                       5 - k, h);
        gsb_printf(o, " | ( %s-h \":\" ){6} %s-h \"::\"", h, h);
        gsb_printf(o, "\n%s-h ::= %shex{1,4}\n", nm, P);
        break;
    }
    case P_URI: {            /* scheme://host[:port][/path][?query][#fragment] (RFC 3986) */
        const char *host = piece(c, P_HOSTNAME), *ip = piece(c, P_IPV4);
        piece(c, P_CHAR);
        gsb_printf(o, "%s ::= [A-Za-z] [A-Za-z0-9+.-]{0,15} \"://\" ( %s | %s ) ( \":\" [1-9] [0-9]{0,3} )? "
                      "( \"/\" %s-p* )* ( \"?\" %s-q* )? ( \"#\" %s-q* )?\n"
                      "%s-p ::= [A-Za-z0-9._~!$&'()*+,;=:@-] | \"%%\" %shex %shex\n"
                      "%s-q ::= %s-p | [/?]\n",
                   nm, host, ip, nm, nm, nm, nm, P, P, nm, nm);
        break;
    }
    case P_DURATION:         /* ISO 8601 as RFC 3339 appendix A writes it */
        gsb_printf(o, "%s ::= \"P\" ( %s-d ( \"T\" %s-t )? | \"T\" %s-t | %s-n \"W\" )\n"
                      "%s-n ::= [0-9]{1,9}\n"
                      "%s-d ::= %s-n \"D\" | %s-n \"M\" ( %s-n \"D\" )? | %s-n \"Y\" ( %s-n \"M\" ( %s-n \"D\" )? )?\n"
                      "%s-t ::= %s-n \"H\" ( %s-n \"M\" ( %s-n \"S\" )? )? | %s-n \"M\" ( %s-n \"S\" )? | %s-n \"S\"\n",
                   nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm, nm);
        break;
    }
    return nm;
}

/* A fresh rule name: prefix + a hint (the property name, sanitized) + a number. */
static void new_name(conv *c, const char *hint, char *out, size_t cap)
{
    char h[24];
    size_t n = 0;
    for (const char *p = hint; *p && n < sizeof(h) - 1; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        h[n++] = ok ? ch : '-';
    }
    h[n] = 0;
    snprintf(out, cap, "%.32s%s-%d", c->prefix, n ? h : "s", ++c->counter);
}

static void child_path(char *out, size_t cap, const char *path, const char *a, const char *b)
{
    snprintf(out, cap, "%s/%s%s%s", path, a, b ? "/" : "", b ? b : "");
}

static int gen(conv *c, const cJSON *s, const char *path, const char *name);

/* Generate schema s into a new rule; its name in out. */
static int gen_new(conv *c, const cJSON *s, const char *path, const char *hint, char *out, size_t cap)
{
    new_name(c, hint, out, cap);
    return gen(c, s, path, out);
}

/* ---------------------------------------------------------------- keywords */

static const char *const unsupported[] = {
    "not", "if", "then", "else", "uniqueItems", "multipleOf", "patternProperties",
    "propertyNames", "minProperties", "maxProperties", "dependentRequired", "dependentSchemas",
    "dependencies", "contains", "minContains", "maxContains", "unevaluatedProperties",
    "unevaluatedItems", "additionalItems", "$dynamicRef", "$recursiveRef",
};

static int check_keywords(conv *c, const cJSON *s, const char *path)
{
    for (const cJSON *k = s->child; k; k = k->next)
        for (size_t i = 0; i < KVC_ARRAY_LEN(unsupported); i++)
            if (strcmp(k->string, unsupported[i]) == 0)
                return bad(c, path, "unsupported schema keyword '%s'", k->string);
    return KVC_OK;
}

/* A non-negative integer keyword (absent: def); out of range is an error. */
static int get_count(conv *c, const cJSON *s, const char *key, const char *path, long def, long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = def;
    if (!v)
        return KVC_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return bad(c, path, "'%s' must be a non-negative integer", key);
    if (v->valuedouble > MAX_BOUND)
        return bad(c, path, "'%s' above 10000 is not supported", key);
    *out = (long)v->valuedouble;
    return KVC_OK;
}

/* ---------------------------------------------------------------- literals */

/* The rule body for one JSON value written exactly (enum and const). */
static void value_literal(conv *c, gsbuf *body, const cJSON *v)
{
    char *text = cJSON_PrintUnformatted(v);
    if (!text) {
        body->oom = true;
        return;
    }
    gsb_literal(body, text, strlen(text));
    free(text);
}

static int gen_enum(conv *c, const cJSON *e, const char *path, gsbuf *body)
{
    if (!cJSON_IsArray(e) || !e->child)
        return bad(c, path, "'%s' must be a non-empty array", "enum");
    for (const cJSON *v = e->child; v; v = v->next) {
        if (v != e->child)
            gsb_puts(body, " | ");
        value_literal(c, body, v);
    }
    return KVC_OK;
}

/* ---------------------------------------------------------------- $ref */

const cJSON *kvc_schema_resolve(const cJSON *root, const char *ref)
{
    if (!root || !ref || ref[0] != '#')
        return NULL;
    const cJSON *node = root;
    const char *p = ref + 1;
    while (*p == '/' && node) {
        p++;
        char tok[256];
        size_t n = 0;
        for (; *p && *p != '/' && n < sizeof(tok) - 1; p++) {
            if (p[0] == '~' && p[1] == '1')
                tok[n++] = '/', p++;
            else if (p[0] == '~' && p[1] == '0')
                tok[n++] = '~', p++;
            else
                tok[n++] = *p;
        }
        tok[n] = 0;
        if (cJSON_IsArray(node)) {
            char *end;
            long i = strtol(tok, &end, 10);
            node = *end ? NULL : cJSON_GetArrayItem(node, (int)i);
        } else {
            node = cJSON_GetObjectItemCaseSensitive(node, tok);
        }
    }
    return *p ? NULL : node;
}

static const cJSON *resolve_ref(conv *c, const char *ref, const char *path)
{
    if (ref[0] != '#') {
        bad(c, path, "$ref '%s': only local references (#...) are supported", ref);
        return NULL;
    }
    const cJSON *node = kvc_schema_resolve(c->root, ref);
    if (!node)
        bad(c, path, "$ref '%s' does not resolve", ref);
    return node;
}

/* The rule for $ref `ref`, generated the first time (recursion reaches the
 * registered name before the rule is complete, which the grammar allows). */
static int gen_ref(conv *c, const char *ref, const char *path, char *out, size_t cap)
{
    for (size_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, ref) == 0) {
            snprintf(out, cap, "%s", c->refs[i].name);
            return KVC_OK;
        }
    const cJSON *target = resolve_ref(c, ref, path);
    if (!target)
        return c->status;
    const char *slash = strrchr(ref, '/');
    new_name(c, slash ? slash + 1 : "root", out, cap);
    if (!kvc_grow((void **)&c->refs, &c->cap_refs, c->n_refs, sizeof(*c->refs)))
        return c->status = kvc_fail(c->err, KVC_ERR_NOMEM, "schema: out of memory");
    c->refs[c->n_refs].ref = strdup(ref);
    c->refs[c->n_refs].name = strdup(out);
    c->n_refs++;
    int saved = c->depth;
    c->depth = 0;                 /* a reference starts a new nesting count */
    int rc = gen(c, target, ref, out);
    c->depth = saved;
    return rc;
}

/* ---------------------------------------------------------------- objects */

typedef struct prop {
    const char  *key;
    const cJSON *schema;      /* NULL: any value */
    bool         required;
} prop;

typedef struct objspec {
    prop        *props;
    size_t       n, cap;
    const cJSON *additional;  /* NULL: none allowed; true or a schema */
} objspec;

static int add_props(conv *c, objspec *o, const cJSON *s, const char *path)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return bad(c, path, "'%s' must be an object", "properties");
    if (req && !cJSON_IsArray(req))
        return bad(c, path, "'%s' must be an array", "required");
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        for (size_t i = 0; i < o->n; i++)
            if (strcmp(o->props[i].key, p->string) == 0)
                return bad(c, path, "allOf: property '%s' defined twice", p->string);
        if (!kvc_grow((void **)&o->props, &o->cap, o->n, sizeof(*o->props)))
            return c->status = kvc_fail(c->err, KVC_ERR_NOMEM, "schema: out of memory");
        o->props[o->n++] = (prop){ p->string, p, false };
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r))
            return bad(c, path, "'%s' must list strings", "required");
        size_t i = 0;
        while (i < o->n && strcmp(o->props[i].key, r->valuestring) != 0)
            i++;
        if (i == o->n) {          /* required without a schema: any value */
            if (!kvc_grow((void **)&o->props, &o->cap, o->n, sizeof(*o->props)))
                return c->status = kvc_fail(c->err, KVC_ERR_NOMEM, "schema: out of memory");
            o->props[o->n++] = (prop){ r->valuestring, NULL, false };
        }
        o->props[i].required = true;
    }
    if (add && !cJSON_IsFalse(add)) {
        if (!cJSON_IsTrue(add) && !cJSON_IsObject(add))
            return bad(c, path, "'%s' must be a boolean or a schema", "additionalProperties");
        o->additional = add;
    }
    return KVC_OK;
}

/* The body of rule base-r{i}{y|n}: the properties from i on, each led by
 * "," ws when comma (y: something came before); optional ones may be
 * skipped; after the last, the extra properties when allowed. */
static void gen_props_from(conv *c, const objspec *o, const char *base, const char *kv_names,
                           bool extra, size_t i, bool comma, gsbuf *body)
{
    char sep[128];
    snprintf(sep, sizeof(sep), comma ? "\",\" %s " : "", c->pname[P_WS]);
    if (i == o->n) {
        if (extra)
            gsb_printf(body, "( %s%s-x ( \",\" %s %s-x )* )?", sep, base, c->pname[P_WS], base);
        else
            gsb_puts(body, "\"\"");
        return;
    }
    gsb_printf(body, "%s%s %s-r%zuy", sep, kv_names + i * NAME_CAP, base, i + 1);
    if (!o->props[i].required)
        gsb_printf(body, " | %s-r%zu%c", base, i + 1, comma ? 'y' : 'n');
}

static int gen_object(conv *c, const cJSON *s, const char *path, gsbuf *body)
{
    objspec o = { 0 };
    int rc = KVC_OK;
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    for (const cJSON *part = all ? all->child : NULL; part && rc == KVC_OK; part = part->next) {
        const cJSON *p = part;
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(part, "$ref");
        if (cJSON_IsString(ref))
            p = resolve_ref(c, ref->valuestring, path);
        if (!p)
            rc = c->status;
        else if (!cJSON_IsObject(p) || (cJSON_GetObjectItemCaseSensitive(p, "type") &&
                 !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "type"))) ||
                 (cJSON_GetObjectItemCaseSensitive(p, "type") &&
                  strcmp(cJSON_GetObjectItemCaseSensitive(p, "type")->valuestring, "object") != 0))
            rc = bad(c, path, "allOf is supported only of object schemas%s", "");
        else if ((rc = check_keywords(c, p, path)) == KVC_OK)
            rc = add_props(c, &o, p, path);
    }
    if (rc == KVC_OK)
        rc = add_props(c, &o, s, path);
    if (rc != KVC_OK) {
        free(o.props);
        return rc;
    }
    if (o.n == 0 && !cJSON_GetObjectItemCaseSensitive(s, "properties") && !all &&
        (!o.additional || cJSON_IsTrue(o.additional))) {
        gsb_puts(body, piece(c, P_OBJECT));       /* no properties: any object */
        free(o.props);
        return KVC_OK;
    }

    char base[NAME_CAP];
    new_name(c, "obj", base, sizeof(base));
    const char *ws = piece(c, P_WS);
    char wsb[NAME_CAP];
    snprintf(wsb, sizeof(wsb), "%s", ws);
    /* each property's key and value: kv_i ::= "\"key\"" ws ":" ws value ws */
    char *kv_names = malloc((o.n + 1) * NAME_CAP);
    if (!kv_names) {
        free(o.props);
        return c->status = kvc_fail(c->err, KVC_ERR_NOMEM, "schema: out of memory");
    }
    for (size_t i = 0; i < o.n && c->status == KVC_OK; i++) {
        char vname[NAME_CAP], cpath[512];
        child_path(cpath, sizeof(cpath), path, "properties", o.props[i].key);
        if (o.props[i].schema)
            gen_new(c, o.props[i].schema, cpath, o.props[i].key, vname, sizeof(vname));
        else
            snprintf(vname, sizeof(vname), "%s", piece(c, P_VALUE));
        snprintf(kv_names + i * NAME_CAP, NAME_CAP, "%.100s-kv%zu", base, i);
        char *key = cJSON_PrintUnformatted(&(cJSON){ .type = cJSON_String,
                                                     .valuestring = (char *)o.props[i].key });
        if (!key) {
            c->out.oom = true;
            break;
        }
        gsb_printf(&c->out, "%s ::= ", kv_names + i * NAME_CAP);
        gsb_literal(&c->out, key, strlen(key));
        gsb_printf(&c->out, " %s \":\" %s %s %s\n", wsb, wsb, vname, wsb);
        free(key);
    }
    bool extra = false;
    if (c->status == KVC_OK && o.additional) {
        char vname[NAME_CAP], cpath[512];
        child_path(cpath, sizeof(cpath), path, "additionalProperties", NULL);
        if (cJSON_IsTrue(o.additional))
            snprintf(vname, sizeof(vname), "%s", piece(c, P_VALUE));
        else
            gen_new(c, o.additional, cpath, "extra", vname, sizeof(vname));
        const char *str = piece(c, P_STRING);
        gsb_printf(&c->out, "%s-x ::= %s %s \":\" %s %s %s\n", base, str, wsb, wsb, vname, wsb);
        extra = true;
    }
    /* rest rules: base-r{i}{y|n} for i = 0 .. n, with or without a leading comma */
    for (size_t i = 0; i <= o.n && c->status == KVC_OK; i++)
        for (int comma = 0; comma < 2; comma++) {
            gsb_printf(&c->out, "%s-r%zu%c ::= ", base, i, comma ? 'y' : 'n');
            gen_props_from(c, &o, base, kv_names, extra, i, comma, &c->out);
            gsb_puts(&c->out, "\n");
        }
    gsb_printf(body, "\"{\" %s %s-r0n \"}\"", wsb, base);
    free(kv_names);
    free(o.props);
    return c->status;
}

/* ---------------------------------------------------------------- arrays */

static int gen_array(conv *c, const cJSON *s, const char *path, gsbuf *body)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    long min, max;
    if (get_count(c, s, "minItems", path, 0, &min) || get_count(c, s, "maxItems", path, -1, &max))
        return c->status;
    if (prefix && !cJSON_IsArray(prefix))
        return bad(c, path, "'%s' must be an array", "prefixItems");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
        return bad(c, path, "'%s' must be a schema", "items");
    long k = prefix ? cJSON_GetArraySize(prefix) : 0;
    /* extra items after the prefix: items, or any value when neither is given */
    bool extras = items ? !cJSON_IsFalse(items) : !prefix;
    if (max >= 0 && max < k)
        k = max;
    long max_extra = !extras ? 0 : max < 0 ? -1 : max - k;
    if (max >= 0 && max < min)
        return bad(c, path, "maxItems < minItems%s", "");
    if (min > k + (max_extra < 0 ? MAX_BOUND : max_extra))
        return bad(c, path, "minItems cannot be met%s", "");
    char ws[NAME_CAP];
    snprintf(ws, sizeof(ws), "%s", piece(c, P_WS));

    char base[NAME_CAP];
    new_name(c, "arr", base, sizeof(base));
    /* base-e: one or more extra items, each followed by ws, separated by "," */
    if (max_extra != 0) {
        char item[NAME_CAP], cpath[512];
        child_path(cpath, sizeof(cpath), path, "items", NULL);
        if (items && cJSON_IsObject(items))
            gen_new(c, items, cpath, "item", item, sizeof(item));
        else
            snprintf(item, sizeof(item), "%s", piece(c, P_VALUE));
        long lo = KVC_MAX(min - k, 1) - 1;
        gsb_printf(&c->out, "%s-e ::= %s %s ( \",\" %s %s %s ){%ld,", base, item, ws, ws, item, ws, lo);
        if (max_extra > 0)
            gsb_printf(&c->out, "%ld", max_extra - 1);
        gsb_puts(&c->out, "}\n");
    }
    /* base-p{j}: prefix item j and what may follow it */
    for (long j = k - 1; j >= 0 && c->status == KVC_OK; j--) {
        char item[NAME_CAP], cpath[512], idx[24], idx1[24];
        snprintf(idx, sizeof(idx), "%ld", j);
        snprintf(idx1, sizeof(idx1), "p%ld", j + 1);
        child_path(cpath, sizeof(cpath), path, "prefixItems", idx);
        gen_new(c, cJSON_GetArrayItem(prefix, (int)j), cpath, "item", item, sizeof(item));
        gsb_printf(&c->out, "%s-p%ld ::= %s %s", base, j, item, ws);
        bool more = j + 1 < k || max_extra != 0;
        if (more)
            gsb_printf(&c->out, " ( \",\" %s %s-%s )%s", ws, base, j + 1 < k ? idx1 : "e",
                       j + 1 >= min ? "?" : "");
        gsb_puts(&c->out, "\n");
    }
    if (k > 0)
        gsb_printf(body, "\"[\" %s %s-p0%s \"]\"", ws, base, min == 0 ? "?" : "");
    else if (max_extra != 0)
        gsb_printf(body, "\"[\" %s ( %s-e )%s \"]\"", ws, base, min == 0 ? "?" : "");
    else
        gsb_printf(body, "\"[\" %s \"]\"", ws);
    return c->status;
}

/* ---------------------------------------------------------------- strings */

/* The rule body for a string matching pattern pat; false (body untouched)
 * when the pattern does not convert. */
static bool pattern_body(const char *pat, gsbuf *body)
{
    gsbuf expr = { 0 };
    kvc_err e = { 0 };
    bool ok = gram_pattern_to_gbnf(pat, &expr, &e) == KVC_OK;
    if (ok) {
        gsb_printf(body, "\"\\\"\" %s \"\\\"\"", expr.oom ? "" : expr.s);
        body->oom |= expr.oom;
    }
    free(expr.s);
    return ok;
}

static int gen_string(conv *c, const cJSON *s, const char *path, gsbuf *body)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    long min, max;
    if (get_count(c, s, "minLength", path, 0, &min) || get_count(c, s, "maxLength", path, -1, &max))
        return c->status;
    if (max >= 0 && max < min)
        return bad(c, path, "maxLength < minLength%s", "");
    bool lengths = min > 0 || max >= 0;
    if (fmt) {
        /* min, max: the lengths of the strings each grammar writes (-1: unbounded) */
        static const struct { const char *name; int piece; long min, max; } formats[] = {
            { "date", P_DATE, 10, 10 },          { "time", P_TIME, 9, 21 },
            { "date-time", P_DATETIME, 20, 32 }, { "uuid", P_UUID, 36, 36 },
            { "email", P_EMAIL, 6, -1 },         { "idn-email", P_EMAIL, 6, -1 },
            { "hostname", P_HOSTNAME, 1, 253 },  { "idn-hostname", P_HOSTNAME, 1, 253 },
            { "ipv4", P_IPV4, 7, 15 },           { "ipv6", P_IPV6, 2, 39 },
            { "uri", P_URI, 4, -1 },             { "url", P_URI, 4, -1 },
            { "iri", P_URI, 4, -1 },             { "duration", P_DURATION, 3, -1 },
        };
        if (!cJSON_IsString(fmt))
            return bad(c, path, "'%s' must be a string", "format");
        size_t i = 0;
        while (i < KVC_ARRAY_LEN(formats) && strcmp(formats[i].name, fmt->valuestring) != 0)
            i++;
        if (i == KVC_ARRAY_LEN(formats))
            return bad(c, path, "unsupported string format '%s'", fmt->valuestring);
        /* a pattern beside a format (zod writes both) is the stricter of the
         * two when it converts; else the format's grammar stands alone */
        if (pat && cJSON_IsString(pat) && !lengths && pattern_body(pat->valuestring, body))
            return KVC_OK;
        /* lengths every string of the format meets are no constraint */
        if (min > formats[i].min || (max >= 0 && (formats[i].max < 0 || max < formats[i].max)))
            return bad(c, path, "format '%s' with minLength/maxLength", formats[i].name);
        gsb_printf(body, "\"\\\"\" %s \"\\\"\"", piece(c, formats[i].piece));
        return KVC_OK;
    }
    if (pat) {
        if (!cJSON_IsString(pat))
            return bad(c, path, "'%s' must be a string", "pattern");
        if (lengths)
            return bad(c, path, "pattern with %s", "minLength/maxLength");
        gsbuf expr = { 0 };
        kvc_err e = { 0 };
        int rc = gram_pattern_to_gbnf(pat->valuestring, &expr, &e);
        if (rc != KVC_OK) {
            free(expr.s);
            return bad(c, path, "%s", e.msg);
        }
        gsb_printf(body, "\"\\\"\" %s \"\\\"\"", expr.oom ? "" : expr.s);
        body->oom |= expr.oom;
        free(expr.s);
        return KVC_OK;
    }
    if (!lengths) {
        gsb_puts(body, piece(c, P_STRING));
        return KVC_OK;
    }
    gsb_printf(body, "\"\\\"\" %s{%ld,", piece(c, P_CHAR), min);
    if (max >= 0)
        gsb_printf(body, "%ld", max);
    gsb_puts(body, "} \"\\\"\"");
    return KVC_OK;
}

/* ---------------------------------------------------------------- integers */

static int bound(conv *c, const cJSON *s, const char *key, const char *path, bool *has, long long *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!x)
        return KVC_OK;
    if (!cJSON_IsNumber(x))
        return bad(c, path, "'%s' must be a number", key);
    bool excl = strncmp(key, "exclusive", 9) == 0, is_min = strstr(key, "inimum") != NULL;
    /* a bound beyond the 15 digits written is clamped to them when that only
     * narrows the range (zod's .int() writes +-(2^53 - 1)); one that would
     * widen it cannot be honoured */
    if (fabs(x->valuedouble) > (double)INT_LIMIT) {
        if ((x->valuedouble > 0) == is_min)
            return bad(c, path, "'%s' beyond 10^15 is not supported", key);
        long long val = x->valuedouble > 0 ? INT_LIMIT : -INT_LIMIT;
        if (*has)
            *v = is_min ? KVC_MAX(*v, val) : KVC_MIN(*v, val);
        else
            *v = val;
        *has = true;
        return KVC_OK;
    }
    double d = is_min ? ceil(x->valuedouble) : floor(x->valuedouble);
    if (excl && d == x->valuedouble)
        d += is_min ? 1 : -1;
    long long val = (long long)d;
    if (*has)
        *v = is_min ? KVC_MAX(*v, val) : KVC_MIN(*v, val);
    else
        *v = val;
    *has = true;
    return KVC_OK;
}

static int gen_integer(conv *c, const cJSON *s, const char *path, gsbuf *body)
{
    bool has_lo = false, has_hi = false;
    long long lo = -INT_LIMIT, hi = INT_LIMIT;
    if (bound(c, s, "minimum", path, &has_lo, &lo) || bound(c, s, "exclusiveMinimum", path, &has_lo, &lo) ||
        bound(c, s, "maximum", path, &has_hi, &hi) || bound(c, s, "exclusiveMaximum", path, &has_hi, &hi))
        return c->status;
    if (!has_lo && !has_hi) {
        gsb_puts(body, piece(c, P_INTEGER));
        return KVC_OK;
    }
    if (lo > hi)
        return bad(c, path, "no integer between minimum and maximum%s", "");
    bool first = true;
    if (hi >= 0) {
        gsb_uint_range(body, KVC_MAX(lo, 0), hi);
        first = false;
    }
    if (lo < 0) {
        gsb_printf(body, "%s\"-\" ( ", first ? "" : " | ");
        gsb_uint_range(body, KVC_MAX(-hi, 1), -lo);
        gsb_puts(body, " )");
    }
    return KVC_OK;
}

/* ---------------------------------------------------------------- dispatch */

static bool has_any(const cJSON *s, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, keys[i]))
            return true;
    return false;
}

/* One alternative per type named (or implied by the keywords present). */
static int gen_typed(conv *c, const cJSON *s, const char *path, gsbuf *body)
{
    static const char *const obj_keys[] = { "properties", "required", "additionalProperties", "allOf" };
    static const char *const arr_keys[] = { "items", "prefixItems", "minItems", "maxItems" };
    static const char *const str_keys[] = { "minLength", "maxLength", "pattern", "format" };
    static const char *const num_keys[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" };
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const char *types[8];
    size_t n = 0;
    if (cJSON_IsString(type)) {
        types[n++] = type->valuestring;
    } else if (cJSON_IsArray(type)) {
        for (const cJSON *t = type->child; t && n < KVC_ARRAY_LEN(types); t = t->next) {
            if (!cJSON_IsString(t))
                return bad(c, path, "'%s' must list strings", "type");
            types[n++] = t->valuestring;
        }
        if (n == 0)
            return bad(c, path, "'%s' is an empty list", "type");
    } else if (type) {
        return bad(c, path, "'%s' must be a string or a list", "type");
    } else {
        if (has_any(s, obj_keys, 4))
            types[n++] = "object";
        if (has_any(s, arr_keys, 4))
            types[n++] = "array";
        if (has_any(s, str_keys, 4))
            types[n++] = "string";
        if (has_any(s, num_keys, 4))
            types[n++] = "number";
        if (n == 0) {
            gsb_puts(body, piece(c, P_VALUE));
            return KVC_OK;
        }
    }
    for (size_t i = 0; i < n && c->status == KVC_OK; i++) {
        const char *t = types[i];
        if (i)
            gsb_puts(body, " | ");
        gsb_puts(body, "( ");
        if (strcmp(t, "object") == 0)
            gen_object(c, s, path, body);
        else if (strcmp(t, "array") == 0)
            gen_array(c, s, path, body);
        else if (strcmp(t, "string") == 0)
            gen_string(c, s, path, body);
        else if (strcmp(t, "integer") == 0)
            gen_integer(c, s, path, body);
        else if (strcmp(t, "number") == 0) {
            if (has_any(s, num_keys, 4))
                return bad(c, path, "minimum/maximum on type '%s' (only on integer)", "number");
            gsb_puts(body, piece(c, P_NUMBER));
        } else if (strcmp(t, "boolean") == 0)
            gsb_puts(body, piece(c, P_BOOLEAN));
        else if (strcmp(t, "null") == 0)
            gsb_puts(body, piece(c, P_NULL));
        else
            return bad(c, path, "unknown type '%s'", t);
        gsb_puts(body, " )");
    }
    return c->status;
}

/* anyOf / oneOf: one alternative per branch. */
static int gen_any_of(conv *c, const cJSON *list, const char *key, const char *path, gsbuf *body)
{
    if (!cJSON_IsArray(list) || !list->child)
        return bad(c, path, "'%s' must be a non-empty array", key);
    int i = 0;
    for (const cJSON *b = list->child; b && c->status == KVC_OK; b = b->next, i++) {
        char name[NAME_CAP], cpath[512], idx[16];
        snprintf(idx, sizeof(idx), "%d", i);
        child_path(cpath, sizeof(cpath), path, key, idx);
        gen_new(c, b, cpath, key, name, sizeof(name));
        gsb_printf(body, "%s%s", i ? " | " : "", name);
    }
    return c->status;
}

/* Write rule `name` for schema s. */
static int gen(conv *c, const cJSON *s, const char *path, const char *name)
{
    if (c->status != KVC_OK)
        return c->status;
    if (cJSON_IsTrue(s)) {
        gsb_printf(&c->out, "%s ::= %s\n", name, piece(c, P_VALUE));
        return KVC_OK;
    }
    if (cJSON_IsFalse(s))
        return bad(c, path, "schema 'false' matches %s", "nothing");
    if (!cJSON_IsObject(s))
        return bad(c, path, "a schema must be an object or a boolean%s", "");
    if (++c->depth > MAX_NEST)
        return bad(c, path, "schema nested too deep%s", "");
    if (check_keywords(c, s, path) != KVC_OK)
        return c->status;
    gsbuf body = { 0 };
    const cJSON *v;
    if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        char target[NAME_CAP];
        if (gen_ref(c, v->valuestring, path, target, sizeof(target)) == KVC_OK)
            gsb_puts(&body, target);
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        value_literal(c, &body, v);
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        gen_enum(c, v, path, &body);
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) ||
               (v = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        gen_any_of(c, v, v->string, path, &body);
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "allOf")) &&
               !cJSON_GetObjectItemCaseSensitive(s, "type") && cJSON_GetArraySize(v) == 1 &&
               !cJSON_GetObjectItemCaseSensitive(s, "properties")) {
        char sub[NAME_CAP], cpath[512];
        child_path(cpath, sizeof(cpath), path, "allOf", "0");
        if (gen_new(c, v->child, cpath, "all", sub, sizeof(sub)) == KVC_OK)
            gsb_puts(&body, sub);
    } else {
        gen_typed(c, s, path, &body);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable")))
        gsb_printf(&body, " | %s", piece(c, P_NULL));
    if (c->status == KVC_OK)
        gsb_printf(&c->out, "%s ::= %s\n", name, body.oom ? "" : body.s);
    c->out.oom |= body.oom;
    free(body.s);
    c->depth--;
    return c->status;
}

/* ---------------------------------------------------------------- entry points */

int kvc_schema_to_gbnf(const char *schema, size_t len, const kvc_schema_opts *opts, char **out,
                       kvc_err *err)
{
    if (out)
        *out = NULL;
    if (!schema || !out)
        return kvc_fail(err, KVC_ERR_INVALID_ARG, "schema: NULL argument");
    cJSON *root = cJSON_ParseWithLength(schema, len);
    if (!root)
        return kvc_fail(err, KVC_ERR_FORMAT, "schema: not valid JSON");
    conv c = { .root = root, .prefix = opts && opts->prefix ? opts->prefix : "", .err = err };
    for (int p = 0; p < P_COUNT; p++)
        name_of(&c, p, c.pname[p], sizeof(c.pname[p]));
    const char *rname = opts && opts->root ? opts->root : "root";
    const char *at = opts && opts->at ? opts->at : "#";
    const cJSON *start = resolve_ref(&c, at, "#");
    if (start)
        gen(&c, start, at, rname);
    for (size_t i = 0; i < c.n_refs; i++) {
        free(c.refs[i].ref);
        free(c.refs[i].name);
    }
    free(c.refs);
    cJSON_Delete(root);
    if (c.status == KVC_OK && c.out.oom)
        c.status = kvc_fail(err, KVC_ERR_NOMEM, "schema: out of memory");
    if (c.status != KVC_OK) {
        free(c.out.s);
        return c.status;
    }
    *out = c.out.s;
    return KVC_OK;
}

int kvc_grammar_from_schema(const char *schema, size_t len, kvc_grammar **out, kvc_err *err)
{
    char *text = NULL;
    int rc = kvc_schema_to_gbnf(schema, len, NULL, &text, err);
    if (rc == KVC_OK) {
        rc = kvc_grammar_parse(text, strlen(text), out, err);
        if (rc != KVC_OK)
            kvc_err_prefix(err, "schema grammar");
    }
    free(text);
    return rc;
}

int kvc_grammar_json_object(kvc_grammar **out, kvc_err *err)
{
    static const char schema[] = "{\"type\":\"object\"}";
    return kvc_grammar_from_schema(schema, sizeof(schema) - 1, out, err);
}
