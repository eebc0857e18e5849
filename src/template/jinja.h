/* jinja.h - a Jinja2 engine for chat templates.
 *
 * It runs what `tokenizer.chat_template` sources use, with the environment
 * transformers renders them in (ImmutableSandboxedEnvironment, trim_blocks,
 * lstrip_blocks, the loopcontrols extension, its own `tojson`, the globals
 * `raise_exception` and `strftime_now`), and renders byte for byte what
 * Python's jinja2 renders given the same data (tests/test_jinja.c checks it).
 * What is not there: template inheritance, include/import, {% call %}
 * blocks, {% raw %}, autoescaping, async; a template using them fails to
 * compile with a message naming the line.
 *
 * Provenance. The variables of a render come in two JSON objects: `data`,
 * the caller's (messages, tools, chat_template_kwargs), whose strings are
 * marked as caller data, and `trusted` (bos_token, add_generation_prompt...),
 * whose strings count as template text. Marks follow the bytes through every
 * operation (concatenation, slicing, filters, methods, tojson); the result
 * lists the byte ranges of the output that came from caller data. Bytes a
 * template computes (JSON punctuation of tojson, digits of numbers, quotes of
 * repr) count as template text.
 *
 * Limits. A render stops with an error past the limits of jinja_limits
 * (output size, memory, loop iterations, macro call depth); parsing bounds
 * nesting at 200. Nothing a template or a message contains can make the
 * engine read or write outside its own memory or recurse without bound. */
#ifndef KVC_JINJA_H
#define KVC_JINJA_H

#include "common.h"

typedef struct jinja_template jinja_template;

typedef struct jinja_limits {
    size_t   max_output;      /* bytes of rendered text; 0 = 64 MiB */
    size_t   max_memory;      /* bytes of working memory; 0 = 512 MiB */
    uint64_t max_iterations;  /* loop iterations, all loops together; 0 = 10 million */
    int      max_call_depth;  /* nested macro calls; 0 = 64 */
    int64_t  now;             /* strftime_now's clock, seconds since the epoch (UTC is
                                 written as local time); 0 = the current time */
} jinja_limits;

typedef struct jinja_span { size_t off, len; } jinja_span;

typedef struct jinja_output {
    char       *text;         /* malloc'd, NUL-terminated (may contain NULs before len) */
    size_t      len;
    jinja_span *marked;       /* malloc'd; sorted, disjoint, non-adjacent ranges of caller data */
    size_t      n_marked;
} jinja_output;

/* Compile Jinja source (UTF-8, `len` bytes). On success *out is a template
 * the caller frees with jinja_template_free; it is only read by renders, so
 * one template may be rendered by several threads at once. On a syntax
 * error returns KVC_ERR_INVALID_ARG and err says "template line N: ...". */
int jinja_compile(const char *src, size_t len, jinja_template **out, kvc_err *err);
void jinja_template_free(jinja_template *t);   /* NULL ok */

/* Render with the variables of two JSON objects (either may be NULL; a name
 * in both takes trusted's value). On success fills *out (free with
 * jinja_output_free). Errors: KVC_ERR_INVALID_ARG for a template that fails
 * (raise_exception's message as given: "template line N: raise_exception:
 * <message>"; an undefined value used; a type error; a limit) or JSON that is
 * not an object; KVC_ERR_NOMEM. *out is zeroed on failure. */
int jinja_render(const jinja_template *t, const char *data_json, const char *trusted_json,
                 const jinja_limits *limits, jinja_output *out, kvc_err *err);
void jinja_output_free(jinja_output *o);      /* NULL ok; zeroes it */

/* The message of a failed raise_exception() is reported with this prefix
 * after "template line N: ", so a server can tell it from other failures. */
#define JINJA_RAISE_PREFIX "raise_exception: "

#endif
