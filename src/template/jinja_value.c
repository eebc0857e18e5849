/* jinja_value.c - the arena, values with Python's semantics, the string
 * builder that carries provenance marks, str()/repr()/json.dumps(), and a
 * JSON reader that keeps what Python's json.loads keeps (order, int vs float). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

/* ---------------------------------------------------------------- arena */

struct jchunk {
    jchunk *next;
    size_t  size, used;
    _Alignas(16) unsigned char mem[];
};

#define JCHUNK_SIZE (64 * 1024)

void jfail(jctx *c, int line, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (line > 0)
        kvc_fail(c->err, c->code ? c->code : KVC_ERR_INVALID_ARG, "template line %d: %s", line, msg);
    else
        kvc_fail(c->err, c->code ? c->code : KVC_ERR_INVALID_ARG, "template: %s", msg);
    longjmp(*c->jb, 1);
}

void *jalloc(jctx *c, size_t n)
{
    void *p = jalloc_raw(c, n);
    memset(p, 0, n);
    return p;
}

void jgrow(jctx *c, void **arr, size_t *cap, size_t n, size_t elsize, size_t first)
{
    if (n < *cap)
        return;
    size_t cap2 = *cap ? *cap * 2 : first;
    void *p = jalloc(c, cap2 * elsize);
    if (n)
        memcpy(p, *arr, n * elsize);
    *arr = p;
    *cap = cap2;
}

void *jalloc_raw(jctx *c, size_t n)
{
    jarena *a = c->a;
    n = (n + 15) & ~(size_t)15;
    if (a->limit && a->used + n > a->limit) {
        c->code = KVC_ERR_INVALID_ARG;
        jfail(c, 0, "memory limit of %zu bytes exceeded", a->limit);
    }
    jchunk *h = a->head;
    if (!h || h->size - h->used < n) {
        size_t size = n > JCHUNK_SIZE / 4 ? n : JCHUNK_SIZE;
        jchunk *nc = malloc(sizeof(jchunk) + size);
        if (!nc) {
            c->code = KVC_ERR_NOMEM;
            jfail(c, 0, "out of memory");
        }
        nc->size = size;
        nc->used = 0;
        if (size == n && h) {            /* a big block: keep filling the current chunk */
            nc->next = h->next;
            h->next = nc;
        } else {
            nc->next = h;
            a->head = nc;
        }
        h = nc;
    }
    void *p = h->mem + h->used;
    h->used += n;
    a->used += n;
    return p;
}

