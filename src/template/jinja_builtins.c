/* jinja_builtins.c - Jinja's filters and tests, Python's str/dict/list
 * methods (as ImmutableSandboxedEnvironment allows them: methods that would
 * modify a list or dict fail), and the globals transformers and Jinja
 * provide. Every string result keeps the provenance marks of the bytes it
 * was made from. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <locale.h>
#include <pthread.h>
#include <time.h>
#include <wctype.h>

#include "jinja_internal.h"


#define C (jrender_ctx(r))

/* ---------------------------------------------------------------- helpers */

static jv *sub(jrender *r, const jv *s, size_t off, size_t n)
{
    return jv_str(C, s->u.s.p + off, n, s->u.s.t ? s->u.s.t + off : NULL);
}

/* Decode the code point at p[i]; sets *len. Invalid bytes count as one. */
static unsigned u8_at(const char *p, size_t n, size_t i, size_t *len)
{
    unsigned char c0 = (unsigned char)p[i];
    int k = c0 < 0x80 ? 1 : c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC0 ? 2 : 1;
    if (i + (size_t)k > n) k = 1;
    unsigned u = k == 1 ? c0 : k == 2 ? c0 & 0x1F : k == 3 ? c0 & 0x0F : c0 & 0x07;
    for (int j = 1; j < k; j++) u = u << 6 | ((unsigned char)p[i + j] & 0x3F);
    *len = (size_t)k;
    return u;
}

/* Python's str.isspace() for one code point. */
static bool u_space(unsigned u)
{
    return (u >= 9 && u <= 13) || (u >= 0x1C && u <= 0x20) || u == 0x85 || u == 0xA0 ||
           u == 0x1680 || (u >= 0x2000 && u <= 0x200A) || u == 0x2028 || u == 0x2029 ||
           u == 0x202F || u == 0x205F || u == 0x3000;
}

/* Length of the code point ending at p[n-1]. */
static size_t u8_back(const char *p, size_t n)
{
    size_t k = 1;
    while (k < n && k < 4 && ((unsigned char)p[n - k] & 0xC0) == 0x80) k++;
    return k;
}

static bool in_chars(const jv *chars, const char *p, size_t len)
{
    const char *c = chars->u.s.p;
    size_t n = chars->u.s.n;
    for (size_t i = 0; i < n;) {
        size_t l;
        u8_at(c, n, i, &l);
        if (l == len && !memcmp(c + i, p, len)) return true;
        i += l;
    }
    return false;
}

/* str.strip/lstrip/rstrip; chars NULL or None = whitespace. */
static jv *strip(jrender *r, jv *s, jv *chars, bool left, bool right)
{
    if (chars && chars->k == JK_NONE) chars = NULL;
    const char *p = s->u.s.p;
    size_t a = 0, b = s->u.s.n;
    while (left && a < b) {
        size_t l;
        unsigned u = u8_at(p, b, a, &l);
        if (chars ? !in_chars(chars, p + a, l) : !u_space(u)) break;
        a += l;
    }
    while (right && b > a) {
        size_t l = u8_back(p + a, b - a), l2;
        unsigned u = u8_at(p, b, b - l, &l2);
        if (chars ? !in_chars(chars, p + b - l, l) : !u_space(u)) break;
        b -= l;
    }
    return sub(r, s, a, b - a);
}

static jv *need_str(jrender *r, int line, jv *v, const char *what)
{
    if (v->k != JK_STR)
        jfail(C, line, "%s: expected a string, got %s", what, jv_type_name(v));
    return v;
}

/* soft_str: what Jinja's string filters do with any value */
static jv *sstr(jrender *r, jv *v) { return jv_to_str(C, v); }

/* Unicode case mapping through glibc's C.UTF-8 tables (one code point to
 * one, as towupper does; Python's few one-to-many mappings such as "ß" ->
 * "SS" are not reproduced). ASCII only where the locale is missing. */
static locale_t utf8_locale;
static pthread_once_t utf8_once = PTHREAD_ONCE_INIT;
static void utf8_init(void) { utf8_locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0); }

static unsigned u_case(unsigned u, bool up)
{
    if (u < 0x80)
        return up ? (u >= 'a' && u <= 'z' ? u - 32 : u) : (u >= 'A' && u <= 'Z' ? u + 32 : u);
    pthread_once(&utf8_once, utf8_init);
    if (!utf8_locale)
        return u;
    return (unsigned)(up ? towupper_l((wint_t)u, utf8_locale) : towlower_l((wint_t)u, utf8_locale));
}

static bool u_cased(unsigned u)
{
    if (u < 0x80)
        return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z');
    return u_case(u, true) != u || u_case(u, false) != u;
}

static void put_cp(jsb *b, unsigned u, bool mark)
{
    char o[4];
    jsb_put_mark(b, o, ju8_put(o, u), mark);
}

/* mode: 0 lower, 1 upper, 2 capitalize (str.capitalize), 3 str.title */
static jv *map_ascii(jrender *r, jv *s, int mode)
{
    jsb b;
    jsb_init(&b, C, 0);
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t l;
        unsigned u = u8_at(s->u.s.p, s->u.s.n, i, &l);
        bool mark = s->u.s.t && s->u.s.t[i];
        bool up = mode == 1 || (mode == 2 && first) || (mode == 3 && !prev_cased);
        bool valid = l > 1 || u < 0x80;
        if (valid) {
            put_cp(&b, u_case(u, up), mark);
        } else {
            jsb_put(&b, s->u.s.p + i, l, s->u.s.t ? s->u.s.t + i : NULL);
        }
        prev_cased = u_cased(u);
        first = false;
        i += l;
    }
    return jsb_take(&b);
}

