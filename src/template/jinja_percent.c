/* jinja_percent.c - Python's printf-style string formatting, `fmt % args`
 * (the % operator on a string, and Jinja's |format filter), as CPython's
 * PyUnicode_Format does it: %[(key)][flags][width][.precision][length]type
 * with the types s r a c d i u o x X e E f F g G and %%.
 *
 * Caller text keeps its marks through the formatting (a %s of message content
 * is still content), so formatting cannot turn data into template markup. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "jinja_internal.h"

#define MAX_WIDTH (1 << 20)   /* width and precision: more is a hostile template */

typedef struct spec {
    bool   left, zero, plus, space, alt;
    long   width, prec;       /* prec -1 = none */
    char   type;
} spec;

/* Pad the finished field f (cps code points) to the spec's width into b:
 * spaces on the left (or right with '-'); zeros after the sign and prefix
 * (head bytes of f) for a number with '0'. */
static void put_field(jsb *b, const spec *s, jv *f, size_t cps, size_t head, bool number)
{
    size_t pad = s->width > 0 && (size_t)s->width > cps ? (size_t)s->width - cps : 0;
    const char *p = f->u.s.p;
    const uint8_t *t = f->u.s.t;
    if (s->left) {
        jsb_put(b, p, f->u.s.n, t);
        for (size_t i = 0; i < pad; i++) jsb_putc(b, ' ');
        return;
    }
    if (number && s->zero) {
        jsb_put(b, p, head, t);
        for (size_t i = 0; i < pad; i++) jsb_putc(b, '0');
        jsb_put(b, p + head, f->u.s.n - head, t ? t + head : NULL);
        return;
    }
    for (size_t i = 0; i < pad; i++) jsb_putc(b, ' ');
    jsb_put(b, p, f->u.s.n, t);
}

/* A number's field: sign, prefix, digits (untainted). */
static void put_number(jctx *c, jsb *b, const spec *s, bool neg, const char *prefix,
                       const char *digits)
{
    jsb f;
    jsb_init(&f, c, 0);
    jsb_puts(&f, neg ? "-" : s->plus ? "+" : s->space ? " " : "");
    jsb_puts(&f, prefix);
    size_t head = f.n;
    jsb_puts(&f, digits);
    jv *v = jsb_take(&f);
    put_field(b, s, v, v->u.s.n, head, true);
}

static void put_int(jrender *r, int line, jsb *b, const spec *s, const jv *v)
{
    jctx *c = jrender_ctx(r);
    bool integral = s->type == 'd' || s->type == 'i' || s->type == 'u';
    int64_t i;
    if (v->k == JK_INT) i = v->u.i;
    else if (v->k == JK_BOOL) i = v->u.b;
    else if (v->k == JK_FLOAT && integral) {
        if (!isfinite(v->u.f) || fabs(v->u.f) >= 9.2e18)
            jfail(c, line, "%%%c format: cannot convert float %g to an integer", s->type, v->u.f);
        i = (int64_t)v->u.f;                 /* int() truncates */
    } else if (integral) {
        jfail(c, line, "%%%c format: a real number is required, not %s", s->type, jv_type_name(v));
    } else {
        jfail(c, line, "%%%c format: an integer is required, not %s", s->type, jv_type_name(v));
    }
    uint64_t m = i < 0 ? (uint64_t)0 - (uint64_t)i : (uint64_t)i;
    char dig[32];
    const char *conv = s->type == 'o' ? "%llo" : s->type == 'x' ? "%llx" : s->type == 'X' ? "%llX"
                     : "%llu";
    int nd = snprintf(dig, sizeof(dig), conv, (unsigned long long)m);
    jsb d;
    jsb_init(&d, c, 0);
    for (long k = nd; k < s->prec; k++) jsb_putc(&d, '0');   /* precision: at least so many digits */
    jsb_puts(&d, dig);
    const char *prefix = !s->alt ? "" : s->type == 'o' ? "0o" : s->type == 'x' ? "0x"
                       : s->type == 'X' ? "0X" : "";
    put_number(c, b, s, i < 0, prefix, jsb_take(&d)->u.s.p);
}

static void put_float(jrender *r, int line, jsb *b, const spec *s, const jv *v)
{
    jctx *c = jrender_ctx(r);
    if (!jv_is_num(v))
        jfail(c, line, "must be real number, not %s", jv_type_name(v));
    double x = jv_num(v);
    char conv[8], dig[400];
    snprintf(conv, sizeof(conv), "%%%s.*%c", s->alt ? "#" : "", s->type);
    int prec = s->prec < 0 ? 6 : (int)s->prec;
    if (fabs(x) >= 1e300 && isfinite(x) && (s->type == 'f' || s->type == 'F') && prec > 0)
        prec = 0;                            /* stay inside dig; such numbers print no fraction anyway */
    int nd = snprintf(dig, sizeof(dig), conv, prec, fabs(x));
    if (nd < 0 || nd >= (int)sizeof(dig))
        jfail(c, line, "%%%c format: precision %d too large", s->type, prec);
    put_number(c, b, s, signbit(x) && !isnan(x), "", dig);
}

/* A string field: str(v), repr(v) or a character, cut to the precision and
 * padded to the width in code points; marks kept. */
