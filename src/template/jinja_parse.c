/* jinja_parse.c - tokens (jinja_lex.c) to a syntax tree: a recursive-descent
 * parser with Jinja's operator grammar and statements. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

#define MAX_DEPTH 200   /* expression and block nesting */

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
    jgrow(P->c, (void **)&v->v, &v->cap, v->n, sizeof(jnode *), 4);
    v->v[v->n++] = x;
}
typedef struct svec { const char **v; size_t n, cap; } svec;
static void sv_push(parser *P, svec *v, const char *x)
{
    jgrow(P->c, (void **)&v->v, &v->cap, v->n, sizeof(char *), 4);
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

/* first (sep item)*: first alone, or a node of `type` with all of them */
static jnode *p_joined(parser *P, jnode *first, const char *sep, jnode *(*item)(parser *),
                       int type)
{
    if (!is_op(P, sep))
        return first;
    int line = cur(P)->line;
    nvec parts = {0};
    nv_push(P, &parts, first);
    while (is_op(P, sep)) {
        next(P);
        nv_push(P, &parts, item(P));
    }
    jnode *n = mk(P, type, line);
    n->args = parts.v;
    n->nargs = parts.n;
    return n;
}

static jnode *p_concat(parser *P) { return p_joined(P, p_math2(P), "~", p_math2, JN_CONCAT); }

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
static jnode *p_tuple_expr(parser *P) { return p_joined(P, p_expr(P), ",", p_expr, JN_TUPLE); }

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
            if (ends) {
                char want[96] = "";
                for (size_t k = 0; ends[k]; k++)
                    snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s'%s'",
                             k ? " or " : "", ends[k]);
                jfail(P->c, t->line, "unexpected end of template, expected %s", want);
            }
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
    size_t nt = 0;
    tok *t = jinja_lex(c, src, len, &nt);
    parser P = { .c = c, .t = t, .n = nt };
    return p_body(&P, NULL, n_out, NULL);
}
