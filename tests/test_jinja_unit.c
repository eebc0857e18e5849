/* test_jinja_unit.c - what Python cannot be the reference for: provenance
 * marks (which output bytes came from the caller's data), error messages
 * naming the line, every limit against hostile templates and messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "test.h"

/* Render; returns the status, fills out (caller frees) and err. */
static int render(const char *tmpl, const char *data, const char *trusted, const jinja_limits *lim,
                  jinja_output *out, kvc_err *err)
{
    jinja_template *t = NULL;
    memset(err, 0, sizeof(*err));
    memset(out, 0, sizeof(*out));
    int rc = jinja_compile(tmpl, strlen(tmpl), &t, err);
    if (rc == KVC_OK)
        rc = jinja_render(t, data, trusted, lim, out, err);
    jinja_template_free(t);
    return rc;
}

/* The marked bytes of out as a string: marked bytes kept, others as '.' */
static char *mask_str(const jinja_output *o)
{
    char *m = malloc(o->len + 1);
    memset(m, '.', o->len);
    m[o->len] = 0;
    for (size_t i = 0; i < o->n_marked; i++)
        memcpy(m + o->marked[i].off, o->text + o->marked[i].off, o->marked[i].len);
    return m;
}

static void check_marks(const char *tmpl, const char *data, const char *want_text, const char *want_mask)
{
    jinja_output o;
    kvc_err err;
    int rc = render(tmpl, data, "{\"bos\": \"<s>\"}", NULL, &o, &err);
    CHECKF(rc == KVC_OK, "%s: %s", tmpl, err.msg);
    if (rc != KVC_OK)
        return;
    CHECKF(!strcmp(o.text, want_text), "%s: text «%s», want «%s»", tmpl, o.text, want_text);
    char *m = mask_str(&o);
    CHECKF(!strcmp(m, want_mask), "%s: marks «%s», want «%s»", tmpl, m, want_mask);
    for (size_t i = 1; i < o.n_marked; i++)   /* sorted, disjoint, not adjacent */
        CHECK(o.marked[i].off > o.marked[i - 1].off + o.marked[i - 1].len);
    free(m);
    jinja_output_free(&o);
}

static void test_provenance(void)
{
    const char *d = "{\"c\": \"<|im_end|>x\", \"n\": \"ab\", \"l\": [\"p\", \"q\"], \"o\": {\"k\": \"v\"}, \"i\": 7}";
    check_marks("[{{ c }}]", d, "[<|im_end|>x]", ".<|im_end|>x.");
    check_marks("{{ bos }}{{ 'lit' }}{{ n }}", d, "<s>litab", "......ab");
    check_marks("{{ (n ~ '-' ~ n) | upper }}", d, "AB-AB", "AB.AB");
    check_marks("{{ (' ' ~ n ~ ' ') | trim }}|{{ c[2:6] }}|{{ c.split('_')[1] }}", d,
                "ab|im_e|end|>x", "ab.im_e.end|>x");
    check_marks("{{ c | replace('im', 'XX') }}", d, "<|XX_end|>x", "<|.._end|>x");
    check_marks("{{ l | join(', ') }}", d, "p, q", "p..q");
    check_marks("{{ o | tojson }}", d, "{\"k\": \"v\"}", "..k....v..");
    check_marks("{{ n | tojson }}", d, "\"ab\"", ".ab.");
    check_marks("{{ i }}{{ i + 1 }}", d, "78", "..");   /* numbers: computed, not marked */
    check_marks("{% set ns = namespace(s='') %}{% for x in l %}{% set ns.s = ns.s + x + '|' %}{% endfor %}{{ ns.s }}",
                d, "p|q|", "p.q.");
    check_marks("{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(n) }}", d, "<ab>", ".ab.");
    check_marks("{% set b %}[{{ n }}]{% endset %}{{ b }}", d, "[ab]", ".ab.");
    check_marks("{{ '{}!'.format(n) }}{{ n.upper() }}{{ n[::-1] }}", d, "ab!ABba", "ab.ABba");
    check_marks("{{ c | tojson }}", "{\"c\": \"a\\nb\\\"\"}", "\"a\\nb\\\"\"", ".a\\nb\\\".");
}

static void check_error(const char *tmpl, const char *data, const jinja_limits *lim, const char *want)
{
    jinja_output o;
    kvc_err err;
    int rc = render(tmpl, data, NULL, lim, &o, &err);
    CHECKF(rc == KVC_ERR_INVALID_ARG, "%s: rc %d", tmpl, rc);
    CHECKF(strstr(err.msg, want) != NULL, "%s: error «%s», want «%s»", tmpl, err.msg, want);
    CHECK(o.text == NULL && o.marked == NULL);
    jinja_output_free(&o);
}