/* Jinja's title filter: words start after runs of -, whitespace, brackets. */
static jv *jinja_title(jrender *r, jv *s)
{
    jv *o = jv_str(C, s->u.s.p, s->u.s.n, s->u.s.t);
    char *p = (char *)o->u.s.p;
    bool start = true;
    for (size_t i = 0; i < o->u.s.n; i++) {
        char ch = p[i];
        if (strchr("- \t\n\r\f\v[](){}", ch) && ch) { start = true; continue; }
        if (start && ch >= 'a' && ch <= 'z') p[i] = (char)(ch - 32);
        else if (!start && ch >= 'A' && ch <= 'Z') p[i] = (char)(ch + 32);
        start = false;
    }
    return o;
}

static jv *replace(jrender *r, jv *s, jv *old, jv *new, int64_t count)
{
    jsb b;
    jsb_init(&b, C, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    int64_t done = 0;
    if (!old->u.s.n) {   /* Python inserts `new` between every character */
        size_t l;
        while (count < 0 || done < count) {
            jsb_put(&b, new->u.s.p, new->u.s.n, new->u.s.t);
            done++;
            if (i >= n) break;
            u8_at(p, n, i, &l);
            jsb_put(&b, p + i, l, s->u.s.t ? s->u.s.t + i : NULL);
            i += l;
        }
        jsb_put(&b, p + i, n - i, s->u.s.t ? s->u.s.t + i : NULL);
        return jsb_take(&b);
    }
    while (i < n && (count < 0 || done < count)) {
        const char *f = memmem(p + i, n - i, old->u.s.p, old->u.s.n);
        if (!f) break;
        size_t at = (size_t)(f - p);
        jsb_put(&b, p + i, at - i, s->u.s.t ? s->u.s.t + i : NULL);
        jsb_put(&b, new->u.s.p, new->u.s.n, new->u.s.t);
        i = at + old->u.s.n;
        done++;
    }
    jsb_put(&b, p + i, n - i, s->u.s.t ? s->u.s.t + i : NULL);
    return jsb_take(&b);
}

/* str.split / rsplit (sep NULL = runs of whitespace). */
static jv *split(jrender *r, jv *s, jv *sep, int64_t maxsplit, bool from_right)
{
    jv *out = jv_list(C, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (sep && sep->k == JK_NONE) sep = NULL;
    if (sep && !sep->u.s.n)
        jfail(C, 0, "split: empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            if (!sep) {
                size_t l;
                while (i < n && u_space(u8_at(p, n, i, &l))) i += l;
                if (i >= n) break;
                if (maxsplit >= 0 && k >= maxsplit) {
                    jv_list_push(C, out, sub(r, s, i, n - i));   /* the rest as it is */
                    break;
                }
                size_t j = i;
                while (j < n && !u_space(u8_at(p, n, j, &l))) j += l;
                jv_list_push(C, out, sub(r, s, i, j - i));
                i = j;
                k++;
            } else {
                const char *f = maxsplit >= 0 && k >= maxsplit ? NULL
                              : memmem(p + i, n - i, sep->u.s.p, sep->u.s.n);
                if (!f) { jv_list_push(C, out, sub(r, s, i, n - i)); break; }
                jv_list_push(C, out, sub(r, s, i, (size_t)(f - p) - i));
                i = (size_t)(f - p) + sep->u.s.n;
                k++;
            }
        }
        return out;
    }
    /* rsplit: collect from the right, then reverse */
    jv *rev = jv_list(C, 0);
    size_t e = n;
    int64_t k = 0;
    for (;;) {
        if (!sep) {
            while (e > 0) { size_t bl = u8_back(p, e), l2; if (!u_space(u8_at(p, e, e - bl, &l2))) break; e -= bl; }
            if (!e) break;
            if (maxsplit >= 0 && k >= maxsplit) {
                jv_list_push(C, rev, sub(r, s, 0, e));
                break;
            }
            size_t a = e;
            while (a > 0) { size_t bl = u8_back(p, a), l2; if (u_space(u8_at(p, a, a - bl, &l2))) break; a -= bl; }
            jv_list_push(C, rev, sub(r, s, a, e - a));
            e = a;
            k++;
        } else {
            size_t at = SIZE_MAX;
            if (!(maxsplit >= 0 && k >= maxsplit) && e >= sep->u.s.n)
                for (size_t x = e - sep->u.s.n + 1; x-- > 0;)
                    if (!memcmp(p + x, sep->u.s.p, sep->u.s.n)) { at = x; break; }
            if (at == SIZE_MAX) { jv_list_push(C, rev, sub(r, s, 0, e)); break; }
            jv_list_push(C, rev, sub(r, s, at + sep->u.s.n, e - at - sep->u.s.n));
            e = at;
            k++;
        }
    }
    for (size_t i = rev->u.l.n; i-- > 0;)
        jv_list_push(C, out, rev->u.l.v[i]);
    return out;
}

static jv *join(jrender *r, jv *sep, jv *items)
{
    jsb b;
    jsb_init(&b, C, 0);
    for (size_t i = 0; i < items->u.l.n; i++) {
        if (i) jsb_put(&b, sep->u.s.p, sep->u.s.n, sep->u.s.t);
        jv_write_str(C, &b, items->u.l.v[i]);
    }
    return jsb_take(&b);
}

/* Keyword or positional argument `idx` named `name`, or NULL. */
static jv *arg(jv **args, size_t nargs, const char **kwn, jv **kwv, size_t nkw, size_t idx,
               const char *name)
{
    for (size_t k = 0; k < nkw; k++)
        if (!strcmp(kwn[k], name)) return kwv[k];
    return idx < nargs ? args[idx] : NULL;
}

static int64_t int_arg(jrender *r, int line, jv *v, int64_t dflt, const char *what)
{
    if (!v || v->k == JK_NONE) return dflt;
    if (v->k == JK_INT) return v->u.i;
    if (v->k == JK_BOOL) return v->u.b;
    jfail(C, line, "%s: expected an integer, got %s", what, jv_type_name(v));
}

/* ---------------------------------------------------------------- str.format */

