/* jinja_internal.h - private to src/template/jinja*.c: the arena, values, the
 * syntax tree, and the helpers the parser, evaluator and built-ins share.
 *
 * Memory. Everything a parse or a render creates lives in one arena (jarena)
 * and is freed with it: values are plain pointers with Python's aliasing (a
 * list held in two variables is one list), and an error anywhere leaves
 * nothing to clean up. An arena has a byte limit; going over it is an error.
 *
 * Errors. Parser and evaluator report errors with jfail(), which longjmps to
 * the jctx's jmp_buf set by the entry point (jinja_compile / jinja_render).
 * Nothing between holds a resource outside the arena, so unwinding is free.
 *
 * Provenance. A string value carries `t`: NULL when every byte came from the
 * template, else one byte per text byte, 1 where that byte came from the
 * caller's data. Every operation that moves bytes moves their marks. */
#ifndef KVC_JINJA_INTERNAL_H
#define KVC_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* ---------------------------------------------------------------- arena */

typedef struct jchunk jchunk;
typedef struct jarena {
    jchunk *head;      /* newest chunk first */
    size_t  used;      /* bytes handed out so far, all chunks */
    size_t  limit;     /* 0 = none */
} jarena;

typedef struct jctx {
    jarena  *a;
    jmp_buf *jb;
    kvc_err *err;
    int      code;     /* status given with the error */
} jctx;

_Noreturn void jfail(jctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *jalloc(jctx *c, size_t n);                     /* zeroed */
void *jalloc_raw(jctx *c, size_t n);                 /* not zeroed: buffers about to be filled */
void  jarena_free(jarena *a);                        /* the chunks; not the jarena */
/* Room for one more element in the arena array *arr of n elements of elsize
 * bytes with room for *cap: when full, *arr becomes a copy in a new arena
 * block of twice the room (`first` when empty); the old one stays in the
 * arena. Fails as jalloc does. */
void  jgrow(jctx *c, void **arr, size_t *cap, size_t n, size_t elsize, size_t first);

/* ---------------------------------------------------------------- values */

enum jkind {
    JK_UNDEF, JK_NONE, JK_BOOL, JK_INT, JK_FLOAT, JK_STR,
    JK_LIST,     /* list or tuple (l.tuple) */
    JK_DICT,     /* insertion-ordered; also namespace() (d.ns) */
    JK_LOOP,     /* the `loop` variable of a for */
    JK_MACRO,    /* a {% macro %} */
    JK_BUILTIN,  /* a global function: range, namespace, raise_exception... */
    JK_METHOD,   /* a method bound to its object: "a b".split */
};

typedef struct jv jv;
typedef struct jnode jnode;
struct jloop;

struct jv {
    uint8_t k;
    union {
        bool    b;
        int64_t i;
        double  f;
        struct { const char *p; size_t n; const uint8_t *t; bool safe; } s;   /* p is NUL-terminated;
                                                  safe: markupsafe's Markup (from |safe) */
        struct { jv **v; size_t n, cap; bool tuple, gen; } l;  /* gen: a generator (see jv_gen) */
        struct { jv **key, **val; size_t n, cap; bool ns; } d;
        struct jloop *loop;
        const jnode *macro;
        int     builtin;
        struct { jv *self; const char *name; } m;
        const char *undef;            /* name for error messages, may be NULL */
    } u;
};

extern jv jv_none_v, jv_true_v, jv_false_v, jv_undef_v;
#define JV_NONE  (&jv_none_v)
#define JV_TRUE  (&jv_true_v)
#define JV_FALSE (&jv_false_v)
#define JV_UNDEF (&jv_undef_v)
#define JV_BOOL(x) ((x) ? JV_TRUE : JV_FALSE)

jv *jv_int(jctx *c, int64_t i);
jv *jv_float(jctx *c, double f);
jv *jv_undef(jctx *c, const char *name);
/* A string copied into the arena; t (NULL = untainted) is copied too. */
jv *jv_str(jctx *c, const char *p, size_t n, const uint8_t *t);
jv *jv_cstr(jctx *c, const char *s);                 /* untainted */
/* An untainted string over s itself, not copied: s must outlive the render
 * (names in the syntax tree do). */
jv *jv_strref(jctx *c, const char *s);
jv *jv_list(jctx *c, size_t cap);
/* A list standing for what Python makes a generator (map, select, items...):
 * always true, no len(), not JSON, printed as "<generator object>". Its
 * items are still readable so iterating twice works where Python's would be
 * empty the second time; templates do not rely on that. */
jv *jv_gen(jctx *c, jv *list);
void jv_list_push(jctx *c, jv *l, jv *x);
jv *jv_dict(jctx *c);
jv *jv_dict_get(const jv *d, const jv *key);         /* NULL when absent */
jv *jv_dict_gets(const jv *d, const char *key);
void jv_dict_set(jctx *c, jv *d, jv *key, jv *val);

bool jv_truthy(const jv *v);
bool jv_eq(const jv *a, const jv *b);
/* <0, 0, >0; fails (Python's TypeError) for values without an order. */
int  jv_cmp(jctx *c, int line, const jv *a, const jv *b);
const char *jv_type_name(const jv *v);
bool jv_is_num(const jv *v);                         /* int, float or bool */
double jv_num(const jv *v);
bool jv_tainted(const jv *v);                        /* a string with a marked byte */
size_t jv_len(jctx *c, int line, const jv *v);       /* Python len() */

/* ---------------------------------------------------------------- string builder */

typedef struct jsb {
    char    *p;
    uint8_t *t;        /* NULL until the first marked byte */
    size_t   n, cap;
    size_t   limit;    /* 0 = none; exceeding it fails */
    jctx    *c;
} jsb;

void jsb_init(jsb *b, jctx *c, size_t limit);
void jsb_put(jsb *b, const char *p, size_t n, const uint8_t *t);   /* t NULL = untainted */
void jsb_putc(jsb *b, char ch);
void jsb_puts(jsb *b, const char *s);
void jsb_put_mark(jsb *b, const char *p, size_t n, bool mark);      /* all n bytes one mark */
void jsb_free(jsb *b);
jv  *jsb_take(jsb *b);              /* a string value in the arena; frees the builder */

/* Python's str(v) and repr(v) appended to b, with marks. */
void jv_write_str(jctx *c, jsb *b, const jv *v);
void jv_write_repr(jctx *c, jsb *b, const jv *v);
jv  *jv_to_str(jctx *c, const jv *v);
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) as
 * transformers' tojson calls it; indent < 0 = None. */
