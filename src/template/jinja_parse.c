/* jinja_parse.c - Jinja2 source to a syntax tree: the lexer (with the
 * whitespace rules of trim_blocks=True, lstrip_blocks=True as transformers
 * sets them) and a recursive-descent parser with Jinja's operator grammar. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

enum ttype { T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING,
             T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct tok {
    uint8_t type;
    int line;
    const char *p;    /* DATA, NAME, STRING (decoded), OP text */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct lexer {
    jctx *c;
    const char *s;    /* normalized source */
    size_t n, pos;
    int line;
    tok *toks;
    size_t nt, cap;
} lexer;

#define MAX_DEPTH 200   /* expression and block nesting */

static tok *push(lexer *L, int type, int line)
{
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tok *nt = jalloc(L->c, cap * sizeof(tok));
        if (L->nt)
            memcpy(nt, L->toks, L->nt * sizeof(tok));
        L->toks = nt;
        L->cap = cap;
    }
    tok *t = &L->toks[L->nt++];
    memset(t, 0, sizeof(*t));
    t->type = (uint8_t)type;
    t->line = line;
    return t;
}

static int count_nl(const char *p, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

static bool is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }
static bool is_name0(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static void put_u8(char *o, size_t *k, unsigned u) { *k += ju8_put(o + *k, u); }

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* A string literal with Python's unicode-escape decoding. */
static void lex_string(lexer *L, int line)
{
    char q = L->s[L->pos];
    size_t start = ++L->pos;
    while (L->pos < L->n && L->s[L->pos] != q) {
        if (L->s[L->pos] == '\\' && L->pos + 1 < L->n)
            L->pos++;
        L->pos++;
    }
    if (L->pos >= L->n)
        jfail(L->c, line, "unexpected end of string literal");
    const char *p = L->s + start;
    size_t n = L->pos - start;
    L->pos++;
    char *o = jalloc(L->c, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\' || i + 1 >= n) { o[k++] = p[i]; continue; }
        char e = p[++i];
        int digits = 0;
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                unsigned u = 0;
                int m = 0;
                while (m < 3 && i < n && p[i] >= '0' && p[i] <= '7') { u = u * 8 + (unsigned)(p[i] - '0'); i++; m++; }
                i--;
                put_u8(o, &k, u);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (digits) {
            unsigned u = 0;
            for (int d = 0; d < digits; d++) {
                if (i + 1 >= n || hexval(p[i + 1]) < 0)
                    jfail(L->c, line, "truncated \\%c escape in a string literal", e);
                u = u * 16 + (unsigned)hexval(p[++i]);
            }
            if (u > 0x10FFFF)
                jfail(L->c, line, "illegal Unicode character in a string literal");
            put_u8(o, &k, u);
        }
    }
    o[k] = 0;
    tok *t = push(L, T_STRING, line);
    t->p = o;
    t->n = k;
}

static const char *const ops2[] = { "//", "**", "==", "!=", ">=", "<=" };

/* Tokens inside {{ }} or {% %} up to the end delimiter. Returns the
 * position just past the delimiter (and its whitespace control). */
static void lex_tag(lexer *L, bool block, bool *line_starting)
{
    int depth = 0;
    const char *end = block ? "%}" : "}}";
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->n)
            jfail(L->c, L->line, "unexpected end of template, expected '%s'", end);
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        if (depth == 0) {
            int strip = 0;
            if (left >= 3 && (p[0] == '-' || p[0] == '+') && !memcmp(p + 1, end, 2))
                strip = p[0] == '-' ? 1 : 2;
            if (strip || (left >= 2 && !memcmp(p, end, 2))) {
                push(L, block ? T_BLOCK_END : T_VAR_END, L->line);
                L->pos += strip ? 3 : 2;
                *line_starting = false;
                if (strip == 1) {
                    while (L->pos < L->n && is_ws(L->s[L->pos])) {
                        if (L->s[L->pos] == '\n') L->line++;
                        *line_starting = L->s[L->pos] == '\n';
                        L->pos++;
                    }
                } else if (!strip && block && L->pos < L->n && L->s[L->pos] == '\n') {
                    L->pos++;         /* trim_blocks */
                    L->line++;
                    *line_starting = true;
                }
                return;
            }
        }
        int line = L->line;
        if (is_name0(*p)) {
            size_t k = 1;
            while (k < left && (is_name0(p[k]) || is_digit(p[k])))
                k++;
            tok *t = push(L, T_NAME, line);
            t->p = p;
            t->n = k;
            L->pos += k;
        } else if (is_digit(*p)) {
            size_t k = 0;
            bool fl = false;
            while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
            if (k + 1 < left && p[k] == '.' && is_digit(p[k + 1]) &&
                !(L->pos > 0 && L->s[L->pos - 1] == '.')) {
                fl = true;
                k++;
                while (k < left && (is_digit(p[k]) || p[k] == '_')) k++;
            }
            if (k < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t e = k + 1;
                if (e < left && (p[e] == '+' || p[e] == '-')) e++;
                if (e < left && is_digit(p[e])) {
                    fl = true;
                    k = e;
                    while (k < left && is_digit(p[k])) k++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t i = 0; i < k && m + 1 < sizeof(buf); i++)
                if (p[i] != '_') buf[m++] = p[i];
            buf[m] = 0;
            tok *t = push(L, fl ? T_FLOAT : T_INT, line);
            if (fl) t->f = strtod(buf, NULL);
            else t->i = strtoll(buf, NULL, 10);
            L->pos += k;
        } else if (*p == '\'' || *p == '"') {
            lex_string(L, line);
            L->line += count_nl(p, (size_t)(L->s + L->pos - p));
        } else {
            size_t k = 1;
            for (size_t i = 0; i < KVC_ARRAY_LEN(ops2); i++)
                if (left >= 2 && !memcmp(p, ops2[i], 2)) k = 2;
            if (k == 1 && !strchr("+-/*%~[](){}><=.:|,;", *p))
                jfail(L->c, line, "unexpected character '%c'", *p);
            if (*p == '(' || *p == '[' || *p == '{') depth++;
            if (*p == ')' || *p == ']' || *p == '}') {
                if (depth == 0)
                    jfail(L->c, line, "unexpected '%c'", *p);
                depth--;
            }
            tok *t = push(L, T_OP, line);
            t->p = p;
            t->n = k;
            L->pos += k;
        }
    }
}