static jv *str_format(jrender *r, int line, jv *fmt, jv **args, size_t nargs, const char **kwn,
                      jv **kwv, size_t nkw)
{
    jsb b;
    jsb_init(&b, C, 0);
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n, auto_i = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *t = fmt->u.s.t ? fmt->u.s.t + i : NULL;
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') { jsb_put(&b, p + i, 1, t); i++; continue; }
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') { jsb_put(&b, p + i, 1, t); i++; continue; }
        if (p[i] == '}') jfail(C, line, "format: single '}' encountered in format string");
        if (p[i] != '{') { jsb_put(&b, p + i, 1, t); continue; }
        size_t e = i + 1;
        while (e < n && p[e] != '}') e++;
        if (e >= n) jfail(C, line, "format: expected '}' before end of string");
        const char *f = p + i + 1;
        size_t fl = e - i - 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl))
            jfail(C, line, "format: conversions, specs and attribute fields are not supported");
        jv *v = NULL;
        if (!fl) {
            if (auto_i >= nargs) jfail(C, line, "format: replacement index %zu out of range", auto_i);
            v = args[auto_i++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            size_t k = (size_t)strtoul(f, NULL, 10);
            if (k >= nargs) jfail(C, line, "format: replacement index %zu out of range", k);
            v = args[k];
        } else {
            for (size_t k = 0; k < nkw; k++)
                if (strlen(kwn[k]) == fl && !memcmp(kwn[k], f, fl)) v = kwv[k];
            if (!v) jfail(C, line, "format: no keyword argument '%.*s'", (int)fl, f);
        }
        jv_write_str(C, &b, v);
        i = e;
    }
    return jsb_take(&b);
}

/* ---------------------------------------------------------------- methods */

static const char *const str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace",
    "upper", "lower", "title", "capitalize", "find", "rfind", "index", "count", "join", "format",
    "isdigit", "isalpha", "isspace", "isalnum", "isupper", "islower", "splitlines", NULL };
static const char *const dict_methods[] = {
    "items", "keys", "values", "get", "copy",
    "pop", "update", "setdefault", "clear", "popitem", NULL };   /* the last 5 are unsafe */
static const char *const list_methods[] = {
    "index", "count", "copy",
    "append", "pop", "extend", "insert", "remove", "reverse", "sort", "clear", NULL };

static bool in_names(const char *const *names, const char *name)
{
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return true;
    return false;
}

bool jhas_method(const jv *self, const char *name)
{
    switch (self->k) {
    case JK_STR:  return in_names(str_methods, name);
    case JK_DICT: return in_names(dict_methods, name);
    case JK_LIST: return in_names(list_methods, name);
    default:      return false;
    }
}

static jv *items_of(jrender *r, jv *d)
{
    jv *l = jv_list(C, d->u.d.n);
    for (size_t i = 0; i < d->u.d.n; i++) {
        jv *t = jv_list(C, 2);
        t->u.l.tuple = true;
        jv_list_push(C, t, d->u.d.key[i]);
        jv_list_push(C, t, d->u.d.val[i]);
        jv_list_push(C, l, t);
    }
    return l;
}

static bool affix(jrender *r, int line, jv *s, jv *a, bool end)
{
    if (a->k == JK_LIST && a->u.l.tuple) {
        for (size_t i = 0; i < a->u.l.n; i++)
            if (affix(r, line, s, a->u.l.v[i], end)) return true;
        return false;
    }
    need_str(r, line, a, end ? "endswith" : "startswith");
    if (a->u.s.n > s->u.s.n) return false;
    return !memcmp(s->u.s.p + (end ? s->u.s.n - a->u.s.n : 0), a->u.s.p, a->u.s.n);
}

