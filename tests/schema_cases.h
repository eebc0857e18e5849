/* schema_cases.h - JSON schemas the grammar tests and bench/bench_grammar.c
 * share. Header-only. */
#ifndef KVC_TEST_SCHEMA_CASES_H
#define KVC_TEST_SCHEMA_CASES_H

#include <stdio.h>
#include <stdlib.h>

/* anyOf of n objects {a: string, bI: integer}, both required, I = 0..n-1
 * (issue 30's reproducer): every object stays a candidate inside "a"'s
 * string, until the second key's name is written. malloc'd; NULL when
 * memory ran out. */
static char *anyof_schema(int n)
{
    size_t cap = 64 + (size_t)n * 160, len = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    len += (size_t)snprintf(s + len, cap - len, "{\"anyOf\":[");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len,
                                "%s{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},"
                                "\"b%d\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b%d\"]}",
                                i ? "," : "", i, i);
    snprintf(s + len, cap - len, "]}");
    return s;
}

#endif