static void emit_data(lexer *L, const char *p, size_t n, int line)
{
    if (!n)
        return;
    tok *t = push(L, T_DATA, line);
    t->p = p;
    t->n = n;
}

static void lex(lexer *L)
{
    bool line_starting = true;
    while (L->pos < L->n) {
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        size_t q = 0;
        while (q + 1 < left && !(p[q] == '{' && (p[q + 1] == '{' || p[q + 1] == '%' || p[q + 1] == '#')))
            q++;
        if (q + 1 >= left) {                  /* no more tags */
            emit_data(L, p, left, L->line);
            L->pos = L->n;
            break;
        }
        char kind = p[q + 1];
        char sign = q + 2 < left && (p[q + 2] == '-' || p[q + 2] == '+') ? p[q + 2] : 0;
        size_t tn = q;
        if (sign == '-') {
            while (tn > 0 && is_ws(p[tn - 1]))
                tn--;
        } else if (sign != '+' && kind != '{') {   /* lstrip_blocks */
            size_t l = tn;
            while (l > 0 && p[l - 1] != '\n')
                l--;
            bool only_ws = l < tn;
            for (size_t i = l; i < tn; i++)
                if (!is_ws(p[i])) only_ws = false;
            if ((l > 0 || line_starting) && only_ws)
                tn = l;
        }
        emit_data(L, p, tn, L->line);
        L->line += count_nl(p, q);
        L->pos += q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = L->s + L->pos;
            const char *f = NULL;
            for (const char *x = e; x + 1 < L->s + L->n; x++)
                if (x[0] == '#' && x[1] == '}') { f = x; break; }
            if (!f)
                jfail(L->c, L->line, "missing end of comment tag");
            L->line += count_nl(e, (size_t)(f - e));
            L->pos = (size_t)(f - L->s) + 2;
            line_starting = false;
            if (f > e && f[-1] == '-') {
                while (L->pos < L->n && is_ws(L->s[L->pos])) {
                    if (L->s[L->pos] == '\n') L->line++;
                    line_starting = L->s[L->pos] == '\n';
                    L->pos++;
                }
            } else if (!(f > e && f[-1] == '+') && L->pos < L->n && L->s[L->pos] == '\n') {
                L->pos++;
                L->line++;
                line_starting = true;
            }
            continue;
        }
        push(L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, L->line);
        lex_tag(L, kind == '%', &line_starting);
    }
    push(L, T_EOF, L->line);
}