void jarena_free(jarena *a)
{
    jchunk *h = a->head;
    while (h) {
        jchunk *next = h->next;
        free(h);
        h = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---------------------------------------------------------------- values */

jv jv_none_v = { .k = JK_NONE }, jv_true_v = { .k = JK_BOOL, .u.b = true },
   jv_false_v = { .k = JK_BOOL, .u.b = false }, jv_undef_v = { .k = JK_UNDEF };

jv *jv_int(jctx *c, int64_t i)
{
    jv *v = jalloc(c, sizeof(jv));
    v->k = JK_INT;
    v->u.i = i;
    return v;
}

jv *jv_float(jctx *c, double f)
{
    jv *v = jalloc(c, sizeof(jv));
    v->k = JK_FLOAT;
    v->u.f = f;
    return v;
}

jv *jv_undef(jctx *c, const char *name)
{
    jv *v = jalloc(c, sizeof(jv));
    v->k = JK_UNDEF;
    v->u.undef = name;
    return v;
}

jv *jv_str(jctx *c, const char *p, size_t n, const uint8_t *t)
{
    jv *v = jalloc(c, sizeof(jv));
    char *s = jalloc_raw(c, n + 1);
    if (n)
        memcpy(s, p, n);
    s[n] = 0;
    v->k = JK_STR;
    v->u.s.p = s;
    v->u.s.n = n;
    if (t) {
        size_t i = 0;
        while (i < n && !t[i])
            i++;
        if (i < n) {
            uint8_t *m = jalloc_raw(c, n);
            memcpy(m, t, n);
            v->u.s.t = m;
        }
    }
    return v;
}

jv *jv_cstr(jctx *c, const char *s) { return jv_str(c, s, strlen(s), NULL); }

jv *jv_strref(jctx *c, const char *s)
{
    jv *v = jalloc(c, sizeof(jv));
    v->k = JK_STR;
    v->u.s.p = s;
    v->u.s.n = strlen(s);
    return v;
}

jv *jv_list(jctx *c, size_t cap)
{
    jv *v = jalloc(c, sizeof(jv));
    v->k = JK_LIST;
    v->u.l.cap = cap;
    v->u.l.v = cap ? jalloc(c, cap * sizeof(jv *)) : NULL;
    return v;
}

jv *jv_gen(jctx *c, jv *list)
{
    (void)c;
    list->u.l.gen = true;
    return list;
}

void jv_list_push(jctx *c, jv *l, jv *x)
{
    jgrow(c, (void **)&l->u.l.v, &l->u.l.cap, l->u.l.n, sizeof(jv *), 8);
    l->u.l.v[l->u.l.n++] = x;
}

jv *jv_dict(jctx *c)
{
    jv *v = jalloc(c, sizeof(jv));
    v->k = JK_DICT;
    return v;
}

/* Python dict keys: 1 == 1.0 == True hash alike; strings compare by bytes. */
jv *jv_dict_get(const jv *d, const jv *key)
{
    for (size_t i = 0; i < d->u.d.n; i++)
        if (jv_eq(d->u.d.key[i], key))
            return d->u.d.val[i];
    return NULL;
}

jv *jv_dict_gets(const jv *d, const char *key)
{
    size_t n = strlen(key);
    for (size_t i = 0; i < d->u.d.n; i++) {
        const jv *k = d->u.d.key[i];
        if (k->k == JK_STR && k->u.s.n == n && memcmp(k->u.s.p, key, n) == 0)
            return d->u.d.val[i];
    }
    return NULL;
}

void jv_dict_set(jctx *c, jv *d, jv *key, jv *val)
{
    for (size_t i = 0; i < d->u.d.n; i++)
        if (jv_eq(d->u.d.key[i], key)) {
            d->u.d.val[i] = val;
            return;
        }
    size_t key_cap = d->u.d.cap;         /* the two arrays share their room */
    jgrow(c, (void **)&d->u.d.key, &key_cap, d->u.d.n, sizeof(jv *), 8);
    jgrow(c, (void **)&d->u.d.val, &d->u.d.cap, d->u.d.n, sizeof(jv *), 8);
    d->u.d.key[d->u.d.n] = key;
    d->u.d.val[d->u.d.n++] = val;
}

bool jv_truthy(const jv *v)
{
    switch (v->k) {
    case JK_UNDEF: case JK_NONE: return false;
    case JK_BOOL:  return v->u.b;
    case JK_INT:   return v->u.i != 0;
    case JK_FLOAT: return v->u.f != 0.0;
    case JK_STR:   return v->u.s.n != 0;
    case JK_LIST:  return v->u.l.gen || v->u.l.n != 0;
    case JK_DICT:  return v->u.d.ns || v->u.d.n != 0;
    default:       return true;
    }
}

bool jv_is_num(const jv *v) { return v->k == JK_INT || v->k == JK_FLOAT || v->k == JK_BOOL; }

double jv_num(const jv *v)
{
    return v->k == JK_FLOAT ? v->u.f : v->k == JK_INT ? (double)v->u.i : v->k == JK_BOOL ? v->u.b : 0;
}

bool jv_eq(const jv *a, const jv *b)
{
    if (a == b)
        return true;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->k != JK_FLOAT && b->k != JK_FLOAT)
            return (a->k == JK_INT ? a->u.i : a->u.b) == (b->k == JK_INT ? b->u.i : b->u.b);
        return jv_num(a) == jv_num(b);
    }
    if (a->k != b->k)
        return false;
    switch (a->k) {
    case JK_UNDEF: case JK_NONE: return true;
    case JK_STR:
        return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case JK_LIST:
        if (a->u.l.n != b->u.l.n || a->u.l.tuple != b->u.l.tuple)
            return false;
        for (size_t i = 0; i < a->u.l.n; i++)
            if (!jv_eq(a->u.l.v[i], b->u.l.v[i]))
                return false;
        return true;
    case JK_DICT:
        if (a->u.d.ns || b->u.d.ns || a->u.d.n != b->u.d.n)
            return false;
        for (size_t i = 0; i < a->u.d.n; i++) {
            jv *o = jv_dict_get(b, a->u.d.key[i]);
            if (!o || !jv_eq(a->u.d.val[i], o))
                return false;
        }
        return true;
    case JK_MACRO:   return a->u.macro == b->u.macro;
    case JK_BUILTIN: return a->u.builtin == b->u.builtin;
    default:         return false;
    }
}

