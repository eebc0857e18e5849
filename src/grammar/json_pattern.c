/* json_pattern.c - a JSON schema "pattern" (a regex subset) as a grammar
 * expression for a JSON string's content.
 *
 * Supported: literal characters, ".", classes [...] and [^...] with ranges,
 * \d \w \s \D \W \S (in and out of classes; \s produces only a space), escaped
 * metacharacters, \n \t \r \uHHHH, groups ( ) and (?: ), alternation |,
 * quantifiers * + ? {m} {m,} {m,n} (lazy forms read as greedy), ^ at the
 * start and $ at the end. Anything else (backreferences, lookaround, \b,
 * named groups, flags) is an error naming it. */
#include "grammar_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RE_DEPTH = 50, MAX_RE_COUNT = 10000, MAX_CLASS = 256 };

typedef struct re {
    const char *p;
    gsbuf      *out;
    kvc_err    *err;
    int         status;
    int         depth;
} re;

static int re_fail(re *r, const char *what)
{
    if (r->status == KVC_OK)
        r->status = kvc_fail(r->err, KVC_ERR_INVALID_ARG, "pattern: %s", what);
    return r->status;
}

/* ---------------------------------------------------------------- classes */

typedef struct crange {
    uint32_t lo, hi;
} crange;

typedef struct cset {
    crange r[MAX_CLASS];
    int    n;
    bool   full;                  /* too many ranges */
} cset;

static void cset_add(cset *s, uint32_t lo, uint32_t hi)
{
    if (s->n == MAX_CLASS) {
        s->full = true;
        return;
    }
    s->r[s->n++] = (crange){ lo, hi };
}

static int cmp_crange(const void *a, const void *b)
{
    const crange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void cset_normalize(cset *s)
{
    qsort(s->r, (size_t)s->n, sizeof(*s->r), cmp_crange);
    int k = 0;
    for (int i = 0; i < s->n; i++) {
        if (k && s->r[i].lo <= s->r[k - 1].hi + 1) {
            if (s->r[i].hi > s->r[k - 1].hi)
                s->r[k - 1].hi = s->r[i].hi;
        } else {
            s->r[k++] = s->r[i];
        }
    }
    s->n = k;
}

static void cset_complement(cset *s)
{
    cset_normalize(s);
    cset c = { .n = 0 };
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next)
            cset_add(&c, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= KVC_MAX_CP)
        cset_add(&c, next, KVC_MAX_CP);
    c.full |= s->full;
    *s = c;
}

/* Remove what JSON must escape: controls, '"' and '\'. */
static void cset_json_safe(cset *s)
{
    cset_normalize(s);
    cset out = { .n = 0 };
    static const crange cut[] = { { 0, 0x1f }, { '"', '"' }, { '\\', '\\' } };
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i].lo, hi = s->r[i].hi;
        /* cut is sorted and disjoint: walk it left to right */
        for (size_t k = 0; k < KVC_ARRAY_LEN(cut) && lo <= hi; k++) {
            if (cut[k].hi < lo || cut[k].lo > hi)
                continue;
            if (cut[k].lo > lo)
                cset_add(&out, lo, cut[k].lo - 1);
            lo = cut[k].hi + 1;
        }
        if (lo <= hi)
            cset_add(&out, lo, hi);
    }
    out.full |= s->full;
    *s = out;
}

static void put_cp(gsbuf *o, uint32_t cp)
{
    if (cp <= 0xFFFF)
        gsb_printf(o, "\\u%04X", cp);
    else
        gsb_printf(o, "\\U%08X", cp);
}

static int emit_class(re *r, cset *s)
{
    cset_json_safe(s);
    if (s->full)
        return re_fail(r, "character class too large");
    if (s->n == 0)
        return re_fail(r, "a class that matches only characters JSON escapes");
    gsb_puts(r->out, "[");
    for (int i = 0; i < s->n; i++) {
        put_cp(r->out, s->r[i].lo);
        if (s->r[i].hi != s->r[i].lo) {
            gsb_puts(r->out, "-");
            put_cp(r->out, s->r[i].hi);
        }
    }
    gsb_puts(r->out, "]");
    return KVC_OK;
}