static jv *str_method(jrender *r, int line, jv *s, const char *name, jv **a, size_t na,
                      const char **kwn, jv **kwv, size_t nkw)
{
    jv *a0 = na > 0 ? a[0] : NULL, *a1 = na > 1 ? a[1] : NULL;
    if (!strcmp(name, "strip"))  return strip(r, s, a0, true, true);
    if (!strcmp(name, "lstrip")) return strip(r, s, a0, true, false);
    if (!strcmp(name, "rstrip")) return strip(r, s, a0, false, true);
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        jv *sep = arg(a, na, kwn, kwv, nkw, 0, "sep");
        if (sep && sep->k != JK_NONE) need_str(r, line, sep, name);
        return split(r, s, sep, int_arg(r, line, arg(a, na, kwn, kwv, nkw, 1, "maxsplit"), -1, name),
                     name[0] == 'r');
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!a0) jfail(C, line, "%s takes at least 1 argument", name);
        return JV_BOOL(affix(r, line, s, a0, name[0] == 'e'));
    }
    if (!strcmp(name, "replace")) {
        if (!a0 || !a1) jfail(C, line, "replace takes at least 2 arguments");
        need_str(r, line, a0, "replace");
        need_str(r, line, a1, "replace");
        return replace(r, s, a0, a1, int_arg(r, line, na > 2 ? a[2] : NULL, -1, "replace"));
    }
    if (!strcmp(name, "upper")) return map_ascii(r, s, 1);
    if (!strcmp(name, "lower")) return map_ascii(r, s, 0);
    if (!strcmp(name, "title")) return map_ascii(r, s, 3);
    if (!strcmp(name, "capitalize")) return map_ascii(r, s, 2);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "count")) {
        if (!a0) jfail(C, line, "%s takes at least 1 argument", name);
        need_str(r, line, a0, name);
        const char *p = s->u.s.p;
        size_t n = s->u.s.n, m = a0->u.s.n;
        if (!strcmp(name, "count")) {
            if (!m) return jv_int(C, (int64_t)ju8_len(p, n) + 1);
            int64_t k = 0;
            for (size_t i = 0; i + m <= n;) {
                const char *f = memmem(p + i, n - i, a0->u.s.p, m);
                if (!f) break;
                k++;
                i = (size_t)(f - p) + m;
            }
            return jv_int(C, k);
        }
        const char *f = NULL;
        if (name[0] == 'r') {
            for (size_t x = n >= m ? n - m + 1 : 0; x-- > 0;)
                if (!memcmp(p + x, a0->u.s.p, m)) { f = p + x; break; }
        } else {
            f = m ? memmem(p, n, a0->u.s.p, m) : p;
        }
        if (!f && name[0] == 'i') jfail(C, line, "substring not found");
        return jv_int(C, f ? (int64_t)ju8_len(p, (size_t)(f - p)) : -1);
    }
    if (!strcmp(name, "join")) {
        if (!a0) jfail(C, line, "join takes exactly one argument");
        jv *items = jiter_list(r, line, a0);
        for (size_t i = 0; i < items->u.l.n; i++)
            if (items->u.l.v[i]->k != JK_STR)
                jfail(C, line, "sequence item %zu: expected str instance, %s found", i,
                      jv_type_name(items->u.l.v[i]));
        return join(r, s, items);
    }
    if (!strcmp(name, "format")) return str_format(r, line, s, a, na, kwn, kwv, nkw);
    if (!strcmp(name, "splitlines")) {
        jv *out = jv_list(C, 0);
        size_t i = 0, n = s->u.s.n;
        while (i < n) {
            size_t j = i;
            while (j < n && s->u.s.p[j] != '\n' && s->u.s.p[j] != '\r') j++;
            jv_list_push(C, out, sub(r, s, i, j - i));
            if (j < n && s->u.s.p[j] == '\r' && j + 1 < n && s->u.s.p[j + 1] == '\n') j++;
            i = j + 1;
        }
        return out;
    }
    /* is* predicates, ASCII */
    size_t n = s->u.s.n;
    bool ok = n > 0, any_cased = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s->u.s.p[i];
        bool d = ch >= '0' && ch <= '9', lo = ch >= 'a' && ch <= 'z', up = ch >= 'A' && ch <= 'Z';
        any_cased |= lo || up;
        if (!strcmp(name, "isdigit")) ok &= d;
        else if (!strcmp(name, "isalpha")) ok &= lo || up;
        else if (!strcmp(name, "isalnum")) ok &= lo || up || d;
        else if (!strcmp(name, "isspace")) ok &= strchr(" \t\n\r\v\f", ch) && ch;
        else if (!strcmp(name, "isupper")) ok &= !lo;
        else if (!strcmp(name, "islower")) ok &= !up;
    }
    if (!strcmp(name, "isupper") || !strcmp(name, "islower")) ok = ok && any_cased;
    return JV_BOOL(ok);
}

jv *jmethod(jrender *r, int line, jv *self, const char *name, jv **a, size_t na, const char **kwn,
            jv **kwv, size_t nkw)
{
    jctx *c = C;
    if (self->k == JK_STR)
        return str_method(r, line, self, name, a, na, kwn, kwv, nkw);
    if (self->k == JK_DICT) {
        if (!strcmp(name, "items")) return items_of(r, self);
        if (!strcmp(name, "keys")) return jiter_list(r, line, self);
        if (!strcmp(name, "values")) {
            jv *l = jv_list(c, self->u.d.n);
            for (size_t i = 0; i < self->u.d.n; i++) jv_list_push(c, l, self->u.d.val[i]);
            return l;
        }
        if (!strcmp(name, "get")) {
            if (!na) jfail(c, line, "get expected at least 1 argument, got 0");
            jv *v = jv_dict_get(self, a[0]);
            return v ? v : na > 1 ? a[1] : JV_NONE;
        }
        if (!strcmp(name, "copy")) {
            jv *d = jv_dict(c);
            for (size_t i = 0; i < self->u.d.n; i++) jv_dict_set(c, d, self->u.d.key[i], self->u.d.val[i]);
            return d;
        }
    }
    if (self->k == JK_LIST) {
        if (!strcmp(name, "index") || !strcmp(name, "count")) {
            if (!na) jfail(c, line, "%s takes exactly one argument", name);
            int64_t k = 0;
            for (size_t i = 0; i < self->u.l.n; i++)
                if (jv_eq(self->u.l.v[i], a[0])) {
                    if (name[0] == 'i') return jv_int(c, (int64_t)i);
                    k++;
                }
            if (name[0] == 'i') jfail(c, line, "value is not in list");
            return jv_int(c, k);
        }
        if (!strcmp(name, "copy")) {
            jv *l = jv_list(c, self->u.l.n);
            for (size_t i = 0; i < self->u.l.n; i++) jv_list_push(c, l, self->u.l.v[i]);
            return l;
        }
    }
    if (self->k == JK_LOOP && !strcmp(name, "cycle")) {
        if (!na) jfail(c, line, "no items for cycling given");
        return a[self->u.loop->i % na];
    }
    /* what the immutable sandbox refuses: methods that modify */
    jfail(c, line, "access to attribute '%s' of '%s' object is unsafe (templates may not modify "
          "lists or dicts)", name, jv_type_name(self));
}

/* ---------------------------------------------------------------- tests */