int jv_cmp(jctx *c, int line, const jv *a, const jv *b)
{
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->k == JK_INT && b->k == JK_INT)
            return (a->u.i > b->u.i) - (a->u.i < b->u.i);
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a->k == JK_STR && b->k == JK_STR) {
        size_t n = KVC_MIN(a->u.s.n, b->u.s.n);
        int r = memcmp(a->u.s.p, b->u.s.p, n);   /* UTF-8 byte order = code point order */
        if (r)
            return r;
        return (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    }
    if (a->k == JK_LIST && b->k == JK_LIST) {
        for (size_t i = 0; i < a->u.l.n && i < b->u.l.n; i++)
            if (!jv_eq(a->u.l.v[i], b->u.l.v[i]))
                return jv_cmp(c, line, a->u.l.v[i], b->u.l.v[i]);
        return (a->u.l.n > b->u.l.n) - (a->u.l.n < b->u.l.n);
    }
    if (a->k == JK_UNDEF || b->k == JK_UNDEF)
        jfail(c, line, "'%s' is undefined", a->k == JK_UNDEF ? (a->u.undef ? a->u.undef : "value")
                                                             : (b->u.undef ? b->u.undef : "value"));
    jfail(c, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
          jv_type_name(b));
}

const char *jv_type_name(const jv *v)
{
    switch (v->k) {
    case JK_UNDEF: return "Undefined";
    case JK_NONE:  return "NoneType";
    case JK_BOOL:  return "bool";
    case JK_INT:   return "int";
    case JK_FLOAT: return "float";
    case JK_STR:   return "str";
    case JK_LIST:  return v->u.l.gen ? "generator" : v->u.l.tuple ? "tuple" : "list";
    case JK_DICT:  return v->u.d.ns ? "Namespace" : "dict";
    case JK_LOOP:  return "LoopContext";
    case JK_MACRO: return "Macro";
    default:       return "function";
    }
}

bool jv_tainted(const jv *v) { return v->k == JK_STR && v->u.s.t; }

size_t jv_len(jctx *c, int line, const jv *v)
{
    switch (v->k) {
    case JK_STR:   return ju8_len(v->u.s.p, v->u.s.n);
    case JK_LIST:  if (!v->u.l.gen) return v->u.l.n; break;
    case JK_DICT:  if (!v->u.d.ns) return v->u.d.n; break;
    case JK_UNDEF: return 0;
    default: break;
    }
    jfail(c, line, "object of type '%s' has no len()", jv_type_name(v));
}

/* ---------------------------------------------------------------- UTF-8 */

