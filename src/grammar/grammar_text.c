/* grammar_text.c - writing grammar text: the growable buffer the schema
 * compiler (json_schema.c) and the pattern translator (json_pattern.c) write
 * into, GBNF literals, and integer ranges spelled as digit rules. */
#include "grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- buffer */

void gsb_put(gsbuf *b, const char *s, size_t n)
{
    kvc_text_append(&b->s, &b->n, &b->cap, &b->oom, s, n);
}

void gsb_puts(gsbuf *b, const char *s)
{
    gsb_put(b, s, strlen(s));
}

void gsb_printf(gsbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        gsb_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    gsb_put(b, big, (size_t)n);
    free(big);
}

void gsb_literal(gsbuf *b, const char *s, size_t n)
{
    gsb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c == '"' || c == '\\')
            gsb_printf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            gsb_printf(b, "\\x%02x", c);
        else
            gsb_put(b, (const char *)&c, 1);
    }
    gsb_put(b, "\"", 1);
}

/* ---------------------------------------------------------------- integer ranges */

/* Digits strings lo and hi of the same length n, lo <= hi: every number
 * between them (with lo's leading digits as they are). */
static void digits_between(gsbuf *b, const char *lo, const char *hi, size_t n)
{
    if (n == 0) {
        gsb_puts(b, "\"\"");
        return;
    }
    size_t n0 = 0, n9 = 0;
    while (n0 < n && lo[n0] == '0')
        n0++;
    while (n9 < n && hi[n9] == '9')
        n9++;
    if (n0 == n && n9 == n) {        /* every string of n digits: no branching, */
        gsb_printf(b, "[0-9]{%zu}", n);    /* else the output doubles per digit */
        return;
    }
    if (lo[0] == hi[0]) {
        gsb_printf(b, "\"%c\" ( ", lo[0]);
        digits_between(b, lo + 1, hi + 1, n - 1);
        gsb_puts(b, " )");
        return;
    }
    char nines[20], zeros[20];
    memset(nines, '9', n - 1);
    memset(zeros, '0', n - 1);
    gsb_printf(b, "\"%c\" ( ", lo[0]);
    digits_between(b, lo + 1, nines, n - 1);
    gsb_puts(b, " )");
    if (lo[0] + 1 <= hi[0] - 1)
        gsb_printf(b, " | [%c-%c] [0-9]{%zu}", lo[0] + 1, hi[0] - 1, n - 1);
    gsb_printf(b, " | \"%c\" ( ", hi[0]);
    digits_between(b, zeros, hi + 1, n - 1);
    gsb_puts(b, " )");
}

void gsb_uint_range(gsbuf *b, long long a, long long bmax)
{
    char sa[24], sb[24];
    int na = snprintf(sa, sizeof(sa), "%lld", a), nb = snprintf(sb, sizeof(sb), "%lld", bmax);
    long long pow = 1;
    for (int i = 1; i < na; i++)
        pow *= 10;
    for (int len = na; len <= nb; len++, pow *= 10) {
        char lo[24], hi[24];
        snprintf(lo, sizeof(lo), "%lld", len == na ? a : pow);
        snprintf(hi, sizeof(hi), "%lld", len == nb ? bmax : pow * 10 - 1);
        if (len > na)
            gsb_puts(b, " | ");
        gsb_puts(b, "( ");
        digits_between(b, lo, hi, (size_t)len);
        gsb_puts(b, " )");
    }
}