bool jtest(jrender *r, int line, const char *name, jv *v, jv **a, size_t na)
{
    jv *a0 = na ? a[0] : NULL;
    if (!strcmp(name, "defined")) return v->k != JK_UNDEF;
    if (!strcmp(name, "undefined")) return v->k == JK_UNDEF;
    if (!strcmp(name, "none")) return v->k == JK_NONE;
    if (!strcmp(name, "string")) return v->k == JK_STR;
    if (!strcmp(name, "mapping")) return v->k == JK_DICT && !v->u.d.ns;
    if (!strcmp(name, "iterable")) return v->k == JK_STR || v->k == JK_LIST || (v->k == JK_DICT && !v->u.d.ns) || v->k == JK_UNDEF;
    if (!strcmp(name, "sequence")) return v->k == JK_STR || v->k == JK_LIST || (v->k == JK_DICT && !v->u.d.ns) || v->k == JK_UNDEF;
    if (!strcmp(name, "boolean")) return v->k == JK_BOOL;
    if (!strcmp(name, "true")) return v->k == JK_BOOL && v->u.b;
    if (!strcmp(name, "false")) return v->k == JK_BOOL && !v->u.b;
    if (!strcmp(name, "number")) return jv_is_num(v);
    if (!strcmp(name, "integer")) return v->k == JK_INT;
    if (!strcmp(name, "float")) return v->k == JK_FLOAT;
    if (!strcmp(name, "callable")) return v->k == JK_MACRO || v->k == JK_BUILTIN || v->k == JK_METHOD;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        jv *s = sstr(r, v);
        jv *m = map_ascii(r, s, name[0] == 'u');
        return jv_eq(s, m);
    }
    if (!strcmp(name, "even") || !strcmp(name, "odd")) {
        if (v->k != JK_INT && v->k != JK_BOOL) jfail(C, line, "test '%s' needs an integer", name);
        int64_t x = v->k == JK_INT ? v->u.i : v->u.b;
        return (x % 2 == 0) == (name[0] == 'e');
    }
    if (!strcmp(name, "divisibleby")) {
        int64_t d = int_arg(r, line, a0, 0, "divisibleby");
        if (!d) jfail(C, line, "divisibleby: division by zero");
        return int_arg(r, line, v, 0, "divisibleby") % d == 0;
    }
    if (!a0 && (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "ne") ||
                !strcmp(name, "in") || !strcmp(name, "sameas") || !strcmp(name, "lt") ||
                !strcmp(name, "gt") || !strcmp(name, "le") || !strcmp(name, "ge")))
        jfail(C, line, "test '%s' needs an argument", name);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jv_eq(v, a0);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_eq(v, a0);
    if (!strcmp(name, "sameas"))
        return v == a0 || (v->k == a0->k && (v->k == JK_NONE || (v->k == JK_BOOL && v->u.b == a0->u.b)));
    if (!strcmp(name, "lt")) return jv_cmp(C, line, v, a0) < 0;
    if (!strcmp(name, "le")) return jv_cmp(C, line, v, a0) <= 0;
    if (!strcmp(name, "gt")) return jv_cmp(C, line, v, a0) > 0;
    if (!strcmp(name, "ge")) return jv_cmp(C, line, v, a0) >= 0;
    if (!strcmp(name, "in")) {
        if (a0->k == JK_STR) return v->k == JK_STR && memmem(a0->u.s.p, a0->u.s.n, v->u.s.p, v->u.s.n);
        jv *l = jiter_list(r, line, a0);
        for (size_t i = 0; i < l->u.l.n; i++)
            if (jv_eq(l->u.l.v[i], v)) return true;
        return false;
    }
    jfail(C, line, "no test named '%s'", name);
}

/* ---------------------------------------------------------------- filters */

/* Jinja's attribute getter: "a.b.0" by getitem, part by part. */
static jv *attr_path(jrender *r, int line, jv *v, jv *path)
{
    if (path->k == JK_INT) return jgetitem(r, line, v, path);
    need_str(r, line, path, "attribute");
    const char *p = path->u.s.p;
    size_t n = path->u.s.n, i = 0;
    while (i <= n) {
        size_t j = i;
        while (j < n && p[j] != '.') j++;
        jv *key;
        bool digits = j > i;
        for (size_t k = i; k < j; k++) digits &= p[k] >= '0' && p[k] <= '9';
        key = digits ? jv_int(C, strtoll(p + i, NULL, 10)) : jv_str(C, p + i, j - i, NULL);
        v = jgetitem(r, line, v, key);
        i = j + 1;
    }
    return v;
}

static jv *select_impl(jrender *r, int line, jv *seq, jv **a, size_t na, bool by_attr, bool keep)
{
    jv *items = jv_truthy(seq) ? jiter_list(r, line, seq) : jv_list(C, 0), *out = jv_gen(C, jv_list(C, 0));
    size_t k = 0;
    jv *attr = NULL;
    if (by_attr) {
        if (!na) jfail(C, line, "selectattr/rejectattr need an attribute");
        attr = a[k++];
    }
    const char *test = NULL;
    if (k < na) test = need_str(r, line, a[k++], "test name")->u.s.p;
    for (size_t i = 0; i < items->u.l.n; i++) {
        jv *x = items->u.l.v[i];
        jv *y = attr ? attr_path(r, line, x, attr) : x;
        bool t = test ? jtest(r, line, test, y, a + k, na - k) : jv_truthy(y);
        if (t == keep) jv_list_push(C, out, x);
    }
    return out;
}

static jv *sort_key(jrender *r, int line, jv *x, jv *attr, bool cs)
{
    if (attr) x = attr_path(r, line, x, attr);
    if (!cs && x->k == JK_STR) x = map_ascii(r, x, 0);
    return x;
}

static jv *sorted(jrender *r, int line, jv *seq, bool reverse, bool cs, jv *attr)
{
    jv *items = jiter_list(r, line, seq);
    size_t n = items->u.l.n;
    jv *out = jv_list(C, n);
    jv **keys = jalloc(C, (n + 1) * sizeof(jv *));
    for (size_t i = 0; i < n; i++) {
        jv_list_push(C, out, items->u.l.v[i]);
        keys[i] = sort_key(r, line, items->u.l.v[i], attr, cs);
    }
    for (size_t i = 1; i < n; i++)         /* stable insertion sort, as Python's sort is stable */
        for (size_t j = i; j > 0; j--) {
            int c = jv_cmp(C, line, keys[j - 1], keys[j]);
            if (reverse ? c >= 0 : c <= 0) break;
            jv *t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t;
            t = out->u.l.v[j]; out->u.l.v[j] = out->u.l.v[j - 1]; out->u.l.v[j - 1] = t;
        }
    return out;
}

