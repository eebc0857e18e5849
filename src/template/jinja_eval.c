/* jinja_eval.c - runs a parsed template: scopes, statements, expressions
 * with Python's semantics, Jinja's attribute and item lookup, macros, and
 * the compile/render entry points. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja.h"
#include "jinja_internal.h"

struct jinja_template {
    jarena  arena;
    jnode **body;
    size_t  nbody;
};

/* A scope: the root (template level), a for loop, a macro call. Lookup
 * walks outwards; `set` writes to the innermost. A macro's scope has the
 * root as parent: a macro sees its arguments and the template's variables,
 * not its caller's loop variables. */
struct jframe {
    jframe *parent;
    jv     *vars;          /* a dict */
};

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

struct jrender {
    jctx     c;
    jframe  *root;
    jframe  *frame;         /* the scope names are looked up in now */
    jsb     *out;
    jv      *block_value;   /* the text a {% filter %} or block set's filters apply to */
    int      ctl;
    int      call_depth;
    uint64_t iterations;
    jinja_limits lim;
};

jctx *jrender_ctx(jrender *r) { return &r->c; }

/* ---------------------------------------------------------------- scopes */

static jv *lookup(jrender *r, jframe *f, const char *name)
{
    for (; f; f = f->parent) {
        jv *v = jv_dict_gets(f->vars, name);
        if (v)
            return v;
    }
    int id = jbuiltin_id(name);
    if (id >= 0) {
        jv *v = jalloc(&r->c, sizeof(jv));
        v->k = JK_BUILTIN;
        v->u.builtin = id;
        return v;
    }
    return jv_undef(&r->c, name);
}

static void assign(jrender *r, jframe *f, const char *name, jv *v)
{
    jv_dict_set(&r->c, f->vars, jv_strref(&r->c, name), v);   /* names live in the tree */
}

static jframe *new_frame(jrender *r, jframe *parent)
{
    jframe *f = jalloc(&r->c, sizeof(jframe));
    f->parent = parent;
    f->vars = jv_dict(&r->c);
    return f;
}

/* Unpack v into names (for a, b in ... / set a, b = ...). */
static void assign_targets(jrender *r, int line, jframe *f, const char **names, size_t n, jv *v)
{
    if (n == 1) {
        assign(r, f, names[0], v);
        return;
    }
    jv *items = jiter_list(r, line, v);
    if (items->u.l.n != n)
        jfail(&r->c, line, "cannot unpack %zu values into %zu names", items->u.l.n, n);
    for (size_t i = 0; i < n; i++)
        assign(r, f, names[i], items->u.l.v[i]);
}

/* ---------------------------------------------------------------- lookup */

static const char *undef_name(const jv *v) { return v->u.undef ? v->u.undef : "value"; }

_Noreturn static void fail_undef(jrender *r, int line, const jv *v)
{
    jfail(&r->c, line, "'%s' is undefined", undef_name(v));
}

static jv *method_value(jrender *r, jv *self, const char *name)
{
    jv *m = jalloc(&r->c, sizeof(jv));
    m->k = JK_METHOD;
    m->u.m.self = self;
    m->u.m.name = name;
    return m;
}