size_t ju8_put(char *o, unsigned u)
{
    if (u < 0x80) { o[0] = (char)u; return 1; }
    if (u < 0x800) { o[0] = (char)(0xC0 | u >> 6); o[1] = (char)(0x80 | (u & 63)); return 2; }
    if (u < 0x10000) { o[0] = (char)(0xE0 | u >> 12); o[1] = (char)(0x80 | (u >> 6 & 63));
                       o[2] = (char)(0x80 | (u & 63)); return 3; }
    o[0] = (char)(0xF0 | u >> 18); o[1] = (char)(0x80 | (u >> 12 & 63));
    o[2] = (char)(0x80 | (u >> 6 & 63)); o[3] = (char)(0x80 | (u & 63));
    return 4;
}

size_t ju8_len(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

size_t ju8_off(const char *p, size_t n, size_t i)
{
    size_t off = 0;
    while (off < n && i > 0) {
        off++;
        while (off < n && ((unsigned char)p[off] & 0xC0) == 0x80)
            off++;
        i--;
    }
    return off;
}

/* ---------------------------------------------------------------- builder */

void jsb_init(jsb *b, jctx *c, size_t limit)
{
    memset(b, 0, sizeof(*b));
    b->c = c;
    b->limit = limit;
}

static void jsb_room(jsb *b, size_t n)
{
    if (b->limit && b->n + n > b->limit) {
        b->c->code = KVC_ERR_INVALID_ARG;
        jfail(b->c, 0, "output longer than the limit of %zu bytes", b->limit);
    }
    if (b->n + n + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1)
        cap *= 2;
    /* arena memory like everything else: a failure anywhere leaks nothing */
    char *np = jalloc_raw(b->c, cap);
    if (b->n)
        memcpy(np, b->p, b->n);
    b->p = np;
    if (b->t) {
        uint8_t *nt = jalloc_raw(b->c, cap);
        memcpy(nt, b->t, b->n);
        b->t = nt;
    }
    b->cap = cap;
}

void jsb_put(jsb *b, const char *p, size_t n, const uint8_t *t)
{
    if (!n)
        return;
    jsb_room(b, n);
    memcpy(b->p + b->n, p, n);
    if (t && !b->t)
        b->t = jalloc(b->c, b->cap);   /* zeroed: the bytes so far are unmarked */
    if (b->t) {
        if (t)
            memcpy(b->t + b->n, t, n);
        else
            memset(b->t + b->n, 0, n);
    }
    b->n += n;
    b->p[b->n] = 0;
}

void jsb_put_mark(jsb *b, const char *p, size_t n, bool mark)
{
    if (!n)
        return;
    if (!mark) {
        jsb_put(b, p, n, NULL);
        return;
    }
    size_t at = b->n;
    jsb_put(b, p, n, NULL);
    if (!b->t)
        b->t = jalloc(b->c, b->cap);
    memset(b->t + at, 1, n);
}

void jsb_putc(jsb *b, char ch) { jsb_put(b, &ch, 1, NULL); }
void jsb_puts(jsb *b, const char *s) { jsb_put(b, s, strlen(s), NULL); }
void jsb_free(jsb *b) { (void)b; /* arena memory */ }

jv *jsb_take(jsb *b)
{
    jv *v = jalloc(b->c, sizeof(jv));
    v->k = JK_STR;
    v->u.s.p = b->p ? b->p : "";
    v->u.s.n = b->n;
    v->u.s.t = NULL;
    if (b->t)
        for (size_t i = 0; i < b->n; i++)
            if (b->t[i]) {
                v->u.s.t = b->t;
                break;
            }
    memset(b, 0, sizeof(*b));
    return v;
}

/* ---------------------------------------------------------------- str / repr */

void jv_write_float(jsb *b, double f)
{
    char buf[40];
    if (isnan(f)) { jsb_puts(b, "nan"); return; }
    if (isinf(f)) { jsb_puts(b, f < 0 ? "-inf" : "inf"); return; }
    int prec;
    for (prec = 1; prec <= 17; prec++) {          /* shortest text that reads back */
        snprintf(buf, sizeof(buf), "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    /* buf is d.ddde±XX; Python writes positional for -4 <= exp < 16. */
    char digits[24];
    int nd = 0;
    const char *q = buf;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char out[64];
    int o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0'; out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof(out) - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    jsb_puts(b, out);
}

static void write_scalar(jctx *c, jsb *b, const jv *v)
{
    char buf[32];
    switch (v->k) {
    case JK_NONE: jsb_puts(b, "None"); break;
    case JK_BOOL: jsb_puts(b, v->u.b ? "True" : "False"); break;
    case JK_INT:  snprintf(buf, sizeof(buf), "%" PRId64, v->u.i); jsb_puts(b, buf); break;
    case JK_FLOAT: jv_write_float(b, v->u.f); break;
    case JK_DICT:  if (v->u.d.ns) { jsb_puts(b, "<Namespace>"); } break;
    case JK_LOOP:  jsb_puts(b, "<LoopContext>"); break;
    case JK_MACRO: jsb_puts(b, "<Macro>"); break;
    case JK_BUILTIN: case JK_METHOD: jsb_puts(b, "<function>"); break;
    default: break;
    }
}

static void write_str_repr(jsb *b, const jv *s)
{
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jsb_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        const uint8_t *t = s->u.s.t ? s->u.s.t + i : NULL;
        char esc[8];
        const char *e = NULL;
        if (ch == '\\') e = "\\\\";
        else if (ch == '\n') e = "\\n";
        else if (ch == '\r') e = "\\r";
        else if (ch == '\t') e = "\\t";
        else if (ch == (unsigned char)q) e = q == '\'' ? "\\'" : "\\\"";
        else if (ch < 0x20 || ch == 0x7f) { snprintf(esc, sizeof(esc), "\\x%02x", ch); e = esc; }
        if (e)
            jsb_put_mark(b, e, strlen(e), t && *t);
        else
            jsb_put(b, p + i, 1, t);
    }
    jsb_putc(b, q);
}

void jv_write_repr(jctx *c, jsb *b, const jv *v)
{
    switch (v->k) {
    case JK_STR: write_str_repr(b, v); break;
    case JK_UNDEF: jsb_puts(b, ""); break;
    case JK_LIST:
        if (v->u.l.gen) { jsb_puts(b, "<generator object>"); break; }
        jsb_putc(b, v->u.l.tuple ? '(' : '[');
        for (size_t i = 0; i < v->u.l.n; i++) {
            if (i) jsb_puts(b, ", ");
            jv_write_repr(c, b, v->u.l.v[i]);
        }
        if (v->u.l.tuple && v->u.l.n == 1) jsb_putc(b, ',');
        jsb_putc(b, v->u.l.tuple ? ')' : ']');
        break;
    case JK_DICT:
        if (v->u.d.ns) { write_scalar(c, b, v); break; }
        jsb_putc(b, '{');
        for (size_t i = 0; i < v->u.d.n; i++) {
            if (i) jsb_puts(b, ", ");
            jv_write_repr(c, b, v->u.d.key[i]);
            jsb_puts(b, ": ");
            jv_write_repr(c, b, v->u.d.val[i]);
        }
        jsb_putc(b, '}');
        break;
    default: write_scalar(c, b, v);
    }
}

void jv_write_str(jctx *c, jsb *b, const jv *v)
{
    if (v->k == JK_STR)
        jsb_put(b, v->u.s.p, v->u.s.n, v->u.s.t);
    else if (v->k != JK_UNDEF)
        jv_write_repr(c, b, v);
}

jv *jv_to_str(jctx *c, const jv *v)
{
    if (v->k == JK_STR)
        return (jv *)v;
    jsb b;
    jsb_init(&b, c, 0);
    jv_write_str(c, &b, v);
    return jsb_take(&b);
}

/* ---------------------------------------------------------------- json.dumps */

static void json_string(jsb *b, const char *p, size_t n, const uint8_t *t, bool ascii)
{
    jsb_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        char esc[8];
        const char *e = NULL;
        switch (ch) {
        case '"':  e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (ch < 0x20) { snprintf(esc, sizeof(esc), "\\u%04x", ch); e = esc; }
        }
        if (ascii && ch >= 0x80) {   /* \\uXXXX, surrogate pairs above the BMP */
            size_t k = ch >= 0xF0 ? 4 : ch >= 0xE0 ? 3 : ch >= 0xC0 ? 2 : 1;
            if (i + k > n) k = 1;
            unsigned u = k == 1 ? 0xFFFD : k == 2 ? ch & 0x1F : k == 3 ? ch & 0x0F : ch & 0x07;
            for (size_t j = 1; j < k; j++) u = u << 6 | ((unsigned char)p[i + j] & 0x3F);
            char e2[16];
            if (u >= 0x10000)
                snprintf(e2, sizeof(e2), "\\u%04x\\u%04x", 0xD800 + ((u - 0x10000) >> 10), 0xDC00 + ((u - 0x10000) & 0x3FF));
            else
                snprintf(e2, sizeof(e2), "\\u%04x", u);
            jsb_put_mark(b, e2, strlen(e2), t && t[i]);
            i += k - 1;
            continue;
        }
        if (e)
            jsb_put_mark(b, e, strlen(e), t && t[i]);
        else
            jsb_put(b, p + i, 1, t ? t + i : NULL);
    }
    jsb_putc(b, '"');
}

static void json_newline(jsb *b, int indent, int level)
{
    jsb_putc(b, '\n');
    for (int i = 0; i < indent * level; i++)
        jsb_putc(b, ' ');
}

static int key_order(const void *x, const void *y)
{
    const jv *a = *(jv *const *)x, *b = *(jv *const *)y;
    if (a->k == JK_STR && b->k == JK_STR) {
        size_t n = KVC_MIN(a->u.s.n, b->u.s.n);
        int r = memcmp(a->u.s.p, b->u.s.p, n);
        return r ? r : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    }
    return 0;
}

static void json_value(jctx *c, int line, jsb *b, const jv *v, int indent, const char *isep,
                       const char *ksep, bool sort, bool ascii, int level)
{
    if (level > 200)
        jfail(c, line, "tojson: nesting deeper than 200");
    char buf[32];
    switch (v->k) {
    case JK_NONE: jsb_puts(b, "null"); return;
    case JK_BOOL: jsb_puts(b, v->u.b ? "true" : "false"); return;
    case JK_INT:  snprintf(buf, sizeof(buf), "%" PRId64, v->u.i); jsb_puts(b, buf); return;
    case JK_FLOAT:
        if (isnan(v->u.f)) jsb_puts(b, "NaN");
        else if (isinf(v->u.f)) jsb_puts(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else jv_write_float(b, v->u.f);
        return;
    case JK_STR: json_string(b, v->u.s.p, v->u.s.n, v->u.s.t, ascii); return;
    case JK_LIST:
        if (v->u.l.gen) break;
        if (!v->u.l.n) { jsb_puts(b, "[]"); return; }
        jsb_putc(b, '[');
        for (size_t i = 0; i < v->u.l.n; i++) {
            if (i) jsb_puts(b, isep);
            if (indent >= 0) json_newline(b, indent, level + 1);
            json_value(c, line, b, v->u.l.v[i], indent, isep, ksep, sort, ascii, level + 1);
        }
        if (indent >= 0) json_newline(b, indent, level);
        jsb_putc(b, ']');
        return;
    case JK_DICT: {
        if (v->u.d.ns) break;
        if (!v->u.d.n) { jsb_puts(b, "{}"); return; }
        size_t n = v->u.d.n;
        size_t *order = jalloc(c, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (sort) {  /* stable insertion sort of indices by key */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && key_order(&v->u.d.key[order[j - 1]], &v->u.d.key[order[j]]) > 0; j--) {
                    size_t t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
                }
        }
        jsb_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            const jv *k = v->u.d.key[order[i]];
            if (i) jsb_puts(b, isep);
            if (indent >= 0) json_newline(b, indent, level + 1);
            if (k->k == JK_STR) {
                json_string(b, k->u.s.p, k->u.s.n, k->u.s.t, ascii);
            } else if (k->k == JK_INT || k->k == JK_FLOAT || k->k == JK_BOOL || k->k == JK_NONE) {
                jsb_putc(b, '"');
                json_value(c, line, b, k, -1, isep, ksep, sort, ascii, level + 1);
                jsb_putc(b, '"');
            } else {
                jfail(c, line, "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
            }
            jsb_puts(b, ksep);
            json_value(c, line, b, v->u.d.val[order[i]], indent, isep, ksep, sort, ascii, level + 1);
        }
        if (indent >= 0) json_newline(b, indent, level);
        jsb_putc(b, '}');
        return;
    }
    default: break;
    }
    jfail(c, line, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
}

void jv_write_json(jctx *c, int line, jsb *b, const jv *v, int indent, const char *item_sep,
                   const char *key_sep, bool sort_keys, bool ensure_ascii)
{
    json_value(c, line, b, v, indent, item_sep, key_sep, sort_keys, ensure_ascii, 0);
}

/* ---------------------------------------------------------------- JSON reader */

typedef struct jp {
    jctx *c;
    const char *p, *s, *e;
    bool mark;
    int depth;
} jp;

_Noreturn static void jp_fail(jp *j, const char *what)
{
    jfail(j->c, 0, "JSON at offset %zu: %s", (size_t)(j->p - j->s), what);
}

static void jp_ws(jp *j)
{
    while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static unsigned jp_hex4(jp *j)
{
    if (j->e - j->p < 4)
        jp_fail(j, "short \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; i++) {
        char ch = *j->p++;
        u <<= 4;
        if (ch >= '0' && ch <= '9') u |= ch - '0';
        else if (ch >= 'a' && ch <= 'f') u |= ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F') u |= ch - 'A' + 10;
        else jp_fail(j, "bad \\u escape");
    }
    return u;
}

static void put_utf8(jsb *b, unsigned u)
{
    char o[4];
    jsb_put(b, o, ju8_put(o, u), NULL);
}

static jv *jp_string(jp *j)
{
    jsb b;
    jsb_init(&b, j->c, 0);
    j->p++;   /* opening quote */
    for (;;) {
        if (j->p >= j->e)
            jp_fail(j, "unterminated string");
        const char *q = j->p;
        while (q < j->e && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20)
            q++;
        jsb_put(&b, j->p, q - j->p, NULL);
        j->p = q;
        if (q >= j->e)
            continue;
        if (*q == '"') { j->p++; break; }
        if ((unsigned char)*q < 0x20)
            jp_fail(j, "control character in string");
        j->p++;
        if (j->p >= j->e)
            jp_fail(j, "unterminated escape");
        char ch = *j->p++;
        switch (ch) {
        case '"': jsb_putc(&b, '"'); break;
        case '\\': jsb_putc(&b, '\\'); break;
        case '/': jsb_putc(&b, '/'); break;
        case 'b': jsb_putc(&b, '\b'); break;
        case 'f': jsb_putc(&b, '\f'); break;
        case 'n': jsb_putc(&b, '\n'); break;
        case 'r': jsb_putc(&b, '\r'); break;
        case 't': jsb_putc(&b, '\t'); break;
        case 'u': {
            unsigned u = jp_hex4(j);
            if (u >= 0xD800 && u < 0xDC00 && j->e - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') {
                const char *save = j->p;
                j->p += 2;
                unsigned lo = jp_hex4(j);
                if (lo >= 0xDC00 && lo < 0xE000)
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                else
                    j->p = save;
            }
            if (u >= 0xD800 && u < 0xE000)
                u = 0xFFFD;   /* a lone surrogate cannot be UTF-8 */
            put_utf8(&b, u);
            break;
        }
        default: jp_fail(j, "bad escape");
        }
    }
    jv *v = jsb_take(&b);
    if (j->mark && v->u.s.n) {
        uint8_t *t = jalloc(j->c, v->u.s.n);
        memset(t, 1, v->u.s.n);
        v->u.s.t = t;
    }
    return v;
}

static jv *jp_value(jp *j);

static jv *jp_number(jp *j)
{
    const char *q = j->p;
    bool is_float = false;
    if (q < j->e && *q == '-') q++;
    if (q >= j->e || *q < '0' || *q > '9')
        jp_fail(j, "unexpected character");
    while (q < j->e && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' ||
                        *q == '+' || *q == '-')) {
        if (*q == '.' || *q == 'e' || *q == 'E') is_float = true;
        q++;
    }
    char buf[64];
    size_t n = (size_t)(q - j->p);
    if (n >= sizeof(buf))
        jp_fail(j, "number too long");
    memcpy(buf, j->p, n);
    buf[n] = 0;
    j->p = q;
    char *end;
    if (!is_float) {
        errno = 0;
        long long i = strtoll(buf, &end, 10);
        if (*end || errno)
            jp_fail(j, "integer out of range");
        return jv_int(j->c, i);
    }
    double f = strtod(buf, &end);
    if (*end)
        jp_fail(j, "bad number");
    return jv_float(j->c, f);
}

static jv *jp_value(jp *j)
{
    jp_ws(j);
    if (j->p >= j->e)
        jp_fail(j, "unexpected end");
    if (++j->depth > 200)
        jp_fail(j, "nesting deeper than 200");
    jv *v;
    char ch = *j->p;
    if (ch == '{') {
        v = jv_dict(j->c);
        j->p++;
        jp_ws(j);
        if (j->p < j->e && *j->p == '}') { j->p++; goto done; }
        for (;;) {
            jp_ws(j);
            if (j->p >= j->e || *j->p != '"')
                jp_fail(j, "expected a key");
            jv *k = jp_string(j);
            jp_ws(j);
            if (j->p >= j->e || *j->p != ':')
                jp_fail(j, "expected ':'");
            j->p++;
            jv_dict_set(j->c, v, k, jp_value(j));
            jp_ws(j);
            if (j->p < j->e && *j->p == ',') { j->p++; continue; }
            if (j->p < j->e && *j->p == '}') { j->p++; break; }
            jp_fail(j, "expected ',' or '}'");
        }
    } else if (ch == '[') {
        v = jv_list(j->c, 0);
        j->p++;
        jp_ws(j);
        if (j->p < j->e && *j->p == ']') { j->p++; goto done; }
        for (;;) {
            jv_list_push(j->c, v, jp_value(j));
            jp_ws(j);
            if (j->p < j->e && *j->p == ',') { j->p++; continue; }
            if (j->p < j->e && *j->p == ']') { j->p++; break; }
            jp_fail(j, "expected ',' or ']'");
        }
    } else if (ch == '"') {
        v = jp_string(j);
    } else if (j->e - j->p >= 4 && !memcmp(j->p, "true", 4)) {
        v = JV_TRUE; j->p += 4;
    } else if (j->e - j->p >= 5 && !memcmp(j->p, "false", 5)) {
        v = JV_FALSE; j->p += 5;
    } else if (j->e - j->p >= 4 && !memcmp(j->p, "null", 4)) {
        v = JV_NONE; j->p += 4;
    } else {
        v = jp_number(j);
    }
done:
    j->depth--;
    return v;
}

jv *jv_parse_json(jctx *c, const char *p, size_t n, bool mark)
{
    jp j = { c, p, p, p + n, mark, 0 };
    jv *v = jp_value(&j);
    jp_ws(&j);
    if (j.p != j.e)
        jp_fail(&j, "trailing characters");
    return v;
}
