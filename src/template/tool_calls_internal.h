/* tool_calls_internal.h - the table of tool-call formats behind
 * tool_calls.h: one row (tc_format) per format, and what the rows share.
 * Private to src/template: tool_calls.c holds the table, the JSON formats'
 * rows (Hermes, Llama 3, Mistral, harmony) and the shared helpers;
 * tool_calls_xml.c holds Qwen3-Coder's XML row. */
#ifndef KVC_TOOL_CALLS_INTERNAL_H
#define KVC_TOOL_CALLS_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tool_calls.h"

/* One tool-call format. Every function is required but shared_rules. */
typedef struct tc_format {
    const char *name;    /* kvc_tool_format_name */
    /* The calls of reply r[0, len) (trimmed) into arr (tc_add_call), the
     * text that is content into the kvc_text_append builder (content, clen,
     * ccap, oom); a format that finds no call leaves arr empty. tools: the
     * request's tools array parsed when .typed, else NULL. */
    void (*parse)(const char *r, size_t len, const cJSON *tools, cJSON *arr, uint64_t seed,
                  char **content, size_t *clen, size_t *ccap, bool *oom);
    bool typed;          /* parse reads the tools (values typed by their schema) */
    /* kvc_tool_calls_holdback for this format. */
    size_t (*holdback)(const char *text, size_t len);
    /* The grammar rules of function fn (the i-th of tools, 1-based; its
     * "name" a string) into *out (malloc'd), and in alt (cap bytes) the
     * expression of one call to it, which rule "calls" chooses among.
     * KVC_ERR_INVALID_ARG naming the function, KVC_ERR_NOMEM. */
    int (*rules)(const cJSON *fn, int i, char **out, char *alt, size_t cap, kvc_err *err);
    /* The grammar's root over rule "calls": one call, and up to 8 in a row */
    const char *root_one, *root_parallel;
    /* Rules every call may use, appended once (NULL: none). */
    void (*shared_rules)(char **b, size_t *l, size_t *c, bool *oom);
} tc_format;

extern const tc_format tc_qwen_xml;    /* tool_calls_xml.c */

/* Append the call of call object o (its "name", and its args_key member,
 * else the other of "arguments" / "parameters", as JSON text; a string is
 * taken as the text) to arr with an id from seed (kvc_tool_call_add);
 * false when o is not a call. */
bool tc_add_call(cJSON *arr, const cJSON *o, const char *args_key, uint64_t seed);

/* Shrink s[0, *n) past the spaces at both ends. */
void tc_trim(const char **s, size_t *n);

/* Bytes at the end of text[0, len) that are, or may begin, mark: len when
 * mark is in it, else the longest end of text that begins mark. */
size_t tc_mark_holdback(const char *text, size_t len, const char *mark);

#endif