void jv_write_json(jctx *c, int line, jsb *b, const jv *v, int indent, const char *item_sep,
                   const char *key_sep, bool sort_keys, bool ensure_ascii);
void jv_write_float(jsb *b, double f);   /* Python's repr(float) */

/* Parse JSON text into values (objects keep their order, integers stay ints).
 * Every string is marked as caller data when `mark`. Fails with the offset. */
jv *jv_parse_json(jctx *c, const char *p, size_t n, bool mark);

/* UTF-8: the encoding of code point u into o[0, 4), returning its length;
 * the number of code points; the byte offset of code point i (clamped). */
size_t ju8_put(char *o, unsigned u);
size_t ju8_len(const char *p, size_t n);
size_t ju8_off(const char *p, size_t n, size_t i);

/* ---------------------------------------------------------------- syntax tree */

enum jnode_type {
    /* statements */
    JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_FILTERBLOCK,
    JN_BREAK, JN_CONTINUE, JN_BODY,
    /* expressions */
    JN_LIT, JN_NAME, JN_LIST, JN_TUPLE, JN_DICT, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL,
    JN_FILTER, JN_TEST, JN_BINOP, JN_NOT, JN_NEG, JN_POS, JN_AND, JN_OR, JN_COMPARE,
    JN_COND, JN_CONCAT,
};

enum jop {   /* binary and comparison operators */
    JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
};

