/* common.c - error messages, failed invariants, clock and aligned memory. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int kvc_fail(kvc_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int kvc_err_prefix(kvc_err *err, const char *fmt, ...)
{
    if (!err)
        return KVC_OK;
    char head[256], old[sizeof(err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof(head), fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof(old));
    snprintf(err->msg, sizeof(err->msg), "%.200s: %.300s", head, old);
    return err->code;
}

int64_t kvc_time_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void *kvc_alloc_aligned(size_t size)
{
    void *p = NULL;
    if (size == 0)
        size = 64;
    size = (size + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, size) != 0)
        return NULL;
    return p;
}

void kvc_free_aligned(void *p) { free(p); }

bool kvc_grow(void **arr, size_t *cap, size_t n, size_t elsize)
{
    if (n < *cap)
        return true;
    size_t cap2 = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, cap2 * elsize);
    if (!p)
        return false;
    *arr = p;
    *cap = cap2;
    return true;
}

void kvc_text_append(char **p, size_t *len, size_t *cap, bool *oom, const char *s, size_t n)
{
    if (*oom)
        return;
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *np = realloc(*p, c);
        if (!np) {
            *oom = true;
            return;
        }
        *p = np;
        *cap = c;
    }
    memcpy(*p + *len, s, n);
    *len += n;
    (*p)[*len] = 0;
}

_Noreturn void kvc_assert_fail(const char *file, int line, const char *cond)
{
    fprintf(stderr, "%s:%d: KVC_ASSERT(%s) failed\n", file, line, cond);
    fflush(stderr);
    abort();
}