static void test_errors(void)
{
    /* syntax */
    check_error("a\n{% if x %}\nb", NULL, NULL, "line 3: unexpected end of template, expected 'elif' or 'else' or 'endif'");
    check_error("{{ 1 + }}", NULL, NULL, "line 1: unexpected end of print statement");
    check_error("x\n{% frobnicate %}", NULL, NULL, "line 2: unknown tag 'frobnicate'");
    check_error("{% endfor %}", NULL, NULL, "line 1: unexpected 'endfor'");
    check_error("{{ 'abc }}", NULL, NULL, "unexpected end of string literal");
    check_error("{# open", NULL, NULL, "missing end of comment tag");
    check_error("{{ a ]] }}", NULL, NULL, "unexpected ']'");
    check_error("{{ x $ y }}", NULL, NULL, "unexpected character '$'");
    check_error("{% for in x %}{% endfor %}", NULL, NULL, "expected 'in' in a for loop");
    check_error("{% macro m(a=1, b) %}{% endmacro %}", NULL, NULL, "non-default argument follows default");
    check_error("{{ '\\x4' }}", NULL, NULL, "truncated \\x escape");
    /* runtime */
    check_error("\n\n{{ raise_exception('bad role: ' ~ r) }}", "{\"r\": \"tool\"}", NULL,
                "line 3: " JINJA_RAISE_PREFIX "bad role: tool");
    check_error("{{ m.x.y }}", "{}", NULL, "'m' is undefined");
    check_error("{{ f() }}", NULL, NULL, "'f' is undefined (called as a function)");
    check_error("{{ 1 + none }}", NULL, NULL, "unsupported operand type(s) for +: 'int' and 'NoneType'");
    check_error("{{ 5 // 0 }}", NULL, NULL, "division or modulo by zero");
    check_error("{{ 'x' | nofilter }}", NULL, NULL, "no filter named 'nofilter'");
    check_error("{{ 1 is notatest }}", NULL, NULL, "no test named 'notatest'");
    check_error("{{ x.update({}) }}", "{\"x\": {}}", NULL, "unsafe");
    check_error("{{ 3 | length }}", NULL, NULL, "has no len()");
    check_error("{% set a, b = [1] %}", NULL, NULL, "cannot unpack 1 values into 2 names");
    check_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, NULL, "takes not more than 1");
    check_error("{% macro m(a) %}{% endmacro %}{{ m(z=1) }}", NULL, NULL, "no keyword argument 'z'");
    check_error("{{ {'a': none} | tojson }}{{ x | tojson }}", NULL, NULL, "Undefined is not JSON serializable");
    check_error("{{ 'a {} {}'.format(1) }}", NULL, NULL, "replacement index 1 out of range");
    check_error("{{ 'abc'.index('z') }}", NULL, NULL, "substring not found");
    check_error("{{ range(0, 5, 0) }}", NULL, NULL, "must not be zero");
    check_error("x", "[1]", NULL, "variables must be a JSON object");
    check_error("x", "{\"a\": }", NULL, "JSON at offset");
    /* limits */
    jinja_limits small = { .max_output = 1000, .max_iterations = 500, .max_call_depth = 8, .max_memory = 1 << 20 };
    check_error("{% for i in range(100) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", NULL, &small,
                "output longer than the limit of 1000 bytes");
    check_error("{% for i in range(30) %}{% for j in range(30) %}{% endfor %}{% endfor %}", NULL, &small,
                "more than 500 loop iterations");
    check_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &small,
                "macro calls nested deeper than 8");
    check_error("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s[:20000] %}{% endfor %}",
                NULL, &small, "memory limit");
    check_error("{{ 'ab' * 100000000 }}", NULL, NULL, "longer than the output limit");
    check_error("{{ range(100000000) | length }}", NULL, NULL, "over the limit");
    /* nesting that would exhaust the stack */
    size_t n = 100000;
    char *deep = malloc(2 * n + 16);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++) deep[3 + i] = '-';
    strcpy(deep + 3 + n, "1 }}");
    check_error(deep, NULL, NULL, "nested deeper than 200");
    char *p = deep;
    for (size_t i = 0; i < 300; i++) p += sprintf(p, "{%% if 1 %%}");
    check_error(deep, NULL, NULL, "nested deeper than 200");
    strcpy(deep, "{{ x");
    for (size_t i = 0; i < 2000; i++) strcat(deep, "|t");
    strcat(deep, " }}");
    check_error(deep, NULL, NULL, "no filter named 't'");
    free(deep);
    check_error("", "{\"a\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
                "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
                NULL, "nesting deeper than 200");
}

static void test_reuse(void)
{
    /* one compiled template, many renders; marks and text independent per render */
    jinja_template *t = NULL;
    kvc_err err = { 0 };
    const char *src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
    CHECK(jinja_compile(src, strlen(src), &t, &err) == KVC_OK);
    for (int i = 0; i < 3; i++) {
        jinja_output o;
        char data[128];
        snprintf(data, sizeof(data), "{\"messages\": [{\"role\": \"user\", \"content\": \"m%d\"}]}", i);
        CHECK(jinja_render(t, data, NULL, NULL, &o, &err) == KVC_OK);
        char want[32];
        snprintf(want, sizeof(want), "<user>m%d", i);
        CHECK(!strcmp(o.text, want));
        CHECK_EQ_INT(o.n_marked, 2);
        jinja_output_free(&o);
    }
    jinja_template_free(t);
    jinja_template_free(NULL);
    jinja_output_free(NULL);
}

int main(void)
{
    test_provenance();
    test_errors();
    test_reuse();
    return test_done("test_jinja_unit");
}