static jv *loop_attr(jrender *r, jv *lv, const char *name)
{
    struct jloop *L = lv->u.loop;
    size_t n = L->items->u.l.n, i = L->i;
    jctx *c = &r->c;
    if (!strcmp(name, "index"))     return jv_int(c, (int64_t)i + 1);
    if (!strcmp(name, "index0"))    return jv_int(c, (int64_t)i);
    if (!strcmp(name, "revindex"))  return jv_int(c, (int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return jv_int(c, (int64_t)(n - i - 1));
    if (!strcmp(name, "first"))     return JV_BOOL(i == 0);
    if (!strcmp(name, "last"))      return JV_BOOL(i + 1 == n);
    if (!strcmp(name, "length"))    return jv_int(c, (int64_t)n);
    if (!strcmp(name, "depth"))     return jv_int(c, L->depth0 + 1);
    if (!strcmp(name, "depth0"))    return jv_int(c, L->depth0);
    if (!strcmp(name, "previtem"))  return i > 0 ? L->items->u.l.v[i - 1] : jv_undef(c, "previtem");
    if (!strcmp(name, "nextitem"))  return i + 1 < n ? L->items->u.l.v[i + 1] : jv_undef(c, "nextitem");
    if (!strcmp(name, "cycle"))     return method_value(r, lv, "cycle");
    return jv_undef(c, name);
}

jv *jgetattr(jrender *r, int line, jv *obj, const char *name)
{
    switch (obj->k) {
    case JK_UNDEF:
        jfail(&r->c, line, "'%s' is undefined (reading its attribute '%s')", undef_name(obj), name);
    case JK_DICT:
        if (!obj->u.d.ns && jhas_method(obj, name))
            return method_value(r, obj, name);
        {
            jv *v = jv_dict_gets(obj, name);
            return v ? v : jv_undef(&r->c, name);
        }
    case JK_STR: case JK_LIST:
        if (jhas_method(obj, name))
            return method_value(r, obj, name);
        return jv_undef(&r->c, name);
    case JK_LOOP:
        return loop_attr(r, obj, name);
    default:
        return jv_undef(&r->c, name);
    }
}

static bool as_index(const jv *k, int64_t *i)
{
    if (k->k == JK_INT) { *i = k->u.i; return true; }
    if (k->k == JK_BOOL) { *i = k->u.b; return true; }
    return false;
}

jv *jgetitem(jrender *r, int line, jv *obj, jv *key)
{
    int64_t i;
    switch (obj->k) {
    case JK_UNDEF:
        fail_undef(r, line, obj);
    case JK_DICT: {
        if (obj->u.d.ns)
            break;
        jv *v = jv_dict_get(obj, key);
        if (v)
            return v;
        return key->k == JK_STR ? jgetattr(r, line, obj, key->u.s.p) : jv_undef(&r->c, NULL);
    }
    case JK_LIST:
        if (as_index(key, &i)) {
            int64_t n = (int64_t)obj->u.l.n;
            if (i < 0) i += n;
            return i >= 0 && i < n ? obj->u.l.v[i] : jv_undef(&r->c, NULL);
        }
        break;
    case JK_STR:
        if (as_index(key, &i)) {
            int64_t n = (int64_t)ju8_len(obj->u.s.p, obj->u.s.n);
            if (i < 0) i += n;
            if (i < 0 || i >= n)
                return jv_undef(&r->c, NULL);
            size_t a = ju8_off(obj->u.s.p, obj->u.s.n, (size_t)i);
            size_t b = ju8_off(obj->u.s.p, obj->u.s.n, (size_t)i + 1);
            return jv_str(&r->c, obj->u.s.p + a, b - a, obj->u.s.t ? obj->u.s.t + a : NULL);
        }
        break;
    default:
        break;
    }
    if (key->k == JK_STR)
        return jgetattr(r, line, obj, key->u.s.p);
    return jv_undef(&r->c, NULL);
}

jv *jiter_list(jrender *r, int line, jv *v)
{
    jctx *c = &r->c;
    switch (v->k) {
    case JK_LIST: return v;
    case JK_UNDEF: return jv_list(c, 0);
    case JK_DICT: {
        if (v->u.d.ns) break;
        jv *l = jv_list(c, v->u.d.n);
        for (size_t i = 0; i < v->u.d.n; i++)
            jv_list_push(c, l, v->u.d.key[i]);
        return l;
    }
    case JK_STR: {
        jv *l = jv_list(c, v->u.s.n);
        size_t off = 0;
        while (off < v->u.s.n) {
            size_t e = off + 1;
            while (e < v->u.s.n && ((unsigned char)v->u.s.p[e] & 0xC0) == 0x80) e++;
            jv_list_push(c, l, jv_str(c, v->u.s.p + off, e - off, v->u.s.t ? v->u.s.t + off : NULL));
            off = e;
        }
        return l;
    }
    default: break;
    }
    jfail(c, line, "'%s' object is not iterable", jv_type_name(v));
}

/* ---------------------------------------------------------------- operators */

static int64_t as_int(const jv *v) { return v->k == JK_BOOL ? v->u.b : v->u.i; }

/* markupsafe.escape() of a plain string added to a Markup one */
static void put_escaped(jsb *s, const jv *v)
{
    for (size_t i = 0; i < v->u.s.n; i++) {
        const char *e = NULL;
        switch (v->u.s.p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        }
        if (e)
            jsb_put_mark(s, e, strlen(e), v->u.s.t && v->u.s.t[i]);
        else
            jsb_put(s, v->u.s.p + i, 1, v->u.s.t ? v->u.s.t + i : NULL);
    }
}

/* str + str; Markup + str escapes the str and stays Markup (markupsafe) */
static jv *concat_str(jrender *r, jv *a, jv *b)
{
    bool safe = a->u.s.safe || b->u.s.safe;
    jsb s;
    jsb_init(&s, &r->c, 0);
    if (safe && !a->u.s.safe) put_escaped(&s, a);
    else jsb_put(&s, a->u.s.p, a->u.s.n, a->u.s.t);
    if (safe && !b->u.s.safe) put_escaped(&s, b);
    else jsb_put(&s, b->u.s.p, b->u.s.n, b->u.s.t);
    jv *v = jsb_take(&s);
    v->u.s.safe = safe;
    return v;
}

static int64_t floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static jv *binop(jrender *r, int line, int op, jv *a, jv *b)
{
    jctx *c = &r->c;
    if (op == JOP_MOD && a->k == JK_STR)     /* str % x: str(undefined) is '' there */
        return jinja_percent_format(r, line, a, b);
    if (a->k == JK_UNDEF) fail_undef(r, line, a);
    if (b->k == JK_UNDEF) fail_undef(r, line, b);
    static const char *const sym[] = { "+", "-", "*", "/", "//", "%", "**" };
    if (jv_is_num(a) && jv_is_num(b)) {
        bool fl = a->k == JK_FLOAT || b->k == JK_FLOAT;
        if (!fl) {
            int64_t x = as_int(a), y = as_int(b);
            switch (op) {
            case JOP_ADD: return jv_int(c, x + y);
            case JOP_SUB: return jv_int(c, x - y);
            case JOP_MUL: return jv_int(c, x * y);
            case JOP_DIV:
                if (!y) jfail(c, line, "division by zero");
                return jv_float(c, (double)x / (double)y);
            case JOP_FLOORDIV:
                if (!y) jfail(c, line, "integer division or modulo by zero");
                return jv_int(c, floordiv(x, y));
            case JOP_MOD:
                if (!y) jfail(c, line, "integer division or modulo by zero");
                return jv_int(c, x - floordiv(x, y) * y);
            case JOP_POW:
                if (y < 0) return jv_float(c, pow((double)x, (double)y));
                { int64_t p = 1; for (int64_t k = 0; k < y && k < 64; k++) p *= x; return jv_int(c, p); }
            }
        }
        double x = jv_num(a), y = jv_num(b);
        switch (op) {
        case JOP_ADD: return jv_float(c, x + y);
        case JOP_SUB: return jv_float(c, x - y);
        case JOP_MUL: return jv_float(c, x * y);
        case JOP_DIV:
            if (y == 0) jfail(c, line, "float division by zero");
            return jv_float(c, x / y);
        case JOP_FLOORDIV:
            if (y == 0) jfail(c, line, "float floor division by zero");
            return jv_float(c, floor(x / y));
        case JOP_MOD:
            if (y == 0) jfail(c, line, "float modulo");
            { double m = fmod(x, y); if (m != 0 && ((m < 0) != (y < 0))) m += y; return jv_float(c, m); }
        case JOP_POW: return jv_float(c, pow(x, y));
        }
    }
    if (op == JOP_ADD && a->k == JK_STR && b->k == JK_STR)
        return concat_str(r, a, b);
    if (op == JOP_ADD && a->k == JK_LIST && b->k == JK_LIST && a->u.l.tuple == b->u.l.tuple) {
        jv *l = jv_list(c, a->u.l.n + b->u.l.n);
        l->u.l.tuple = a->u.l.tuple;
        for (size_t i = 0; i < a->u.l.n; i++) jv_list_push(c, l, a->u.l.v[i]);
        for (size_t i = 0; i < b->u.l.n; i++) jv_list_push(c, l, b->u.l.v[i]);
        return l;
    }
    if (op == JOP_MUL && (a->k == JK_STR || a->k == JK_LIST || b->k == JK_STR || b->k == JK_LIST)) {
        jv *seq = a->k == JK_STR || a->k == JK_LIST ? a : b, *num = seq == a ? b : a;
        if (num->k == JK_INT || num->k == JK_BOOL) {
            int64_t k = as_int(num);
            if (seq->k == JK_STR) {
                if (k > 0 && seq->u.s.n && (uint64_t)k > r->lim.max_output / seq->u.s.n)
                    jfail(c, line, "string repetition longer than the output limit");
                jsb s;
                jsb_init(&s, c, 0);
                for (int64_t i = 0; i < k; i++) jsb_put(&s, seq->u.s.p, seq->u.s.n, seq->u.s.t);
                return jsb_take(&s);
            }
            if (k > 0 && seq->u.l.n && (uint64_t)k > r->lim.max_iterations / seq->u.l.n)
                jfail(c, line, "list repetition too long");
            jv *l = jv_list(c, 0);
            l->u.l.tuple = seq->u.l.tuple;
            for (int64_t i = 0; i < k; i++)
                for (size_t j = 0; j < seq->u.l.n; j++) jv_list_push(c, l, seq->u.l.v[j]);
            return l;
        }
    }
    jfail(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], jv_type_name(a),
          jv_type_name(b));
}

static bool contains(jrender *r, int line, jv *needle, jv *hay)
{
    switch (hay->k) {
    case JK_STR:
        if (needle->k != JK_STR)
            jfail(&r->c, line, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        if (!needle->u.s.n) return true;
        return memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
    case JK_LIST:
        for (size_t i = 0; i < hay->u.l.n; i++)
            if (jv_eq(hay->u.l.v[i], needle)) return true;
        return false;
    case JK_DICT:
        if (hay->u.d.ns) break;
        return jv_dict_get(hay, needle) != NULL;
    case JK_UNDEF:
        return false;
    default: break;
    }
    jfail(&r->c, line, "argument of type '%s' is not iterable", jv_type_name(hay));
}

static bool compare(jrender *r, int line, int op, jv *a, jv *b)
{
    switch (op) {
    case JOP_EQ: return jv_eq(a, b);
    case JOP_NE: return !jv_eq(a, b);
    case JOP_IN: return contains(r, line, a, b);
    case JOP_NOTIN: return !contains(r, line, a, b);
    default: break;
    }
    if ((a->k == JK_LIST || b->k == JK_LIST || a->k == JK_STR || b->k == JK_STR || jv_is_num(a) ||
         jv_is_num(b)) && a->k != JK_UNDEF && b->k != JK_UNDEF &&
        !((jv_is_num(a) && jv_is_num(b)) || a->k == b->k))
        jfail(&r->c, line, "'%s' not supported between instances of '%s' and '%s'",
              op == JOP_LT ? "<" : op == JOP_LE ? "<=" : op == JOP_GT ? ">" : ">=",
              jv_type_name(a), jv_type_name(b));
    int k = jv_cmp(&r->c, line, a, b);
    switch (op) {
    case JOP_LT: return k < 0;
    case JOP_LE: return k <= 0;
    case JOP_GT: return k > 0;
    default:     return k >= 0;
    }
}

/* Python slicing of lists and strings (by code point). */
static jv *slice(jrender *r, int line, jv *obj, jv *lo, jv *hi, jv *st)
{
    if (obj->k == JK_UNDEF) fail_undef(r, line, obj);
    if (obj->k != JK_LIST && obj->k != JK_STR)
        jfail(&r->c, line, "'%s' object is not subscriptable", jv_type_name(obj));
    int64_t n = obj->k == JK_LIST ? (int64_t)obj->u.l.n : (int64_t)ju8_len(obj->u.s.p, obj->u.s.n);
    int64_t step = 1, a = 0, b = 0;
    if (st && st->k != JK_NONE) {
        if (!as_index(st, &step)) jfail(&r->c, line, "slice indices must be integers or None");
        if (!step) jfail(&r->c, line, "slice step cannot be zero");
    }
    bool has_a = lo && lo->k != JK_NONE, has_b = hi && hi->k != JK_NONE;
    if ((has_a && !as_index(lo, &a)) || (has_b && !as_index(hi, &b)))
        jfail(&r->c, line, "slice indices must be integers or None");
    if (step > 0) {
        if (!has_a) a = 0; else { if (a < 0) a += n; if (a < 0) a = 0; if (a > n) a = n; }
        if (!has_b) b = n; else { if (b < 0) b += n; if (b < 0) b = 0; if (b > n) b = n; }
    } else {
        if (!has_a) a = n - 1; else { if (a < 0) a += n; if (a < 0) a = -1; if (a >= n) a = n - 1; }
        if (!has_b) b = -1; else { if (b < 0) b += n; if (b < 0) b = -1; if (b >= n) b = n - 1; }
    }
    jctx *c = &r->c;
    if (obj->k == JK_LIST) {
        jv *l = jv_list(c, 0);
        l->u.l.tuple = obj->u.l.tuple;
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
            jv_list_push(c, l, obj->u.l.v[i]);
        return l;
    }
    jsb s;
    jsb_init(&s, c, 0);
    if (step == 1) {
        if (a < b) {
            size_t x = ju8_off(obj->u.s.p, obj->u.s.n, (size_t)a), y = ju8_off(obj->u.s.p, obj->u.s.n, (size_t)b);
            jsb_put(&s, obj->u.s.p + x, y - x, obj->u.s.t ? obj->u.s.t + x : NULL);
        }
        return jsb_take(&s);
    }
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
        size_t x = ju8_off(obj->u.s.p, obj->u.s.n, (size_t)i), y = ju8_off(obj->u.s.p, obj->u.s.n, (size_t)i + 1);
        jsb_put(&s, obj->u.s.p + x, y - x, obj->u.s.t ? obj->u.s.t + x : NULL);
    }
    return jsb_take(&s);
}

/* ---------------------------------------------------------------- calls */

static void render_body(jrender *r, jframe *f, jnode **body, size_t n);


static jv *call_macro(jrender *r, int line, jv *fn, jv **args, size_t nargs, const char **kwn,
                      jv **kwv, size_t nkw)
{
    const jnode *m = fn->u.macro;
    if (++r->call_depth > r->lim.max_call_depth)
        jfail(&r->c, line, "macro calls nested deeper than %d", r->lim.max_call_depth);
    if (nargs > m->nnames)
        jfail(&r->c, line, "macro '%s' takes not more than %zu argument(s)", m->name, m->nnames);
    jframe *f = new_frame(r, r->root);
    jv **vals = jalloc(&r->c, (m->nnames + 1) * sizeof(jv *));
    for (size_t i = 0; i < nargs; i++)
        vals[i] = args[i];
    for (size_t k = 0; k < nkw; k++) {
        size_t i = 0;
        while (i < m->nnames && strcmp(m->names[i], kwn[k])) i++;
        if (i == m->nnames)
            jfail(&r->c, line, "macro '%s' takes no keyword argument '%s'", m->name, kwn[k]);
        if (vals[i])
            jfail(&r->c, line, "macro '%s' got multiple values for argument '%s'", m->name, kwn[k]);
        vals[i] = kwv[k];
    }
    jframe *saved = r->frame;
    for (size_t i = 0; i < m->nnames; i++) {
        if (!vals[i]) {
            r->frame = f;
            vals[i] = m->args[i] ? jeval(r, m->args[i]) : jv_undef(&r->c, m->names[i]);
        }
        assign(r, f, m->names[i], vals[i]);
    }
    jsb out, *prev = r->out;
    jsb_init(&out, &r->c, r->lim.max_output);
    r->out = &out;
    render_body(r, f, m->body, m->nbody);
    r->out = prev;
    r->frame = saved;
    r->ctl = CTL_NONE;
    r->call_depth--;
    return jsb_take(&out);
}

jv *jcall(jrender *r, int line, jv *fn, jv **args, size_t nargs, const char **kwn, jv **kwv, size_t nkw)
{
    switch (fn->k) {
    case JK_MACRO:   return call_macro(r, line, fn, args, nargs, kwn, kwv, nkw);
    case JK_BUILTIN: return jbuiltin_call(r, line, fn->u.builtin, args, nargs, kwn, kwv, nkw);
    case JK_METHOD:  return jmethod(r, line, fn->u.m.self, fn->u.m.name, args, nargs, kwn, kwv, nkw);
    case JK_UNDEF:
        jfail(&r->c, line, "'%s' is undefined (called as a function)", undef_name(fn));
    default:
        jfail(&r->c, line, "'%s' object is not callable", jv_type_name(fn));
    }
}

/* Evaluate a node's positional and keyword arguments. */
static jv **eval_args(jrender *r, const jnode *e, jv ***kwv_out)
{
    jv **args = jalloc(&r->c, (e->nargs + 1) * sizeof(jv *));
    for (size_t i = 0; i < e->nargs; i++)
        args[i] = jeval(r, e->args[i]);
    jv **kwv = jalloc(&r->c, (e->nkw + 1) * sizeof(jv *));
    for (size_t i = 0; i < e->nkw; i++)
        kwv[i] = jeval(r, e->kwvals[i]);
    *kwv_out = kwv;
    return args;
}

/* ---------------------------------------------------------------- expressions */

jv *jeval(jrender *r, const jnode *e)
{
    jctx *c = &r->c;
    switch (e->type) {
    case JN_LIT:  return e->lit;
    case JN_NAME: return lookup(r, r->frame, e->name);
    case JN_LIST: case JN_TUPLE: {
        jv *l = jv_list(c, e->nargs);
        l->u.l.tuple = e->type == JN_TUPLE;
        for (size_t i = 0; i < e->nargs; i++)
            jv_list_push(c, l, jeval(r, e->args[i]));
        return l;
    }
    case JN_DICT: {
        jv *d = jv_dict(c);
        for (size_t i = 0; i < e->nargs; i++)
            jv_dict_set(c, d, jeval(r, e->args[i]), jeval(r, e->kwvals[i]));
        return d;
    }
    case JN_ATTR:  return jgetattr(r, e->line, jeval(r, e->a), e->name);
    case JN_ITEM: {
        jv *obj = jeval(r, e->a);
        return jgetitem(r, e->line, obj, jeval(r, e->b));
    }
    case JN_SLICE: {
        jv *obj = jeval(r, e->a);
        jv *p[3];
        for (int i = 0; i < 3; i++)
            p[i] = e->args[i] ? jeval(r, e->args[i]) : NULL;
        return slice(r, e->line, obj, p[0], p[1], p[2]);
    }
    case JN_CALL: {
        jv *fn = jeval(r, e->a), **kwv;
        jv **args = eval_args(r, e, &kwv);
        return jcall(r, e->line, fn, args, e->nargs, e->kwnames, kwv, e->nkw);
    }
    case JN_FILTER: {
        jv *v = e->a ? jeval(r, e->a) : r->block_value, **kwv;
        jv **args = eval_args(r, e, &kwv);
        return jfilter(r, e->line, e->name, v, args, e->nargs, e->kwnames, kwv, e->nkw);
    }
    case JN_TEST: {
        jv *v = jeval(r, e->a), **kwv;
        jv **args = eval_args(r, e, &kwv);
        bool t = jtest(r, e->line, e->name, v, args, e->nargs);
        return JV_BOOL(e->op ? !t : t);
    }
    case JN_BINOP: {
        jv *a = jeval(r, e->a);
        return binop(r, e->line, e->op, a, jeval(r, e->b));
    }
    case JN_NOT: return JV_BOOL(!jv_truthy(jeval(r, e->a)));
    case JN_NEG: case JN_POS: {
        jv *v = jeval(r, e->a);
        if (v->k == JK_UNDEF) fail_undef(r, e->line, v);
        if (!jv_is_num(v))
            jfail(c, e->line, "bad operand type for unary %c: '%s'", e->type == JN_NEG ? '-' : '+', jv_type_name(v));
        if (e->type == JN_POS) return v->k == JK_BOOL ? jv_int(c, v->u.b) : v;
        return v->k == JK_FLOAT ? jv_float(c, -v->u.f) : jv_int(c, -as_int(v));
    }
    case JN_AND: {
        jv *a = jeval(r, e->a);
        return jv_truthy(a) ? jeval(r, e->b) : a;
    }
    case JN_OR: {
        jv *a = jeval(r, e->a);
        return jv_truthy(a) ? a : jeval(r, e->b);
    }
    case JN_COMPARE: {
        jv *a = jeval(r, e->a);
        for (size_t i = 0; i < e->nargs; i++) {
            jv *b = jeval(r, e->args[i]);
            if (!compare(r, e->line, e->ops[i], a, b))
                return JV_FALSE;
            a = b;
        }
        return JV_TRUE;
    }
    case JN_COND:
        if (jv_truthy(jeval(r, e->a)))
            return jeval(r, e->b);
        return e->c ? jeval(r, e->c) : jv_undef(c, NULL);
    case JN_CONCAT: {
        jsb s;
        jsb_init(&s, c, 0);
        for (size_t i = 0; i < e->nargs; i++)
            jv_write_str(c, &s, jeval(r, e->args[i]));
        return jsb_take(&s);
    }
    default:
        jfail(c, e->line, "internal error: node %d is not an expression", e->type);
    }
}

/* ---------------------------------------------------------------- statements */

static void exec_for(jrender *r, jframe *f, const jnode *s)
{
    jctx *c = &r->c;
    jv *src = jiter_list(r, s->line, jeval(r, s->a));
    jframe *lf = new_frame(r, f);
    jv *items = src;
    if (s->b) {     /* loop filter: applied before the loop, so loop.* counts what passes */
        items = jv_list(c, 0);
        jframe *saved = r->frame;
        for (size_t i = 0; i < src->u.l.n; i++) {
            assign_targets(r, s->line, lf, s->names, s->nnames, src->u.l.v[i]);
            r->frame = lf;
            if (jv_truthy(jeval(r, s->b)))
                jv_list_push(c, items, src->u.l.v[i]);
        }
        r->frame = saved;
    }
    struct jloop *L = jalloc(c, sizeof(struct jloop));
    L->items = items;
    L->node = s;
    jv *lv = jalloc(c, sizeof(jv));
    lv->k = JK_LOOP;
    lv->u.loop = L;
    size_t n = items->u.l.n;
    for (size_t i = 0; i < n; i++) {
        if (++r->iterations > r->lim.max_iterations)
            jfail(c, s->line, "more than %llu loop iterations", (unsigned long long)r->lim.max_iterations);
        L->i = i;
        /* each iteration is a fresh scope: a `set` in the body is gone by the next one */
        jframe *it = new_frame(r, f);
        assign(r, it, "loop", lv);
        assign_targets(r, s->line, it, s->names, s->nnames, items->u.l.v[i]);
        render_body(r, it, s->body, s->nbody);
        if (r->ctl == CTL_BREAK) { r->ctl = CTL_NONE; break; }
        r->ctl = CTL_NONE;
    }
    if (!n && s->norelse)
        render_body(r, f, s->orelse, s->norelse);
}

static jv *render_to_string(jrender *r, jframe *f, jnode **body, size_t n)
{
    jsb out, *prev = r->out;
    jsb_init(&out, &r->c, r->lim.max_output);
    r->out = &out;
    render_body(r, f, body, n);
    r->out = prev;
    return jsb_take(&out);
}

static jv *apply_block_filters(jrender *r, jframe *f, const jnode *chain, jv *text)
{
    jv *saved = r->block_value;
    r->block_value = text;
    r->frame = f;
    jv *v = jeval(r, chain);
    r->block_value = saved;
    return v;
}

static void exec(jrender *r, jframe *f, const jnode *s)
{
    jctx *c = &r->c;
    r->frame = f;
    switch (s->type) {
    case JN_TEXT:
        jsb_put(r->out, s->lit->u.s.p, s->lit->u.s.n, NULL);
        break;
    case JN_OUTPUT:
        jv_write_str(c, r->out, jeval(r, s->a));
        break;
    case JN_IF:
        if (jv_truthy(jeval(r, s->a)))
            render_body(r, f, s->body, s->nbody);
        else
            render_body(r, f, s->orelse, s->norelse);
        break;
    case JN_FOR:
        exec_for(r, f, s);
        break;
    case JN_SET: {
        jv *v = jeval(r, s->b);
        if (s->a) {
            jv *ns = jeval(r, s->a);
            if (ns->k != JK_DICT || !ns->u.d.ns)
                jfail(c, s->line, "cannot assign attribute '%s' on a non-namespace object", s->name);
            jv_dict_set(c, ns, jv_strref(c, s->name), v);
        } else {
            assign_targets(r, s->line, f, s->names, s->nnames, v);
        }
        break;
    }
    case JN_SETBLOCK: {
        jv *v = render_to_string(r, f, s->body, s->nbody);
        if (s->b)
            v = apply_block_filters(r, f, s->b, v);
        if (s->a) {
            r->frame = f;
            jv *ns = jeval(r, s->a);
            if (ns->k != JK_DICT || !ns->u.d.ns)
                jfail(c, s->line, "cannot assign attribute '%s' on a non-namespace object", s->name);
            jv_dict_set(c, ns, jv_strref(c, s->name), v);
        } else {
            assign(r, f, s->names[0], v);
        }
        break;
    }
    case JN_FILTERBLOCK: {
        jv *v = apply_block_filters(r, f, s->b, render_to_string(r, f, s->body, s->nbody));
        jv_write_str(c, r->out, v);
        break;
    }
    case JN_MACRO: {
        jv *m = jalloc(c, sizeof(jv));
        m->k = JK_MACRO;
        m->u.macro = s;
        assign(r, f, s->name, m);
        break;
    }
    case JN_BREAK:    r->ctl = CTL_BREAK; break;
    case JN_CONTINUE: r->ctl = CTL_CONTINUE; break;
    case JN_BODY:     render_body(r, f, s->body, s->nbody); break;
    default:
        jfail(c, s->line, "internal error: node %d is not a statement", s->type);
    }
}

static void render_body(jrender *r, jframe *f, jnode **body, size_t n)
{
    for (size_t i = 0; i < n && r->ctl == CTL_NONE; i++)
        exec(r, f, body[i]);
    r->frame = f;
}

/* ---------------------------------------------------------------- entry points */

int jinja_compile(const char *src, size_t len, jinja_template **out, kvc_err *err)
{
    *out = NULL;
    jinja_template *t = calloc(1, sizeof(*t));
    if (!t)
        return kvc_fail(err, KVC_ERR_NOMEM, "template: out of memory");
    t->arena.limit = 256u << 20;
    jmp_buf jb;
    jctx c = { &t->arena, &jb, err, 0 };
    if (setjmp(jb)) {
        jinja_template_free(t);
        return err ? err->code : KVC_ERR_INVALID_ARG;
    }
    t->body = jinja_parse(&c, src, len, &t->nbody);
    *out = t;
    return KVC_OK;
}

void jinja_template_free(jinja_template *t)
{
    if (!t)
        return;
    jarena_free(&t->arena);
    free(t);
}

void jinja_output_free(jinja_output *o)
{
    if (!o)
        return;
    free(o->text);
    free(o->marked);
    memset(o, 0, sizeof(*o));
}

static void add_vars(jrender *r, const char *json, bool mark)
{
    if (!json)
        return;
    jv *d = jv_parse_json(&r->c, json, strlen(json), mark);
    if (d->k != JK_DICT)
        jfail(&r->c, 0, "variables must be a JSON object");
    for (size_t i = 0; i < d->u.d.n; i++) {
        jv *k = d->u.d.key[i];
        jv *name = jv_str(&r->c, k->u.s.p, k->u.s.n, NULL);
        jv_dict_set(&r->c, r->root->vars, name, d->u.d.val[i]);
    }
}

/* The marks of the output as sorted ranges; malloc'd. */
static int marks_to_spans(const jsb *b, jinja_output *o)
{
    if (!b->t)
        return KVC_OK;
    size_t cap = 16, n = 0;
    jinja_span *s = malloc(cap * sizeof(*s));
    if (!s)
        return KVC_ERR_NOMEM;
    for (size_t i = 0; i < b->n;) {
        if (!b->t[i]) { i++; continue; }
        size_t j = i;
        while (j < b->n && b->t[j]) j++;
        if (!kvc_grow((void **)&s, &cap, n, sizeof(*s))) {
            free(s);
            return KVC_ERR_NOMEM;
        }
        s[n++] = (jinja_span){ i, j - i };
        i = j;
    }
    o->marked = s;
    o->n_marked = n;
    return KVC_OK;
}

int jinja_render(const jinja_template *t, const char *data_json, const char *trusted_json,
                 const jinja_limits *limits, jinja_output *out, kvc_err *err)
{
    memset(out, 0, sizeof(*out));
    jarena arena = { 0 };
    jrender r;
    memset(&r, 0, sizeof(r));
    if (limits)
        r.lim = *limits;
    if (!r.lim.max_output) r.lim.max_output = 64u << 20;
    if (!r.lim.max_memory) r.lim.max_memory = 512u << 20;
    if (!r.lim.max_iterations) r.lim.max_iterations = 10000000;
    if (!r.lim.max_call_depth) r.lim.max_call_depth = 64;
    if (!r.lim.now) r.lim.now = (int64_t)time(NULL);
    arena.limit = r.lim.max_memory;
    jmp_buf jb;
    r.c = (jctx){ &arena, &jb, err, 0 };
    if (setjmp(jb)) {
        jarena_free(&arena);
        return err ? err->code : KVC_ERR_INVALID_ARG;
    }
    r.root = new_frame(&r, NULL);
    add_vars(&r, data_json, true);
    add_vars(&r, trusted_json, false);   /* a name in both: trusted's value */
    jsb b;
    jsb_init(&b, &r.c, r.lim.max_output);
    r.out = &b;
    render_body(&r, r.root, t->body, t->nbody);
    int rc = KVC_ERR_NOMEM;
    out->text = malloc(b.n + 1);
    if (out->text) {
        memcpy(out->text, b.p ? b.p : "", b.n);
        out->text[b.n] = 0;
        out->len = b.n;
        rc = marks_to_spans(&b, out);
    }
    jarena_free(&arena);
    if (rc) {
        jinja_output_free(out);
        return kvc_fail(err, rc, "template: out of memory");
    }
    return KVC_OK;
}

int64_t jrender_now(jrender *r) { return r->lim.now; }