/* \d \w \s and their negations into s; false if e is not one of them. */
static bool shorthand(cset *s, char e)
{
    cset t = { .n = 0 };
    switch (e | 0x20) {
    case 'd':
        cset_add(&t, '0', '9');
        break;
    case 'w':
        cset_add(&t, '0', '9'), cset_add(&t, 'A', 'Z'), cset_add(&t, '_', '_'), cset_add(&t, 'a', 'z');
        break;
    case 's':
        cset_add(&t, ' ', ' ');
        break;
    default:
        return false;
    }
    if (e >= 'A' && e <= 'Z')
        cset_complement(&t);
    for (int i = 0; i < t.n; i++)
        cset_add(s, t.r[i].lo, t.r[i].hi);
    return true;
}

/* One UTF-8 character at r->p (advanced). */
static bool utf8_char(re *r, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)r->p;
    int n = s[0] < 0x80 ? 0 : s[0] >= 0xC2 && s[0] <= 0xDF ? 1 : s[0] >= 0xE0 && s[0] <= 0xEF ? 2
          : s[0] >= 0xF0 && s[0] <= 0xF4 ? 3 : -1;
    if (n < 0)
        return re_fail(r, "invalid UTF-8"), false;
    uint32_t c = n ? s[0] & (0x3Fu >> n) : s[0];
    for (int i = 1; i <= n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return re_fail(r, "invalid UTF-8"), false;
        c = c << 6 | (s[i] & 0x3F);
    }
    r->p += n + 1;
    *cp = c;
    return true;
}

/* An escape after '\' in or out of a class, as one code point. */
static bool escape_char(re *r, uint32_t *cp)
{
    char e = *r->p;
    if (e == 'n' || e == 't' || e == 'r' || e == 'f' || e == 'v') {
        *cp = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'f' ? '\f' : '\v';
        r->p++;
        return true;
    }
    if (e == 'u') {
        uint32_t v = 0;
        for (int i = 1; i <= 4; i++) {
            char h = r->p[i];
            int d = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
            if (d < 0)
                return re_fail(r, "bad \\u escape"), false;
            v = v << 4 | (uint32_t)d;
        }
        r->p += 5;
        *cp = v;
        return true;
    }
    if (e && strchr(".*+?()[]{}|^$\\/-", e)) {
        *cp = (uint8_t)e;
        r->p++;
        return true;
    }
    char msg[64];
    snprintf(msg, sizeof(msg), "escape \\%c not supported", e ? e : '0');
    re_fail(r, msg);
    return false;
}

/* [...] after the '['. */
static int parse_class(re *r)
{
    cset s = { .n = 0 };
    bool negate = *r->p == '^';
    r->p += negate;
    bool first = true;
    while (*r->p && (*r->p != ']' || first)) {
        first = false;
        uint32_t lo, hi;
        if (*r->p == '\\') {
            r->p++;
            if (shorthand(&s, *r->p)) {
                r->p++;
                continue;
            }
            if (!escape_char(r, &lo))
                return r->status;
        } else if (*r->p == '[' && r->p[1] == ':') {
            return re_fail(r, "POSIX classes [:name:] not supported");
        } else if (!utf8_char(r, &lo)) {
            return r->status;
        }
        hi = lo;
        if (r->p[0] == '-' && r->p[1] && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                if (!escape_char(r, &hi))
                    return r->status;
            } else if (!utf8_char(r, &hi)) {
                return r->status;
            }
            if (hi < lo)
                return re_fail(r, "class range out of order");
        }
        cset_add(&s, lo, hi);
    }
    if (*r->p != ']')
        return re_fail(r, "unterminated class");
    r->p++;
    if (negate)
        cset_complement(&s);
    return emit_class(r, &s);
}

/* ---------------------------------------------------------------- structure */

/* A literal code point: JSON-escaped where JSON needs it. */
static void emit_literal_cp(re *r, uint32_t cp)
{
    char buf[8];
    size_t n;
    if (cp == '"' || cp == '\\') {
        buf[0] = '\\', buf[1] = (char)cp, n = 2;
    } else if (cp < 0x20) {
        n = (size_t)snprintf(buf, sizeof(buf), "\\u%04x", cp);
        if (cp == '\n' || cp == '\t' || cp == '\r')
            n = 2, buf[0] = '\\', buf[1] = cp == '\n' ? 'n' : cp == '\t' ? 't' : 'r';
    } else {
        gsb_puts(r->out, " [");
        put_cp(r->out, cp);              /* a one-character class */
        gsb_puts(r->out, "]");
        return;
    }
    gsb_puts(r->out, " ");
    gsb_literal(r->out, buf, n);
}

static int parse_alt(re *r, bool top);