static jv *indent(jrender *r, jv *s, jv *width, bool first, bool blank)
{
    jsb ind;
    jsb_init(&ind, C, 0);
    if (width && width->k == JK_STR) jsb_put(&ind, width->u.s.p, width->u.s.n, width->u.s.t);
    else for (int64_t i = 0; i < (width ? (width->k == JK_INT ? width->u.i : 4) : 4); i++) jsb_putc(&ind, ' ');
    jv *pad = jsb_take(&ind);
    jsb b;
    jsb_init(&b, C, 0);
    if (first) jsb_put(&b, pad->u.s.p, pad->u.s.n, pad->u.s.t);
    /* lines as str.splitlines() of s + "\n" */
    size_t i = 0, n = s->u.s.n, line_no = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s->u.s.p[j] != '\n' && s->u.s.p[j] != '\r') j++;
        if (line_no > 0) {
            jsb_putc(&b, '\n');
            if (blank || j > i) jsb_put(&b, pad->u.s.p, pad->u.s.n, pad->u.s.t);
        }
        jsb_put(&b, s->u.s.p + i, j - i, s->u.s.t ? s->u.s.t + i : NULL);
        if (j < n && s->u.s.p[j] == '\r' && j + 1 < n && s->u.s.p[j + 1] == '\n') j++;
        i = j + 1;
        line_no++;
    }
    return jsb_take(&b);
}