/* One node type for all: which fields a type uses is listed with it.
 *   TEXT, LIT: lit              OUTPUT: a                   NAME: name
 *   IF: a cond, body, orelse    FOR: names/nnames targets, a iterable, b filter (or NULL),
 *                                    body, orelse, op = 1 if recursive
 *   SET: names/nnames targets or (a object, name attribute), b value
 *   SETBLOCK: name (or a + name), body, b filter chain applied to the body (a FILTER on NULL)
 *   MACRO: name, names/nnames params, args defaults (NULL = none), body
 *   FILTERBLOCK: b filter chain, body       BODY: body (generation)
 *   LIST/TUPLE: args            DICT: args keys, kwvals values
 *   ATTR: a . name              ITEM: a [ b ]        SLICE: a [ args[0]:args[1]:args[2] ] (NULL parts)
 *   CALL: a callee, args, kwnames/kwvals    FILTER/TEST: a value (NULL = the block's text), name,
 *                                           args, kwnames/kwvals; TEST op = 1 when negated
 *   BINOP: op, a, b   NOT/NEG/POS: a   AND/OR: a, b   COMPARE: a, args operands, ops
 *   COND: b if a else c (c NULL = undefined)   CONCAT: args */
struct jnode {
    uint8_t  type;
    uint8_t  op;
    int      line;
    jnode   *a, *b, *c;
    jnode  **args;   size_t nargs;
    jnode  **body;   size_t nbody;
    jnode  **orelse; size_t norelse;
    const char **names; size_t nnames;
    const char **kwnames; jnode **kwvals; size_t nkw;
    uint8_t *ops;
    const char *name;
    jv      *lit;
};

/* ---------------------------------------------------------------- tokens */

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

/* The tokens of src (jinja_lex.c), ending with T_EOF. */
tok *jinja_lex(jctx *c, const char *src, size_t len, size_t *n_out);

/* Parse src into a list of statements (the template's body). */
jnode **jinja_parse(jctx *c, const char *src, size_t len, size_t *n_out);

/* ---------------------------------------------------------------- evaluation */

typedef struct jframe jframe;
typedef struct jrender jrender;

struct jloop {
    jv     *items;      /* the list iterated (after the loop filter) */
    size_t  i;
    int     depth0;
    const jnode *node;  /* for loop(...) of a recursive for */
};

jv *jeval(jrender *r, const jnode *e);
/* Call a callable value with positional args and keywords. */
jv *jcall(jrender *r, int line, jv *fn, jv **args, size_t nargs, const char **kwn, jv **kwv,
          size_t nkw);
jctx *jrender_ctx(jrender *r);
int64_t jrender_now(jrender *r);         /* strftime_now's clock */
/* The value of v as a list for iteration (lists, tuples, dict keys, string
 * characters, undefined as empty); fails for what Python cannot iterate. */
jv *jiter_list(jrender *r, int line, jv *v);
/* Jinja's getattr(obj, name) and getitem(obj, key). */
jv *jgetattr(jrender *r, int line, jv *obj, const char *name);
jv *jgetitem(jrender *r, int line, jv *obj, jv *key);

/* jinja_percent.c: Python's fmt % operand for a string fmt (a tuple operand
 * gives the arguments, a dict serves %(key)s, anything else is the one
 * argument); fails with Python's TypeError/ValueError messages. */
jv *jinja_percent_format(jrender *r, int line, jv *fmt, jv *operand);

/* jinja_builtins.c */
jv *jfilter(jrender *r, int line, const char *name, jv *v, jv **args, size_t nargs,
            const char **kwn, jv **kwv, size_t nkw);
bool jtest(jrender *r, int line, const char *name, jv *v, jv **args, size_t nargs);
jv *jmethod(jrender *r, int line, jv *self, const char *name, jv **args, size_t nargs,
            const char **kwn, jv **kwv, size_t nkw);
bool jhas_method(const jv *self, const char *name);
int jbuiltin_id(const char *name);   /* -1 when not a global function */
jv *jbuiltin_call(jrender *r, int line, int id, jv **args, size_t nargs, const char **kwn,
                  jv **kwv, size_t nkw);

#endif