static int parse_quant(re *r)
{
    char q = *r->p;
    if (q == '*' || q == '+' || q == '?') {
        gsb_put(r->out, &q, 1);
        r->p++;
    } else if (q == '{') {
        const char *s = r->p + 1;
        char *end;
        long m = strtol(s, &end, 10), n = m;
        if (end == s || m < 0 || m > MAX_RE_COUNT)
            return re_fail(r, "bad {m,n}");
        if (*end == ',') {
            s = end + 1;
            n = *s == '}' ? -1 : strtol(s, &end, 10);
            if (n != -1 && (end == s || n < m || n > MAX_RE_COUNT))
                return re_fail(r, "bad {m,n}");
            if (n == -1)
                end = (char *)s;
        }
        if (*end != '}')
            return re_fail(r, "bad {m,n}");
        if (n < 0)
            gsb_printf(r->out, "{%ld,}", m);
        else
            gsb_printf(r->out, "{%ld,%ld}", m, n);
        r->p = end + 1;
    } else {
        return KVC_OK;
    }
    if (*r->p == '?')
        r->p++;                          /* lazy: the same strings */
    if (*r->p == '*' || *r->p == '+' || *r->p == '?' || *r->p == '{')
        return re_fail(r, "a quantifier on a quantifier");
    return KVC_OK;
}

/* One atom and its quantifier. The atom is written as one GBNF item. */
static int parse_atom(re *r)
{
    char c = *r->p;
    if (c == '(') {
        r->p++;
        if (*r->p == '?') {
            if (r->p[1] != ':')
                return re_fail(r, "(?...) other than (?:...) not supported");
            r->p += 2;
        }
        if (++r->depth > MAX_RE_DEPTH)
            return re_fail(r, "groups nested too deep");
        gsb_puts(r->out, " (");
        if (parse_alt(r, false) != KVC_OK)
            return r->status;
        if (*r->p != ')')
            return re_fail(r, "unbalanced parenthesis");
        r->p++;
        r->depth--;
        gsb_puts(r->out, " )");
    } else if (c == '[') {
        r->p++;
        gsb_puts(r->out, " ");
        if (parse_class(r) != KVC_OK)
            return r->status;
    } else if (c == '.') {
        r->p++;
        gsb_puts(r->out, " [^" GRAM_JSON_CHAR_EXCL "]");
    } else if (c == '\\') {
        r->p++;
        cset s = { .n = 0 };
        uint32_t cp;
        if (shorthand(&s, *r->p)) {
            r->p++;
            gsb_puts(r->out, " ");
            if (emit_class(r, &s) != KVC_OK)
                return r->status;
        } else if (*r->p >= '0' && *r->p <= '9') {
            return re_fail(r, "backreferences not supported");
        } else if (*r->p == 'b' || *r->p == 'B') {
            return re_fail(r, "word boundaries \\b not supported");
        } else if (!escape_char(r, &cp)) {
            return r->status;
        } else {
            emit_literal_cp(r, cp);
        }
    } else if (c == '^' || c == '$') {
        return re_fail(r, "^ or $ inside the pattern (only at its ends)");
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return re_fail(r, "a quantifier with nothing before it");
    } else {
        uint32_t cp;
        if (!utf8_char(r, &cp))
            return r->status;
        emit_literal_cp(r, cp);
    }
    return parse_quant(r);
}

/* Alternatives up to ')' (or the end, or a final '$' when top). */
static int parse_alt(re *r, bool top)
{
    for (;;) {
        bool empty = true;
        while (*r->p && *r->p != '|' && *r->p != ')' && !(top && r->p[0] == '$' && !r->p[1])) {
            if (parse_atom(r) != KVC_OK)
                return r->status;
            empty = false;
        }
        if (empty)
            gsb_puts(r->out, " \"\"");
        if (*r->p != '|')
            return KVC_OK;
        r->p++;
        gsb_puts(r->out, " |");
    }
}

int gram_pattern_to_gbnf(const char *pattern, gsbuf *expr, kvc_err *err)
{
    re r = { .p = pattern, .out = expr, .err = err };
    bool start = *r.p == '^';
    r.p += start;
    if (!start)
        gsb_puts(expr, "[^" GRAM_JSON_CHAR_EXCL "]*");
    gsb_puts(expr, " (");
    if (parse_alt(&r, true) != KVC_OK)
        return r.status;
    if (*r.p == ')')
        return re_fail(&r, "unbalanced parenthesis");
    bool end = *r.p == '$';
    gsb_puts(expr, " )");
    if (!end)
        gsb_puts(expr, " [^" GRAM_JSON_CHAR_EXCL "]*");
    return KVC_OK;
}