/* ---------------------------------------------------------------- parser */

typedef struct parser {
    jctx *c;
    tok *t;
    size_t i, n;
    int depth;
} parser;

static tok *cur(parser *P) { return &P->t[P->i]; }
static tok *next(parser *P) { tok *t = &P->t[P->i]; if (t->type != T_EOF) P->i++; return t; }

static bool is_op(parser *P, const char *op)
{
    tok *t = cur(P);
    return t->type == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}

static bool is_name(parser *P, const char *name)
{
    tok *t = cur(P);
    return t->type == T_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}

static const char *tok_desc(parser *P, tok *t)
{
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_BLOCK_END: return "end of statement block";
    case T_VAR_END: return "end of print statement";
    case T_NAME: case T_OP: {
        char *s = jalloc(P->c, t->n + 3);
        s[0] = '\'';
        memcpy(s + 1, t->p, t->n);
        s[t->n + 1] = '\'';
        return s;
    }
    case T_STRING: return "string";
    case T_INT: case T_FLOAT: return "number";
    default: return "template text";
    }
}

static void expect_op(parser *P, const char *op)
{
    if (!is_op(P, op))
        jfail(P->c, cur(P)->line, "expected '%s', got %s", op, tok_desc(P, cur(P)));
    next(P);
}

static const char *tok_str(parser *P, tok *t)
{
    char *s = jalloc(P->c, t->n + 1);
    memcpy(s, t->p, t->n);
    return s;
}

static const char *expect_name(parser *P)
{
    if (cur(P)->type != T_NAME)
        jfail(P->c, cur(P)->line, "expected a name, got %s", tok_desc(P, cur(P)));
    return tok_str(P, next(P));
}

static jnode *mk(parser *P, int type, int line)
{
    jnode *n = jalloc(P->c, sizeof(jnode));
    n->type = (uint8_t)type;
    n->line = line;
    return n;
}

/* Growable node arrays, in the arena. */
typedef struct nvec { jnode **v; size_t n, cap; } nvec;
static void nv_push(parser *P, nvec *v, jnode *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode **nv = jalloc(P->c, cap * sizeof(jnode *));
        if (v->n) memcpy(nv, v->v, v->n * sizeof(jnode *));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}