static void put_text(jrender *r, int line, jsb *b, const spec *s, const jv *v)
{
    jctx *c = jrender_ctx(r);
    jsb f;
    jsb_init(&f, c, 0);
    if (s->type == 's') {
        jv_write_str(c, &f, v);
    } else if (s->type == 'r' || s->type == 'a') {
        jv_write_repr(c, &f, v);
    } else {                                  /* 'c' */
        if (v->k == JK_STR) {
            if (ju8_len(v->u.s.p, v->u.s.n) != 1) jfail(c, line, "%%c requires int or char");
            jsb_put(&f, v->u.s.p, v->u.s.n, v->u.s.t);
        } else if (v->k == JK_INT || v->k == JK_BOOL) {
            int64_t cp = v->k == JK_INT ? v->u.i : v->u.b;
            char o[4];
            if (cp < 0 || cp > 0x10FFFF) jfail(c, line, "%%c arg not in range(0x110000)");
            jsb_put(&f, o, ju8_put(o, (unsigned)cp), NULL);
        } else {
            jfail(c, line, "%%c requires int or char");
        }
    }
    jv *t = jsb_take(&f);
    size_t cps = ju8_len(t->u.s.p, t->u.s.n);
    if (s->prec >= 0 && (size_t)s->prec < cps) {
        t = jv_str(c, t->u.s.p, ju8_off(t->u.s.p, t->u.s.n, (size_t)s->prec), t->u.s.t);
        cps = (size_t)s->prec;
    }
    put_field(b, s, t, cps, 0, false);
}

/* The next positional argument (args[*next], *next advanced). */
static jv *next_arg(jctx *c, int line, jv **args, size_t nargs, size_t *next)
{
    if (*next >= nargs) jfail(c, line, "not enough arguments for format string");
    return args[(*next)++];
}

/* A width or precision: digits, or '*' taking an int argument. */
static long read_num(jctx *c, int line, const char *p, size_t n, size_t *i, jv **args,
                     size_t nargs, size_t *next, bool *star)
{
    long v = 0;
    *star = false;
    if (*i < n && p[*i] == '*') {
        (*i)++;
        *star = true;
        jv *a = next_arg(c, line, args, nargs, next);
        if (a->k != JK_INT && a->k != JK_BOOL) jfail(c, line, "* wants int");
        int64_t x = a->k == JK_INT ? a->u.i : a->u.b;
        if (x > MAX_WIDTH || x < -MAX_WIDTH) jfail(c, line, "format: width over %d", MAX_WIDTH);
        return (long)x;
    }
    while (*i < n && p[*i] >= '0' && p[*i] <= '9') {
        v = v * 10 + (p[(*i)++] - '0');
        if (v > MAX_WIDTH) jfail(c, line, "format: width or precision over %d", MAX_WIDTH);
    }
    return v;
}

jv *jinja_percent_format(jrender *r, int line, jv *fmt, jv *operand)
{
    jctx *c = jrender_ctx(r);
    /* a tuple gives the arguments; a mapping serves %(key)s and, as one
     * argument, plain specs; anything else is the one argument */
    bool tuple = operand->k == JK_LIST && operand->u.l.tuple;
    jv *map = operand->k == JK_DICT && !operand->u.d.ns ? operand : NULL;
    jv **args = tuple ? operand->u.l.v : &operand;
    size_t nargs = tuple ? operand->u.l.n : 1, next = 0;
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n;
    jsb b;
    jsb_init(&b, c, 0);
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            jsb_put(&b, p + i, 1, fmt->u.s.t ? fmt->u.s.t + i : NULL);
            continue;
        }
        i++;
        jv *v = NULL;
        if (i < n && p[i] == '(') {           /* %(key)s */
            if (!map) jfail(c, line, "format requires a mapping");
            size_t depth = 1, k0 = ++i;
            for (; i < n && depth; i++)
                depth += p[i] == '(' ? 1 : p[i] == ')' ? -1 : 0;
            if (depth) jfail(c, line, "incomplete format key");
            v = jv_dict_get(map, jv_str(c, p + k0, i - 1 - k0, NULL));
            if (!v) jfail(c, line, "format: no key '%.*s'", (int)(i - 1 - k0), p + k0);
        }
        spec s = { .prec = -1 };
        for (; i < n && strchr("-+ #0", p[i]) && p[i]; i++) {
            s.left |= p[i] == '-';
            s.plus |= p[i] == '+';
            s.space |= p[i] == ' ';
            s.alt |= p[i] == '#';
            s.zero |= p[i] == '0';
        }
        bool star;
        s.width = read_num(c, line, p, n, &i, args, nargs, &next, &star);
        if (s.width < 0) {                    /* a negative * width: left-justified */
            s.left = true;
            s.width = -s.width;
        }
        if (i < n && p[i] == '.') {
            i++;
            s.prec = read_num(c, line, p, n, &i, args, nargs, &next, &star);
            if (s.prec < 0) s.prec = 0;
        }
        while (i < n && (p[i] == 'h' || p[i] == 'l' || p[i] == 'L')) i++;
        if (i >= n) jfail(c, line, "incomplete format");
        s.type = p[i];
        if (s.type == '%') {
            jsb_putc(&b, '%');
            continue;
        }
        if (!strchr("sracdiuoxXeEfFgG", s.type) || !s.type)
            jfail(c, line, "unsupported format character '%c' (0x%x) at index %zu",
                  (unsigned char)s.type >= 0x20 && (unsigned char)s.type < 0x7f ? s.type : '?',
                  (unsigned char)s.type, ju8_len(p, i));
        if (!v) v = next_arg(c, line, args, nargs, &next);
        switch (s.type) {
        case 's': case 'r': case 'a': case 'c': put_text(r, line, &b, &s, v); break;
        case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': put_float(r, line, &b, &s, v); break;
        default: put_int(r, line, &b, &s, v); break;
        }
    }
    if (next < nargs && !map)
        jfail(c, line, "not all arguments converted during string formatting");
    return jsb_take(&b);   /* a plain str: Markup's % (escaping its arguments) is not modelled */
}