jv *jfilter(jrender *r, int line, const char *name, jv *v, jv **a, size_t na, const char **kwn,
            jv **kwv, size_t nkw)
{
    jctx *c = C;
#define ARG(i, nm) arg(a, na, kwn, kwv, nkw, (i), (nm))
    if (!strcmp(name, "tojson")) {
        jv *ea = ARG(0, "ensure_ascii"), *ind = ARG(1, "indent"), *sep = ARG(2, "separators"),
           *sk = ARG(3, "sort_keys");
        int indent_n = ind && ind->k != JK_NONE ? (int)int_arg(r, line, ind, 0, "tojson indent") : -1;
        if (indent_n > 64) jfail(c, line, "tojson: indent over 64");
        const char *isep = indent_n >= 0 ? "," : ", ", *ksep = ": ";
        if (sep && sep->k != JK_NONE) {
            if (sep->k != JK_LIST || sep->u.l.n != 2 || sep->u.l.v[0]->k != JK_STR || sep->u.l.v[1]->k != JK_STR)
                jfail(c, line, "tojson: separators must be two strings");
            isep = sep->u.l.v[0]->u.s.p;
            ksep = sep->u.l.v[1]->u.s.p;
        }
        jsb b;
        jsb_init(&b, c, 0);
        jv_write_json(c, line, &b, v, indent_n, isep, ksep, sk && jv_truthy(sk), ea && jv_truthy(ea));
        return jsb_take(&b);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) return jv_int(c, (int64_t)jv_len(c, line, v));
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv *dv = ARG(0, "default_value"), *bo = ARG(1, "boolean");
        bool use = v->k == JK_UNDEF || (bo && jv_truthy(bo) && !jv_truthy(v));
        return use ? (dv ? dv : jv_cstr(c, "")) : v;
    }
    if (!strcmp(name, "format")) {       /* soft_str(value) % (kwargs or args) */
        if (na && nkw) jfail(c, line, "can't handle positional and keyword arguments at the same time");
        jv *operand;
        if (nkw) {
            operand = jv_dict(c);
            for (size_t i = 0; i < nkw; i++) jv_dict_set(c, operand, jv_cstr(c, kwn[i]), kwv[i]);
        } else {
            operand = jv_list(c, na);
            operand->u.l.tuple = true;
            for (size_t i = 0; i < na; i++) jv_list_push(c, operand, a[i]);
        }
        return jinja_percent_format(r, line, sstr(r, v), operand);
    }
    if (!strcmp(name, "trim")) return strip(r, sstr(r, v), ARG(0, "chars"), true, true);
    if (!strcmp(name, "string")) return sstr(r, v);
    if (!strcmp(name, "safe")) {
        jv *s = sstr(r, v);
        if (s->u.s.safe) return s;
        s = jv_str(c, s->u.s.p, s->u.s.n, s->u.s.t);
        s->u.s.safe = true;
        return s;
    }
    if (!strcmp(name, "upper")) return map_ascii(r, sstr(r, v), 1);
    if (!strcmp(name, "lower")) return map_ascii(r, sstr(r, v), 0);
    if (!strcmp(name, "capitalize")) return map_ascii(r, sstr(r, v), 2);
    if (!strcmp(name, "title")) return jinja_title(r, sstr(r, v));
    if (!strcmp(name, "join")) {
        jv *sep = ARG(0, "d"), *attr = ARG(1, "attribute");
        jv *items = jiter_list(r, line, v);
        if (attr) {
            jv *l = jv_list(c, items->u.l.n);
            for (size_t i = 0; i < items->u.l.n; i++) jv_list_push(c, l, attr_path(r, line, items->u.l.v[i], attr));
            items = l;
        }
        return join(r, sep ? sstr(r, sep) : jv_cstr(c, ""), items);
    }
    if (!strcmp(name, "replace")) {
        jv *s = sstr(r, v), *o = ARG(0, "old"), *nw = ARG(1, "new");
        if (!o || !nw) jfail(c, line, "replace needs old and new");
        return replace(r, s, sstr(r, o), sstr(r, nw), int_arg(r, line, ARG(2, "count"), -1, "replace"));
    }
    if (!strcmp(name, "items")) {
        if (v->k == JK_UNDEF) return jv_list(c, 0);
        if (v->k != JK_DICT || v->u.d.ns) jfail(c, line, "items: expected a mapping, got %s", jv_type_name(v));
        return jv_gen(c, items_of(r, v));
    }
    if (!strcmp(name, "dictsort")) {
        if (v->k != JK_DICT || v->u.d.ns) jfail(c, line, "dictsort: expected a mapping, got %s", jv_type_name(v));
        jv *cs = ARG(0, "case_sensitive"), *by = ARG(1, "by"), *rev = ARG(2, "reverse");
        bool by_value = by && by->k == JK_STR && !strcmp(by->u.s.p, "value");
        jv *pos = jv_int(c, by_value ? 1 : 0);
        return sorted(r, line, items_of(r, v), rev && jv_truthy(rev), cs && jv_truthy(cs), pos);
    }
    if (!strcmp(name, "list")) {
        jv *items = jiter_list(r, line, v), *l = jv_list(c, items->u.l.n);
        for (size_t i = 0; i < items->u.l.n; i++) jv_list_push(c, l, items->u.l.v[i]);
        return l;
    }
    if (!strcmp(name, "selectattr")) return select_impl(r, line, v, a, na, true, true);
    if (!strcmp(name, "rejectattr")) return select_impl(r, line, v, a, na, true, false);
    if (!strcmp(name, "select")) return select_impl(r, line, v, a, na, false, true);
    if (!strcmp(name, "reject")) return select_impl(r, line, v, a, na, false, false);
    if (!strcmp(name, "map")) {
        jv *items = jv_truthy(v) ? jiter_list(r, line, v) : jv_list(c, 0);
        jv *out = jv_gen(c, jv_list(c, items->u.l.n));
        jv *attr = ARG(99, "attribute"), *dflt = ARG(99, "default");
        for (size_t i = 0; i < items->u.l.n; i++) {
            jv *x = items->u.l.v[i];
            if (attr) {
                x = attr_path(r, line, x, attr);
                if (x->k == JK_UNDEF && dflt) x = dflt;
            } else {
                if (!na) jfail(c, line, "map needs a filter name or attribute=");
                x = jfilter(r, line, need_str(r, line, a[0], "map")->u.s.p, x, a + 1, na - 1, NULL, NULL, 0);
            }
            jv_list_push(c, out, x);
        }
        return out;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jv *items = jiter_list(r, line, v);
        if (!items->u.l.n) return jv_undef(c, NULL);
        return items->u.l.v[name[0] == 'f' ? 0 : items->u.l.n - 1];
    }
    if (!strcmp(name, "reverse")) {
        if (v->k == JK_STR) {
            jv *out;
            jsb b;
            jsb_init(&b, c, 0);
            for (size_t e = v->u.s.n; e > 0;) {
                size_t l = u8_back(v->u.s.p, e);
                jsb_put(&b, v->u.s.p + e - l, l, v->u.s.t ? v->u.s.t + e - l : NULL);
                e -= l;
            }
            out = jsb_take(&b);
            return out;
        }
        jv *items = jiter_list(r, line, v), *l = jv_list(c, items->u.l.n);
        for (size_t i = items->u.l.n; i-- > 0;) jv_list_push(c, l, items->u.l.v[i]);
        return jv_gen(c, l);   /* reversed(): an iterator */
    }
    if (!strcmp(name, "sort")) {
        jv *rev = ARG(0, "reverse"), *cs = ARG(1, "case_sensitive"), *attr = ARG(2, "attribute");
        return sorted(r, line, v, rev && jv_truthy(rev), cs && jv_truthy(cs), attr);
    }
    if (!strcmp(name, "unique")) {
        jv *cs = ARG(0, "case_sensitive"), *attr = ARG(1, "attribute");
        jv *items = jiter_list(r, line, v), *out = jv_list(c, 0), *seen = jv_list(c, 0);
        for (size_t i = 0; i < items->u.l.n; i++) {
            jv *k = sort_key(r, line, items->u.l.v[i], attr, cs && jv_truthy(cs));
            bool dup = false;
            for (size_t j = 0; j < seen->u.l.n && !dup; j++) dup = jv_eq(seen->u.l.v[j], k);
            if (!dup) { jv_list_push(c, seen, k); jv_list_push(c, out, items->u.l.v[i]); }
        }
        return jv_gen(c, out);
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        jv *cs = ARG(0, "case_sensitive"), *attr = ARG(1, "attribute");
        jv *items = jiter_list(r, line, v);
        if (!items->u.l.n) return jv_undef(c, NULL);
        jv *best = items->u.l.v[0], *bk = sort_key(r, line, best, attr, cs && jv_truthy(cs));
        for (size_t i = 1; i < items->u.l.n; i++) {
            jv *k = sort_key(r, line, items->u.l.v[i], attr, cs && jv_truthy(cs));
            int cmp = jv_cmp(c, line, k, bk);
            if (name[1] == 'i' ? cmp < 0 : cmp > 0) { best = items->u.l.v[i]; bk = k; }
        }
        return best;
    }
    if (!strcmp(name, "indent")) {
        jv *w = ARG(0, "width"), *f = ARG(1, "first"), *bl = ARG(2, "blank");
        return indent(r, sstr(r, v), w, f && jv_truthy(f), bl && jv_truthy(bl));
    }
    if (!strcmp(name, "int")) {
        jv *dflt = ARG(0, "default");
        if (v->k == JK_INT) return v;
        if (v->k == JK_BOOL) return jv_int(c, v->u.b);
        if (v->k == JK_FLOAT && isfinite(v->u.f)) return jv_int(c, (int64_t)v->u.f);
        if (v->k == JK_STR) {
            jv *s = strip(r, v, NULL, true, true);
            char *end;
            long long x = strtoll(s->u.s.p, &end, 10);
            if (s->u.s.n && !*end) return jv_int(c, x);
            double f = strtod(s->u.s.p, &end);
            if (s->u.s.n && !*end && isfinite(f)) return jv_int(c, (int64_t)f);
        }
        return dflt ? dflt : jv_int(c, 0);
    }
    if (!strcmp(name, "float")) {
        jv *dflt = ARG(0, "default");
        if (v->k == JK_FLOAT) return v;
        if (v->k == JK_INT || v->k == JK_BOOL) return jv_float(c, jv_num(v));
        if (v->k == JK_STR) {
            char *end;
            double f = strtod(v->u.s.p, &end);
            if (v->u.s.n && !*end) return jv_float(c, f);
        }
        return dflt ? dflt : jv_float(c, 0.0);
    }
    if (!strcmp(name, "abs")) {
        if (v->k == JK_INT) return jv_int(c, v->u.i < 0 ? -v->u.i : v->u.i);
        if (v->k == JK_FLOAT) return jv_float(c, fabs(v->u.f));
        if (v->k == JK_BOOL) return jv_int(c, v->u.b);
        jfail(c, line, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (!strcmp(name, "round")) {
        int64_t prec = int_arg(r, line, ARG(0, "precision"), 0, "round");
        jv *m = ARG(1, "method");
        if (!jv_is_num(v)) jfail(c, line, "round: expected a number, got %s", jv_type_name(v));
        double x = jv_num(v), p = pow(10.0, (double)prec);
        const char *meth = m && m->k == JK_STR ? m->u.s.p : "common";
        double y = !strcmp(meth, "ceil") ? ceil(x * p) / p : !strcmp(meth, "floor") ? floor(x * p) / p
                 : nearbyint(x * p) / p;   /* Python's round: half to even */
        return jv_float(c, y);
    }
    if (!strcmp(name, "wordcount")) {
        jv *words = split(r, sstr(r, v), NULL, -1, false);
        return jv_int(c, (int64_t)words->u.l.n);
    }
    if (!strcmp(name, "sum")) {
        jv *attr = ARG(0, "attribute"), *start = ARG(1, "start");
        jv *items = jiter_list(r, line, v), *acc = start ? start : jv_int(c, 0);
        for (size_t i = 0; i < items->u.l.n; i++) {
            jv *x = attr ? attr_path(r, line, items->u.l.v[i], attr) : items->u.l.v[i];
            if (!jv_is_num(x) || !jv_is_num(acc)) jfail(c, line, "sum: expected numbers");
            acc = acc->k == JK_FLOAT || x->k == JK_FLOAT ? jv_float(c, jv_num(acc) + jv_num(x))
                                                         : jv_int(c, (int64_t)jv_num(acc) + (int64_t)jv_num(x));
        }
        return acc;
    }
    if (!strcmp(name, "batch")) {
        int64_t size = int_arg(r, line, ARG(0, "linecount"), 0, "batch");
        if (size <= 0) jfail(c, line, "batch: size must be positive");
        jv *fill = ARG(1, "fill_with");
        jv *items = jiter_list(r, line, v), *out = jv_list(c, 0), *cur = NULL;
        for (size_t i = 0; i < items->u.l.n; i++) {
            if (!cur || cur->u.l.n == (size_t)size) { cur = jv_list(c, 0); jv_list_push(c, out, cur); }
            jv_list_push(c, cur, items->u.l.v[i]);
        }
        if (cur && fill) while (cur->u.l.n < (size_t)size) jv_list_push(c, cur, fill);
        return jv_gen(c, out);
    }
#undef ARG
    jfail(c, line, "no filter named '%s'", name);
}

/* ---------------------------------------------------------------- globals */

enum { B_RANGE, B_NAMESPACE, B_DICT, B_RAISE, B_STRFTIME, B_COUNT };
static const char *const builtin_names[B_COUNT] = {
    "range", "namespace", "dict", "raise_exception", "strftime_now" };

int jbuiltin_id(const char *name)
{
    for (int i = 0; i < B_COUNT; i++)
        if (!strcmp(builtin_names[i], name)) return i;
    return -1;
}

jv *jbuiltin_call(jrender *r, int line, int id, jv **a, size_t na, const char **kwn, jv **kwv, size_t nkw)
{
    jctx *c = C;
    switch (id) {
    case B_RANGE: {
        if (!na || na > 3) jfail(c, line, "range expected 1 to 3 arguments, got %zu", na);
        int64_t lo = 0, hi, st = 1;
        if (na == 1) hi = int_arg(r, line, a[0], 0, "range");
        else { lo = int_arg(r, line, a[0], 0, "range"); hi = int_arg(r, line, a[1], 0, "range"); }
        if (na == 3) st = int_arg(r, line, a[2], 0, "range");
        if (!st) jfail(c, line, "range() arg 3 must not be zero");
        int64_t n = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
        if (n > 1000000) jfail(c, line, "range of %" PRId64 " items is over the limit of 1000000", n);
        jv *l = jv_list(c, (size_t)n);
        for (int64_t i = 0; i < n; i++) jv_list_push(c, l, jv_int(c, lo + i * st));
        return l;
    }
    case B_NAMESPACE: case B_DICT: {
        jv *d = jv_dict(c);
        d->u.d.ns = id == B_NAMESPACE;
        for (size_t i = 0; i < na; i++) {
            if (a[i]->k != JK_DICT || a[i]->u.d.ns)
                jfail(c, line, "%s() takes a mapping as positional argument", builtin_names[id]);
            for (size_t k = 0; k < a[i]->u.d.n; k++) jv_dict_set(c, d, a[i]->u.d.key[k], a[i]->u.d.val[k]);
        }
        for (size_t k = 0; k < nkw; k++) jv_dict_set(c, d, jv_cstr(c, kwn[k]), kwv[k]);
        return d;
    }
    case B_RAISE: {
        jv *msg = na ? jv_to_str(c, a[0]) : jv_cstr(c, "");
        jfail(c, line, "raise_exception: %.*s", (int)KVC_MIN(msg->u.s.n, 300), msg->u.s.p);
    }
    case B_STRFTIME: {
        if (na != 1 || a[0]->k != JK_STR) jfail(c, line, "strftime_now takes one format string");
        time_t now = (time_t)jrender_now(r);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        size_t n = strftime(buf, sizeof(buf), a[0]->u.s.p, &tm);
        return jv_str(c, buf, n, NULL);
    }
    }
    jfail(c, line, "internal error: builtin %d", id);
}