typedef struct svec { const char **v; size_t n, cap; } svec;
static void sv_push(parser *P, svec *v, const char *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        const char **nv = jalloc(P->c, cap * sizeof(char *));
        if (v->n) memcpy(nv, v->v, v->n * sizeof(char *));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static jnode *p_expr(parser *P);
static jnode *p_or(parser *P);
static jnode *p_unary(parser *P, bool with_filter);

static void enter(parser *P)
{
    if (++P->depth > MAX_DEPTH)
        jfail(P->c, cur(P)->line, "expression nested deeper than %d", MAX_DEPTH);
}

/* ( args ) after the '(' is current; fills args and keywords of n. */
static void p_call_args(parser *P, jnode *n)
{
    expect_op(P, "(");
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    while (!is_op(P, ")")) {
        if (args.n || kwn.n)
            expect_op(P, ",");
        if (is_op(P, ")"))
            break;
        if (cur(P)->type == T_NAME && P->t[P->i + 1].type == T_OP && P->t[P->i + 1].n == 1 &&
            P->t[P->i + 1].p[0] == '=') {
            sv_push(P, &kwn, expect_name(P));
            next(P);
            nv_push(P, &kwv, p_expr(P));
        } else {
            if (kwn.n)
                jfail(P->c, cur(P)->line, "positional argument after a keyword argument");
            nv_push(P, &args, p_expr(P));
        }
    }
    next(P);
    n->args = args.v; n->nargs = args.n;
    n->kwnames = kwn.v; n->kwvals = kwv.v; n->nkw = kwn.n;
}

static jnode *p_primary(parser *P)
{
    tok *t = cur(P);
    int line = t->line;
    jnode *n;
    if (t->type == T_NAME) {
        next(P);
        const char *s = tok_str(P, t);
        n = mk(P, JN_LIT, line);
        if (!strcmp(s, "true") || !strcmp(s, "True")) n->lit = JV_TRUE;
        else if (!strcmp(s, "false") || !strcmp(s, "False")) n->lit = JV_FALSE;
        else if (!strcmp(s, "none") || !strcmp(s, "None")) n->lit = JV_NONE;
        else { n->type = JN_NAME; n->name = s; }
        return n;
    }
    if (t->type == T_STRING) {
        jsb b;
        jsb_init(&b, P->c, 0);
        while (cur(P)->type == T_STRING) {     /* adjacent literals concatenate */
            tok *s = next(P);
            jsb_put(&b, s->p, s->n, NULL);
        }
        n = mk(P, JN_LIT, line);
        n->lit = jsb_take(&b);
        return n;
    }
    if (t->type == T_INT || t->type == T_FLOAT) {
        next(P);
        n = mk(P, JN_LIT, line);
        n->lit = t->type == T_INT ? jv_int(P->c, t->i) : jv_float(P->c, t->f);
        return n;
    }
    if (is_op(P, "(")) {
        next(P);
        if (is_op(P, ")")) {
            next(P);
            return mk(P, JN_TUPLE, line);
        }
        jnode *e = p_expr(P);
        if (is_op(P, ",")) {
            nvec items = {0};
            nv_push(P, &items, e);
            while (is_op(P, ",")) {
                next(P);
                if (is_op(P, ")")) break;
                nv_push(P, &items, p_expr(P));
            }
            e = mk(P, JN_TUPLE, line);
            e->args = items.v;
            e->nargs = items.n;
        }
        expect_op(P, ")");
        return e;
    }
    if (is_op(P, "[")) {
        next(P);
        nvec items = {0};
        while (!is_op(P, "]")) {
            if (items.n) expect_op(P, ",");
            if (is_op(P, "]")) break;
            nv_push(P, &items, p_expr(P));
        }
        next(P);
        n = mk(P, JN_LIST, line);
        n->args = items.v;
        n->nargs = items.n;
        return n;
    }
    if (is_op(P, "{")) {
        next(P);
        nvec keys = {0}, vals = {0};
        while (!is_op(P, "}")) {
            if (keys.n) expect_op(P, ",");
            if (is_op(P, "}")) break;
            nv_push(P, &keys, p_expr(P));
            expect_op(P, ":");
            nv_push(P, &vals, p_expr(P));
        }
        next(P);
        n = mk(P, JN_DICT, line);
        n->args = keys.v; n->nargs = keys.n;
        n->kwvals = vals.v; n->nkw = vals.n;
        return n;
    }
    jfail(P->c, line, "unexpected %s", tok_desc(P, t));
}

static jnode *p_subscript(parser *P, jnode *obj)
{
    int line = cur(P)->line;
    if (is_op(P, ".")) {
        next(P);
        tok *t = cur(P);
        if (t->type == T_INT) {
            next(P);
            jnode *n = mk(P, JN_ITEM, line);
            n->a = obj;
            n->b = mk(P, JN_LIT, line);
            n->b->lit = jv_int(P->c, t->i);
            return n;
        }
        jnode *n = mk(P, JN_ATTR, line);
        n->a = obj;
        n->name = expect_name(P);
        return n;
    }
    next(P);   /* [ */
    jnode *parts[3] = { NULL, NULL, NULL };
    int k = 0;
    bool slice = false;
    for (;;) {
        if (is_op(P, "]")) break;
        if (is_op(P, ":")) {
            next(P);
            slice = true;
            if (++k > 2) jfail(P->c, line, "too many ':' in a subscript");
            continue;
        }
        if (parts[k]) jfail(P->c, line, "expected ':' or ']' in a subscript");
        parts[k] = p_expr(P);
    }
    next(P);
    if (!slice) {
        if (!parts[0]) jfail(P->c, line, "empty subscript");
        jnode *n = mk(P, JN_ITEM, line);
        n->a = obj;
        n->b = parts[0];
        return n;
    }
    jnode *n = mk(P, JN_SLICE, line);
    n->a = obj;
    n->args = jalloc(P->c, 3 * sizeof(jnode *));
    memcpy(n->args, parts, sizeof(parts));
    n->nargs = 3;
    return n;
}

static jnode *p_postfix(parser *P, jnode *n)
{
    for (;;) {
        if (is_op(P, ".") || is_op(P, "[")) {
            n = p_subscript(P, n);
        } else if (is_op(P, "(")) {
            jnode *c = mk(P, JN_CALL, cur(P)->line);
            c->a = n;
            p_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *p_filter(parser *P, jnode *value)
{
    int line = cur(P)->line;
    jnode *f = mk(P, JN_FILTER, line);
    f->a = value;
    f->name = expect_name(P);
    while (is_op(P, ".")) {     /* dotted filter names */
        next(P);
        const char *more = expect_name(P);
        char *s = jalloc(P->c, strlen(f->name) + strlen(more) + 2);
        sprintf(s, "%s.%s", f->name, more);
        f->name = s;
    }
    if (is_op(P, "("))
        p_call_args(P, f);
    return f;
}

static jnode *p_filter_expr(parser *P, jnode *n)
{
    for (;;) {
        int line = cur(P)->line;
        if (is_op(P, "|")) {
            next(P);
            n = p_filter(P, n);
        } else if (is_name(P, "is")) {
            next(P);
            jnode *t = mk(P, JN_TEST, line);
            t->a = n;
            if (is_name(P, "not")) { next(P); t->op = 1; }
            t->name = expect_name(P);
            tok *c = cur(P);
            if (is_op(P, "(")) {
                p_call_args(P, t);
            } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT ||
                        c->type == T_FLOAT || is_op(P, "[") || is_op(P, "{")) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") &&
                       !is_name(P, "is") && !is_name(P, "if") && !is_name(P, "in") &&
                       !is_name(P, "not")) {
                jnode *arg = p_postfix(P, p_primary(P));
                t->args = jalloc(P->c, sizeof(jnode *));
                t->args[0] = arg;
                t->nargs = 1;
            }
            n = t;
        } else if (is_op(P, "(")) {
            jnode *c = mk(P, JN_CALL, line);
            c->a = n;
            p_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *p_unary(parser *P, bool with_filter)
{
    enter(P);
    int line = cur(P)->line;
    jnode *n;
    if (is_op(P, "-") || is_op(P, "+")) {
        bool neg = is_op(P, "-");
        next(P);
        n = mk(P, neg ? JN_NEG : JN_POS, line);
        n->a = p_unary(P, false);
    } else {
        n = p_primary(P);
    }
    n = p_postfix(P, n);
    if (with_filter)
        n = p_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *binop(parser *P, int op, jnode *a, jnode *b, int line)
{
    jnode *n = mk(P, JN_BINOP, line);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *p_pow(parser *P)
{
    jnode *n = p_unary(P, true);
    while (is_op(P, "**")) {
        int line = next(P)->line;
        n = binop(P, JOP_POW, n, p_unary(P, true), line);
    }
    return n;
}

static jnode *p_math2(parser *P)
{
    jnode *n = p_pow(P);
    for (;;) {
        int op = is_op(P, "*") ? JOP_MUL : is_op(P, "/") ? JOP_DIV : is_op(P, "//") ? JOP_FLOORDIV
               : is_op(P, "%") ? JOP_MOD : -1;
        if (op < 0) return n;
        int line = next(P)->line;
        n = binop(P, op, n, p_pow(P), line);
    }
}

static jnode *p_concat(parser *P)
{
    jnode *n = p_math2(P);
    if (!is_op(P, "~"))
        return n;
    nvec parts = {0};
    nv_push(P, &parts, n);
    int line = cur(P)->line;
    while (is_op(P, "~")) {
        next(P);
        nv_push(P, &parts, p_math2(P));
    }
    jnode *c = mk(P, JN_CONCAT, line);
    c->args = parts.v;
    c->nargs = parts.n;
    return c;
}

static jnode *p_math1(parser *P)
{
    jnode *n = p_concat(P);
    for (;;) {
        int op = is_op(P, "+") ? JOP_ADD : is_op(P, "-") ? JOP_SUB : -1;
        if (op < 0) return n;
        int line = next(P)->line;
        n = binop(P, op, n, p_concat(P), line);
    }
}

static jnode *p_compare(parser *P)
{
    int line = cur(P)->line;
    jnode *first = p_math1(P);
    nvec rest = {0};
    uint8_t ops[64];
    size_t nops = 0;
    for (;;) {
        int op;
        if (is_op(P, "==")) op = JOP_EQ;
        else if (is_op(P, "!=")) op = JOP_NE;
        else if (is_op(P, "<")) op = JOP_LT;
        else if (is_op(P, "<=")) op = JOP_LE;
        else if (is_op(P, ">")) op = JOP_GT;
        else if (is_op(P, ">=")) op = JOP_GE;
        else if (is_name(P, "in")) op = JOP_IN;
        else if (is_name(P, "not") && P->t[P->i + 1].type == T_NAME && P->t[P->i + 1].n == 2 &&
                 !memcmp(P->t[P->i + 1].p, "in", 2)) { next(P); op = JOP_NOTIN; }
        else break;
        next(P);
        if (nops == sizeof(ops))
            jfail(P->c, line, "comparison chain too long");
        ops[nops++] = (uint8_t)op;
        nv_push(P, &rest, p_math1(P));
    }
    if (!nops)
        return first;
    jnode *n = mk(P, JN_COMPARE, line);
    n->a = first;
    n->args = rest.v;
    n->nargs = rest.n;
    n->ops = jalloc(P->c, nops);
    memcpy(n->ops, ops, nops);
    return n;
}

static jnode *p_not(parser *P)
{
    if (is_name(P, "not")) {
        int line = next(P)->line;
        enter(P);
        jnode *n = mk(P, JN_NOT, line);
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}

/* or: and ('or' and)*, and: not ('and' not)* */
static jnode *p_logic(parser *P, bool is_or)
{
    jnode *n = is_or ? p_logic(P, false) : p_not(P);
    while (is_name(P, is_or ? "or" : "and")) {
        int line = next(P)->line;
        jnode *x = mk(P, is_or ? JN_OR : JN_AND, line);
        x->a = n;
        x->b = is_or ? p_logic(P, false) : p_not(P);
        n = x;
    }
    return n;
}

static jnode *p_or(parser *P) { return p_logic(P, true); }

/* Jinja's parse_condexpr: a if c else b, b optional. */
static jnode *p_expr(parser *P)
{
    enter(P);
    jnode *n = p_or(P);
    while (is_name(P, "if")) {
        int line = next(P)->line;
        jnode *c = mk(P, JN_COND, line);
        c->b = n;
        c->a = p_or(P);
        if (is_name(P, "else")) {
            next(P);
            c->c = p_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* An expression list without parentheses ("a, b" in for / set targets
 * and values) becomes a tuple. */
static jnode *p_tuple_expr(parser *P)
{
    int line = cur(P)->line;
    jnode *n = p_expr(P);
    if (!is_op(P, ","))
        return n;
    nvec items = {0};
    nv_push(P, &items, n);
    while (is_op(P, ",")) {
        next(P);
        nv_push(P, &items, p_expr(P));
    }
    jnode *t = mk(P, JN_TUPLE, line);
    t->args = items.v;
    t->nargs = items.n;
    return t;
}

/* ---------------------------------------------------------------- statements */

static jnode **p_body(parser *P, const char *const *ends, size_t *n_out, const char **which);

static void expect_block_end(parser *P)
{
    if (cur(P)->type != T_BLOCK_END)
        jfail(P->c, cur(P)->line, "expected end of statement block, got %s", tok_desc(P, cur(P)));
    next(P);
}

static void p_targets(parser *P, svec *names)
{
    bool paren = is_op(P, "(");
    if (paren) next(P);
    sv_push(P, names, expect_name(P));
    while (is_op(P, ",")) {
        next(P);
        if (paren && is_op(P, ")")) break;
        sv_push(P, names, expect_name(P));
    }
    if (paren) expect_op(P, ")");
}

static jnode *p_if(parser *P, int line)
{
    jnode *n = mk(P, JN_IF, line);
    n->a = p_expr(P);
    expect_block_end(P);
    static const char *const ends[] = { "elif", "else", "endif", NULL };
    const char *which;
    n->body = p_body(P, ends, &n->nbody, &which);
    if (!strcmp(which, "elif")) {
        int l = cur(P)->line;
        jnode *e = p_if(P, l);
        n->orelse = jalloc(P->c, sizeof(jnode *));
        n->orelse[0] = e;
        n->norelse = 1;
        return n;     /* the nested if consumed endif */
    }
    if (!strcmp(which, "else")) {
        expect_block_end(P);
        static const char *const ends2[] = { "endif", NULL };
        n->orelse = p_body(P, ends2, &n->norelse, &which);
    }
    expect_block_end(P);
    return n;
}

static jnode *p_for(parser *P, int line)
{
    jnode *n = mk(P, JN_FOR, line);
    svec names = {0};
    p_targets(P, &names);
    n->names = names.v;
    n->nnames = names.n;
    if (!is_name(P, "in"))
        jfail(P->c, cur(P)->line, "expected 'in' in a for loop, got %s", tok_desc(P, cur(P)));
    next(P);
    /* the iterable: no conditional expression here, so "if" starts the filter */
    n->a = p_or(P);
    if (is_op(P, ",")) {
        jfail(P->c, cur(P)->line, "a tuple as a for loop's iterable is not supported");
    }
    if (is_name(P, "if")) {
        next(P);
        n->b = p_expr(P);
    }
    if (is_name(P, "recursive")) {
        next(P);
        n->op = 1;
    }
    expect_block_end(P);
    static const char *const ends[] = { "else", "endfor", NULL };
    const char *which;
    n->body = p_body(P, ends, &n->nbody, &which);
    if (!strcmp(which, "else")) {
        expect_block_end(P);
        static const char *const ends2[] = { "endfor", NULL };
        n->orelse = p_body(P, ends2, &n->norelse, &which);
    }
    expect_block_end(P);
    return n;
}

/* filters after a block set's name or {% filter %}: a chain applied to NULL */
static jnode *p_filter_chain(parser *P)
{
    jnode *f = p_filter(P, NULL);
    while (is_op(P, "|")) {
        next(P);
        f = p_filter(P, f);
    }
    return f;
}

static jnode *p_set(parser *P, int line)
{
    jnode *n = mk(P, JN_SET, line);
    svec names = {0};
    const char *first = expect_name(P);
    if (is_op(P, ".")) {
        next(P);
        n->a = mk(P, JN_NAME, line);
        n->a->name = first;
        n->name = expect_name(P);
    } else {
        sv_push(P, &names, first);
        while (is_op(P, ",")) {
            next(P);
            sv_push(P, &names, expect_name(P));
        }
        n->names = names.v;
        n->nnames = names.n;
    }
    if (is_op(P, "=")) {
        next(P);
        n->b = p_tuple_expr(P);
        expect_block_end(P);
        return n;
    }
    if (names.n > 1)
        jfail(P->c, line, "a block set takes one name");
    n->type = JN_SETBLOCK;
    if (is_op(P, "|")) {
        next(P);
        n->b = p_filter_chain(P);
    }
    expect_block_end(P);
    static const char *const ends[] = { "endset", NULL };
    const char *which;
    n->body = p_body(P, ends, &n->nbody, &which);
    expect_block_end(P);
    return n;
}

static jnode *p_macro(parser *P, int line)
{
    jnode *n = mk(P, JN_MACRO, line);
    n->name = expect_name(P);
    expect_op(P, "(");
    svec params = {0};
    nvec defs = {0};
    bool any_default = false;
    while (!is_op(P, ")")) {
        if (params.n) expect_op(P, ",");
        if (is_op(P, ")")) break;
        sv_push(P, &params, expect_name(P));
        jnode *d = NULL;
        if (is_op(P, "=")) {
            next(P);
            d = p_expr(P);
            any_default = true;
        } else if (any_default) {
            jfail(P->c, line, "macro '%s': non-default argument follows default argument", n->name);
        }
        nv_push(P, &defs, d);
    }
    next(P);
    expect_block_end(P);
    n->names = params.v;
    n->nnames = params.n;
    n->args = defs.v;
    n->nargs = defs.n;
    static const char *const ends[] = { "endmacro", NULL };
    const char *which;
    n->body = p_body(P, ends, &n->nbody, &which);
    if (cur(P)->type == T_NAME)   /* {% endmacro name %} */
        next(P);
    expect_block_end(P);
    return n;
}

static jnode *p_statement(parser *P)
{
    int line = cur(P)->line;
    next(P);   /* {% */
    if (cur(P)->type != T_NAME)
        jfail(P->c, line, "expected a statement name, got %s", tok_desc(P, cur(P)));
    const char *name = tok_str(P, cur(P));
    next(P);
    if (++P->depth > MAX_DEPTH)
        jfail(P->c, line, "blocks nested deeper than %d", MAX_DEPTH);
    jnode *n;
    if (!strcmp(name, "if")) n = p_if(P, line);
    else if (!strcmp(name, "for")) n = p_for(P, line);
    else if (!strcmp(name, "set")) n = p_set(P, line);
    else if (!strcmp(name, "macro")) n = p_macro(P, line);
    else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        n = mk(P, name[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
        expect_block_end(P);
    } else if (!strcmp(name, "filter")) {
        n = mk(P, JN_FILTERBLOCK, line);
        n->b = p_filter_chain(P);
        expect_block_end(P);
        static const char *const ends[] = { "endfilter", NULL };
        const char *which;
        n->body = p_body(P, ends, &n->nbody, &which);
        expect_block_end(P);
    } else if (!strcmp(name, "generation")) {
        n = mk(P, JN_BODY, line);
        expect_block_end(P);
        static const char *const ends[] = { "endgeneration", NULL };
        const char *which;
        n->body = p_body(P, ends, &n->nbody, &which);
        expect_block_end(P);
    } else {
        jfail(P->c, line, "unknown tag '%s'", name);
    }
    P->depth--;
    return n;
}

/* Statements up to one of `ends` (NULL-terminated; NULL = up to the end of
 * the template). The end tag's name is consumed; its %} is not. */
static jnode **p_body(parser *P, const char *const *ends, size_t *n_out, const char **which)
{
    nvec body = {0};
    for (;;) {
        tok *t = cur(P);
        if (t->type == T_EOF) {
            if (ends)
                jfail(P->c, t->line, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->type == T_DATA) {
            next(P);
            jnode *n = mk(P, JN_TEXT, t->line);
            n->lit = jv_str(P->c, t->p, t->n, NULL);
            nv_push(P, &body, n);
        } else if (t->type == T_VAR_BEGIN) {
            next(P);
            jnode *n = mk(P, JN_OUTPUT, t->line);
            n->a = p_tuple_expr(P);
            if (cur(P)->type != T_VAR_END)
                jfail(P->c, cur(P)->line, "expected end of print statement, got %s", tok_desc(P, cur(P)));
            next(P);
            nv_push(P, &body, n);
        } else if (t->type == T_BLOCK_BEGIN) {
            tok *nt = &P->t[P->i + 1];
            if (nt->type == T_NAME && ends) {
                for (size_t k = 0; ends[k]; k++)
                    if (nt->n == strlen(ends[k]) && !memcmp(nt->p, ends[k], nt->n)) {
                        *which = ends[k];
                        P->i += 2;
                        goto out;
                    }
            }
            if (nt->type == T_NAME && ((nt->n > 3 && !memcmp(nt->p, "end", 3)) ||
                                       (nt->n == 4 && !memcmp(nt->p, "else", 4)) ||
                                       (nt->n == 4 && !memcmp(nt->p, "elif", 4))))
                jfail(P->c, nt->line, "unexpected '%s'%s%s", tok_str(P, nt),
                      ends ? ", expected " : "", ends ? ends[0] : "");
            nv_push(P, &body, p_statement(P));
        } else {
            jfail(P->c, t->line, "unexpected %s", tok_desc(P, t));
        }
    }
out:
    *n_out = body.n;
    return body.v;
}

jnode **jinja_parse(jctx *c, const char *src, size_t len, size_t *n_out)
{
    /* newlines normalized to \n; one trailing newline dropped (keep_trailing_newline=False) */
    char *s = jalloc(c, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    lexer L = { .c = c, .s = s, .n = n, .line = 1 };
    lex(&L);
    parser P = { .c = c, .t = L.toks, .n = L.nt };
    return p_body(&P, NULL, n_out, NULL);
}
